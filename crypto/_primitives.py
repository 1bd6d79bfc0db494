"""Small cryptographic primitives that the recipes (Sphinx, tokens) compose.

Nothing in here knows about packets or credentials: each helper is one
well-known primitive with fixed sizes, so that recipe modules never touch raw
ciphers or group arithmetic (STYLE.md §7). Sizes are exported as constants and
read by :mod:`crypto._geometry`; packet code reads them from the geometry.

* X25519 (RFC 7748) through libsodium (pynacl): ``x25519``, ``x25519_base``.
* HKDF-SHA256 (RFC 5869) through ``cryptography`` (extract and expand in one
  native call) and HMAC-SHA256 (RFC 2104) on the standard library's one-shot
  ``hmac.digest``.
* ChaCha20 (RFC 8439 block function) as a key stream through ``cryptography``.
* LIONESS (Anderson & Biham 1996), a wide-block cipher (SPRP) from ChaCha20 and
  keyed BLAKE2b: a change to any bit of the block garbles all of it.
* ``ct_equal``: the one constant-time comparison for MACs, tags and secrets
  (STYLE.md §9). The token recipe imports it from here too.
"""

from __future__ import annotations

import hashlib
import hmac

import nacl.bindings
import nacl.exceptions
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from anonml.base.errors import InputError
from anonml.crypto._sizes import (
    CHACHA20_KEY_SIZE,
    LIONESS_HALF_SIZE,
    LIONESS_KEY_SIZE,
    LIONESS_MIN_BLOCK_SIZE,
    LIONESS_SUBKEY_SIZE,
    SHA256_SIZE,
    X25519_ELEMENT_SIZE,
    X25519_SCALAR_SIZE,
)

_SHA256 = SHA256()
# cryptography's ChaCha20 takes the 16-byte "counter || nonce" block of RFC 7539's
# original layout; every key in this package is used for one message only, so the
# all-zero counter/nonce is safe (RFC 8439 §2.3: (key, nonce) must never repeat).
_CHACHA20_ZERO_NONCE = bytes(16)

class InvalidGroupElement(InputError):
    """Raised by :func:`x25519` when the result is the all-zero point.

    That happens exactly when the input point has small order (RFC 7748 §6.1:
    "check that the output is not all-zero"); libsodium refuses it.
    """


def ct_equal(left: bytes, right: bytes) -> bool:
    """Compare two byte strings in time independent of where they differ.

    The one comparison for MACs, tags and secrets in this package (STYLE.md §9):
    ``==`` on secret bytes leaks the length of the common prefix through timing.
    """
    return hmac.compare_digest(left, right)


def hmac_sha256(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104) of ``data`` under ``key``: 32 bytes."""
    return hmac.digest(key, data, "sha256")


def hkdf_sha256(ikm: bytes, *, salt: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 (RFC 5869 §2.2 extract, §2.3 expand) of ``length`` bytes."""
    if not 0 < length <= 255 * SHA256_SIZE:
        raise ValueError(f"HKDF-SHA256 output length out of range: {length!r}")
    # One native call for the extract and all expand blocks: every hop of every
    # packet derives 256 bytes (8 blocks), and the per-block Python loop this
    # replaced cost twice as much (14 against 7 µs measured). An empty salt is
    # HashLen zeros (RFC 5869 §2.2), which is what HKDF does with salt=None.
    return HKDF(algorithm=_SHA256, length=length, salt=salt if salt else None, info=info).derive(ikm)


def chacha20_xor(key: bytes, data: bytes) -> bytes:
    """Xor ``data`` with the ChaCha20 key stream of a single-use ``key``.

    Encryption and decryption are the same operation. ``key`` must never be
    used for a second message (the nonce is fixed).
    """
    if len(key) != CHACHA20_KEY_SIZE:
        raise ValueError(f"ChaCha20 key must be {CHACHA20_KEY_SIZE} bytes, got {len(key)!r}")
    encryptor = Cipher(algorithms.ChaCha20(key, _CHACHA20_ZERO_NONCE), mode=None).encryptor()
    return encryptor.update(data)


