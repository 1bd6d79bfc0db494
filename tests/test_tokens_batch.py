"""Batched token verification (crypto/_token.py, crypto/_batch.py; issue 26).

A batch is checked with one small-exponent test and bisected when it fails:
every bad token must be refused alone, with the reason a single verification
gives, and every good token of its batch accepted.
"""

from __future__ import annotations

import hashlib

import pytest

import anonml.crypto._token as token_module
from anonml.aggregator import IssuerWorkers
from anonml.crypto import (
    Credential,
    CredentialSecret,
    IssuerSecretKey,
    JobRefused,
    Token,
    TokenJob,
    begin_issuance,
    finish_issuance,
    issue_credential,
    make_token,
    token_challenges,
    verify_token,
    verify_tokens,
)
from anonml.crypto._group import ORDER, POINT_BYTES, seeded_rng
from anonml.protocol import SurveyId

ROUND = hashlib.sha256(b"batched verification").digest()
PARTITIONS = (3, 5)
BATCH = 256
_POINTS_AT = 35  # version, kid, partition
_COMMITMENT_AT = _POINTS_AT + 4 * POINT_BYTES
_RESPONSES_AT = _POINTS_AT + 5 * POINT_BYTES


@pytest.fixture(scope="module")
def secret_key() -> IssuerSecretKey:
    return IssuerSecretKey.generate(seeded_rng(b"batch issuer"))


@pytest.fixture(scope="module")
def credentials(secret_key: IssuerSecretKey) -> list[Credential]:
    """Four peers, two in each partition."""
    issued = []
    for index in range(4):
        partition = PARTITIONS[index % 2]
        rng = seeded_rng(b"batch peer %d" % index)
        request, state = begin_issuance(secret_key.public_key(), CredentialSecret.generate(rng), partition, rng=rng)
        response = issue_credential(secret_key, request.to_bytes(), partition, rng=rng)
        issued.append(finish_issuance(state, response.to_bytes()))
    return issued


