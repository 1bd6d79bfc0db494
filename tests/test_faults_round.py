"""``anonml bench faults`` on a whole round: a relay killed for good in the data
phase is routed around (the demo runs more relays than a path is long), and
the bench's exit code and audit say so."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from anonml.base.process import anonml_command

# System suite: the demo's own processes, its windows in wall-clock seconds.
pytestmark = [pytest.mark.system, pytest.mark.usefixtures("machine_share")]

# A guard against a hang (a 24-peer round is planned at about a minute here), not a timing assertion.
HANG_GUARD_SECONDS = 900


def test_a_round_survives_a_relay_killed_for_good_in_the_data_phase(tmp_path: Path) -> None:
    ran = subprocess.run(
        anonml_command("bench", "faults", "--peers", "24", "--events", "0", "--drop", "0", "--reset", "0", "--delay", "0",
                       "--relay-down-for-good", "--max-lost-share", "0.01", "--work-dir", str(tmp_path), "--json"),
        capture_output=True, text=True, timeout=HANG_GUARD_SECONDS,
    )
    result = json.loads(ran.stdout)
    assert ran.returncode == 0, result["failures"]
    (gone,) = result["kills"]
    assert (gone["outcome"], gone["phase"], gone["planned"]) == ("killed for good", "data", "data, first attempt")
    # It never came back: the supervisor restarted nothing.
    assert result["restarts"] == []
    assert result["relays"] > result["path_length"]
    assert result["round"]["status"] == "done"
    assert result["accepted_fraction"] >= 0.99
    assert result["audit"]["counted_twice"] == 0 and result["audit"]["unknown_accepted"] == 0


@pytest.mark.usefixtures("postgres_server")  # skips without PostgreSQL (fails in CI); the bench starts a server of its own
def test_ingest_workers_killed_in_the_data_phase_lose_nothing_through_the_real_relays_on_postgresql(tmp_path: Path) -> None:
    """Issue 27: the round's driver and two ingest workers share the round on PostgreSQL; every kill is a
    worker's, inside the data phase, while every link (peers, relays, the driver's and each worker's sink)
    drops, resets and delays connections. The relays deliver to all three sink addresses and route around a
    dead one; nothing may be lost or counted twice."""
    ran = subprocess.run(
        anonml_command("bench", "faults", "--peers", "24", "--ingest-workers", "2", "--kill-workers-only", "--events", "4",
                       "--data-kills", "4", "--store", "postgresql", "--work-dir", str(tmp_path), "--json"),
        capture_output=True, text=True, timeout=HANG_GUARD_SECONDS,
    )
    result = json.loads(ran.stdout)
    assert ran.returncode == 0, result["failures"]
    assert result["store"] == "postgresql" and result["round"]["status"] == "done"
    assert len(result["kills"]) == 4 and {kill["target"] for kill in result["kills"]} <= {"ingest-0", "ingest-1"}
    assert sum(1 for kill in result["kills"] if kill["outcome"] == "killed") >= 3
    assert result["audit"]["lost"] == 0 and result["audit"]["counted_twice"] == 0 and result["audit"]["unknown_accepted"] == 0
    # Every sink address took packets: the workers were in the round, not beside it.
    assert all(count > 0 for count in result["sink_deliveries"].values()), result["sink_deliveries"]
