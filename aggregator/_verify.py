"""Final-hop processing and token verification of one batch of packets (DESIGN.md §5, §6).

:func:`process_batch` is synchronous and CPU-bound (X25519, LIONESS, P-256
proofs), in two stages the sink overlaps: :func:`open_batch` (final Sphinx
layer, replay tag, message, survey and window) in a worker thread while
:func:`finish_batch` verifies the previous batch's tokens (in the worker
processes) and stores it. Each packet ends as one outcome — ``"accepted"`` or
a rejection reason — and accepted packets are stored, with the batch's
rejections counted, in one commit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from anonml.aggregator._round import RoundState, SurveyRefused, message_hash
from anonml.aggregator._store import VerifiedPacket
from anonml.aggregator._workers import IssuerWorkers
from anonml.crypto import REJECTION_REASONS as TOKEN_REJECTION_REASONS
from anonml.crypto import (
    FinalMessage,
    InvalidPacket,
    JobRefused,
    ReplayedPacket,
    TokenJob,
    process_packet,
)
from anonml.protocol import CoverMessage, InvalidMessage, SurveyMessage, parse_message, receipt_digest

log = logging.getLogger(__name__)

REJECTION_REASONS: tuple[str, ...] = (
    "bad-packet",
    "replay",
    "bad-message",
    "unknown-survey",
    "outside-window",
    *sorted(f"bad-token/{reason}" for reason in TOKEN_REJECTION_REASONS - {"wrong-partition"}),
    "wrong-partition",
    "double-submission",
    "duplicate",
)
COVER_REASONS: tuple[str, ...] = ("cover", "cover/unknown-survey", "cover/outside-window")
"""Every reason a cover packet is counted under (``cover``: inside its survey's acceptance window)."""
"""Every reason a packet is counted as rejected under (``bad-token/`` names the token's reason: :func:`aggregator._workers.token_rejection`)."""


@dataclass(frozen=True)
class _Opened:
    message: SurveyMessage
    job: TokenJob
    """Its ``message`` is the bound bytes the token signs."""


def _open(
    state: RoundState, frame: bytes, now: float, batch_tags: set[bytes], in_flight: AbstractSet[bytes] = frozenset()
) -> _Opened:
    """Final Sphinx layer, message parsing, survey and window: raise SurveyRefused(reason) on failure.

    Authentic packets' replay tags are added to ``batch_tags`` (stored with
    the batch); ``in_flight`` holds the tags of earlier batches opened but not
    yet stored, which count as seen.
    """

    def is_replay(tag: bytes) -> bool:
        if tag in batch_tags or tag in in_flight or state.store.replay_seen(tag):
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
        message = parse_message(result.message)
    except InvalidMessage:
        raise SurveyRefused("bad-message") from None
    if isinstance(message, CoverMessage):
        # A second-chance packet that repairs nothing (DESIGN.md §3.7): counted by reason, dropped.
        try:
            state.check_survey(message.survey, now)
        except SurveyRefused as refused:
            raise SurveyRefused(f"cover/{refused.reason}") from None
        raise SurveyRefused("cover")
    partition = state.check_survey(message.survey, now)
    bound = message.bound_bytes()
    return _Opened(message, TokenJob(message.survey.to_bytes(), bound, message.token, partition))


@dataclass
class OpenedBatch:
    """A batch after its final Sphinx layers: what :func:`finish_batch` needs to verify and store it."""

    arrivals: list[float]
    inbox_ids: Sequence[int]
    opened: list[tuple[int, _Opened]]
    outcomes: list[str]
    rejections: list[str]
    tags: set[bytes]
    """Replay tags of the batch's authentic packets, stored with it."""


def open_batch(
    state: RoundState,
    frames: list[bytes],
    now: float | Sequence[float],
    *,
    inbox_ids: Sequence[int] = (),
    in_flight: AbstractSet[bytes] = frozenset(),
) -> OpenedBatch:
    """The first stage of :func:`process_batch`: final Sphinx layer and replay tag, message, open survey and window.

    ``in_flight`` are the replay tags of batches opened before this one and
    not stored yet (the sink opens one batch while it verifies the previous one).
    """
    arrivals = [float(now)] * len(frames) if isinstance(now, (int, float)) else list(now)
    if len(arrivals) != len(frames):
        raise ValueError(f"{len(arrivals)} arrival times for {len(frames)} frames")
    batch = OpenedBatch(arrivals, inbox_ids, [], [""] * len(frames), [], set())
    for index, frame in enumerate(frames):
        try:
            batch.opened.append((index, _open(state, frame, arrivals[index], batch.tags, in_flight)))
        except SurveyRefused as exc:
            batch.outcomes[index] = exc.reason
            batch.rejections.append(exc.reason)
    return batch


def finish_batch(state: RoundState, batch: OpenedBatch, workers: IssuerWorkers) -> list[str]:
    """The second stage of :func:`process_batch`: tokens, report format, then one commit of the whole batch."""
    outcomes, rejections = batch.outcomes, batch.rejections
    results = workers.verify([item.job for _, item in batch.opened])
    verified: list[tuple[int, VerifiedPacket]] = []
    for (index, item), result in zip(batch.opened, results):
        if isinstance(result, JobRefused):
            outcomes[index] = result.reason
            rejections.append(result.reason)
            continue
        try:
            state.check_report(item.message.survey, item.message.report)
        except InvalidMessage:
            outcomes[index] = "bad-message"
            rejections.append("bad-message")
            continue
        verified.append(
            (index, VerifiedPacket(item.message.survey, result, message_hash(item.job.message), item.message.report,
                                   receipt_digest(result), batch.arrivals[index]))
        )
    stored = state.store.store_batch(
        [packet for _, packet in verified], rejections, int(max(batch.arrivals, default=0)), sorted(batch.tags), batch.inbox_ids
    )
    for (index, _), outcome in zip(verified, stored):
        outcomes[index] = outcome
    if rejections:
        log.debug("batch of %d: rejected %r", len(outcomes), rejections)
    return outcomes


def process_batch(
    state: RoundState,
    frames: list[bytes],
    now: float | Sequence[float],
    verifier: IssuerWorkers | None = None,
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
    batch = open_batch(state, frames, now, inbox_ids=inbox_ids)
    return finish_batch(state, batch, verifier or IssuerWorkers(state.secrets.issuer_key))
