"""Token costs for ``anonml bench crypto`` (DESIGN.md §6 targets: token ≤ 300
bytes, verification ≤ 0.6 ms on one core).

Every time is measured beside ``p256_mul_us``, one constant-time P-256
multiplication through the same helper the recipe uses, so the figures can
be read as "verification costs about N multiplications" on a noisy machine.
Verification needs two constant-time multiplications (the keyed MAC check),
three public multi-scalar multiplications (the proof) and four point
decompressions; ``H(ctx)`` is cached per survey, as it is at the aggregator.
"""

from __future__ import annotations

from crypto._bench import time_us
from crypto._credential import (
    CredentialSecret,
    IssuerSecretKey,
    begin_issuance,
    finish_issuance,
    issue_credential,
    make_token,
    verify_token,
)
from crypto._group import G, random_scalar, secret_mul, system_rng

_CTX = b"anonml/bench/survey-context"
_MESSAGE = bytes(range(256)) * 8  # a 2 KiB payload, hashed once into the proof
_PARTITION = 3


def measure_tokens(repeat: int) -> dict[str, float]:
    """Microseconds for each step of issuance and of a token, its size, and
    the cost of one P-256 multiplication measured in the same run."""
    secret_key = IssuerSecretKey.generate()
    public_key = secret_key.public_key()
    secret = CredentialSecret.generate()
    request, state = begin_issuance(public_key, secret, _PARTITION)
    request_bytes = request.to_bytes()
    response_bytes = issue_credential(secret_key, request_bytes, _PARTITION).to_bytes()
    credential = finish_issuance(state, response_bytes)
    token = make_token(public_key, credential, _CTX, _MESSAGE)
    verify_token(secret_key, _CTX, _MESSAGE, token, expected_partition=_PARTITION)  # warm the H(ctx) cache

    scalar, point = random_scalar(system_rng), secret_mul(random_scalar(system_rng), G)
    return {
        "p256_mul_us": time_us(lambda: secret_mul(scalar, point), repeat),
        "token_create_us": time_us(lambda: make_token(public_key, credential, _CTX, _MESSAGE), repeat),
        "token_verify_us": time_us(
            lambda: verify_token(secret_key, _CTX, _MESSAGE, token, expected_partition=_PARTITION), repeat
        ),
        "token_bytes": float(len(token)),
        "issue_request_us": time_us(lambda: begin_issuance(public_key, secret, _PARTITION), repeat),
        "issue_us": time_us(lambda: issue_credential(secret_key, request_bytes, _PARTITION), repeat),
        "issue_finish_us": time_us(lambda: finish_issuance(state, response_bytes), repeat),
    }


if __name__ == "__main__":
    for name, value in measure_tokens(200).items():
        print(f"{name:>18} {value:10.1f}")
