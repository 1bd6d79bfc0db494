"""Fuzzing the token recipe's boundary: every parser and every function that
takes bytes from the network raises only its documented error.

Over 100,000 malformed inputs (truncated, oversized, random bytes, random
fields with a valid header, points off the curve, the identity point,
non-canonical x, scalars >= q, bit flips of valid encodings, wrong types).
Inputs that still parse must be canonical (re-encode to the same bytes);
inputs that reach a proof check must be rejected.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anonml.crypto import (
    REJECTION_REASONS,
    Credential,
    CredentialError,
    CredentialSecret,
    InvalidIssuance,
    InvalidKeyMaterial,
    InvalidToken,
    IssuanceRequest,
    IssuanceResponse,
    IssuerPublicKey,
    IssuerSecretKey,
    Token,
    begin_issuance,
    finish_issuance,
    issue_credential,
    make_token,
    verify_token,
)
from anonml.crypto._credential import (
    CREDENTIAL_BYTES,
    ISSUANCE_REQUEST_BYTES,
    ISSUANCE_RESPONSE_BYTES,
    PUBLIC_KEY_BYTES,
    SECRET_KEY_BYTES,
)
from anonml.crypto._token import TOKEN_BYTES
from anonml.crypto._group import (
    FIELD_PRIME,
    GROUP,
    ORDER,
    POINT_BYTES,
    SCALAR_BYTES,
    seeded_rng,
)

CTX = b"fuzzed survey context"
MESSAGE = b"fuzzed message"
PARTITION = 3
HEADER = 35  # version, kid, partition
MINIMUM_INPUTS = 100_000


@dataclass(frozen=True)
class Target:
    """One boundary: ``parse`` takes untrusted bytes; ``valid`` is a genuine
    encoding; ``must_reject`` when any change to ``valid`` has to be refused
    (the input reaches a proof check)."""

    name: str
    parse: Callable[[Any], Any]
    error: type[CredentialError]
    valid: bytes
    points: tuple[int, ...]
    scalars: tuple[int, ...]
    must_reject: bool


def _offsets(start: int, count: int, size: int) -> tuple[int, ...]:
    return tuple(start + i * size for i in range(count))


@pytest.fixture(scope="module")
def targets() -> list[Target]:
    rng = seeded_rng(b"fuzz fixtures")
    secret_key = IssuerSecretKey.generate(rng)
    public_key = secret_key.public_key()
    secret = CredentialSecret.generate(rng)
    request, state = begin_issuance(public_key, secret, PARTITION, rng=rng)
    response = issue_credential(secret_key, request.to_bytes(), PARTITION, rng=rng)
    credential = finish_issuance(state, response.to_bytes())
    token = make_token(public_key, credential, CTX, MESSAGE, rng=rng)
    verify_token(secret_key, CTX, MESSAGE, token, expected_partition=PARTITION)

    def verify(data: Any) -> bytes:
        return verify_token(secret_key, CTX, MESSAGE, data, expected_partition=PARTITION)

    def issue(data: Any) -> Any:
        return issue_credential(secret_key, data, PARTITION, rng=seeded_rng(b"fuzz issue"))

    def finish(data: Any) -> Any:
        return finish_issuance(state, data)

    token_points, token_scalars = _offsets(HEADER, 4, POINT_BYTES), _offsets(HEADER + 4 * POINT_BYTES, 4, SCALAR_BYTES)
    request_points = _offsets(HEADER, 3, POINT_BYTES)
    request_scalars = _offsets(HEADER + 3 * POINT_BYTES, 4, SCALAR_BYTES)
    response_points = _offsets(HEADER, 4, POINT_BYTES)
    response_scalars = _offsets(HEADER + 4 * POINT_BYTES, 7, SCALAR_BYTES)
    result = [
        Target("verify_token", verify, InvalidToken, token, token_points, token_scalars, True),
        Target("Token.from_bytes", Token.from_bytes, InvalidToken, token, token_points, token_scalars, False),
        Target("issue_credential", issue, InvalidIssuance, request.to_bytes(), request_points, request_scalars, True),
        Target("IssuanceRequest.from_bytes", IssuanceRequest.from_bytes, InvalidIssuance, request.to_bytes(),
               request_points, request_scalars, False),
        Target("finish_issuance", finish, InvalidIssuance, response.to_bytes(), response_points, response_scalars, True),
        Target("IssuanceResponse.from_bytes", IssuanceResponse.from_bytes, InvalidIssuance, response.to_bytes(),
               response_points, response_scalars, False),
        Target("Credential.from_bytes", Credential.from_bytes, InvalidKeyMaterial, credential.to_bytes(),
               _offsets(HEADER, 2, POINT_BYTES), (HEADER + 2 * POINT_BYTES,), False),
        Target("IssuerPublicKey.from_bytes", IssuerPublicKey.from_bytes, InvalidKeyMaterial, public_key.to_bytes(),
               _offsets(1, 3, POINT_BYTES), (), False),
        Target("IssuerSecretKey.from_bytes", IssuerSecretKey.from_bytes, InvalidKeyMaterial, secret_key.to_bytes(),
               (), _offsets(1, 4, SCALAR_BYTES), False),
        Target("CredentialSecret.from_bytes", CredentialSecret.from_bytes, InvalidKeyMaterial, secret.to_bytes(),
               (), (1,), False),
    ]  # fmt: skip
    sizes = [TOKEN_BYTES, TOKEN_BYTES, ISSUANCE_REQUEST_BYTES, ISSUANCE_REQUEST_BYTES, ISSUANCE_RESPONSE_BYTES,
             ISSUANCE_RESPONSE_BYTES, CREDENTIAL_BYTES, PUBLIC_KEY_BYTES, SECRET_KEY_BYTES, 1 + SCALAR_BYTES]  # fmt: skip
    assert [len(t.valid) for t in result] == sizes
    return result


def _x_not_on_curve() -> bytes:
    b = int(GROUP.parameters()["b"])
    x = 1
    while pow((x**3 - 3 * x + b) % FIELD_PRIME, (FIELD_PRIME - 1) // 2, FIELD_PRIME) == 1:
        x += 1
    return x.to_bytes(32, "big")


OFF_CURVE_X = _x_not_on_curve()


def _bad_point(rnd: random.Random) -> bytes:
    choice = rnd.randrange(6)
    if choice == 0:
        return bytes(POINT_BYTES)  # what a zero-padded identity would look like
    if choice == 1:
        return bytes((rnd.choice((2, 3)),)) + OFF_CURVE_X
    if choice == 2:  # x >= p: a non-canonical alias of a small x
        return bytes((rnd.choice((2, 3)),)) + rnd.randrange(FIELD_PRIME, 2**256).to_bytes(32, "big")
    if choice == 3:
        return b"\x04" + rnd.randbytes(32)  # uncompressed prefix, wrong length
    if choice == 4:
        return bytes((rnd.choice([b for b in range(256) if b not in (2, 3)]),)) + rnd.randbytes(32)
    return bytes((rnd.choice((2, 3)),)) + rnd.randbytes(32)  # about half of these are on the curve


def _mutate(target: Target, rnd: random.Random, kind: int) -> Any:
    valid = target.valid
    if kind == 0:
        return valid[: rnd.randrange(len(valid))]
    if kind == 1:
        return valid + rnd.randbytes(rnd.randrange(1, 64))
    if kind == 2:
        return rnd.randbytes(len(valid))
    if kind == 3:
        return rnd.randbytes(rnd.randrange(0, 700))
    if kind == 4:  # valid header, random body: reaches the field decoders
        head = HEADER if target.points and target.points[0] == HEADER else 1
        body = bytearray(rnd.randbytes(len(valid) - head))
        for offset in target.points:
            body[offset - head] = rnd.choice((2, 3))
        return valid[:head] + bytes(body)
    if kind == 5 and target.points:
        offset = rnd.choice(target.points)
        return valid[:offset] + _bad_point(rnd) + valid[offset + POINT_BYTES :]
    if kind == 6 and target.scalars:
        offset = rnd.choice(target.scalars)
        bad = rnd.randrange(ORDER, 2**256).to_bytes(32, "big")
        return valid[:offset] + bad + valid[offset + SCALAR_BYTES :]
    if kind == 7:
        return (bytearray(valid), valid.hex(), None, 0, [valid])[rnd.randrange(5)]
    flipped = bytearray(valid)  # kinds 8, 9 (and 5, 6 without such fields): bit flips
    for _ in range(rnd.randrange(1, 4)):
        position = rnd.randrange(len(valid) * 8)
        flipped[position // 8] ^= 1 << (position % 8)
    return bytes(flipped)


def _run(target: Target, data: Any, reasons: Counter[str]) -> None:
    try:
        parsed = target.parse(data)
    except target.error as exc:
        assert exc.reason in REJECTION_REASONS, exc.reason
        reasons[exc.reason] += 1
        return
    if target.must_reject:  # a flip can undo another: only the genuine input passes
        assert data == target.valid, f"{target.name} accepted {data!r}"
    else:
        assert parsed.to_bytes() == data, f"{target.name} accepted a non-canonical encoding"
    reasons["accepted"] += 1


@pytest.mark.slow
def test_hundred_thousand_malformed_inputs_raise_only_typed_errors(targets: list[Target]) -> None:
    rnd = random.Random(20261122)
    per_target = -(-MINIMUM_INPUTS // len(targets))
    total = 0
    reasons: Counter[str] = Counter()
    for target in targets:
        for index in range(per_target):
            _run(target, _mutate(target, rnd, index % 10), reasons)
            total += 1
    assert total >= MINIMUM_INPUTS
    # Every kind of rejection was exercised, and bit flips did reach the proofs.
    assert {"malformed", "bad-point", "scalar-range", "bad-proof", "wrong-kid", "wrong-partition"} <= set(reasons)


def test_every_single_bit_flip_of_a_token_is_rejected(targets: list[Target]) -> None:
    target = targets[0]
    reasons: Counter[str] = Counter()
    for position in range(len(target.valid) * 8):
        flipped = bytearray(target.valid)
        flipped[position // 8] ^= 1 << (position % 8)
        with pytest.raises(InvalidToken) as caught:
            target.parse(bytes(flipped))
        reasons[caught.value.reason] += 1
    assert reasons["bad-proof"] > 0 and reasons["wrong-kid"] > 0


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600))
def test_arbitrary_bytes_raise_only_typed_errors(targets: list[Target], data: bytes) -> None:
    for target in targets:
        _run(target, data, Counter())
