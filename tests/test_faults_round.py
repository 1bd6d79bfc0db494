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
