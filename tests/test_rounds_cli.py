"""Issue 15, the aggregator operator's side: a round spec is validated completely at
``round new``, relays are named by the files ``relay info --json`` writes, the
schedule's start is explicit and never in the past, rounds are listed and named by
short ids, and missing directories or reports get advice that fits."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from anonml.base.process import anonml_command
from anonml.cli import main
from test_aggregator_cli import write_spec


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def agg(tmp_path: Path) -> Path:
    data_dir = tmp_path / "agg"
    assert invoke("aggregator", "init", "--data-dir", str(data_dir))[0] == 0
    return data_dir


def round_new(agg: Path, spec: Path, *extra: str) -> tuple[int, str]:
    return invoke("aggregator", "round", "new", "--data-dir", str(agg), "--spec", str(spec), *extra)


def test_an_unknown_oracle_is_refused_at_round_new_naming_the_choices(agg: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "round.toml")
    spec.write_text(spec.read_text().replace('oracle = "auto"', 'oracle = "magic"'))
    code, output = round_new(agg, spec)
    assert code == 1
    assert "privacy.oracle" in output and "'magic'" in output and "one of grr, sue, pq" in output
    assert "Traceback" not in output
    assert not (agg / "rounds").exists() or not any((agg / "rounds").iterdir())


def test_every_registry_name_is_checked(agg: Path, tmp_path: Path) -> None:
    for old, new, field in (('plan = "split"', 'plan = "zigzag"', "learning.plan"), ('learner = "logreg"', 'learner = "forest"', "learning.learner")):
        spec = write_spec(tmp_path / "round.toml")
        spec.write_text(spec.read_text().replace(old, new))
        code, output = round_new(agg, spec)
        assert code == 1 and field in output, output


def test_relays_are_named_by_the_files_relay_info_writes(agg: Path, tmp_path: Path) -> None:
    relay_dir = tmp_path / "relay"
    assert invoke("relay", "init", "--data-dir", str(relay_dir), "--listen", "127.0.0.1:9911")[0] == 0
    info = subprocess.run(anonml_command("relay", "info", "--data-dir", str(relay_dir), "--json"), capture_output=True, text=True, check=True)
    (tmp_path / "relay-1.json").write_text(info.stdout)
    descriptor = json.loads(info.stdout)
    spec = write_spec(tmp_path / "round.toml", register=60)
    text = re.sub(r"relays = \[.*\]", 'relays = ["relay-1.json"]', spec.read_text())
    spec.write_text(text)
    code, output = round_new(agg, spec)
    assert code == 0, output
    round_id = output.strip().splitlines()[-1]
    from anonml.aggregator import AggregatorHome, open_round

    [relay] = open_round(AggregatorHome(agg), round_id).manifest.relays
    assert (relay.node_id.hex(), relay.port, relay.public_key.hex()) == (descriptor["node_id"], 9911, descriptor["public_key"])
    # A file that is not there names the command that writes it.
    spec.write_text(text.replace("relay-1.json", "relay-2.json"))
    code, output = round_new(agg, spec)
    assert code == 1 and "network.relays[0]" in output and "relay info" in output and "--json" in output


def test_a_schedule_that_has_started_is_refused_and_start_can_be_set(agg: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "round.toml", register=60)
    past = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 3600))
    spec.write_text(spec.read_text().replace("[schedule]\n", f"[schedule]\nstart = {past}\n"))
    code, output = round_new(agg, spec)
    assert code == 1 and "ago" in output and "--start" in output and "Traceback" not in output
    spec = write_spec(tmp_path / "round2.toml", register=60)
    before = int(time.time())
    code, output = round_new(agg, spec, "--start", "+10m")
    assert code == 0, output
    from anonml.aggregator import AggregatorHome, open_round

    schedule = open_round(AggregatorHome(agg), output.strip().splitlines()[-1]).manifest.schedule
    assert before + 600 + 60 <= schedule.t_register_end <= int(time.time()) + 600 + 60
    # round new says when registration closes, in local time, and what must be running by then.
    local = time.strftime("%Y-%m-%d %H:%M", time.localtime(schedule.t_register_end))
    assert f"registration closes {local}" in output and "aggregator run" in output


def new_rounds(agg: Path, tmp_path: Path, count: int, pause: float = 0.0) -> list[str]:
    """The ids of ``count`` rounds made one after the other (``pause`` seconds after each), registration open a minute."""
    ids = []
    for i in range(count):
        code, output = round_new(agg, write_spec(tmp_path / f"round{i}.toml", register=60))
        assert code == 0, output
        ids.append(output.strip().splitlines()[-1])
        time.sleep(pause)
    return ids


def test_rounds_are_listed_and_a_unique_short_id_names_a_round(agg: Path, tmp_path: Path) -> None:
    ids = new_rounds(agg, tmp_path, 2)
    code, listing = invoke("aggregator", "rounds", "--data-dir", str(agg), "--json")
    assert code == 0
    listed = json.loads(listing)
    assert {item["round_id"] for item in listed} == set(ids)
    assert all(item["status"].startswith("waiting: start `aggregator run`") for item in listed)
    code, table = invoke("aggregator", "rounds", "--data-dir", str(agg))
    assert code == 0 and all(round_id[:16] in table for round_id in ids)
    # A short id is enough for `report`; a round without a report says what finishes it.
    code, output = invoke("aggregator", "report", "--data-dir", str(agg), ids[0][:16])
    assert code == 1 and "has no report yet" in output and "aggregator run" in output and ids[0][:16] in output
    code, output = invoke("aggregator", "report", "--data-dir", str(agg), "ffff" if not any(i.startswith("ffff") for i in ids) else "eeee")
    assert code == 1 and "aggregator rounds" in output


def test_missing_directories_get_advice_that_fits(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    for args in (("rounds",), ("report", "abc"), ("run",)):
        code, output = invoke("aggregator", *args, "--data-dir", str(missing)) if args[0] != "report" else invoke("aggregator", "report", "--data-dir", str(missing), "abc")
        assert code == 1
        assert "no aggregator data directory" in output and "aggregator init" in output
        assert "round new" not in output and "has it finished" not in output


def test_run_refuses_a_round_whose_registration_closed_before_it_was_served(agg: Path, tmp_path: Path) -> None:
    code, output = round_new(agg, write_spec(tmp_path / "round.toml", register=1))
    assert code == 0
    time.sleep(1.5)
    code, listing = invoke("aggregator", "rounds", "--data-dir", str(agg), "--json")
    [item] = json.loads(listing)
    # The listing says so, and does not send the operator to a `run` that refuses the round.
    assert item["status"].startswith("never served") and "resume" not in item["status"]
    code, output = invoke("aggregator", "run", "--data-dir", str(agg))
    assert code == 1
    assert "registration for this round closed" in output and "--start" in output


def test_rounds_keep_the_order_they_were_made_in_and_the_newest_is_the_default(agg: Path, tmp_path: Path) -> None:
    """Sorted by the time `round new` recorded, not the directory's time (which opening a database changes)."""
    import os

    ids = new_rounds(agg, tmp_path, 2, pause=1.1)  # creation times are whole seconds
    # The older round's directory and database look newer, as after a listing or a run opened them.
    for path in (agg / "rounds" / ids[0], agg / "rounds" / ids[0] / "round.sqlite"):
        os.utime(path, (time.time() + 60, time.time() + 60))
    for _ in range(2):
        code, listing = invoke("aggregator", "rounds", "--data-dir", str(agg), "--json")
        assert code == 0 and [item["round_id"] for item in json.loads(listing)] == ids
    code, output = invoke("aggregator", "report", "--data-dir", str(agg))
    assert code == 1 and ids[1][:16] in output and ids[0][:16] not in output
