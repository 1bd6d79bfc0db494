"""Local differential privacy: frequency oracles, post-processing, private
quantiles, numeric mechanisms and the privacy-budget ledger."""

from __future__ import annotations

__all__: list[str] = []
