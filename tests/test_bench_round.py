"""``anonml bench round``: its arithmetic on given figures, and (system) one small real round."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from anonml.base.process import anonml_command
from anonml.bench.round import (
    cost_rows,
    issuance_us_per_report,
    phase_costs,
    phase_seconds,
    report_lines,
    role_floors_us,
    role_of,
    synthetic_data,
)

FLOOR = {
    "sphinx_process_hop_us": 100.0,
    "sphinx_process_final_us": 70.0,
    "sphinx_build_4hop_us": 600.0,
    "token_create_us": 500.0,
    "token_verify_batch256_us": 230.0,
    "issue_us": 1400.0,
    "p256_mult_us": 50.0,
}


def test_each_role_floor_is_the_cryptography_one_report_needs_there() -> None:
    floors = role_floors_us(FLOOR, ["relay-0", "relay-1", "relay-2"], 3)
    assert floors == {"aggregator": 300.0, "relay-0": 100.0, "relay-1": 100.0, "relay-2": 100.0, "peers": 1100.0}
    # Paths of 3 over 5 relays: each relay carries 3/5 of the reports.
    assert role_floors_us(FLOOR, [f"relay-{i}" for i in range(5)], 3)["relay-4"] == pytest.approx(60.0)
    with pytest.raises(ValueError, match="a path of 4 hops over 3 relays"):
        role_floors_us(FLOOR, ["relay-0", "relay-1", "relay-2"], 4)


def test_cost_rows_divide_cpu_by_accepted_reports_and_by_the_floor() -> None:
    rows = cost_rows({"aggregator": 0.9, "relay-0": 0.2, "commands": 1.5}, {"aggregator": 210.0, "commands": 60.0},
                     {"aggregator": 300.0, "relay-0": 100.0, "peers": 1100.0}, accepted=1000)
    by_role = {row["role"]: row for row in rows}
    assert by_role["aggregator"] == {"role": "aggregator", "cpu_seconds": 0.9, "cpu_us_per_report": 900.0,
                                     "floor_us_per_report": 300.0, "x_floor": 3.0, "peak_rss_mb": 210.0}
    assert by_role["relay-0"]["x_floor"] == 2.0
    # A role that was never sampled still shows its floor; one without a floor has no ratio.
    assert by_role["peers"]["cpu_seconds"] == 0.0 and by_role["peers"]["x_floor"] == 0.0
    assert by_role["commands"]["floor_us_per_report"] is None and by_role["commands"]["x_floor"] is None
    assert all(row["cpu_us_per_report"] is None for row in cost_rows({"aggregator": 1.0}, {}, {}, accepted=0))


def test_issuance_is_spread_over_the_accepted_reports() -> None:
    # One credential per peer, two reports per peer: half a credential per report.
    assert issuance_us_per_report(1400.0, credentials=500, accepted=1000) == 700.0
    assert issuance_us_per_report(1400.0, credentials=500, accepted=0) is None


def test_phase_seconds_run_from_each_change_to_the_next() -> None:
    phases = [("registration", 12.0), ("issuance", 20.0), ("data", 31.5), ("done", 50.0)]
    assert phase_seconds(phases, started=10.0, ended=53.0) == [
        ("setup", 2.0), ("registration", 8.0), ("issuance", 11.5), ("data", 18.5), ("report and audit", 3.0),
    ]
    # A round whose status was never seen spent all its time setting up.
    assert phase_seconds([], started=0.0, ended=5.0) == [("setup", 5.0)]


def test_each_phase_gets_the_cpu_spent_between_its_start_and_the_next_phase() -> None:
    phases = [("registration", 12.0), ("issuance", 20.0), ("done", 30.0)]
    # CPU by role at the sample before each phase was first seen, then at the end.
    marks = [{"aggregator": 1.0, "peers": 0.5}, {"aggregator": 3.0, "peers": 4.5}, {"aggregator": 9.0, "peers": 8.5, "relay-0": 1.0}]
    final = {"aggregator": 9.5, "peers": 8.5, "relay-0": 1.0}
    rows = phase_costs(phases, marks, final, started=10.0, ended=34.0, peers=1000, n_cores=2)
    assert [row["phase"] for row in rows] == ["setup", "registration", "issuance", "report and audit"]
    setup, registration, issuance, audit = rows
    assert setup["cpu_by_role"] == {"aggregator": 1.0, "peers": 0.5} and setup["cpu_seconds"] == 1.5
    assert registration["cpu_by_role"] == {"aggregator": 2.0, "peers": 4.0}
    # 6 s of CPU over 1,000 peers in 8 s on 2 cores: 6 ms a peer, 6 / 16 of the machine busy.
    assert (registration["cpu_ms_per_peer"], registration["busy"]) == (6.0, 0.38)
    assert issuance["cpu_by_role"] == {"aggregator": 6.0, "peers": 4.0, "relay-0": 1.0}
    assert (issuance["seconds"], issuance["cpu_seconds"], issuance["busy"]) == (10.0, 11.0, 0.55)
    # The round's outcome ("done") gets no span: from it to the end is the report and audit.
    assert (audit["seconds"], audit["cpu_by_role"]["aggregator"]) == (4.0, 0.5)
    assert sum(row["cpu_seconds"] for row in rows) == sum(final.values())


def test_processes_are_told_apart_by_their_command_lines() -> None:
    python = ["/usr/bin/python3", "-c", "import sys; from anonml.cli import main; sys.exit(main())"]
    assert role_of([*python, "relay", "run", "--data-dir", "/tmp/w/relay-2"]) == "relay-2"
    assert role_of([*python, "aggregator", "run", "--data-dir", "/tmp/w/aggregator", "--round", "ab"]) == "aggregator"
    assert role_of(["/usr/bin/python3", "-m", "anonml.demo._swarm", "/tmp/w/peers/worker-0.json"]) == "peers"
    assert role_of([*python, "relay", "init", "--data-dir", "/tmp/w/relay-0"]) == "commands"


def test_synthetic_peers_come_from_the_seed() -> None:
    first, again, other = synthetic_data(50, 3), synthetic_data(50, 3), synthetic_data(50, 4)
    assert first.train_rows == again.train_rows and first.train_rows != other.train_rows
    assert len(first.train_rows) == 50 and len(first.test_labels) > 0
    assert all(len(row) == len(first.header) for row in first.train_rows)
    assert set(np.unique(first.train_labels)) <= {0, 1}
    with pytest.raises(ValueError, match="at least 1"):
        synthetic_data(0, 0)


def test_report_lines_show_each_role_beside_its_floor() -> None:
    result = {
        "peers": 8, "data": "synthetic", "phase": "done", "accepted": 1000, "wall_seconds": 60.0, "load_average": [1.0, 1.0, 1.0],
        "audit": {"accepted": 990, "prepared": 1000}, "path_length": 3, "cores": 2,
        "phases": [{"phase": "setup", "seconds": 2.0, "cpu_seconds": 1.0, "cpu_ms_per_peer": 125.0, "busy": 0.25}],
        "floor_us": FLOOR, "cpu_seconds_sampled": 2.6, "cpu_seconds_children_rusage": 2.7, "cpu_seconds_bench": 1.0,
        "peak_rss_mb_total": 500.0, "credentials": 500, "issuance_us_per_report": 700.0,
        "packets": {"sends": 2000, "covers": 1000, "resends": 0, "relay_forwarded": 6000},
        "roles": cost_rows({"aggregator": 0.9}, {"aggregator": 210.0}, {"aggregator": 300.0}, accepted=1000),
    }
    lines = report_lines(result)
    assert "990 of 1000 prepared messages accepted" in lines[0]
    assert lines[1] == "wall seconds per phase: setup 2.0"
    assert lines[2] == "CPU per phase (all roles; busy = share of the 2 cores used): setup 1.0 s = 125.0 ms/peer, busy 0.25"
    assert lines[4].split() == ["aggregator", "0.9", "900", "300", "3", "210"]
    assert lines[6].startswith("packets: 2000 sent by the peers (1000 covers, 0 resent), 6000 forwarded")
    assert "1400.0 µs per credential x 500 credentials = 700.0 µs per accepted report" in lines[7]


@pytest.mark.system
def test_a_small_round_reports_every_role_above_its_floor(tmp_path: object) -> None:
    done = subprocess.run(anonml_command("bench", "round", "--peers", "60", "--work-dir", str(tmp_path), "--json"),
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    roles = {row["role"]: row for row in result["roles"]}
    assert {"aggregator", "peers", "relay-0"} <= set(roles)
    for role in ("aggregator", "peers", "relay-0"):
        # Real work includes the floor's cryptography: nothing costs less than it.
        assert roles[role]["x_floor"] > 1.0, roles[role]
        assert roles[role]["peak_rss_mb"] > 0
    assert result["phases"][0]["phase"] == "setup" and result["phases"][-1]["phase"] == "report and audit"
    assert any(p["phase"].startswith("data") for p in result["phases"])
