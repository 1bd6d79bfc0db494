"""Final-hop processing and token verification of one batch of packets (DESIGN.md §5, §6).

:func:`process_batch` is synchronous and CPU-bound (X25519, LIONESS, P-256
proofs): the sink runs it in a worker thread, off the event loop. Each packet
ends as one outcome — ``"accepted"`` or a rejection reason — and accepted
packets are stored, with the batch's rejections counted, in one commit before
any acknowledgement goes back on the link.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from crypto import (
    FinalMessage,
    InvalidPacket,
    InvalidToken,
    IssuerSecretKey,
    ReplayedPacket,
    process_packet,
    verify_token,
)
from protocol import InvalidMessage, SurveyMessage, receipt_digest

from aggregator._round import RoundState, SurveyRefused, message_hash
from aggregator._store import VerifiedPacket

log = logging.getLogger(__name__)

REJECTION_REASONS = (
    "bad-packet",
    "replay",
    "bad-message",
    "unknown-survey",
    "outside-window",
    "bad-token/<reason>",
    "wrong-partition",
    "double-submission",
    "duplicate",
)
"""Every reason a packet is counted as rejected (``bad-token/`` carries the token's reason)."""


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


_WORKER_KEY: list[IssuerSecretKey] = []


def _init_worker(issuer_key_bytes: bytes) -> None:
    _WORKER_KEY[:] = [IssuerSecretKey.from_bytes(issuer_key_bytes)]


def _verify_in_worker(jobs: list[TokenJob]) -> list[bytes | str]:
    return [verify_job(_WORKER_KEY[0], job) for job in jobs]


class TokenVerifier:
    """Verifies a batch's tokens: in the calling thread, or spread over worker processes.

    petlib holds the GIL through its P-256 arithmetic, so threads do not run
    verifications in parallel (measured: 2 threads gave no speed-up); with
    ``processes > 0`` a process pool does.
    """

    def __init__(self, issuer_key: IssuerSecretKey, processes: int = 0) -> None:
        self.issuer_key = issuer_key
        self.pool: ProcessPoolExecutor | None = None
        if processes > 0:
            self.pool = ProcessPoolExecutor(
                processes, mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker, initargs=(issuer_key.to_bytes(),),
            )
            self.processes = processes

    def warm(self) -> None:
        """Start every worker process now (spawning imports the crypto stack: seconds, not per packet)."""
        if self.pool is not None:
            list(self.pool.map(_verify_in_worker, [[] for _ in range(self.processes)]))

    def verify(self, jobs: list[TokenJob]) -> list[bytes | str]:
        if self.pool is None or len(jobs) < 2:
            return [verify_job(self.issuer_key, job) for job in jobs]
        chunk = -(-len(jobs) // self.processes)
        parts = [jobs[i : i + chunk] for i in range(0, len(jobs), chunk)]
        return [result for part in self.pool.map(_verify_in_worker, parts) for result in part]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


@dataclass(frozen=True)
class _Opened:
    message: SurveyMessage
    bound: bytes
    job: TokenJob


def _open(state: RoundState, frame: bytes, now: int, batch_tags: set[bytes]) -> _Opened:
    """Final Sphinx layer, message parsing, survey and window: raise SurveyRefused(reason) on failure.

    Authentic packets' replay tags are added to ``batch_tags`` (stored with the batch).
    """

    def is_replay(tag: bytes) -> bool:
        if tag in batch_tags or state.store.replay_seen(tag):
            return True
        batch_tags.add(tag)
        return False

    try:
        result = process_packet(state.geometry, state.secrets.final_hop_private_key, frame, is_replay=is_replay)
    except ReplayedPacket:
        raise SurveyRefused("replay") from None
    except InvalidPacket:
        raise SurveyRefused("bad-packet") from None
    if not isinstance(result, FinalMessage):
        # The aggregator is always the last hop: anything routed onwards is misrouted.
        raise SurveyRefused("bad-packet")
    try:
        message = SurveyMessage.from_bytes(result.message)
    except InvalidMessage:
        raise SurveyRefused("bad-message") from None
    partition = state.check_survey(message.survey, now)
    bound = message.bound_bytes()
    return _Opened(message, bound, TokenJob(message.survey.to_bytes(), bound, message.token, partition))


def process_batch(
    state: RoundState,
    frames: list[bytes],
    now: int | Sequence[int],
    verifier: TokenVerifier | None = None,
    *,
    inbox_ids: Sequence[int] = (),
) -> list[str]:
    """Outcome per frame (``"accepted"`` or a reason), after the batch is durable.

    ``now`` is the time the frames arrived (one for all, or one per frame): the
    acceptance window is judged at arrival, not when verification gets to
    them. Order per packet (DESIGN.md §5, §6): final Sphinx layer and replay
    tag, message, open survey and window, token (with its partition), report
    format, then double-submission handling in the store. ``inbox_ids`` are
    removed from the inbox in the same commit.
    """
    verifier = verifier or TokenVerifier(state.secrets.issuer_key)
    arrivals = [now] * len(frames) if isinstance(now, int) else list(now)
    if len(arrivals) != len(frames):
        raise ValueError(f"{len(arrivals)} arrival times for {len(frames)} frames")
    outcomes: list[str] = [""] * len(frames)
    rejections: list[str] = []
    batch_tags: set[bytes] = set()
    opened: list[tuple[int, _Opened]] = []
    for index, frame in enumerate(frames):
        try:
            opened.append((index, _open(state, frame, arrivals[index], batch_tags)))
        except SurveyRefused as exc:
            outcomes[index] = exc.reason
            rejections.append(exc.reason)
    results = verifier.verify([item.job for _, item in opened])
    verified: list[tuple[int, VerifiedPacket]] = []
    for (index, item), result in zip(opened, results):
        if isinstance(result, str):
            outcomes[index] = result
            rejections.append(result)
            continue
        try:
            state.check_report(item.message.survey, item.message.report)
        except InvalidMessage:
            outcomes[index] = "bad-message"
            rejections.append("bad-message")
            continue
        verified.append(
            (index, VerifiedPacket(item.message.survey, result, message_hash(item.bound), item.message.report, receipt_digest(result)))
        )
    stored = state.store.store_batch(
        [packet for _, packet in verified], rejections, max(arrivals, default=0), sorted(batch_tags), inbox_ids
    )
    for (index, _), outcome in zip(verified, stored):
        outcomes[index] = outcome
    if rejections:
        log.debug("batch of %d: rejected %r", len(frames), rejections)
    return outcomes
