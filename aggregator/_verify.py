"""Final-hop processing and token verification of one batch of packets (DESIGN.md §5, §6).

:func:`process_batch` is synchronous and CPU-bound (X25519, LIONESS, P-256
proofs): the sink runs it in a worker thread, off the event loop. Each packet
ends as one outcome — ``"accepted"`` or a rejection reason — and accepted
packets are stored, with the batch's rejections counted, in one commit before
any acknowledgement goes back on the link.
"""

from __future__ import annotations

import logging

from crypto import FinalMessage, InvalidPacket, InvalidToken, ReplayedPacket, process_packet, verify_token
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


def _open(state: RoundState, frame: bytes, now: int, batch_tags: set[bytes]) -> VerifiedPacket:
    """Check one frame through to a verified token; raise SurveyRefused(reason) otherwise.

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
    try:
        digest = verify_token(
            state.secrets.issuer_key, message.survey.to_bytes(), bound, message.token, expected_partition=partition
        )
    except InvalidToken as exc:
        raise SurveyRefused("wrong-partition" if exc.reason == "wrong-partition" else f"bad-token/{exc.reason}") from None
    try:
        state.check_report(message.survey, message.report)
    except InvalidMessage:
        raise SurveyRefused("bad-message") from None
    return VerifiedPacket(message.survey, digest, message_hash(bound), message.report, receipt_digest(digest))


def process_batch(state: RoundState, frames: list[bytes], now: int) -> list[str]:
    """Outcome per frame (``"accepted"`` or a reason), after the batch is durable."""
    verified: list[tuple[int, VerifiedPacket]] = []
    outcomes: list[str] = [""] * len(frames)
    rejections: list[str] = []
    batch_tags: set[bytes] = set()
    for index, frame in enumerate(frames):
        try:
            verified.append((index, _open(state, frame, now, batch_tags)))
        except SurveyRefused as exc:
            outcomes[index] = exc.reason
            rejections.append(exc.reason)
    stored = state.store.store_batch([packet for _, packet in verified], rejections, now, sorted(batch_tags))
    for (index, _), outcome in zip(verified, stored):
        outcomes[index] = outcome
    if rejections:
        log.debug("batch of %d: rejected %r", len(frames), rejections)
    return outcomes
