"""The reaper: ends the demo's process groups when the demo ends, however it ends.

Each of the demo's children runs in a session and process group of its own
(``_children``), so no signal meant for the demo reaches it by accident. The
demo stops them all on its way out, but a SIGKILLed demo runs no clean-up:
its relays, its aggregator and the peers' workers kept running and kept
their ports.

:func:`open_children` starts this process first, with the read end of a pipe
as its stdin, and writes one line to that pipe for each child process
group it starts (``+PGID``) and each one that ended (``-PGID``). The kernel
closes the write end when the demo exits, whatever ended it, and this
process reads end-of-file: it sends SIGTERM to every group still listed,
then SIGKILL to whatever is left after the grace period. After a clean stop
no group is still listed and it exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import BinaryIO

# A line is a sign and a process id: far below this; a longer one is not the demo's.
MAX_LINE = 32


def read_groups(lines: BinaryIO) -> set[int]:
    """The process groups still listed when ``lines`` ends: each ``+PGID`` adds one, each ``-PGID`` removes it.

    Any other line (the demo writes none) is reported on stderr and skipped, so
    the reaper keeps every group it was told of.
    """
    groups: set[int] = set()
    while line := lines.readline(MAX_LINE):
        sign, number = line[:1], line[1:].strip()
        if sign in (b"+", b"-") and number.isdigit() and 1 < int(number) < 2**22:
            (groups.add if sign == b"+" else groups.discard)(int(number))
        else:
            print(f"anonml demo reaper: skipped a line that is not +PGID or -PGID: {line[:MAX_LINE]!r}", file=sys.stderr)
    return groups


def end_groups(groups: Iterable[int], grace: float) -> None:
    """SIGTERM each group, then SIGKILL each one still there after ``grace`` seconds."""
    live = {group for group in groups if _signal_group(group, signal.SIGTERM)}
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = {group for group in live if _signal_group(group, 0)}
    for group in live:
        _signal_group(group, signal.SIGKILL)


def _signal_group(group: int, signum: int) -> bool:
    """Send ``signum`` to the group; False if no process of it is left."""
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        return False
    except PermissionError:  # its pid was reused by someone else's process: not ours to signal
        return False
    return True


def main(argv: list[str]) -> None:
    """``python -m anonml.demo._reaper GRACE_SECONDS`` (the demo's own grace: _children.STOP_GRACE_SECONDS)."""
    end_groups(read_groups(sys.stdin.buffer), float(argv[1]))


if __name__ == "__main__":
    main(sys.argv)
