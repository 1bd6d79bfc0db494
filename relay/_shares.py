"""Each source's and each network's share of the held packets, fair from the first packet (issue 25).

A held packet cannot be taken back: the relay has acknowledged it and must
release it in its window. So fairness cannot wait for contention: once one
address has filled the queue, nothing can be evicted to make room for an
honest peer (issue 25 measured 100,000 in-window packets from one address
accepted in 16 s, then every honest packet answered BUSY until the phase
ended). Each source address may therefore hold at most ``per_source``
packets and each network (:func:`transport.source_prefix`, a /24 or a /48)
at most ``per_prefix``, whatever the queue's fill, until they are released
(a share is given back when its packets' release times come, before they are
forwarded, so it renews with each release window and a slow next hop does not
hold an honest sender to it). With the defaults (:class:`relay.RelayConfig`), an attacker with
addresses in 16 networks holds at most half of ``max_held_packets``.

Packets from an authenticated directory neighbour are not charged: a relay
forwards packets that passed its own hop, from many peers. Packets restored
after a restart are charged to nobody (the store does not keep their
source); they count only against the total, and only until released.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from anonml.relay._metrics import DropReason
from anonml.transport import source_prefix


class HeldShares:
    """Held (and pending) packets per source address and per network prefix."""

    def __init__(self, *, per_source: int, per_prefix: int) -> None:
        self.per_source = per_source
        self.per_prefix = per_prefix
        self._by_source: Counter[str] = Counter()
        self._by_prefix: Counter[str] = Counter()
        self._owner: dict[int, str] = {}
        """Committed row id -> its source, until the row is released."""

    def refusal(self, source: str) -> DropReason | None:
        """Why ``source`` may not hold one more packet now (None: it may)."""
        if self._by_source[source] >= self.per_source:
            return DropReason.SOURCE_SHARE
        if self._by_prefix[source_prefix(source)] >= self.per_prefix:
            return DropReason.PREFIX_SHARE
        return None

    def take(self, source: str, count: int = 1) -> None:
        """Charge ``count`` packets being checked (before their commit) to ``source``."""
        self._by_source[source] += count
        self._by_prefix[source_prefix(source)] += count

    def give_back(self, source: str, count: int) -> None:
        """Return ``count`` of ``source``'s packets (released, or their commit failed)."""
        for counter, key in ((self._by_source, source), (self._by_prefix, source_prefix(source))):
            remaining = counter[key] - count
            if remaining > 0:
                counter[key] = remaining
            else:
                del counter[key]

    def own(self, source: str, row_ids: Iterable[int]) -> None:
        """The committed rows of packets charged to ``source``: their shares are given back by :meth:`release`."""
        for row_id in row_ids:
            self._owner[row_id] = source

    def release(self, row_ids: Iterable[int]) -> None:
        """Rows released to their forwarders: their sources' shares are free again."""
        released: Counter[str] = Counter()
        for row_id in row_ids:
            source = self._owner.pop(row_id, None)
            if source is not None:
                released[source] += 1
        for source, count in released.items():
            self.give_back(source, count)

    def held_by(self, source: str) -> int:
        return self._by_source[source]
