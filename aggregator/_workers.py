"""The issuer's secret-key work, a batch at a time: blind issuance and token verification (DESIGN.md §6).

Both run in the calling thread or, with ``processes > 0``, spread over worker
processes that each load the key once (``crypto``'s batch functions).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

from anonml.aggregator._rejections import RejectionReason
from anonml.crypto import (
    IssueJob,
    JobRefused,
    IssuerSecretKey,
    TokenJob,
    init_worker,
    issue_credentials,
    issue_in_worker,
    verify_in_worker,
    verify_tokens,
)


def token_rejection(reason: str) -> RejectionReason:
    """The rejection counter's name for a token refused with ``InvalidToken.reason``."""
    if reason == "wrong-partition":
        return RejectionReason.WRONG_PARTITION
    return RejectionReason(f"bad-token/{reason}")


Job = TypeVar("Job")

WORKER_NICENESS = 10
"""How much lower the worker processes' scheduling priority is than the service's (``os.nice``).

Verification is throughput work and intake latency work: on a busy host the
sink's and the HTTP server's event loop, which acknowledge packets and answer
requests, get the CPU first, and a flood of junk tokens (issue 25) backs up
the verifier's inbox (bounded: intake answers BUSY when it is full) rather
than delaying every honest acknowledgement. Linux gives nice 10 about a
tenth of a nice-0 process's weight, so an idle core still verifies at full
speed."""


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

    def __init__(self, issuer_key: IssuerSecretKey | None, processes: int = 0) -> None:
        """``issuer_key`` None: the round has ended and its key is erased; there is no work then
        (every survey is closed, issuance too), and any would be a bug."""
        self.issuer_key = issuer_key
        self.processes = processes
        self.pool: ProcessPoolExecutor | None = None
        if processes > 0 and issuer_key is not None:
            self.pool = ProcessPoolExecutor(
                processes, mp_context=multiprocessing.get_context("spawn"),
                initializer=init_worker, initargs=(issuer_key.to_bytes(), WORKER_NICENESS),
            )

    def warm(self) -> None:
        """Start every worker process now (spawning imports the crypto stack: seconds, not per packet)."""
        if self.pool is not None:
            list(self.pool.map(verify_in_worker, [[] for _ in range(self.processes)]))

    def _spread(self, work: Callable[[list[Job]], list[bytes | JobRefused]], jobs: list[Job]) -> list[bytes | JobRefused]:
        assert self.pool is not None
        chunk = -(-len(jobs) // self.processes)
        parts = [jobs[i : i + chunk] for i in range(0, len(jobs), chunk)]
        return [result for part in self.pool.map(work, parts) for result in part]

    def _key(self) -> IssuerSecretKey:
        if self.issuer_key is None:
            raise RuntimeError("the round has ended: its issuer key is erased")
        return self.issuer_key

    def verify(self, jobs: list[TokenJob]) -> list[bytes | JobRefused]:
        """Per job the tag digest or the refusal, its reason the rejection counter's name (see :func:`token_rejection`)."""
        if not jobs:
            return []
        if self.pool is None or len(jobs) < 2:
            results = verify_tokens(self._key(), jobs)
        else:
            results = self._spread(verify_in_worker, jobs)
        return [JobRefused(token_rejection(result.reason)) if isinstance(result, JobRefused) else result for result in results]

    def issue(self, jobs: list[IssueJob]) -> list[bytes | JobRefused]:
        """Per job the blind response or the refusal (its reason ``InvalidIssuance.reason``)."""
        if not jobs:
            return []
        if self.pool is None or len(jobs) < 2:
            return issue_credentials(self._key(), jobs)
        return self._spread(issue_in_worker, jobs)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
