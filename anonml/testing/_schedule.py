"""Wall-clock schedules for tests whose relays run on real sockets.

Those tests cannot use trio's MockClock, so their hop windows are real
seconds, fixed in each packet when it is built. A window sized for an idle
machine closes before its packets are sent on a busy one (CI runs the suite
two workers at a time beside the demo's processes), and the relay then
rightly refuses them as late. The tests size their windows from
:func:`seconds_for` (or :func:`window_seconds`), from the packet cost measured when the schedule is drawn,
and draw again with more slack when the work was not ready in time
(:func:`drawn_in_time`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from anonml.crypto import PathHop, SphinxGeometry, build_packet

T = TypeVar("T")

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


def window_seconds(packets: int, packet_cost: float, *, floor: int = 2, slack: float = SLACK) -> int:
    """Whole wall seconds (a window's unit) to allow for building, sending and
    processing ``packets`` that cost ``packet_cost`` seconds each: ``slack``
    times their cost, rounded up, at least ``floor``."""
    return max(floor, math.ceil(slack * packets * packet_cost))


def seconds_for(packets: int, geometry: SphinxGeometry, path: Sequence[PathHop], *, floor: int = 2) -> int:
    """:func:`window_seconds` for ``packets`` along ``path`` at the cost measured now."""
    return window_seconds(packets, packet_seconds(geometry, path), floor=floor)


def drawn_in_time(draw: Callable[[float], tuple[T, float]], *, attempts: int = 4) -> T:
    """What ``draw(slack)`` built, from the first draw that was ready in time.

    ``draw`` sizes its windows with ``window_seconds(..., slack=slack)`` from
    a cost the caller measured once (:func:`packet_seconds`), builds the
    packets they are fixed in, and returns them with the Unix time they had
    to be ready by. When the machine slowed down by more than the slack
    allows (another process started), the work is drawn again with twice the
    slack rather than failing the test for the machine's load. The cost is
    not measured again: measured under the new load as well, the windows
    would grow by both factors at once (a cascade test's windows grew to
    minutes that way).
    """
    slack = SLACK
    for _ in range(attempts):
        built, ready_by = draw(slack)
        if time.time() < ready_by:
            return built
        slack *= 2
    raise AssertionError(f"building took longer than its measured allowance {attempts} times (last slack {slack / 2:g})")
