"""Shared by the command tests: a long-running command started as a child process, and what is left of
its processes once it is killed."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psutil


@contextmanager
def running_until(command: Sequence[str], marker: str, *, within: float) -> Iterator[subprocess.Popen[str]]:
    """``command`` as a child process, once a line of its stderr holds ``marker``.

    Fails if the child exits or ``within`` seconds pass first; the child is
    killed on the way out if it still runs (a test that stops it itself
    checks how it ended).
    """
    child = subprocess.Popen(list(command), stderr=subprocess.PIPE, text=True)
    try:
        assert child.stderr is not None
        deadline = time.monotonic() + within
        while marker not in child.stderr.readline():
            assert time.monotonic() < deadline and child.poll() is None, f"{command!r} never printed {marker!r}"
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def assert_sigkill_leaves_no_survivor(process: subprocess.Popen[str] | subprocess.Popen[bytes],
                                      family: Sequence[psutil.Process]) -> None:
    """SIGKILL ``process`` (it runs no clean-up) and check that every one of ``family``, the processes it
    started, is gone within 30 s."""
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    _, alive = psutil.wait_procs(family, timeout=30)
    assert alive == [], alive
