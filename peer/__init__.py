"""The peer: computes features locally, perturbs them, and sends each subset
as one anonymous packet."""

from __future__ import annotations

__all__: list[str] = []
