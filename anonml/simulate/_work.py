"""First-hop work asked of one peer alone: colluding first relays that make a target pay, late, or move.

A relay asks first-hop work (protocol._work, relay._work) of every frame
from a sender that is not a listed neighbour, one level for all at a time.
A relay colluding with the aggregator sees the sender of each frame it takes
as first hop, so it may ask a chosen target alone for the most its link
client pays (``DEFAULT_MAX_WORK_BITS``, 2**20 hashes a stamp, about a second
at :data:`~anonml.protocol.REFERENCE_HASHES_PER_SECOND`), refuse stamps that
pay it, and take its time answering. The target's packet then leaves late,
after its send window, by another path, or not in that window at all, and
the aggregator would link it by its arrival time or its window.

:class:`FirstHopWork` plays that operator for the targets' links to each
colluding relay (by default the first ``path_length - 1`` relays of the
manifest, the most that leaves one honest relay on every path): it asks the
cap in its hello, answers each frame MORE_WORK ``refusals`` times whatever its
stamp (the link client re-stamps at most ``_WORK_ROUNDS`` times, then counts
the relay busy and the peer takes another path), and passes a frame that
then pays the level to its own relay. ``hold`` delays every MORE_WORK answer
(the variant that keeps the peer waiting on its ack before it re-stamps or
gives up). The simulator charges each stamp its wall time on the virtual
clock (``base.threads.run_timed_work``), so the work moves sends as it would.
Each frame it takes is recorded with the work asked (:class:`FrameRecord`),
for the estimators that speak after it (``_property``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import trio

from anonml.protocol import STAMP_BYTES, stamp_work
from anonml.simulate._adversary import (
    Adversary,
    FrameRecord,
    RoundContext,
    collude_on_link,
    forward_frames,
)
from anonml.transport import DEFAULT_MAX_WORK_BITS, AckStatus, FixedWork, LinkClient, LinkSessionStats

REFUSE_ALWAYS = 1_000
"""More MORE_WORK answers per frame than any client re-stamps: the frame is never taken."""
HOLD_SECONDS = 25.0
"""How long the held variant keeps each MORE_WORK answer: just under the link client's ack timeout (30 s)."""


class FirstHopWork(Adversary):
    """Colluding first relays ask the targets alone for the most work their clients pay, refuse, and stall.

    ``relays``: the colluding relays' indices (None: the first ``path_length - 1``); ``bits``: the work asked
    (default the link client's cap); ``refusals``: MORE_WORK answers per frame before a paid stamp is taken
    (the default, the client's re-stamping rounds, takes the last stamp it makes: the latest its packet can
    leave by this path); ``hold``: seconds each MORE_WORK answer waits before it goes out.
    """

    name = "first-hop-work"

    def __init__(self, targets: Sequence[str] = (), relays: Sequence[int] | None = None, *,
                 bits: int = DEFAULT_MAX_WORK_BITS, refusals: int = 4, hold: float = 0.0) -> None:
        super().__init__(targets)
        if not (isinstance(bits, int) and 0 < bits <= DEFAULT_MAX_WORK_BITS) or refusals < 0 or hold < 0:
            raise ValueError(f"bits must be in 1..{DEFAULT_MAX_WORK_BITS}, refusals and hold at least 0; "
                             f"got bits={bits!r}, refusals={refusals!r}, hold={hold!r}")
        self.relays = None if relays is None else tuple(relays)
        self.bits = bits
        self.refusals = refusals
        self.hold = hold
        self.refused: Counter[bytes] = Counter()
        """MORE_WORK answers given per packet (the packet's bytes, its stamp left off)."""

    def describe(self) -> str:
        relays = "the first path_length - 1 relays" if self.relays is None else f"relays {list(self.relays)}"
        return (f"{self.name} ({relays} ask {self.bits} bits, refuse {self.refusals} stamps per packet, "
                f"hold each refusal {self.hold:.0f} s)")

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        colluding = self.relays if self.relays is not None else range(context.manifest.path_length - 1)
        for relay in colluding:
            self._collude(context, relay % len(context.relays))

    def _collude(self, context: RoundContext, relay: int) -> None:
        async def on_packets_from(source: str, forward: LinkClient, session: LinkSessionStats,
                                  frames: list[bytes]) -> list[AckStatus]:
            assert session.work_context is not None, "it asks the target for work, so its frames are stamped"
            context.view.frames.extend(FrameRecord(context.clock(), relay, source, False, self.bits) for _ in frames)
            statuses: list[AckStatus | None] = []
            paid: list[bytes] = []
            for frame in frames:
                packet, stamp = frame[:-STAMP_BYTES], frame[-STAMP_BYTES:]
                if self.refused[packet] < self.refusals or stamp_work(session.work_context, packet, stamp) < self.bits:
                    self.refused[packet] += 1
                    statuses.append(AckStatus.MORE_WORK)
                else:
                    statuses.append(None)
                    paid.append(packet)
            if self.hold > 0 and AckStatus.MORE_WORK in statuses:
                await trio.sleep(self.hold)
            forwarded = iter(await forward_frames(forward, paid) if paid else [])
            return [next(forwarded) if status is None else status for status in statuses]

        collude_on_link(context, relay, self.targets, on_packets_from, work=FixedWork(self.bits))


def held_first_hop_work(targets: Sequence[str]) -> FirstHopWork:
    """The cap asked, every stamp refused, each refusal held ``HOLD_SECONDS`` (``first-hop-work-held``)."""
    held = FirstHopWork(targets, refusals=REFUSE_ALWAYS, hold=HOLD_SECONDS)
    held.name = "first-hop-work-held"
    return held
