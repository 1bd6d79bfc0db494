"""Issue 15's newcomer walk: the README's commands and every bad input a newcomer
tried, each as its own process, as a person types them. None may print a
traceback; each refusal names its fix. The two walks, a dozen and twenty processes
in a row, are in the system suite; the full demo runs in test_demo.py and
test_dashboard_browser.py, both system tests too."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from anonml.base.process import anonml_command
from test_aggregator_cli import free_port, write_spec

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def anonml(*args: str, timeout: float = 120, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*prefix, *anonml_command(*args)], capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


def refused(result: subprocess.CompletedProcess[str], *fix: str) -> str:
    """The one-line refusal; it must name each of ``fix``."""
    assert result.returncode != 0, result.stdout
    text = result.stdout + result.stderr
    for words in fix:
        assert words in text, text
    return text


def test_help_and_the_startup_benchmark() -> None:
    assert "aggregator" in anonml("--help").stdout
    run = anonml("bench", "startup", "--repetitions", "2", "--command", "", "--command", "relay run", "--json")
    figures = json.loads(run.stdout)
    assert [row["command"] for row in figures["commands"]] == ["anonml --help", "anonml relay run --help"]
    assert all(row["help_median_s"] > 0 and row["python_pass_median_s"] > 0 for row in figures["commands"])
    assert run.returncode == (1 if any(row["ratio"] > figures["max_ratio"] for row in figures["commands"]) else 0)


# System: about twenty CLI processes in a row (72 s at load 8-19; 12-24 s quiet, the fast suite's slowest test).
@pytest.mark.system
def test_an_operators_walk_from_init_to_a_peers_dry_run(tmp_path: Path) -> None:
    agg, relay, me = tmp_path / "agg", tmp_path / "relay", tmp_path / "me"
    identity = re.search(r"identity ([0-9a-f]{64})", anonml("aggregator", "init", "--data-dir", str(agg)).stdout).group(1)  # type: ignore[union-attr]
    spec = write_spec(tmp_path / "round.toml", register=600)
    http_port = int(re.search(r"http_port = (\d+)", spec.read_text()).group(1))  # type: ignore[union-attr]
    anonml("relay", "init", "--data-dir", str(relay), "--listen", f"127.0.0.1:{free_port()}", "--aggregator", f"{identity}@http://127.0.0.1:{http_port}")
    (tmp_path / "relay-1.json").write_text(anonml("relay", "info", "--data-dir", str(relay), "--json").stdout)
    spec.write_text(re.sub(r"relays = \[.*\]", 'relays = ["relay-1.json"]', spec.read_text()))
    created = anonml("aggregator", "round", "new", "--data-dir", str(agg), "--spec", str(spec))
    assert created.returncode == 0 and "registration closes" in created.stderr
    short = created.stdout.strip()[:16]
    assert short in anonml("aggregator", "rounds", "--data-dir", str(agg)).stdout
    refused(anonml("aggregator", "report", "--data-dir", str(agg), short), "has no report yet", "aggregator run")
    served = subprocess.Popen(anonml_command("aggregator", "run", "--data-dir", str(agg), "--round", short),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    relay_process = subprocess.Popen(anonml_command("relay", "run", "--data-dir", str(relay)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        anonml("peer", "init", "--data-dir", str(me))
        data = tmp_path / "me.csv"
        data.write_text("colour,size,y\nred,4,1\n")
        url = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + 60
        while True:
            shown = anonml("peer", "join", "--data-dir", str(me), "--aggregator", url, "--data", str(data), "--dry-run")
            if shown.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # `aggregator run` is still starting
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "nothing was sent" in shown.stdout and "times (e^" in shown.stdout and "your data packet(s) leave" in shown.stdout
        assert "Lifetime budget: 10 over all rounds" in shown.stdout
        # A lifetime budget below what this round may cost: the dry run refuses it and names the command.
        assert "spent 0 of the lifetime budget 10" in anonml("peer", "budget", "--data-dir", str(me)).stdout
        assert "lifetime budget 0.5" in anonml("peer", "budget", "--data-dir", str(me), "--lifetime", "0.5").stdout
        refused(anonml("peer", "join", "--data-dir", str(me), "--aggregator", url, "--data", str(data), "--dry-run"),
                "over your lifetime budget of 0.5", "anonml peer budget")
        # The same data directory again (so the same ports): the lock names the process and the fix
        # (issue 14: a second run used to start until it met the port).
        refused(anonml("aggregator", "run", "--data-dir", str(agg), "--round", short), "is in use by pid",
                "only one `anonml aggregator run`", "stop that one first")
        time.sleep(1.5)
    finally:
        served.send_signal(signal.SIGINT)
        out, err = served.communicate(timeout=60)
        relay_process.send_signal(signal.SIGINT)
        relay_err = relay_process.communicate(timeout=60)[1]
    assert "Traceback" not in err + relay_err
    # Piped, `aggregator run` prints its progress as lines while it serves.
    assert "live dashboard: " in err and re.search(r"\[\d\d:\d\d:\d\d\] phase registration; next registration closes at", err), err
    assert "resumes the round" in err


# System: a dozen CLI processes in a row (42 s at load 8-19, 8-19 s quiet).
@pytest.mark.system
def test_bad_inputs_fail_fast_and_name_their_fix(tmp_path: Path) -> None:
    anonml("peer", "init", "--data-dir", str(tmp_path / "me"))
    data = tmp_path / "me.csv"
    data.write_text("colour,size,y\nred,4,1\n")
    join = ("peer", "join", "--data-dir", str(tmp_path / "me"), "--data", str(data), "--dry-run", "--aggregator")
    refused(anonml(*join, "127.0.0.1:8080"), "does not start with http://", "--aggregator http://")
    refused(anonml("peer", "budget", "--data-dir", str(tmp_path / "me"), "--lifetime", "inf"), "--lifetime", "positive number")
    # Nothing listens on a port just freed: refused at once, not after 120 s of retries.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused(anonml(*join, f"http://127.0.0.1:{port}", timeout=60), "nothing answers at", "aggregator run")
    # An unknown host, looked up in a network namespace of its own (no interface: no query leaves).
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        refused(anonml(*join, "http://no-such-host.invalid:8080", timeout=60, prefix=("unshare", "-n")), "does not resolve", "--aggregator")
    refused(anonml("demo", "--dataset", "adult", "--data-dir", "/nonexistent"), "adult.data", "--data-dir")
    refused(anonml("experiment", "adult", "--data-dir", str(SHARED / "data" / "adult"), "--epsilon", "1e-300"), "--epsilon", "1e-06")
    agg = tmp_path / "agg"
    refused(anonml("aggregator", "rounds", "--data-dir", str(agg)), "no aggregator data directory", "aggregator init")
    anonml("aggregator", "init", "--data-dir", str(agg))
    refused(anonml("aggregator", "report", "--data-dir", str(agg)), "no rounds", "round new")
    spec = write_spec(tmp_path / "round.toml")
    spec.write_text(spec.read_text().replace('oracle = "auto"', 'oracle = "magic"'))
    refused(anonml("aggregator", "round", "new", "--data-dir", str(agg), "--spec", str(spec)), "privacy.oracle", "one of grr, sue")


@pytest.mark.parametrize("debug", [False, True])
def test_debug_shows_the_traceback_only_when_asked(tmp_path: Path, debug: bool) -> None:
    args = ("--debug",) if debug else ()
    result = subprocess.run(anonml_command(*args, "aggregator", "rounds", "--data-dir", str(tmp_path / "none")), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert ("Traceback" in result.stderr) == debug
