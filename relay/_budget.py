"""A budget of refused frames per source: who sends what the relay must refuse is slowed down.

Every frame costs the relay its Sphinx processing (an X25519 and a MAC)
before it can be refused; issue 13's floods of late or far-future packets
were authentic Sphinx packets, so no check refuses them cheaply. A token
bucket per source address allows ``rate`` refused frames per second (and a
burst of ``burst``); a source that has spent more has its next batch wait
until the bucket is back above zero. Nothing is refused for it: an honest
sender sees its acks come later, and honest senders almost never send what
is refused (a packet is late only if its sender or the network was very
slow). Authenticated directory neighbours are not budgeted: they forward
only what passed their own hop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Sources remembered at most; beyond it, those quiet longest are forgotten.
_MAX_SOURCES = 65_536


@dataclass
class RefusalBudget:
    """Token buckets of refused frames, one per source address (trio time, so MockClock works)."""

    rate: float
    burst: float
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    """source -> (tokens, at what time), in the order of their last spend."""

    def _tokens(self, source: str, now: float) -> float:
        tokens, at = self._buckets.get(source, (self.burst, now))
        return min(self.burst, tokens + (now - at) * self.rate)

    def delay(self, source: str, now: float) -> float:
        """Seconds ``source``'s next batch must wait (0 while its budget is not overspent)."""
        tokens = self._tokens(source, now)
        return 0.0 if tokens >= 0 else -tokens / self.rate

    def spend(self, source: str, refused: int, now: float) -> None:
        """Charge ``refused`` frames to ``source``."""
        if refused <= 0:
            return
        tokens = self._tokens(source, now) - refused
        self._buckets.pop(source, None)  # re-inserted last: the dict stays ordered by last spend
        self._buckets[source] = (tokens, now)
        # The source quiet longest has refilled the most (forgetting a full bucket changes
        # nothing). Forgetting one still in debt forgives it, but keeping every source would
        # let a flood from many addresses grow this without bound, and scanning them all for
        # full buckets cost each spend a pass over every source once the bound was reached.
        while len(self._buckets) > _MAX_SOURCES:
            del self._buckets[next(iter(self._buckets))]
