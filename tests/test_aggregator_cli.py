"""``anonml aggregator``: init, round new (spec validation), run (minimum participation), report."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from process_support import assert_sigkill_leaves_no_survivor, running_until

from anonml.base.process import anonml_command
from anonml.cli import main
from anonml.demo import free_port

SPEC = """
name = "cli-round"
[task]
label = {{ name = "y", positive = ["1"], negative = ["0"] }}
features = [
  {{ name = "colour", type = "categorical", categories = ["red", "green"] }},
  {{ name = "size", type = "numeric", low = 0, high = 10 }},
]
[learning]
k_p = 2
k_h = 1
k_s = 1
plan = "split"
learner = "logreg"
[privacy]
eps_total = {eps}
oracle = "auto"
[schedule]
register = {register}
issue = 1
median_rounds = 1
median_send = 1
median_delivery = 3
data_send = 1
data_delivery = 3
[network]
relays = [{{ node_id = "{node}", host = "127.0.0.1", port = 9100, public_key = "{key}", key_epoch = 1 }}]
path_length = 1
http_host = "127.0.0.1"
http_port = {http}
sink_host = "127.0.0.1"
sink_port = {sink}
[participation]
min_participation = 3
registration = "open"
purpose = "test"
min_anonymity_set = 1
"""



def write_spec(path: Path, eps: str = "2.0", register: int = 1) -> Path:
    path.write_text(SPEC.format(eps=eps, register=register, node="01" * 16, key="02" * 32, http=free_port(), sink=free_port()))
    return path


def new_round(tmp_path: Path, register: int) -> Path:
    """`aggregator init` and `round new` with :func:`write_spec`'s round (registration open ``register`` s); the data dir."""
    runner = CliRunner()
    data_dir = tmp_path / "agg"
    assert runner.invoke(main, ["aggregator", "init", "--data-dir", str(data_dir)]).exit_code == 0
    write_spec(tmp_path / "round.toml", register=register)
    created = runner.invoke(main, ["aggregator", "round", "new", "--data-dir", str(data_dir), "--spec", str(tmp_path / "round.toml")])
    assert created.exit_code == 0, created.output
    return data_dir


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(main, ["aggregator", "init", "--data-dir", str(tmp_path / "agg")])
    assert first.exit_code == 0, first.output
    assert (tmp_path / "agg" / "identity.key").stat().st_mode & 0o077 == 0
    before = (tmp_path / "agg" / "identity.key").read_bytes()
    second = runner.invoke(main, ["aggregator", "init", "--data-dir", str(tmp_path / "agg")])
    assert second.exit_code != 0 and "refusing" in second.output
    assert (tmp_path / "agg" / "identity.key").read_bytes() == before


def test_malformed_spec_names_the_field(tmp_path: Path) -> None:
    runner = CliRunner()
    runner.invoke(main, ["aggregator", "init", "--data-dir", str(tmp_path / "agg")])
    spec = write_spec(tmp_path / "round.toml", eps='"lots"')
    result = runner.invoke(main, ["aggregator", "round", "new", "--data-dir", str(tmp_path / "agg"), "--spec", str(spec)])
    assert result.exit_code != 0
    assert "privacy.eps_total" in result.output


def test_round_new_with_plan_auto_prints_the_planners_choice(tmp_path: Path) -> None:
    runner = CliRunner()
    runner.invoke(main, ["aggregator", "init", "--data-dir", str(tmp_path / "agg")])
    spec = write_spec(tmp_path / "round.toml")
    fixed = 'k_p = 2\nk_h = 1\nk_s = 1\nplan = "split"\n'
    spec.write_text(spec.read_text().replace(fixed, 'plan = "auto"\nexpected_peers = 200\n'))
    created = runner.invoke(main, ["aggregator", "round", "new", "--data-dir", str(tmp_path / "agg"), "--spec", str(spec)])
    assert created.exit_code == 0, created.output
    assert "simulating the round's candidate plans for 200 peers" in created.stderr
    assert "the planner chose one kp=" in created.stderr and "simulated AUC" in created.stderr


