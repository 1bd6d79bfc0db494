"""Child processes of a benchmark (a relay, an aggregator, an attacker): none outlives it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def child_processes(*, grace: float = 30.0) -> Iterator[list[subprocess.Popen[str]]]:
    """A list to start children into; on exit each is asked to stop (its stdin closed: the benchmark's
    children exit at end of input), given ``grace`` seconds, then killed."""
    processes: list[subprocess.Popen[str]] = []
    try:
        yield processes
    finally:
        for process in processes:
            if process.stdin is not None:
                process.stdin.close()
        for process in processes:
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
