"""What a relay counts of packets that could not be held for their whole window (``relay.LateIntake``):
taken in after the window opened, or stored after their drawn release time (issue 24)."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from anonml.crypto import ReleaseWindow
from anonml.relay import LateIntake, WallClock
from anonml.transport import AckStatus
from test_relay_windows import T0, Harness


class SlowRelayClock(WallClock):
    """Wall time that moves ``step`` seconds more at each reading: a relay whose own work (Sphinx, its
    SQLite commit) takes that long between two readings."""

    def __init__(self, offset: float, step: float) -> None:
        super().__init__(offset)
        self.step = step
        self.readings = 0

    def now(self) -> float:
        self.readings += 1
        return super().now() + self.readings * self.step


async def test_packets_whose_release_time_passed_before_they_were_stored_are_counted(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A batch taken in just as its window opens but stored half a second later: the packets whose
    drawn time had passed go out at once, in the order they were stored (relay.LateIntake.due_before_stored)."""
    clock = SlowRelayClock(T0 - trio.current_time(), step=0.5)
    harness = Harness(tmp_path, clock)
    window = ReleaseWindow(T0 + 1, T0 + 2)
    packets = [harness.packet(i, window) for i in range(200)]
    # Taken in at the window's start (the relay's first reading), stored at its second.
    clock.readings = 1
    assert await harness.relay.on_packets(packets) == [AckStatus.ACCEPTED] * 200
    assert clock.readings == 3
    stored_at = T0 + 1.5
    due = sum(1 for release_at, _, _ in harness.store.schedule() if release_at < stored_at)
    assert 60 < due < 140  # about half of a uniform draw on the window
    assert harness.relay.counters.late_intake == LateIntake(due_before_stored=due)
