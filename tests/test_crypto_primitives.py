"""The primitive helpers against their RFC vectors and reference libraries."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from anonml.crypto._sizes import LIONESS_KEY_SIZE, LIONESS_MIN_BLOCK_SIZE
from anonml.crypto._primitives import (
    InvalidGroupElement,
    chacha20_keystream,
    chacha20_xor,
    ct_equal,
    hkdf_sha256,
    hmac_sha256,
    lioness_decrypt,
    lioness_encrypt,
    x25519,
    x25519_base,
    xor_bytes,
)


def test_hkdf_rfc5869_test_case_1() -> None:
    okm = hkdf_sha256(
        bytes.fromhex("0b" * 22), salt=bytes.fromhex("000102030405060708090a0b0c"), info=bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"), length=42
    )
    assert okm.hex() == "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"


def test_hkdf_rfc5869_test_case_3_empty_salt_and_info() -> None:
    okm = hkdf_sha256(bytes.fromhex("0b" * 22), salt=b"", info=b"", length=42)
    assert okm.hex() == "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=80), st.binary(max_size=80), st.binary(max_size=40), st.integers(1, 600))
def test_hkdf_matches_rfc5869_written_out(ikm: bytes, salt: bytes, info: bytes, length: int) -> None:
    # RFC 5869 §2.2-2.3 from HMAC alone: hkdf_sha256 wraps cryptography's HKDF,
    # so the reference must not be that same call.
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
    assert hkdf_sha256(ikm, salt=salt, info=info, length=length) == okm[:length]


@pytest.mark.parametrize("length", [0, 255 * 32 + 1])
def test_hkdf_rejects_lengths_out_of_range(length: int) -> None:
    with pytest.raises(ValueError, match=repr(length)):
        hkdf_sha256(b"k", salt=b"s", info=b"i", length=length)


@given(st.binary(max_size=100), st.binary(max_size=300))
def test_hmac_sha256_is_rfc2104(key: bytes, data: bytes) -> None:
    assert hmac_sha256(key, data) == hmac.new(key, data, "sha256").digest()


def test_ct_equal() -> None:
    assert ct_equal(b"\x00" * 32, bytes(32))
    assert not ct_equal(b"\x00" * 31 + b"\x01", bytes(32))
    assert not ct_equal(b"", bytes(1))


def test_xor_bytes_and_unequal_lengths() -> None:
    assert xor_bytes(b"\x0f\xf0", b"\xff\xff") == b"\xf0\x0f"
    with pytest.raises(ValueError):
        xor_bytes(b"a", b"ab")


def test_chacha20_keystream_is_the_rfc8439_block_function() -> None:
    # RFC 8439 §A.1, test vector #1: all-zero key and nonce, block counter 0.
    expected = (
        "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
        "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"
    )
    assert chacha20_keystream(bytes(32), 64).hex() == expected


@given(st.binary(min_size=32, max_size=32), st.binary(max_size=500))
def test_chacha20_xor_is_an_involution(key: bytes, data: bytes) -> None:
    assert chacha20_xor(key, chacha20_xor(key, data)) == data
    assert chacha20_xor(key, data) == xor_bytes(data, chacha20_keystream(key, len(data)))


def test_chacha20_rejects_short_key() -> None:
    with pytest.raises(ValueError, match="31"):
        chacha20_xor(bytes(31), b"x")


@settings(max_examples=100)
@given(st.binary(min_size=LIONESS_KEY_SIZE, max_size=LIONESS_KEY_SIZE), st.binary(min_size=LIONESS_MIN_BLOCK_SIZE, max_size=600))
def test_lioness_round_trip(key: bytes, block: bytes) -> None:
    ciphertext = lioness_encrypt(key, block)
    assert len(ciphertext) == len(block)
    assert lioness_decrypt(key, ciphertext) == block


@settings(max_examples=100)
@given(st.binary(min_size=LIONESS_KEY_SIZE, max_size=LIONESS_KEY_SIZE), st.binary(min_size=256, max_size=256), st.data())
def test_lioness_one_bit_flip_garbles_every_part_of_the_block(key: bytes, block: bytes, data: st.DataObject) -> None:
    ciphertext = bytearray(lioness_encrypt(key, block))
    bit = data.draw(st.integers(0, 8 * len(ciphertext) - 1))
    ciphertext[bit // 8] ^= 1 << (bit % 8)
    garbled = lioness_decrypt(key, bytes(ciphertext))
    # A wide-block cipher: no 16-byte chunk of the plaintext survives (each
    # survives by chance with probability 2**-128).
    for offset in range(0, len(block), 16):
        assert garbled[offset : offset + 16] != block[offset : offset + 16]


def test_lioness_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="127"):
        lioness_encrypt(bytes(127), bytes(100))
    with pytest.raises(ValueError, match="32"):
        lioness_decrypt(bytes(LIONESS_KEY_SIZE), bytes(32))


def test_x25519_rfc7748_section_6_1() -> None:
    alice = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    bob = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
    assert x25519_base(alice).hex() == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    assert x25519_base(bob).hex() == "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
    shared = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"
    assert x25519(alice, x25519_base(bob)).hex() == shared
    assert x25519(bob, x25519_base(alice)).hex() == shared


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32))
def test_x25519_matches_cryptography(scalar: bytes, other: bytes) -> None:
    public = x25519_base(other)
    reference = X25519PrivateKey.from_private_bytes(scalar).exchange(
        X25519PrivateKey.from_private_bytes(other).public_key()
    )
    assert x25519(scalar, public) == reference


@pytest.mark.parametrize(
    "point",
    [
        bytes(32),  # u = 0, the point of order 2
        (1).to_bytes(32, "little"),  # u = 1, a point of order 4
        bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),  # order 8
    ],
)
def test_x25519_refuses_small_order_points(point: bytes) -> None:
    with pytest.raises(InvalidGroupElement):
        x25519(bytes(range(32)), point)


def test_x25519_rejects_wrong_lengths() -> None:
    with pytest.raises(ValueError):
        x25519(bytes(31), bytes(32))
    with pytest.raises(ValueError):
        x25519_base(bytes(33))