def xor_bytes(left: bytes, right: bytes) -> bytes:
    """Xor two byte strings of the same length."""
    if len(left) != len(right):
        raise ValueError(f"xor of unequal lengths {len(left)!r} and {len(right)!r}")
    # Big-integer xor is one C loop, much faster than a Python loop over bytes.
    return (int.from_bytes(left, "little") ^ int.from_bytes(right, "little")).to_bytes(
        len(left), "little"
    )


def chacha20_keystream(key: bytes, length: int) -> bytes:
    """The first ``length`` bytes of the ChaCha20 key stream of a single-use ``key``."""
    return chacha20_xor(key, bytes(length))


def _keyed_blake2b(key: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(data, key=key, digest_size=LIONESS_HALF_SIZE).digest()


def _lioness_split(key: bytes, block: bytes) -> tuple[list[bytes], bytes, bytes]:
    if len(key) != LIONESS_KEY_SIZE:
        raise ValueError(f"LIONESS key must be {LIONESS_KEY_SIZE} bytes, got {len(key)!r}")
    if len(block) < LIONESS_MIN_BLOCK_SIZE:
        raise ValueError(f"LIONESS block must be >= {LIONESS_MIN_BLOCK_SIZE} bytes, got {len(block)!r}")
    subkeys = [key[i : i + LIONESS_SUBKEY_SIZE] for i in range(0, LIONESS_KEY_SIZE, LIONESS_SUBKEY_SIZE)]
    return subkeys, block[:LIONESS_HALF_SIZE], block[LIONESS_HALF_SIZE:]


def lioness_encrypt(key: bytes, block: bytes) -> bytes:
    """Encrypt ``block`` (any length > 32 bytes) with LIONESS under a 128-byte key.

    Anderson & Biham 1996 §3, four rounds over (L, R) with |L| = 32:
    R ^= S(L ^ K1); L ^= H_K2(R); R ^= S(L ^ K3); L ^= H_K4(R),
    S = ChaCha20 key stream, H = keyed BLAKE2b-256.
    """
    (k1, k2, k3, k4), left, right = _lioness_split(key, block)
    right = chacha20_xor(xor_bytes(left, k1), right)
    left = xor_bytes(left, _keyed_blake2b(k2, right))
    right = chacha20_xor(xor_bytes(left, k3), right)
    left = xor_bytes(left, _keyed_blake2b(k4, right))
    return left + right


def lioness_decrypt(key: bytes, block: bytes) -> bytes:
    """Invert :func:`lioness_encrypt`: the four rounds in reverse order."""
    (k1, k2, k3, k4), left, right = _lioness_split(key, block)
    left = xor_bytes(left, _keyed_blake2b(k4, right))
    right = chacha20_xor(xor_bytes(left, k3), right)
    left = xor_bytes(left, _keyed_blake2b(k2, right))
    right = chacha20_xor(xor_bytes(left, k1), right)
    return left + right


def x25519(scalar: bytes, point: bytes) -> bytes:
    """X25519(scalar, point) of RFC 7748 §5 (the scalar is clamped).

    Raises :class:`InvalidGroupElement` for a small-order ``point`` (the result
    would be all zeros) and ``ValueError`` for wrong input lengths.
    """
    if len(scalar) != X25519_SCALAR_SIZE or len(point) != X25519_ELEMENT_SIZE:
        raise ValueError(f"X25519 takes 32-byte inputs, got {len(scalar)!r} and {len(point)!r}")
    try:
        shared: bytes = nacl.bindings.crypto_scalarmult(scalar, point)
    except nacl.exceptions.CryptoError as exc:
        raise InvalidGroupElement(f"small-order X25519 point: {point.hex()!r}") from exc
    return shared


def x25519_base(scalar: bytes) -> bytes:
    """X25519(scalar, 9): the public element of a (clamped) secret scalar."""
    if len(scalar) != X25519_SCALAR_SIZE:
        raise ValueError(f"X25519 scalar must be 32 bytes, got {len(scalar)!r}")
    public: bytes = nacl.bindings.crypto_scalarmult_base(scalar)
    return public