# System suite: a real `aggregator run` serving a registration window nobody joins (20 s at least).
@pytest.mark.system
def test_round_missing_participation_exits_with_a_clear_status(tmp_path: Path) -> None:
    runner = CliRunner()
    runner.invoke(main, ["aggregator", "init", "--data-dir", str(tmp_path / "agg")])
    # Registration stays open long enough for `aggregator run` to start serving on a loaded machine:
    # five times a process start timed now (6 s closed before it served at load 13-20, where its
    # start took 8 s; 20 s closed before it served beside four busy loops and a 398-peer demo).
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import anonml.aggregator"], check=True, timeout=300)
    register = max(20, math.ceil(5 * (time.monotonic() - started)))
    spec = write_spec(tmp_path / "round.toml", register=register)
    created = runner.invoke(main, ["aggregator", "round", "new", "--data-dir", str(tmp_path / "agg"), "--spec", str(spec)])
    assert created.exit_code == 0, created.output
    round_id = created.stdout.strip().splitlines()[-1]
    assert len(bytes.fromhex(round_id)) == 32
    # A real process: serves, nobody registers, the round fails when registration closes.
    result = subprocess.run(
        [sys.executable, "-c", "from anonml.cli import main; main()", "aggregator", "run", "--data-dir", str(tmp_path / "agg"), "--round", round_id,
         "--linger", "0"],
        capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 3, result.stderr
    assert "minimum participation" in result.stderr
    assert (tmp_path / "agg" / "rounds" / round_id / "report.json").is_file()
    summary = runner.invoke(main, ["aggregator", "report", "--data-dir", str(tmp_path / "agg"), round_id])
    assert summary.exit_code == 0 and "failed" in summary.output


def test_the_documented_example_spec_is_valid() -> None:
    import tomllib

    from anonml.aggregator._spec import parse_round_spec
    from anonml.aggregator._spec_example import ROUND_SPEC_EXAMPLE

    relay = '{ node_id = "%s", host = "127.0.0.1", port = %d, public_key = "%s", key_epoch = 1 },'
    relays = "\n".join(relay % (f"{i:02x}" * 16, 9001 + i, f"{i + 16:02x}" * 32) for i in range(3))
    text = ROUND_SPEC_EXAMPLE.replace('  "relay-1.json",', "").replace(
        '{ node_id = "<hex>", host = "127.0.0.1", port = 9001, public_key = "<hex>", key_epoch = 1 },', relays
    )
    spec = parse_round_spec(tomllib.loads(text))
    assert spec.learning.k_p == 8 and spec.schedule.median_rounds == 4 and len(spec.network.relays) == 3
    # The example shows the defaults: a spec that leaves the windows out gets the same, in minutes.
    document = tomllib.loads(text)
    for name in ("register", "issue", "median_send", "median_delivery", "data_send", "data_delivery"):
        del document["schedule"][name]
    defaults = parse_round_spec(document)
    assert (defaults.schedule.register, defaults.schedule.issue) == (spec.schedule.register, spec.schedule.issue) == (1800, 900)
    assert (defaults.schedule.median_send, defaults.schedule.median_delivery) == (spec.schedule.median_send, spec.schedule.median_delivery) == (300, 600)
    assert (defaults.schedule.data_send, defaults.schedule.data_delivery) == (spec.schedule.data_send, spec.schedule.data_delivery) == (900, 1800)


def test_the_readme_round_on_a_custom_table_reads_the_experiments_feature_spec(tmp_path: Path) -> None:
    """The README's ``people.toml`` and ``people-round.toml``: the round takes
    the experiment's feature-spec file and asks for three cut points."""
    import re
    import tomllib

    from anonml.aggregator._spec import RoundSpecError, parse_round_spec

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = {match.group(1): match.group(2) for match in re.finditer(r"```toml\n# ([\w.-]+\.toml)[^\n]*\n(.*?)```", readme, re.S)}
    (tmp_path / "people.toml").write_text(blocks["people.toml"])
    relay = '{ node_id = "%s", host = "127.0.0.1", port = %d, public_key = "%s", key_epoch = 1 }'
    inline = ", ".join(relay % (f"{i:02x}" * 16, 9001 + i, f"{i + 16:02x}" * 32) for i in range(3))
    text = blocks["people-round.toml"].replace('["relay-1.json", "relay-2.json", "relay-3.json"]', f"[{inline}]")
    spec = parse_round_spec(tomllib.loads(text), base_dir=tmp_path)
    hours = spec.task.features.feature("hours")
    assert spec.task.features.names == ("hours", "team") and hours.n_bins == 4 and spec.schedule.median_rounds == 4
    # A spec file that is missing or malformed is refused with the field that names it.
    for content in (None, "not toml ["):
        target = tmp_path / "other" / "people.toml"
        target.parent.mkdir(exist_ok=True)
        if content is None:
            target.unlink(missing_ok=True)
        else:
            target.write_text(content)
        with pytest.raises(RoundSpecError) as refused:
            parse_round_spec(tomllib.loads(text), base_dir=target.parent)
        assert refused.value.field == "task.spec_file", refused.value


def test_bench_aggregator_reports_its_figures() -> None:
    import json

    result = CliRunner().invoke(main, ["bench", "aggregator", "--packets", "20", "--processes", "0", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["processes=0"]["accepted"] == 20
    assert figures["processes=0"]["x_verify_token"] > 0


def test_run_keeps_serving_after_the_round_while_its_peers_read_the_final_log() -> None:
    """The clean-clone CI of stop 46 (tests/test_readme_walk.py): `aggregator run` without `--linger` closed its port
    as the round ended, and one peer, polling for the final receipt log a moment later, ended unconfirmed. It had
    worked while learning spent 2 s importing scikit-learn after t_r. By default it now serves two of a peer's
    longest poll gaps and more."""
    from anonml.aggregator._cli import run
    from anonml.peer._client import retry_delay

    [linger] = [param for param in run.params if param.name == "linger"]
    assert isinstance(linger.default, float) and linger.default >= 2 * retry_delay(100)


def test_run_on_a_taken_port_fails_with_a_clear_message(tmp_path: Path) -> None:
    import re
    import socket

    runner = CliRunner()
    runner.invoke(main, ["aggregator", "init", "--data-dir", str(tmp_path / "agg")])
    # Registration open well past the `round new` -> `run` gap on a loaded machine: with 1 s it had
    # closed before `run` reached the port (CI beside four busy loops), a refusal of its own.
    spec = write_spec(tmp_path / "round.toml", register=600)
    http_port = int(re.search(r"http_port = (\d+)", spec.read_text()).group(1))  # type: ignore[union-attr]
    created = runner.invoke(main, ["aggregator", "round", "new", "--data-dir", str(tmp_path / "agg"), "--spec", str(spec)])
    round_id = created.stdout.strip().splitlines()[-1]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", http_port))
        taken.listen()
        result = runner.invoke(main, ["aggregator", "run", "--data-dir", str(tmp_path / "agg"), "--round", round_id])
    assert result.exit_code == 1
    assert "cannot serve the round" in result.output


def test_sigterm_stops_run_and_its_worker_processes_and_a_second_run_is_refused(tmp_path: Path) -> None:
    """Issue 14: after a SIGTERM the two pool workers and the multiprocessing resource tracker
    outlived ``aggregator run --processes 2``; and a second run on the same directory started anyway."""
    import signal

    import psutil

    data_dir = new_round(tmp_path, register=600)
    command = [sys.executable, "-c", "import sys; from anonml.cli import main; sys.exit(main())",
               "aggregator", "run", "--data-dir", str(data_dir), "--processes", "2"]
    with running_until(command, "serving", within=120) as run:
        # The two workers (and the resource tracker): the pool may still be starting them when the service
        # says it is serving (beside four busy loops one of them was not there yet).
        def workers(family: list[psutil.Process]) -> int:
            return sum("multiprocessing.spawn" in " ".join(child.cmdline()) for child in family)

        deadline = time.monotonic() + 60
        while workers(family := psutil.Process(run.pid).children(recursive=True)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert workers(family) == 2
        second = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1 and "Traceback" not in second.stderr
        assert f"in use by pid {run.pid}" in second.stderr
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 143
        _, alive = psutil.wait_procs(family, timeout=30)
        assert alive == [], alive


def test_a_run_killed_with_sigkill_leaves_no_worker_process_behind(tmp_path: Path) -> None:
    """A SIGKILLed ``aggregator run`` shuts no pool down: its verification worker waited on its task
    queue for ever, holding the issuer key, and multiprocessing's resource tracker waited on it."""
    import psutil

    data_dir = new_round(tmp_path, register=600)
    command = [*anonml_command("aggregator", "run", "--data-dir", str(data_dir), "--processes", "1")]
    with running_until(command, "serving", within=120) as run:
        family = psutil.Process(run.pid).children(recursive=True)
        assert family  # the worker (and the resource tracker)
        assert_sigkill_leaves_no_survivor(run, family)


@pytest.mark.system
def test_a_lingering_run_prints_its_summary_before_the_linger_and_sigterm_then_offers_no_resume(tmp_path: Path) -> None:
    """Issue 29: `--linger` held the summary back until it ended, and a SIGTERM to the finished round said
    `aggregator run` "resumes the round" (which has nothing left to do)."""
    import signal

    # Nobody registers: the round fails when registration closes (its minimum participation unmet).
    data_dir = new_round(tmp_path, register=20)
    command = [*anonml_command("aggregator", "run", "--data-dir", str(data_dir), "--linger", "120")]
    with running_until(command, "round FAILED", within=300) as run:
        assert run.stderr is not None
        assert "dashboard stays up" in run.stderr.readline()  # the summary came first; the linger follows
        run.send_signal(signal.SIGTERM)
        rest = run.stderr.read()
        assert run.wait(timeout=60) == 3
    assert "while lingering after the round ended (failed)" in rest and "resumes" not in rest
