"""The issuer's secret-key work, one batch at a time, in this process or in a worker process.

Blind issuance and token verification are CPU-bound P-256 proofs with the
round's issuer secret key (DESIGN.md §6). Token proofs are verified a batch
at a time (:func:`verify_tokens`). The aggregator spreads batches of
them over spawned worker processes; each worker loads the key once
(:func:`init_worker`) and runs :func:`verify_in_worker` or
:func:`issue_in_worker`. Living in ``crypto`` keeps a worker's imports to the
crypto stack: a spawned process imports the package of the function it runs.
Results are plain bytes (a tag digest or a blind response) or the error's
``reason`` string, so they cross process boundaries as they are.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from anonml.base.process import exit_with_parent
from anonml.crypto._credential import InvalidIssuance, InvalidToken, IssuerSecretKey, issue_credential
from anonml.crypto._group import RandomSource, system_rng
from anonml.crypto._token import CheckedToken, Token, check_token, failing_proofs, tag_digest_of


@dataclass(frozen=True)
class TokenJob:
    """One token to verify: everything ``verify_token`` needs besides the issuer key."""

    ctx: bytes
    message: bytes
    token: bytes
    partition: int


@dataclass(frozen=True)
class IssueJob:
    """One blind issuance: the peer's request and the partition the roster gives it."""

    request: bytes
    partition: int


@dataclass(frozen=True)
class JobRefused:
    """A batch job the issuer refused, as a value (a worker process cannot raise one job's error without losing the batch)."""

    reason: str
    """``InvalidToken.reason`` or ``InvalidIssuance.reason``."""


def verify_tokens(
    issuer_key: IssuerSecretKey, jobs: list[TokenJob], *, rng: RandomSource = system_rng
) -> list[bytes | JobRefused]:
    """Per job the 32-byte tag digest, or why the token was refused.

    Parsing, key id, partition and identity checks run per token; the proofs
    of the tokens that pass them are checked together (``crypto._token``:
    one small-exponent batch test, bisected when it fails), so a bad proof
    costs its batch one more pass and rejects only its own token."""
    results: list[bytes | JobRefused] = []
    checked: list[CheckedToken] = []
    positions: list[int] = []
    for job in jobs:
        try:
            token = Token.from_bytes(job.token)
            checked.append(check_token(issuer_key, job.ctx, job.message, token, expected_partition=job.partition))
        except InvalidToken as exc:
            results.append(JobRefused(exc.reason))
            continue
        positions.append(len(results))
        results.append(tag_digest_of(token))
    for index in failing_proofs(issuer_key, checked, rng=rng):
        results[positions[index]] = JobRefused("bad-proof")
    return results


def issue_credentials(issuer_key: IssuerSecretKey, jobs: list[IssueJob]) -> list[bytes | JobRefused]:
    """Per job the issuer's blind response, or why the request was refused."""
    results: list[bytes | JobRefused] = []
    for job in jobs:
        try:
            results.append(issue_credential(issuer_key, job.request, job.partition).to_bytes())
        except InvalidIssuance as exc:
            results.append(JobRefused(exc.reason))
    return results


_WORKER_KEY: list[IssuerSecretKey] = []


def init_worker(issuer_key_bytes: bytes, niceness: int = 0) -> None:
    """A worker process's initialiser: load the issuer key once, and lower its scheduling priority
    by ``niceness`` (``os.nice``).

    SIGINT is left to the parent (a Ctrl-C reaches the whole process group),
    which shuts the pool down; a worker that took it would print a traceback
    and die mid-batch."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if niceness:
        os.nice(niceness)
    _WORKER_KEY[:] = [IssuerSecretKey.from_bytes(issuer_key_bytes)]
    exit_with_parent()  # a SIGKILLed parent shuts no pool down


def verify_in_worker(jobs: list[TokenJob]) -> list[bytes | JobRefused]:
    return verify_tokens(_WORKER_KEY[0], jobs)


def issue_in_worker(jobs: list[IssueJob]) -> list[bytes | JobRefused]:
    return issue_credentials(_WORKER_KEY[0], jobs)
