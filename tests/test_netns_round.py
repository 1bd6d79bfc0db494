"""``anonml bench netns`` (a round whose aggregator, relays and peers each run in their own network namespace):
no namespace or process outlives the bench, also when a signal stops it. Needs root and iproute2 (skips with the
reason otherwise).

The whole round at 25 ms and 1% loss is the bench's own check (it exits non-zero below 99% accepted or off
chance), not a test here: 2 of the first 6 40-peer rounds failed in registration (peers' requests reset until
their deadline), cause not yet found (README "Across network hosts"), and a test that may not fail checks nothing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from anonml.base.process import anonml_command
from anonml.bench._netns import PREFIX, listed_namespaces, missing_tools

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("machine_share")]


@pytest.fixture(autouse=True)
def needs_namespaces() -> None:
    reason = missing_tools() if shutil.which("ip") else "`ip` (iproute2) is not installed"
    if reason is not None:
        pytest.skip(f"no network namespaces here: {reason}")


def namespaces_of(pid: int) -> list[str]:
    return [name for name in listed_namespaces() if name.startswith(f"{PREFIX}{pid}-")]


def test_a_signal_to_the_bench_removes_its_namespaces_and_every_process_in_them(tmp_path: Path) -> None:
    bench = subprocess.Popen(anonml_command("bench", "netns", "--peers", "40", "--work-dir", str(tmp_path)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Once the round's driver has started its relays, the namespaces hold processes.
        deadline = time.monotonic() + 300
        while not list((tmp_path / "round" / "logs").glob("relay-0.log")):
            assert bench.poll() is None and time.monotonic() < deadline, "the bench ended before its round started"
            time.sleep(0.2)
        names = namespaces_of(bench.pid)
        assert len(names) == 9
        running = [pid for name in names for pid in subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                                                                   text=True, check=True).stdout.split()]
        assert running
        bench.send_signal(signal.SIGINT)
        assert bench.wait(timeout=120) == 128 + signal.SIGINT
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert namespaces_of(bench.pid) == []
    assert not [pid for pid in running if os.path.exists(f"/proc/{pid}")]
