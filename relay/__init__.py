"""The relay: a mix node that holds Sphinx packets and re-times them inside
published release windows."""

from __future__ import annotations

__all__: list[str] = []
