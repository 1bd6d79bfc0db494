"""The relay's notion of wall time, as a seam for tests.

Release windows are absolute UTC seconds (DESIGN.md §3), but trio sleeps on
its own monotonic clock. :class:`WallClock` ties the two by one offset:
``wall = trio.current_time() + offset``. Under trio's ``MockClock`` (STYLE.md
3) the offset is any chosen wall time, so window logic runs instantly and
deterministically; in production the offset is taken once from ``time.time()``
when the relay starts, after which wall time advances with the monotonic
clock, so an NTP step cannot make a held packet jump its release time. (Over
days the two clocks drift by the NTP slew rate, at most 500 ppm: under a
minute per day, well inside any window a round would use.)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
import trio

Uniform = Callable[[float, float], float]
"""A draw uniform on ``[low, high]``: a relay's release times."""


def uniform_from(rng: np.random.Generator | None) -> Uniform:
    """Draws from the operating system's CSPRNG, or from a seeded ``rng`` (tests; relay._server says why not
    in production)."""
    if rng is None:
        return random.SystemRandom().uniform
    generator = rng

    def uniform(low: float, high: float) -> float:
        return float(generator.uniform(low, high)) if high > low else low

    return uniform


class RelayClock(Protocol):
    """Wall time for window logic and its conversion to trio deadlines."""

    def now(self) -> float:
        """Seconds since the Unix epoch (UTC)."""
        ...

    def to_trio(self, wall: float) -> float:
        """The trio deadline (``trio.current_time()`` scale) of wall instant ``wall``."""
        ...


class WallClock:
    """``now() = trio.current_time() + offset`` (see the module docstring)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    @classmethod
    def anchored(cls) -> WallClock:
        """A clock that agrees with ``time.time()`` now; call inside ``trio.run``."""
        return cls(time.time() - trio.current_time())

    @classmethod
    def starting_at(cls, wall: float) -> WallClock:
        """A clock whose ``now()`` is ``wall`` at this moment (tests, MockClock)."""
        return cls(wall - trio.current_time())

    def now(self) -> float:
        return trio.current_time() + self.offset

    def to_trio(self, wall: float) -> float:
        return wall - self.offset


class PinnedClock:
    """A wall clock stopped at ``instant`` (the relay benchmark's zero-length windows).

    Every hop's window ``[instant, instant]`` is open for the whole run, so no
    packet waits and none is late: what remains is pure processing (Sphinx,
    SQLite, link). Deadlines ``d`` seconds after ``instant`` are ``d`` real
    seconds from the call, so forwarding timeouts still work.
    """

    def __init__(self, instant: float) -> None:
        self.instant = instant

    def now(self) -> float:
        return self.instant

    def to_trio(self, wall: float) -> float:
        return trio.current_time() + (wall - self.instant)
