"""AnonML: the ``anonml`` command and the whole-system entry points.

The roles live in their own top-level packages (``relay``, ``peer``,
``aggregator``, ``crypto``, ``mechanisms``); the protocol's shared vocabulary
lives in ``protocol``. This package only wires them into one command.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
