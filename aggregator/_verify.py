"""Final-hop processing and token verification (DESIGN.md §5, §6), in three steps.

1. :func:`open_frames`, at the link before anything is stored: the final
   Sphinx layer (its MAC first) of each frame. A frame that fails is refused
   and counted, never stored: nothing unauthenticated is stored (DESIGN.md
   §5; issue 13: random frames used to be stored durably, 5,603 per second
   from one connection). What passes is stored in the inbox under its replay
   tag (``RoundStore.enqueue``, which refuses a tag seen before).
2. :func:`open_batch`, on inbox rows: message parsing, open survey and
   window (judged at arrival).
3. :func:`judge_batch` verifies the tokens (in the worker processes) and
   report formats, and :func:`store_judged` stores accepted packets with the
   batch's rejections and removes its rows from the inbox in one commit.

:func:`process_batch` runs all three on frames in memory (tests, benchmarks).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from anonml.aggregator._rejections import RejectionReason
from anonml.aggregator._round import RoundState, SurveyRefused, message_hash
from anonml.aggregator._store import VerifiedPacket
from anonml.aggregator._workers import IssuerWorkers
from anonml.crypto import (
    FinalMessage,
    InvalidPacket,
    JobRefused,
    TokenJob,
    never_replayed,
    process_packet,
)
from anonml.protocol import CoverMessage, InvalidMessage, SurveyMessage, parse_message, receipt_digest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delivered:
    """A frame whose final Sphinx layer verified: its replay tag and the message it carries."""

    tag: bytes
    message: bytes


def open_frames(state: RoundState, frames: Sequence[bytes]) -> list[Delivered | RejectionReason]:
    """The final Sphinx layer of each frame (MAC, then decryption): what it carries, or why it is refused.

    Replays are not judged here: the inbox's unique tag and the replay cache
    decide them when the message is stored (``RoundStore.enqueue``), so the
    callback only hands the tag back (it is in the result).
    """
    results: list[Delivered | RejectionReason] = []
    for frame in frames:
        try:
            result = process_packet(state.geometry, state.secrets.final_hop_private_key, frame,
                                    is_replay=never_replayed)
        except InvalidPacket:
            results.append(RejectionReason.BAD_PACKET)
            continue
        if not isinstance(result, FinalMessage):
            # The aggregator is always the last hop: anything routed onwards is misrouted.
            results.append(RejectionReason.BAD_PACKET)
            continue
        results.append(Delivered(result.replay_tag, result.message))
    return results


@dataclass(frozen=True)
class _Opened:
    message: SurveyMessage
    job: TokenJob
    """Its ``message`` is the bound bytes the token signs."""


def _open(state: RoundState, message: bytes, now: float) -> _Opened:
    """Message parsing, survey and window: raise SurveyRefused(reason) on failure."""
    try:
        parsed = parse_message(message)
    except InvalidMessage:
        raise SurveyRefused(RejectionReason.BAD_MESSAGE) from None
    if isinstance(parsed, CoverMessage):
        # A second-chance packet that repairs nothing (DESIGN.md §3.7): counted by reason
        # among the covers (RoundStore.store_batch), dropped.
        try:
            state.check_survey(parsed.survey, now)
        except SurveyRefused as refused:
            raise SurveyRefused(f"cover/{refused.reason}") from None
        raise SurveyRefused("cover")
    partition = state.check_survey(parsed.survey, now)
    bound = parsed.bound_bytes()
    return _Opened(parsed, TokenJob(parsed.survey.to_bytes(), bound, parsed.token, partition))


@dataclass
class OpenedBatch:
    """Inbox rows after message parsing: what :func:`judge_batch` needs to verify them."""

    arrivals: list[float]
    inbox_ids: Sequence[int]
    opened: list[tuple[int, _Opened]] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)

    def token_jobs(self) -> list[TokenJob]:
        """The tokens to verify, one per message that parsed (in ``opened`` order)."""
        return [item.job for _, item in self.opened]


def open_batch(state: RoundState, rows: Sequence[tuple[int, bytes, bytes, float]]) -> OpenedBatch:
    """Parse each inbox row ``(id, tag, message, arrived)``: message, open survey and window at arrival."""
    batch = OpenedBatch([row[3] for row in rows], [row[0] for row in rows])
    batch.outcomes = [""] * len(rows)
    for index, (_, _, message, arrived) in enumerate(rows):
        try:
            batch.opened.append((index, _open(state, message, arrived)))
        except SurveyRefused as exc:
            batch.outcomes[index] = exc.reason
            batch.rejections.append(exc.reason)
    return batch


@dataclass
class JudgedBatch:
    """A batch whose tokens are verified: what :func:`store_judged` commits."""

    batch: OpenedBatch
    verified: list[tuple[int, VerifiedPacket]]


def judge_batch(state: RoundState, batch: OpenedBatch, workers: IssuerWorkers) -> JudgedBatch:
    """Tokens (in the worker processes when there are any) and report formats.

    The batch's tokens are verified together (``crypto.verify_tokens``: one
    small-exponent check of all their proofs, bisected when it fails), so a
    bad token is refused alone, counted by its reason like any other."""
    return judge_verified(state, batch, workers.verify(batch.token_jobs()))


def judge_verified(state: RoundState, batch: OpenedBatch, results: Sequence[bytes | JobRefused]) -> JudgedBatch:
    """Report formats, given the verdict on each of ``batch.token_jobs()`` (``IssuerWorkers.verify``'s)."""
    if len(results) != len(batch.opened):
        raise ValueError(f"{len(results)} token verdicts for {len(batch.opened)} tokens")
    verified: list[tuple[int, VerifiedPacket]] = []
    for (index, item), result in zip(batch.opened, results):
        if isinstance(result, JobRefused):
            batch.outcomes[index] = result.reason
            batch.rejections.append(result.reason)
            continue
        try:
            state.check_report(item.message.survey, item.message.report)
        except InvalidMessage:
            batch.outcomes[index] = RejectionReason.BAD_MESSAGE
            batch.rejections.append(RejectionReason.BAD_MESSAGE)
            continue
        verified.append(
            (index, VerifiedPacket(item.message.survey, result, message_hash(item.job.message), item.message.report,
                                   receipt_digest(result), batch.arrivals[index]))
        )
    return JudgedBatch(batch, verified)


def store_judged(state: RoundState, judged: JudgedBatch) -> list[str]:
    """One commit: accepted packets and the batch's rejections, its inbox rows removed (their replay tags
    were taken when they entered the inbox).

    Raises StorageError (nothing of the batch committed) when the store
    fails; calling it again with the same batch is safe.
    """
    batch = judged.batch
    stored = state.store.store_batch(
        [packet for _, packet in judged.verified], batch.rejections, int(max(batch.arrivals, default=0)),
        batch.inbox_ids,
    )
    outcomes = list(batch.outcomes)
    for (index, _), outcome in zip(judged.verified, stored):
        outcomes[index] = outcome
    if batch.rejections:
        log.debug("batch of %d: rejected %r", len(outcomes), batch.rejections)
    return outcomes


def process_batch(
    state: RoundState,
    frames: list[bytes],
    now: float | Sequence[float],
    verifier: IssuerWorkers | None = None,
) -> list[str]:
    """Outcome per frame (``"accepted"`` or a reason), after the batch is durable.

    ``now`` is the time the frames arrived (one for all, or one per frame): the
    acceptance window is judged at arrival, not when verification gets to
    them. Order per packet (DESIGN.md §5, §6): final Sphinx layer, replay tag
    (through the inbox, as the sink does), message, open survey and window,
    token (with its partition), report format, then double-submission
    handling in the store.
    """
    arrivals = [float(now)] * len(frames) if isinstance(now, (int, float)) else [float(t) for t in now]
    if len(arrivals) != len(frames):
        raise ValueError(f"{len(arrivals)} arrival times for {len(frames)} frames")
    opened = open_frames(state, frames)
    outcomes: list[str] = [r if isinstance(r, RejectionReason) else "" for r in opened]
    refused = Counter(str(r) for r in opened if isinstance(r, RejectionReason))
    authentic = [(index, r, arrivals[index]) for index, r in enumerate(opened) if isinstance(r, Delivered)]
    rows: list[tuple[int, bytes, bytes, float]] = []
    pending: list[int] = []
    # One commit per arrival time (a sink stores each link batch with its own).
    for arrived in sorted({arrived for _, _, arrived in authentic}):
        group = [(index, delivered) for index, delivered, at in authentic if at == arrived]
        row_ids = state.store.enqueue([(d.tag, d.message) for _, d in group], arrived)
        for (index, delivered), row_id in zip(group, row_ids):
            if row_id is None:
                outcomes[index] = RejectionReason.REPLAY
                refused[RejectionReason.REPLAY] += 1
            else:
                rows.append((row_id, delivered.tag, delivered.message, arrived))
                pending.append(index)
    state.store.count_rejections(refused)
    judged = judge_batch(state, open_batch(state, rows), verifier or IssuerWorkers(state.secrets.issuer_key))
    for index, outcome in zip(pending, store_judged(state, judged)):
        outcomes[index] = outcome
    return outcomes
