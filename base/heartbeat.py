"""A line every minute from a long-running command that otherwise has nothing to say.

``relay run`` forwards for hours and a piped ``peer join`` waits minutes
between steps; without a periodic line an operator cannot tell a quiet
process from a stuck one (issue 29).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

HEARTBEAT_SECONDS = 60.0


async def heartbeat(line: Callable[[], str], emit: Callable[[str], None], every: float = HEARTBEAT_SECONDS) -> None:
    """Emit ``line()`` every ``every`` seconds until cancelled."""
    while True:
        await trio.sleep(every)
        emit(line())
