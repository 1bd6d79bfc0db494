"""Every message the peers prepared, set against what the aggregator accepted.

Each peer's store records every message it prepared (survey, receipt, how
often it was sent, whether its receipt was seen) before it leaves; the
aggregator's round store holds one row per accepted message with the same
receipt (DESIGN.md §6, ``protocol.receipt_digest``). Matching the two by (survey, receipt) says what was
lost, what was counted twice and what the aggregator holds that no peer
prepared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anonml.aggregator import PostgresLocation, RoundStore
from anonml.peer import PeerStore, StoredPacket
from anonml.protocol import SurveyId, SurveyKind


@dataclass
class Audit:
    """The outcome for every prepared message."""

    prepared: int = 0
    accepted: int = 0
    lost: int = 0
    counted_twice: int = 0
    unknown_accepted: int = 0
    """Accepted by the aggregator but prepared by no audited peer."""
    peer_acknowledged_but_lost: int = 0
    """The peer saw its receipt, yet the aggregator has no such message (must be 0)."""
    lost_by_kind: Counter[str] = field(default_factory=Counter)
    lost_by_reason: Counter[str] = field(default_factory=Counter)
    """Lost messages by what their peer's store says happened to them (:func:`loss_reason`)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "prepared": self.prepared,
            "accepted": self.accepted,
            "lost": self.lost,
            "counted_twice": self.counted_twice,
            "unknown_accepted": self.unknown_accepted,
            "peer_acknowledged_but_lost": self.peer_acknowledged_but_lost,
            "lost_by_kind": dict(self.lost_by_kind),
            "lost_by_reason": dict(self.lost_by_reason),
        }


def loss_reason(packet: StoredPacket) -> str:
    """Why a message the aggregator does not hold was lost, as far as its peer's store tells.

    ``not-sent``: its peer tried no send (its window passed first, or the
    peer stopped); ``sent-once`` / ``sent-twice-or-more``: sent (the second
    time in the second chance) and never accepted; ``acknowledged``: its peer
    saw its receipt in the final log, so the aggregator lost what it had
    logged (must never happen).
    """
    if packet.acknowledged:
        return "acknowledged"
    return "not-sent" if packet.sends == 0 else "sent-once" if packet.sends == 1 else "sent-twice-or-more"


def audit(prepared: Iterable[StoredPacket], accepted: Mapping[SurveyId, list[bytes]]) -> Audit:
    """Match prepared messages to accepted receipts by (survey, receipt)."""
    result = Audit()
    accepted_count: Counter[tuple[bytes, bytes]] = Counter()
    for survey, receipts in accepted.items():
        for receipt in receipts:
            accepted_count[(survey.to_bytes(), receipt)] += 1
    matched: set[tuple[bytes, bytes]] = set()
    for packet in prepared:
        result.prepared += 1
        # The peer keeps the receipt digest its sealed report will be listed under (protocol.seal_report).
        key = (packet.survey, packet.receipt)
        copies = accepted_count.get(key, 0)
        if copies == 0:
            result.lost += 1
            kind = SurveyId.from_bytes(packet.survey).kind
            result.lost_by_kind["median" if kind == SurveyKind.MEDIAN else "data"] += 1
            result.lost_by_reason[loss_reason(packet)] += 1
            result.peer_acknowledged_but_lost += int(packet.acknowledged)
            continue
        result.accepted += 1
        result.counted_twice += int(copies > 1)
        matched.add(key)
    result.unknown_accepted = sum(count for key, count in accepted_count.items() if key not in matched)
    return result


def audit_round(peer_stores: Iterable[Path], round_store: Path | PostgresLocation, round_id: bytes) -> Audit:
    """:func:`audit` over the packets in every peer store and the aggregator's round store (its SQLite file or
    its schema on PostgreSQL)."""
    prepared: list[StoredPacket] = []
    for path in peer_stores:
        store = PeerStore(path, durable=False)
        try:
            prepared.extend(packet for _, packet in store.packets(round_id))
        finally:
            store.close()
    aggregator = RoundStore(round_store)
    try:
        accepted = aggregator.receipts()
    finally:
        aggregator.close()
    return audit(prepared, accepted)
