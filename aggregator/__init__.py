"""The aggregator: runs a round, verifies tokens, estimates histograms and
trains the partition-ensemble learner."""

from __future__ import annotations

__all__: list[str] = []
