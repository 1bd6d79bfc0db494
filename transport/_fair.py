"""Fair turns at a service's CPU-bound intake: a light source goes before a flooding one (issue 25).

A relay's link intake (Sphinx work and the batch's commit) and the
aggregator's sink (the final layer, then the inbox commit) run one slice of
a connection's batch at a time on the event loop. Trio runs ready tasks in
the order they became ready, so an honest packet arriving while sixteen
flooding connections each had a batch waiting was processed after a slice of
each of them (issue 25's ``relay-junk-tokens``: honest p99 4-7x unloaded,
while junk that no relay can tell from honest packets was forwarded at line
rate).

:class:`FairTurns` hands out one turn at a time in start-time fair queueing
order (Goyal, Vin and Cheng, SIGCOMM 1996): a flow's slice is tagged
``start = max(V, finish of the flow's previous slice)`` and ``finish = start +
cost``, where ``V`` is the start tag of the slice last granted, and the
waiting slice with the smallest finish tag goes next, so flows that keep
sending share the intake equally per unit of cost, served in turn. Before
them all go the batches of quiet flows: a batch (a :class:`FairLane`) whose
flow's last finish tag ``V`` had passed when it began (it used less than
its share), or a new flow's, as fq_codel serves new flows first; when the
intake goes idle a busy period ends and every flow is new again (the paper's
rule: V becomes the largest finish tag served). So a peer's
batch waits for at most the slice being processed, whatever flooding flows
have queued, and its commit does not wait for their round either. Plain
start-time order put a peer's slice behind the rest of a flooding round (14
of 16 slices in the test), and per-slice finish order its commit (which
costs a slice: an fsync holds the loop). A flow is what the caller names it: at a relay a
source's network (so 64 addresses in one /24 are one flow) or an
authenticated neighbour's node id; nothing about a flow leaves the process,
and turns change only when a batch is processed, not what is stored or sent
on (a relay's release times are drawn in the packet's window regardless).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import AsyncIterator, Hashable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import trio

# Flows remembered at most; beyond it, those whose finish tags are behind the virtual
# time (they would start at V anyway) are forgotten.
_MAX_FLOWS = 65_536


@dataclass(order=True)
class _Waiting:
    backlogged: bool
    finish: float
    sequence: int
    start: float = field(compare=False)
    event: trio.Event = field(compare=False, default_factory=trio.Event)
    granted: bool = field(compare=False, default=False)
    abandoned: bool = field(compare=False, default=False)


class FairTurns:
    """One turn at a time, in fair queueing order per flow (module docstring)."""

    def __init__(self) -> None:
        self._finish: dict[Hashable, float] = {}
        self._virtual = 0.0
        self._waiting: list[_Waiting] = []
        self._held = False
        self._sequence = itertools.count()

    def lane(self, flow: Hashable) -> FairLane:
        """The turns of one batch of ``flow``: quiet (ahead of backlogged flows) if the flow's last
        finish tag is behind ``V`` now, or it is new."""
        previous = self._finish.get(flow)
        return FairLane(self, flow, backlogged=previous is not None and previous >= self._virtual)

    @asynccontextmanager
    async def _turn(self, lane: FairLane, cost: float) -> AsyncIterator[None]:
        if cost <= 0:
            raise ValueError(f"a turn's cost must be positive, got {cost!r}")
        flow = lane.flow
        start = max(self._virtual, self._finish.get(flow, self._virtual))
        self._finish[flow] = start + cost
        if len(self._finish) > _MAX_FLOWS:
            self._finish = {f: tag for f, tag in self._finish.items() if tag > self._virtual}
        entry = _Waiting(lane.backlogged, start + cost, next(self._sequence), start)
        heapq.heappush(self._waiting, entry)
        if not self._held:
            # A slice runs without yielding, so a turn free now would go to whichever task trio
            # happens to run first: reserve it, let the other ready tasks queue their slices, then
            # grant the first in order (perhaps not ours).
            self._held = True
            await trio.lowlevel.cancel_shielded_checkpoint()
            self._release()
        try:
            await entry.event.wait()
        except BaseException:
            if entry.granted:
                self._release()  # granted as it was cancelled: pass the turn on
            else:
                entry.abandoned = True
            raise
        self._virtual = max(self._virtual, start)
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            entry = heapq.heappop(self._waiting)
            if not entry.abandoned:
                entry.granted = True
                entry.event.set()
                return
        self._held = False
        # The busy period has ended: every flow starts the next one at V, as a new flow. Kept, a flow's
        # last finish tag stayed ahead of V and its next batch waited behind a round of every other
        # flow's slices (test_fair_turns: a flow served in an earlier busy period).
        self._finish.clear()


@dataclass(frozen=True)
class FairLane:
    """One batch's turns (:meth:`FairTurns.lane`): its priority is fixed when the batch begins."""

    turns: FairTurns
    flow: Hashable
    backlogged: bool

    def turn(self, cost: float) -> AbstractAsyncContextManager[None]:
        """Hold the intake for one slice (or the commit) of the batch, costing ``cost`` (frames, say)."""
        return self.turns._turn(self, cost)
