"""The issuer's secret-key work, a batch at a time: blind issuance and token verification (DESIGN.md §6).

Both are CPU-bound P-256 proofs with the round's issuer secret key. They run
in the calling thread or, with ``processes > 0``, spread over worker
processes that each load the key once; results are plain bytes (a response
or a tag digest) or a plain-string reason, so they cross process boundaries
as they are.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from crypto import InvalidIssuance, InvalidToken, IssuerSecretKey, issue_credential, verify_token


@dataclass(frozen=True)
class TokenJob:
    """One token to verify: everything ``verify_token`` needs besides the issuer key."""

    ctx: bytes
    message: bytes
    token: bytes
    partition: int


def verify_job(issuer_key: IssuerSecretKey, job: TokenJob) -> bytes | str:
    """The tag digest, or the rejection reason (``wrong-partition`` or ``bad-token/<reason>``)."""
    try:
        return verify_token(issuer_key, job.ctx, job.message, job.token, expected_partition=job.partition)
    except InvalidToken as exc:
        return "wrong-partition" if exc.reason == "wrong-partition" else f"bad-token/{exc.reason}"


@dataclass(frozen=True)
class IssueJob:
    """One blind issuance: the peer's request and the partition the roster gives it."""

    request: bytes
    partition: int


def issue_job(issuer_key: IssuerSecretKey, job: IssueJob) -> bytes | str:
    """The issuer's blind response, or the refusal reason (``InvalidIssuance.reason``) for a bad request."""
    try:
        return issue_credential(issuer_key, job.request, job.partition).to_bytes()
    except InvalidIssuance as exc:
        return exc.reason


_WORKER_KEY: list[IssuerSecretKey] = []


def _init_worker(issuer_key_bytes: bytes) -> None:
    _WORKER_KEY[:] = [IssuerSecretKey.from_bytes(issuer_key_bytes)]


def _verify_in_worker(jobs: list[TokenJob]) -> list[bytes | str]:
    return [verify_job(_WORKER_KEY[0], job) for job in jobs]


def _issue_in_worker(jobs: list[IssueJob]) -> list[bytes | str]:
    return [issue_job(_WORKER_KEY[0], job) for job in jobs]


Job = TypeVar("Job")


class IssuerWorkers:
    """The issuer's secret-key work — token verification and blind issuance — for a batch at a time.

    In the calling thread, or spread over worker processes: petlib's P-256
    arithmetic is short C calls between Python steps, so threads barely run
    it in parallel (measured: 2 threads gave no speed-up), and the HTTP
    server and packet sink share the aggregator's one interpreter with it;
    with ``processes > 0`` a process pool does the arithmetic beside them.
    Both kinds of work share the pool: issuance ends before any packet can
    arrive (DESIGN.md §3).
    """

    def __init__(self, issuer_key: IssuerSecretKey, processes: int = 0) -> None:
        self.issuer_key = issuer_key
        self.processes = processes
        self.pool: ProcessPoolExecutor | None = None
        if processes > 0:
            self.pool = ProcessPoolExecutor(
                processes, mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker, initargs=(issuer_key.to_bytes(),),
            )

    def warm(self) -> None:
        """Start every worker process now (spawning imports the crypto stack: seconds, not per packet)."""
        if self.pool is not None:
            list(self.pool.map(_verify_in_worker, [[] for _ in range(self.processes)]))

    def _spread(self, work: Callable[[list[Job]], list[bytes | str]], jobs: list[Job]) -> list[bytes | str]:
        assert self.pool is not None
        chunk = -(-len(jobs) // self.processes)
        parts = [jobs[i : i + chunk] for i in range(0, len(jobs), chunk)]
        return [result for part in self.pool.map(work, parts) for result in part]

    def verify(self, jobs: list[TokenJob]) -> list[bytes | str]:
        """Per job the tag digest or the rejection reason (see :func:`verify_job`)."""
        if self.pool is None or len(jobs) < 2:
            return [verify_job(self.issuer_key, job) for job in jobs]
        return self._spread(_verify_in_worker, jobs)

    def issue(self, jobs: list[IssueJob]) -> list[bytes | str]:
        """Per job the blind response or the refusal reason (see :func:`issue_job`)."""
        if self.pool is None or len(jobs) < 2:
            return [issue_job(self.issuer_key, job) for job in jobs]
        return self._spread(_issue_in_worker, jobs)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
