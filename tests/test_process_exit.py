"""``base.process.exit_with_parent``: a pool's workers end with their parent, however it ends."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from process_support import assert_sigkill_leaves_no_survivor

POOL = """
import multiprocessing, sys, time
from concurrent.futures import ProcessPoolExecutor
from anonml.base.process import exit_with_parent

if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[1])
    with ProcessPoolExecutor(2, mp_context=context, initializer=exit_with_parent) as pool:
        list(pool.map(time.sleep, [0.2, 0.2]))
        print("ready", flush=True)
        time.sleep(600)
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_pool_workers_end_when_their_parent_is_killed(start_method: str) -> None:
    """`anonml simulate`'s pool (fork) and the aggregator's verification workers (spawn): a SIGKILLed
    parent shuts no pool down, and its workers waited on their task queue for ever."""
    parent = subprocess.Popen([sys.executable, "-c", POOL, start_method], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        workers = psutil.Process(parent.pid).children(recursive=True)
        assert len(workers) >= 2
        assert_sigkill_leaves_no_survivor(parent, workers)
    finally:
        parent.kill()
