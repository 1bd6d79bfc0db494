"""The work a relay asks of first-hop frames, rising while its first-hop intake is behind (issue 25).

Junk that a relay cannot tell from honest packets (valid Sphinx built with
its public key, carrying tokens that fail only at the aggregator) used to
cost the relay a Sphinx unwrap and the aggregator a verification per frame,
at whatever rate one attacker core could send. Now every frame from a sender
that is not a listed neighbour carries a stamp (protocol._work), checked
before the unwrap (a hash of the frame, microseconds against ~380 µs), and
the relay asks ``bits`` of work of it: none while it keeps up, more while its
first-hop intake is busy, as Tor's onion-service defence raises its suggested
effort with load. A sender that pays ``2**bits`` hashes per frame sends at most
one core's hash rate over that; one that does not is answered MORE_WORK,
refused before any Sphinx work and charged to its refusal budget like any
refused frame. Neighbours' frames (authenticated in the link handshake) carry
no stamp: relay-to-relay traffic is the forwarding of frames already paid for.

The level (one for every sender at a time: protocol._work says why that
leaks nothing) follows the intake's *backlog*: the mean number of first-hop
batches inside the intake (waiting for their turn, transport.FairTurns, or
being checked and committed) over each ``INTERVAL`` seconds of wall time.
Not the CPU it takes, nor whether anything waits at all: on a machine that
other processes keep busy the relay gets a small share of a core (bench
abuse at load 10: 8%), and a flood that takes most of that share used less
than a tenth of a core; and honest batches wait too there (~250 ms p99 with
nobody attacking), one or two at a time. A flood from many connections
keeps many batches waiting. Above ``RAISE_BACKLOG`` the level rises by
``RAISE_BITS`` (from 0 straight to ``FIRST_BITS``), up to ``max_bits``;
below ``FALL_BACKLOG`` it falls by one bit per ``FALL_SECONDS`` of calm, to
0. Rising fast and falling slowly keeps a flood near the level at which it
no longer builds a backlog. One bit a step and a grace of one interval: bench
abuse (load 13-19) saw a flood pushed to 14 bits with steps of two and a
grace of 1 s, where an honest stamp costs ~0.5 s of wall time on a machine
that gives the probe a seventh of a core. For ``GRACE_SECONDS`` after a rise, stamps of
the level before it still pass, so a peer that stamped with the level its
hello named is not refused for a rise it could not have seen (it learns the
new level from a MORE_WORK ack, and re-stamps on the same connection).

The round simulator runs every relay on one virtual clock in one process;
its honest relays ask no work (max_work_bits 0: this level follows
``time.monotonic`` and the intake's backlog, neither of which a virtual
round has), while its colluding relays ask one target for work
(``anonml.simulate._work``), each stamp charged its modelled wall time
(``protocol.stamp_seconds``). The level itself is what this module's tests
and bench abuse's relay-junk-tokens check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import time

from anonml.protocol import MAX_WORK_BITS, STAMP_BYTES, stamp_work
from anonml.transport import AckStatus
from anonml.relay._metrics import DropReason, RelayCounters

INTERVAL = 0.5
RAISE_BACKLOG = 4.0
FALL_BACKLOG = 1.0
FIRST_BITS = 12
RAISE_BITS = 1
FALL_SECONDS = 2.0
GRACE_SECONDS = 0.5


class FirstHopWork:
    """The relay's work level and its check of stamped frames (module docstring); a ``transport.WorkDemand``."""

    def __init__(self, is_neighbour: Callable[[bytes], bool], counters: RelayCounters, *, max_bits: int,
                 now: Callable[[], float] = time.monotonic) -> None:
        """``is_neighbour(node_id)``: whether a node is a listed neighbour; ``counters`` count the frames refused."""
        if not (isinstance(max_bits, int) and 0 <= max_bits <= MAX_WORK_BITS):
            raise ValueError(f"max_bits must be an integer in 0..{MAX_WORK_BITS}, got {max_bits!r}")
        self._is_neighbour = is_neighbour
        self._counters = counters
        self.max_bits = max_bits
        self._now = now
        self._bits = 0
        self._previous_bits = 0
        self._raised_at = -float("inf")
        self._interval_start: float | None = None
        self._batches = 0  # first-hop batches inside the intake now
        self._batch_seconds = 0.0  # their number integrated over this interval's time
        self._counted_at = 0.0
        self._calm_seconds = 0.0

    def asks_work(self, node_id: bytes | None) -> bool:
        """Stamps from everyone but a listed neighbour (a key the directory does not list is any sender),
        unless this relay never asks work (max_bits 0: its frames stay bare packets)."""
        return self.max_bits > 0 and (node_id is None or not self._is_neighbour(node_id))

    def bits(self) -> int:
        """The work asked now."""
        self._update(self._now())
        return self._bits

    def passing_bits(self) -> int:
        """The least work a stamp needs now: the level before the last rise, for GRACE_SECONDS after it."""
        now = self._now()
        self._update(now)
        return min(self._bits, self._previous_bits) if now < self._raised_at + GRACE_SECONDS else self._bits

    @contextmanager
    def inside(self) -> Iterator[None]:
        """Around a first-hop batch's intake (its waits for turns included): the backlog the level follows."""
        self._count(self._now(), +1)
        try:
            yield
        finally:
            self._count(self._now(), -1)

    def _count(self, now: float, change: int) -> None:
        self._update(now)
        self._batch_seconds += self._batches * (now - self._counted_at)
        self._counted_at = now
        self._batches += change

    def check(self, frames: Sequence[bytes], context: bytes | None) -> tuple[list[bytes], list[int]]:
        """The packets of ``frames`` (stamped, bound to ``context``; None: bare packets, taken whole) whose
        stamps do the work asked, and the positions of those that fall short (to be answered MORE_WORK)."""
        if context is None:
            return list(frames), []
        needed = self.passing_bits()
        packets: list[bytes] = []
        short: list[int] = []
        for index, frame in enumerate(frames):
            packet, stamp = frame[:-STAMP_BYTES], frame[-STAMP_BYTES:]
            if needed == 0 or stamp_work(context, packet, stamp) >= needed:
                packets.append(packet)
            else:
                short.append(index)
        if short:  # (a zero count would still add the reason to the metrics)
            self._counters.received += len(short)
            self._counters.drop(DropReason.INSUFFICIENT_WORK, len(short))
        return packets, short

    def _update(self, now: float) -> None:
        if self._interval_start is None:
            self._interval_start = self._counted_at = now
            return
        elapsed = now - self._interval_start
        if elapsed < INTERVAL:
            return
        backlog = (self._batch_seconds + self._batches * (now - self._counted_at)) / elapsed
        self._interval_start = self._counted_at = now
        self._batch_seconds = 0.0
        if backlog > RAISE_BACKLOG:
            self._calm_seconds = 0.0
            if self._bits < self.max_bits:
                self._previous_bits, self._raised_at = self._bits, now
                self._bits = min(self.max_bits, max(FIRST_BITS, self._bits + RAISE_BITS))
        elif backlog < FALL_BACKLOG:
            # A long quiet spell (no frame asked for the level) counts whole: one bit per FALL_SECONDS of it.
            self._calm_seconds += elapsed
            steps = int(self._calm_seconds // FALL_SECONDS)
            self._calm_seconds -= steps * FALL_SECONDS
            self._bits = max(0, self._bits - steps)
            self._previous_bits = min(self._previous_bits, self._bits)
        else:
            self._calm_seconds = 0.0


def with_refusals(statuses: Sequence[AckStatus], short: Sequence[int]) -> list[AckStatus]:
    """The statuses of a stamped batch: MORE_WORK at the positions in ``short`` (ascending), ``statuses`` (of
    the other frames, in order) between them."""
    merged: list[AckStatus] = []
    rest = iter(statuses)
    refused = set(short)
    for index in range(len(statuses) + len(short)):
        merged.append(AckStatus.MORE_WORK if index in refused else next(rest))
    return merged
