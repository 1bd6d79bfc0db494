"""Generate tests/vectors/token_kat.json: known-answer vectors for the
one-per-survey tokens (DESIGN.md §6).

Everything comes from one deterministic byte stream (``seeded_rng``), so the
library must rebuild these bytes exactly: tests/test_tokens_vectors.py calls
:func:`generate` and compares it with the pinned file, and separately checks
the pinned tokens against the pinned key.

Run from the repository root: ``.venv/bin/python tests/vectors/gen_token_vectors.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from anonml.crypto import (
    CredentialSecret,
    IssuerSecretKey,
    begin_issuance,
    finish_issuance,
    issue_credential,
    make_token,
    survey_point,
    verify_token,
)
from anonml.crypto._group import G, H, encode_point, seeded_rng
from anonml.protocol import SurveyId

SEED = b"anonml token known-answer vectors v1"
VECTORS_PATH = Path(__file__).resolve().parent / "token_kat.json"
ROUND_ID = bytes(range(32))
PARTITIONS = (0, 7)
MESSAGES = (b"perturbed subset report #1", b"a different report, same survey")


def generate() -> dict[str, Any]:
    """Build every vector from :data:`SEED`; the order of draws is part of the vector."""
    rng = seeded_rng(SEED)
    secret_key = IssuerSecretKey.generate(rng)
    public_key = secret_key.public_key()
    peers: list[dict[str, Any]] = []
    for partition in PARTITIONS:
        secret = CredentialSecret.generate(rng)
        request, state = begin_issuance(public_key, secret, partition, rng=rng)
        response = issue_credential(secret_key, request.to_bytes(), partition, rng=rng)
        credential = finish_issuance(state, response.to_bytes())
        surveys = (SurveyId.data(ROUND_ID, partition, 1), SurveyId.data(ROUND_ID, partition, 2))
        tokens = []
        for survey in surveys:
            ctx = survey.to_bytes()
            for message in MESSAGES:
                token = make_token(public_key, credential, ctx, message, rng=rng)
                digest = verify_token(secret_key, ctx, message, token, expected_partition=partition)
                tokens.append(
                    {
                        "ctx": ctx.hex(),
                        "survey_point": encode_point(survey_point(ctx)).hex(),
                        "message": message.hex(),
                        "token": token.hex(),
                        "tag_digest": digest.hex(),
                    }
                )
        peers.append(
            {
                "partition": partition,
                "secret": secret.to_bytes().hex(),
                "issuance_request": request.to_bytes().hex(),
                "issuance_response": response.to_bytes().hex(),
                "credential": credential.to_bytes().hex(),
                "tokens": tokens,
            }
        )
    return {
        "description": "anonml one-per-survey tokens (CMZ14 MAC_GGM on P-256; token version 2: one sent commitment, batch-verifiable), DESIGN.md §6",
        "seed": SEED.hex(),
        "generators": {"g": encode_point(G).hex(), "h": encode_point(H).hex()},
        "issuer_secret_key": secret_key.to_bytes().hex(),
        "issuer_public_key": public_key.to_bytes().hex(),
        "kid": public_key.kid.hex(),
        "peers": peers,
    }


def main() -> None:
    VECTORS_PATH.write_text(json.dumps(generate(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {VECTORS_PATH}")


if __name__ == "__main__":
    main()