@pytest.fixture(scope="module")
def good_jobs(secret_key: IssuerSecretKey, credentials: list[Credential]) -> list[TokenJob]:
    """256 valid tokens over two partitions and two surveys per partition."""
    jobs = []
    for index in range(BATCH):
        credential = credentials[index % len(credentials)]
        ctx = SurveyId.data(ROUND, credential.partition, index % 3 // 2).to_bytes()
        message = b"report %d" % index
        token = make_token(secret_key.public_key(), credential, ctx, message, rng=seeded_rng(b"token %d" % index))
        jobs.append(TokenJob(ctx, message, token, credential.partition))
    return jobs


def _with_response(job: TokenJob, which: int, delta: int) -> TokenJob:
    """``job`` with response ``which`` moved by ``delta`` (still a canonical scalar)."""
    at = _RESPONSES_AT + 32 * which
    value = (int.from_bytes(job.token[at : at + 32], "big") + delta) % ORDER
    return TokenJob(job.ctx, job.message, job.token[:at] + value.to_bytes(32, "big") + job.token[at + 32 :], job.partition)


def _bad_proof(job: TokenJob, kind: int, donor: TokenJob) -> TokenJob:
    """A token that parses and passes every per-token check but whose proof is false."""
    if kind == 0:  # bound to another message
        return TokenJob(job.ctx, job.message + b"!", job.token, job.partition)
    if kind == 1:  # a response moved
        return _with_response(job, 1, 1)
    if kind == 2:  # another token's commitment
        at = _COMMITMENT_AT
        return TokenJob(job.ctx, job.message, job.token[:at] + donor.token[at : at + POINT_BYTES] + job.token[at + POINT_BYTES :], job.partition)
    # the tag of another peer: a fresh tag would be a second submission
    at = _POINTS_AT + 3 * POINT_BYTES
    return TokenJob(job.ctx, job.message, job.token[:at] + donor.token[at : at + POINT_BYTES] + job.token[at + POINT_BYTES :], job.partition)


def _refused(results: list[bytes | JobRefused]) -> dict[int, str]:
    return {index: result.reason for index, result in enumerate(results) if isinstance(result, JobRefused)}


def test_a_good_batch_is_accepted_with_the_single_verification_digests(
    secret_key: IssuerSecretKey, good_jobs: list[TokenJob]
) -> None:
    results = verify_tokens(secret_key, good_jobs)
    singles = [verify_token(secret_key, j.ctx, j.message, j.token, expected_partition=j.partition) for j in good_jobs[:8]]
    assert _refused(results) == {}
    assert results[:8] == singles
    assert verify_tokens(secret_key, []) == []


@pytest.mark.parametrize("position", [0, 1, 100, 127, 128, 254, 255])
def test_one_bad_proof_among_255_good_is_refused_alone(
    secret_key: IssuerSecretKey, good_jobs: list[TokenJob], position: int
) -> None:
    good = verify_tokens(secret_key, good_jobs)
    for kind in range(4):
        jobs = list(good_jobs)
        jobs[position] = _bad_proof(jobs[position], kind, good_jobs[(position + 1) % BATCH])
        results = verify_tokens(secret_key, jobs)
        assert _refused(results) == {position: "bad-proof"}, kind
        assert [r for i, r in enumerate(results) if i != position] == [r for i, r in enumerate(good) if i != position]


def test_several_bad_tokens_are_each_refused_with_their_reason(
    secret_key: IssuerSecretKey, good_jobs: list[TokenJob]
) -> None:
    jobs = list(good_jobs)
    expected: dict[int, str] = {}
    for kind, position in enumerate((3, 4, 77, 200, 255)):
        jobs[position] = _bad_proof(jobs[position], kind % 4, good_jobs[position - 1])
        expected[position] = "bad-proof"
    # Per-token checks in the same batch keep their own reasons.
    jobs[10] = TokenJob(jobs[10].ctx, jobs[10].message, jobs[10].token[:-1], jobs[10].partition)
    jobs[11] = TokenJob(jobs[11].ctx, jobs[11].message, jobs[11].token, jobs[11].partition + 1)
    zeroed = jobs[12].token[:_POINTS_AT] + bytes(POINT_BYTES) + jobs[12].token[_POINTS_AT + POINT_BYTES :]
    jobs[12] = TokenJob(jobs[12].ctx, jobs[12].message, zeroed, jobs[12].partition)
    expected.update({10: "malformed", 11: "wrong-partition", 12: "bad-point"})
    assert _refused(verify_tokens(secret_key, jobs)) == expected
    every_other_bad = [_bad_proof(job, 1, job) if index % 2 else job for index, job in enumerate(good_jobs[:32])]
    assert _refused(verify_tokens(secret_key, every_other_bad)) == {i: "bad-proof" for i in range(1, 32, 2)}


def _cancelling_pair(secret_key: IssuerSecretKey, first: TokenJob, second: TokenJob) -> tuple[TokenJob, TokenJob]:
    """Two false proofs whose errors cancel in a plain sum: ``rr`` moved by
    ``δ`` in one and by ``-δ·γV1/γV2`` in the other leaves ``E1 = δ·γV1·g``
    and ``E2 = -δ·γV1·g`` (the challenges do not hash the responses)."""
    public_key = secret_key.public_key()
    gamma_1 = token_challenges(public_key, first.ctx, first.message, Token.from_bytes(first.token))[0]
    gamma_2 = token_challenges(public_key, second.ctx, second.message, Token.from_bytes(second.token))[0]
    delta = 12345
    return _with_response(first, 2, delta), _with_response(second, 2, -delta * gamma_1 * pow(gamma_2, -1, ORDER))


def test_random_coefficients_stop_errors_that_cancel(
    secret_key: IssuerSecretKey, good_jobs: list[TokenJob], monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = _cancelling_pair(secret_key, good_jobs[0], good_jobs[1])
    jobs = [*pair, *good_jobs[2:16]]
    assert _refused(verify_tokens(secret_key, jobs)) == {0: "bad-proof", 1: "bad-proof"}
    # Why the coefficients must be random: with all of them 1 the pair passes.
    monkeypatch.setattr(token_module, "small_coefficients", lambda count, rng: [1] * count)
    assert _refused(verify_tokens(secret_key, jobs)) == {}


@pytest.fixture
def checked_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each combined proof check made from now on."""
    sizes: list[int] = []
    original = token_module._proofs_hold

    def counting(key: IssuerSecretKey, batch: list[object], rng: object) -> bool:
        sizes.append(len(batch))
        return original(key, batch, rng)  # type: ignore[arg-type]

    monkeypatch.setattr(token_module, "_proofs_hold", counting)
    return sizes


def test_one_bad_token_costs_under_three_passes(
    secret_key: IssuerSecretKey, good_jobs: list[TokenJob], checked_sizes: list[int]
) -> None:
    jobs = list(good_jobs)
    jobs[200] = _bad_proof(jobs[200], 0, jobs[0])
    assert _refused(verify_tokens(secret_key, jobs)) == {200: "bad-proof"}
    # The whole batch, then at most both halves per level (the second half
    # of a failing part is not checked when its first half passes).
    assert len(checked_sizes) <= 1 + 2 * 8 and sum(checked_sizes) < 3 * BATCH


def test_a_batch_of_junk_costs_three_passes_not_one_per_level(
    secret_key: IssuerSecretKey, good_jobs: list[TokenJob], checked_sizes: list[int]
) -> None:
    # Issue 25: junk tokens flooded through an honest relay (every proof false) were bisected to
    # the last level, about log2(256) = 8 passes over the batch plus the singles, each junk token
    # costing ~7.5x an honest one; dense failures are checked alone after the batch and its halves.
    junk = [_bad_proof(job, 1, job) for job in good_jobs]
    assert _refused(verify_tokens(secret_key, junk)) == {i: "bad-proof" for i in range(BATCH)}
    assert sum(checked_sizes) <= 3 * BATCH and len(checked_sizes) <= 3 + BATCH
    # A dense half among good tokens: refused alone, the good ones accepted.
    checked_sizes.clear()
    mixed = [_bad_proof(job, 1, job) if 64 <= index < 192 else job for index, job in enumerate(good_jobs)]
    assert _refused(verify_tokens(secret_key, mixed)) == {i: "bad-proof" for i in range(64, 192)}
    assert sum(checked_sizes) <= 3 * BATCH


def test_the_aggregator_counts_a_bad_token_alone(secret_key: IssuerSecretKey, good_jobs: list[TokenJob]) -> None:
    jobs = list(good_jobs[:64])
    jobs[40] = _bad_proof(jobs[40], 1, jobs[0])
    results = IssuerWorkers(secret_key).verify(jobs)
    assert _refused(results) == {40: "bad-token/bad-proof"}


def test_the_key_meets_secret_mul_once_per_partition_and_never_wsum(
    secret_key: IssuerSecretKey, good_jobs: list[TokenJob], monkeypatch: pytest.MonkeyPatch
) -> None:
    # DESIGN.md §6 pitfall "secret scalars through wsum", in the batched path:
    # the key multiplies the batch's sums, in constant time, once per
    # partition (x0 + x2·j) and once for x1, whatever the batch size.
    from anonml.crypto._group import GROUP

    key_scalars = {secret_key._x1} | {(secret_key._x0 + j * secret_key._x2) % ORDER for j in PARTITIONS}
    wsum_scalars: list[int] = []
    secret_calls: list[int] = []
    original_wsum, original_secret_mul = GROUP.wsum, token_module.secret_mul

    def recording_wsum(weights: list[object], points: list[object]) -> object:
        wsum_scalars.extend(int(w) for w in weights)  # type: ignore[call-overload]
        return original_wsum(weights, points)

    def recording_secret_mul(scalar: int, point: object) -> object:
        secret_calls.append(scalar)
        return original_secret_mul(scalar, point)  # type: ignore[arg-type]

    monkeypatch.setattr(GROUP, "wsum", recording_wsum)
    monkeypatch.setattr(token_module, "secret_mul", recording_secret_mul)
    assert _refused(verify_tokens(secret_key, good_jobs[:64])) == {}
    assert sorted(secret_calls) == sorted(key_scalars)
    assert key_scalars.isdisjoint(wsum_scalars)


def test_a_batch_costs_the_group_work_the_bench_prices_as_its_floor(
    secret_key: IssuerSecretKey, good_jobs: list[TokenJob], monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``anonml bench crypto`` prices BATCH_POINTS_PER_TOKEN as the floor of a
    # batched verification: count the decompressions and the points summed.
    from anonml.crypto import BATCH_POINTS_PER_TOKEN
    from anonml.crypto._group import GROUP, _GeneratorTable

    import petlib.ec

    decoded: list[bytes] = []
    summed: list[int] = []
    original_from_binary, original_wsum = petlib.ec.EcPt.from_binary, GROUP.wsum

    def counting_from_binary(data: bytes, group: object) -> object:
        decoded.append(data)
        return original_from_binary(data, group)

    def counting_wsum(weights: list[object], points: list[object]) -> object:
        summed.append(len(points))
        return original_wsum(weights, points)

    original_mul_plus, original_mul = _GeneratorTable.mul_plus, _GeneratorTable.mul

    def counting_mul_plus(table: object, scalar: object, weights: list[object], points: list[object]) -> object:
        summed.append(len(points) + 1)  # and the table's own point (g or h)
        return original_mul_plus(table, scalar, weights, points)  # type: ignore[arg-type]

    def counting_mul(table: object, scalar: object) -> object:
        summed.append(1)
        return original_mul(table, scalar)  # type: ignore[arg-type]

    monkeypatch.setattr(petlib.ec.EcPt, "from_binary", staticmethod(counting_from_binary))
    monkeypatch.setattr(GROUP, "wsum", counting_wsum)
    monkeypatch.setattr(_GeneratorTable, "mul_plus", counting_mul_plus)
    monkeypatch.setattr(_GeneratorTable, "mul", counting_mul)
    jobs = good_jobs[:64]
    assert _refused(verify_tokens(secret_key, jobs)) == {}
    per_token_decoded, per_token_summed = BATCH_POINTS_PER_TOKEN
    assert len(decoded) == per_token_decoded * len(jobs)
    # Besides the tokens' points, one term per batch for each of g, h, X1, each
    # survey's H(ctx), each partition's key product and x1's.
    surveys = len({job.ctx for job in jobs})
    assert sum(summed) == per_token_summed * len(jobs) + 3 + surveys + len(PARTITIONS) + 1


def test_verification_workers_run_at_a_lower_cpu_priority_than_the_service(secret_key: IssuerSecretKey) -> None:
    # Issue 25: junk tokens verified at the service's priority delayed the sink's and HTTP's answers on a
    # busy host; the workers yield the CPU to them (aggregator._workers.WORKER_NICENESS).
    import os

    from anonml.aggregator._workers import WORKER_NICENESS

    workers = IssuerWorkers(secret_key, processes=1)
    try:
        assert workers.pool is not None
        assert workers.pool.submit(os.nice, 0).result(timeout=60) == min(19, os.nice(0) + WORKER_NICENESS)
    finally:
        workers.close()
