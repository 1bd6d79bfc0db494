"""Relay and aggregator under a low open-file limit (issue 25): the soft limit is raised to the hard
one at start, the connection caps fit what is left, and below the minimum the process refuses to
start with one line. Each runs as a child process whose RLIMIT_NOFILE is set before it starts."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from test_aggregator_cli import new_round

from anonml.crypto import SphinxGeometry
from anonml.testing import loopback_relay
from anonml.transport import DescriptorLimitError, fit_connection_caps
from anonml.transport._admission import holding_room

COMMAND = [sys.executable, "-c", "import sys; from anonml.cli import main; sys.exit(main())"]


def limited(soft: int, hard: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


def run_limited(args: list[str], soft: int, hard: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=60,
                          preexec_fn=limited(soft, hard))


def read_until(child: subprocess.Popen[str], needle: str) -> list[str]:
    """The child's stderr lines up to the first that contains ``needle`` (fails if it exits first)."""
    assert child.stderr is not None
    lines: list[str] = []
    while not any(needle in line for line in lines):
        line = child.stderr.readline()
        assert line, "".join(lines)
        lines.append(line)
    return lines


def test_caps_share_what_the_limit_leaves_after_each_minimum() -> None:
    wanted, minimum = {"link": 256, "mirror": 128}, {"link": 64, "mirror": 16}
    assert fit_connection_caps(wanted, minimum, reserve=128, limit=20_000, server="relay") == wanted
    # Each listener holds up to a quarter of its cap (at least one) of refused connections open besides:
    # (256 - 128 - 2) * 4 // 5 - 80 = 20 spare slots, shared 192 : 112; with their held ones, 123 descriptors.
    caps = fit_connection_caps(wanted, minimum, reserve=128, limit=256, server="relay")
    assert caps == {"link": 76, "mirror": 23} and sum(cap + holding_room(cap) for cap in caps.values()) <= 256 - 128
    with pytest.raises(DescriptorLimitError, match=r"^relay: the open-file limit \(RLIMIT_NOFILE\) is 200, below the 228"):
        fit_connection_caps(wanted, minimum, reserve=128, limit=200, server="relay")


def test_a_relay_raises_its_soft_limit_and_refuses_a_hard_limit_below_its_minimum(tmp_path: Path) -> None:
    geometry = SphinxGeometry.create(max_hops=2, packet_size=1024)
    data_dir = tmp_path / "relay"
    loopback_relay(data_dir, geometry, next_hops=[], mirror=("127.0.0.1", 0))
    refused = run_limited(["relay", "run", "--data-dir", str(data_dir)], 150, 150)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    [line] = [line for line in refused.stderr.splitlines() if "RLIMIT_NOFILE" in line]
    assert "is 150, below the 232 it needs" in line and "ulimit -n" in line
    # A soft limit of 64 (a process could not even hold its slots) with room under the hard one: it serves.
    command = [*COMMAND, "relay", "run", "--data-dir", str(data_dir)]
    child = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=limited(64, 4096))
    try:
        lines = read_until(child, "event=listening")
        limits = open(f"/proc/{child.pid}/limits").read()
        assert [row for row in limits.splitlines() if row.startswith("Max open files")][0].split()[3:5] == ["4096", "4096"]
        assert not any("connections-capped-by-descriptor-limit" in line for line in lines)
    finally:
        child.kill()
        child.wait()


def test_an_aggregator_refuses_a_limit_below_its_minimum_and_serves_with_caps_that_fit(tmp_path: Path) -> None:
    data_dir = new_round(tmp_path, register=600)
    refused = run_limited(["aggregator", "run", "--data-dir", str(data_dir)], 60, 60)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "aggregator: the open-file limit (RLIMIT_NOFILE) is 60, below the" in refused.stderr
    # The 256: served, with the API's and the sink's caps lowered to fit.
    command = [*COMMAND, "aggregator", "run", "--data-dir", str(data_dir)]
    child = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=limited(256, 256))
    try:
        lines = read_until(child, "serving")
        assert any("connection caps lowered to fit the open-file limit" in line for line in lines), lines
        workers = psutil.Process(child.pid).children(recursive=True)
    finally:
        # SIGTERM: the aggregator stops its verification worker too (a SIGKILL left it running, orphaned).
        child.terminate()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    assert workers and psutil.wait_procs(workers, timeout=30)[1] == []
