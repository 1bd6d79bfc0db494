"""``python -m relay ...`` is ``anonml relay ...``."""

from __future__ import annotations

from anonml.relay._cli import relay

relay(prog_name="python -m relay")
