"""Known-answer tests for the tokens: rebuild the pinned vectors byte for byte.

tests/vectors/gen_token_vectors.py wrote tests/vectors/token_kat.json from a
deterministic byte stream; any change to an encoding, a transcript, the nonce
derivation or the hash-to-point shows up here as a mismatch.
"""

from __future__ import annotations

from typing import Any

import pytest
from vector_support import load_generator, load_vectors

from anonml.crypto import (
    Credential,
    InvalidToken,
    IssuanceRequest,
    IssuanceResponse,
    IssuerPublicKey,
    IssuerSecretKey,
    make_token,
    tag_digest,
    verify_token,
)


@pytest.fixture(scope="module")
def pinned() -> dict[str, Any]:
    data: dict[str, Any] = load_vectors("token_kat.json")
    return data


def test_regenerated_vectors_match_the_pinned_file(pinned: dict[str, Any]) -> None:
    assert load_generator("gen_token_vectors").generate() == pinned


def test_pinned_keys_parse_and_reencode(pinned: dict[str, Any]) -> None:
    secret_key = IssuerSecretKey.from_bytes(bytes.fromhex(pinned["issuer_secret_key"]))
    public_key = IssuerPublicKey.from_bytes(bytes.fromhex(pinned["issuer_public_key"]))
    assert secret_key.public_key() == public_key
    assert secret_key.to_bytes().hex() == pinned["issuer_secret_key"]
    assert public_key.kid.hex() == pinned["kid"]
    for peer in pinned["peers"]:
        for field, parser in (
            ("issuance_request", IssuanceRequest),
            ("issuance_response", IssuanceResponse),
            ("credential", Credential),
        ):
            assert parser.from_bytes(bytes.fromhex(peer[field])).to_bytes().hex() == peer[field]


def test_pinned_tokens_verify_to_the_pinned_digests(pinned: dict[str, Any]) -> None:
    secret_key = IssuerSecretKey.from_bytes(bytes.fromhex(pinned["issuer_secret_key"]))
    for peer in pinned["peers"]:
        credential = Credential.from_bytes(bytes.fromhex(peer["credential"]))
        for vector in peer["tokens"]:
            ctx, message = bytes.fromhex(vector["ctx"]), bytes.fromhex(vector["message"])
            token = bytes.fromhex(vector["token"])
            digest = verify_token(secret_key, ctx, message, token, expected_partition=peer["partition"])
            assert digest.hex() == vector["tag_digest"]
            assert tag_digest(credential, ctx).hex() == vector["tag_digest"]
            with pytest.raises(InvalidToken):
                verify_token(secret_key, ctx, message + b"!", token, expected_partition=peer["partition"])


def test_pinned_credential_makes_fresh_tokens_with_the_pinned_tag(pinned: dict[str, Any]) -> None:
    secret_key = IssuerSecretKey.from_bytes(bytes.fromhex(pinned["issuer_secret_key"]))
    public_key = secret_key.public_key()
    peer = pinned["peers"][1]
    credential = Credential.from_bytes(bytes.fromhex(peer["credential"]))
    vector = peer["tokens"][0]
    ctx = bytes.fromhex(vector["ctx"])
    token = make_token(public_key, credential, ctx, b"fresh message")
    assert token.hex() != vector["token"]
    digest = verify_token(secret_key, ctx, b"fresh message", token, expected_partition=peer["partition"])
    assert digest.hex() == vector["tag_digest"]
