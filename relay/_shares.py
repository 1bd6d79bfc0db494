"""Each sender's and each network's share of the held packets, fair from the first packet (issue 25).

A held packet cannot be taken back: the relay has acknowledged it and must
release it in its window. So fairness cannot wait for contention: once one
sender has filled the queue, nothing can be evicted to make room for an
honest peer (issue 25 measured 100,000 in-window packets from one address
accepted in 16 s, then every honest packet answered BUSY until the phase
ended). Every packet is charged to its sender until it is released (a share
is given back when its packets' release times come, before they are
forwarded, so it renews with each release window and a slow next hop does
not hold an honest sender to it):

* a source address (a peer, a stranger) may hold at most ``per_source``
  packets and its network (:func:`transport.source_prefix`, a /24 or a /48)
  at most ``per_prefix``, whatever the queue's fill. With the defaults
  (:class:`relay.RelayConfig`), an attacker with addresses in 16 networks
  holds at most half of ``max_held_packets``.
* an authenticated directory neighbour (a relay, or an aggregator's final
  hop, proven by its link key) is charged by its node id, from whatever
  address it connects, and may hold ``per_neighbour()`` packets
  (:meth:`relay.RelayConfig.max_held_per_neighbour`: the queue divided among
  the other listed relays, at least in two). Neighbours used to be exempt:
  one colluding relay, authenticated with its own listed key, filled an
  honest relay's queue with in-window packets and its peers got BUSY.

The neighbour's share is sized by what an honest one forwards. A peer's path
is ``path_length`` distinct relays chosen uniformly per packet, and each
hop's window opens when the previous one closes
(:func:`protocol.hop_windows`). So the packets this relay holds for one hop
window beyond the first arrive from the other listed relays, each sending
in expectation one equal part of them: a queue that holds this relay's part
of a window of the round holds each neighbour's part of it in a share of
``max_held_packets / (listed relays - 1)``.

Packets restored after a restart are charged to nobody (the store does not
keep their sender); they count only against the total, and only until
released.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

from anonml.relay._metrics import DropReason
from anonml.transport import source_prefix

Sender = str | bytes
"""Who a packet is charged to: a source IP address (str), or an authenticated neighbour's node id (bytes)."""
_Key = TypeVar("_Key")


class HeldShares:
    """Held (and pending) packets per sender and per source network prefix."""

    def __init__(self, *, per_source: int, per_prefix: int, per_neighbour: Callable[[], int]) -> None:
        """``per_neighbour`` is asked at each packet: it follows the directory's listed relays."""
        self.per_source = per_source
        self.per_prefix = per_prefix
        self.per_neighbour = per_neighbour
        self._by_sender: Counter[Sender] = Counter()
        self._by_prefix: Counter[str] = Counter()
        self._owner: dict[int, Sender] = {}
        """Committed row id -> its sender, until the row is released."""

    def refusal(self, sender: Sender) -> DropReason | None:
        """Why ``sender`` may not hold one more packet now (None: it may)."""
        held = self._by_sender[sender]
        if isinstance(sender, bytes):
            return DropReason.NEIGHBOUR_SHARE if held >= self.per_neighbour() else None
        if held >= self.per_source:
            return DropReason.SOURCE_SHARE
        if self._by_prefix[source_prefix(sender)] >= self.per_prefix:
            return DropReason.PREFIX_SHARE
        return None

    def take(self, sender: Sender, count: int = 1) -> None:
        """Charge ``count`` packets being checked (before their commit) to ``sender``."""
        self._by_sender[sender] += count
        if isinstance(sender, str):
            self._by_prefix[source_prefix(sender)] += count

    def give_back(self, sender: Sender, count: int) -> None:
        """Return ``count`` of ``sender``'s packets (released, or their commit failed)."""
        _decrease(self._by_sender, sender, count)
        if isinstance(sender, str):
            _decrease(self._by_prefix, source_prefix(sender), count)

    def own(self, sender: Sender, row_ids: Iterable[int]) -> None:
        """The committed rows of packets charged to ``sender``: their shares are given back by :meth:`release`."""
        for row_id in row_ids:
            self._owner[row_id] = sender

    def release(self, row_ids: Iterable[int]) -> None:
        """Rows released to their forwarders: their senders' shares are free again."""
        released: Counter[Sender] = Counter()
        for row_id in row_ids:
            sender = self._owner.pop(row_id, None)
            if sender is not None:
                released[sender] += 1
        for sender, count in released.items():
            self.give_back(sender, count)

    def held_by(self, sender: Sender) -> int:
        return self._by_sender[sender]


def _decrease(counter: Counter[_Key], key: _Key, count: int) -> None:
    remaining = counter[key] - count
    if remaining > 0:
        counter[key] = remaining
    else:
        del counter[key]
