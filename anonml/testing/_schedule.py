"""Wall-clock schedules for tests whose relays run on real sockets.

Those tests cannot use trio's MockClock, so their hop windows are real
seconds, fixed in each packet when it is built. A window sized for an idle
machine closes before its packets are sent on a busy one (CI runs the suite
two workers at a time beside the demo's processes), and the relay then
rightly refuses them as late. The tests size their windows from
:func:`seconds_for`, from the packet cost measured when the schedule is drawn.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence

from anonml.crypto import PathHop, SphinxGeometry, build_packet

#: How far the machine may slow down between measuring and finishing the work.
SLACK = 10.0


def packet_seconds(geometry: SphinxGeometry, path: Sequence[PathHop], probes: int = 5) -> float:
    """Wall seconds that building one packet along ``path`` takes now (the
    median of ``probes``). Building a packet does the elliptic-curve work of
    all its hops, so it is also the unit of a relay's intake and of a final
    hop's unwrapping: all of it slows down alike when the machine is busy."""
    samples = []
    for _ in range(probes):
        started = time.perf_counter()
        build_packet(geometry, path, b"probe")
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def seconds_for(packets: int, geometry: SphinxGeometry, path: Sequence[PathHop], *, floor: int = 2) -> int:
    """Whole wall seconds (a window's unit) to allow for building, sending and
    processing ``packets`` along ``path``: :data:`SLACK` times their measured
    cost, rounded up, at least ``floor``."""
    return max(floor, math.ceil(SLACK * packets * packet_seconds(geometry, path)))
