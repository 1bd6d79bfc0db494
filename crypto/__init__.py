"""Cryptographic recipes: Sphinx packets and one-per-survey anonymous tokens.

Recipes compose the small primitive helpers kept in their own modules; nothing
here does raw cipher or group arithmetic inline.
"""

from __future__ import annotations

__all__: list[str] = []
