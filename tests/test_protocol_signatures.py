"""Ed25519 checks of the protocol's signed documents (``protocol._signed.ed25519_holds``): a process running
many peers checks the same roster, heads and manifest once per peer, so a signature already found to hold
is not checked again; anything else is checked every time."""

from __future__ import annotations

import pytest
from nacl.signing import SigningKey, VerifyKey

import anonml.protocol._signed as signed_module
from anonml.base.memo import PureCache
from anonml.protocol import DocumentKind, InvalidDocument, SignedDocument


class CountingVerifyKey(VerifyKey):
    checks = 0

    def verify(self, *args: object, **kwargs: object) -> bytes:  # type: ignore[override]
        CountingVerifyKey.checks += 1
        return super().verify(*args, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> type[CountingVerifyKey]:
    import nacl.signing

    monkeypatch.setattr(nacl.signing, "VerifyKey", CountingVerifyKey)
    monkeypatch.setattr(signed_module, "_holds", PureCache(max_entries=16))
    CountingVerifyKey.checks = 0
    return CountingVerifyKey


def test_a_signature_that_held_is_not_checked_again_and_a_forgery_is_checked_every_time(counting: type[CountingVerifyKey]) -> None:
    key = SigningKey(bytes(range(32)))
    public = bytes(key.verify_key)
    signature = key.sign(b"roster entry").signature
    assert signed_module.ed25519_holds(public, b"roster entry", signature)
    assert signed_module.ed25519_holds(public, b"roster entry", signature)
    assert counting.checks == 1
    forged = bytes([signature[0] ^ 1]) + signature[1:]
    for _ in range(2):
        assert not signed_module.ed25519_holds(public, b"roster entry", forged)
        assert not signed_module.ed25519_holds(public, b"roster entrY", signature)
        assert not signed_module.ed25519_holds(bytes(SigningKey(bytes(32)).verify_key), b"roster entry", signature)
    assert counting.checks == 7
    # Malformed keys and signatures do not hold (nacl raises; nothing is kept).
    assert not signed_module.ed25519_holds(public[:5], b"roster entry", signature)
    assert not signed_module.ed25519_holds(public, b"roster entry", signature[:10])


def test_a_document_signed_by_another_key_is_refused_after_the_genuine_one_was_checked(counting: type[CountingVerifyKey]) -> None:
    aggregator, other = SigningKey(bytes(range(32))), SigningKey(bytes(range(1, 33)))
    round_id = bytes(32)
    genuine = SignedDocument.create(aggregator, DocumentKind.MEDIANS, round_id, {"cut_points": {}})
    genuine.verify(bytes(aggregator.verify_key), kind=DocumentKind.MEDIANS, round_id=round_id)
    genuine.verify(bytes(aggregator.verify_key), kind=DocumentKind.MEDIANS, round_id=round_id)
    assert counting.checks == 1
    with pytest.raises(InvalidDocument):
        genuine.verify(bytes(other.verify_key), kind=DocumentKind.MEDIANS, round_id=round_id)
    tailored = SignedDocument(genuine.kind, round_id, genuine.body.replace(b"{}", b'{"age":[1]}'), genuine.signature)
    with pytest.raises(InvalidDocument):
        tailored.verify(bytes(aggregator.verify_key), kind=DocumentKind.MEDIANS, round_id=round_id)
