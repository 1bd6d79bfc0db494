"""Issue 29: the README's role commands (relay, aggregator, peer), taken from its table and run as written.

The commands come from the README's "By role" table; placeholders (``D``,
``HOST:PORT``, ``IDENTITY@URL``, ``me.csv``, ``CODE``, …) are filled in and
each optional ``[…]`` part is left out unless the walk needs it (``relay
init``'s ``--mirror``, ``relay info``'s ``--json`` that writes
``relay-N.json``, ``peer join``'s ``--invitation``, ``--dry-run`` and
``--yes``). The round is the README's own: ``trial-round.toml`` and
``people.toml`` as its "Trying a round on one machine" paragraph writes them,
only the aggregator's two ports changed to free ones.
"""

from __future__ import annotations

import itertools
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from anonml.aggregator import read_round_spec
from anonml.base.process import anonml_command
from anonml.cli import main
from anonml.demo import free_port

README = Path(__file__).resolve().parents[1] / "README.md"
ROLES = ("relay operator", "aggregator operator", "peer")


def readme_commands() -> dict[str, list[str]]:
    """Each role's commands as the README's table writes them (backticked, starting with ``anonml``)."""
    commands: dict[str, list[str]] = {}
    for line in README.read_text().splitlines():
        for role in ROLES:
            if line.startswith(f"| {role} |"):
                commands[role] = [c for c in re.findall(r"`([^`]+)`", line) if c.startswith("anonml ")]
    return commands


def as_written(command: str, keep: tuple[str, ...] = (), **values: str | list[str]) -> list[str]:
    """The words of ``command`` with the optional parts in ``keep`` kept, the others dropped, and placeholders
    filled: a placeholder given a list takes its values in turn (``relay init``'s two ``HOST:PORT``)."""
    text = re.sub(r"\s*\[([^\]]+)\]", lambda m: f" {m.group(1)}" if m.group(1) in keep else "", command)
    fills = {name: iter(value) if isinstance(value, list) else itertools.repeat(value) for name, value in values.items()}
    return [next(fills[word]) if word in fills else word for word in shlex.split(text)]


def readme_file(first_line: str) -> str:
    """The README's fenced block whose first line is ``first_line`` (``# people.toml``), as written."""
    blocks = re.findall(r"^```\w*\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    found = [block for block in blocks if block.splitlines()[0].startswith(first_line)]
    assert len(found) == 1, f"the README has {len(found)} blocks starting {first_line!r}"
    return str(found[0])


def _command_of(words: list[str]) -> click.Command:
    context = click.Context(main, info_name="anonml")
    command: click.Command = main
    for word in words:
        if not isinstance(command, click.Group) or word.startswith("-"):
            break
        found = command.get_command(context, word)
        if found is None:
            break
        command = found
    return command


def test_every_command_the_readme_names_exists_with_the_options_it_shows() -> None:
    commands = readme_commands()
    assert set(commands) == set(ROLES)
    for role, written in commands.items():
        assert written, role
        for text in written:
            words = shlex.split(re.sub(r"[\[\]]", " ", text.split(">")[0]))[1:]
            command = _command_of(words)
            offered = {option for param in command.params for option in param.opts}
            named = {word for word in words if word.startswith("--")}
            assert named <= offered, (text, named - offered)


def _run(words: list[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    assert words[0] == "anonml"
    result = subprocess.run(anonml_command(*words[1:]), capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


def _start(words: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``words`` as a child process writing its stdout and stderr to ``log``'s ``.out`` and ``.err`` files
    (files, not pipes: a long-running role's progress lines never fill a pipe nobody reads)."""
    assert words[0] == "anonml"
    with open(log.with_suffix(".out"), "wb") as out, open(log.with_suffix(".err"), "wb") as err:
        return subprocess.Popen(anonml_command(*words[1:]), stdout=out, stderr=err)


def _output(log: Path) -> str:
    return log.with_suffix(".out").read_text() + log.with_suffix(".err").read_text()


def _wait_for(marker: str, log: Path, process: subprocess.Popen[bytes], *, within: float) -> None:
    """Until ``process`` has printed ``marker``; fails if it exits or ``within`` seconds pass first."""
    deadline = time.monotonic() + within
    while marker not in _output(log):
        assert process.poll() is None, f"exited {process.returncode} before printing {marker!r}:\n{_output(log)}"
        assert time.monotonic() < deadline, f"no {marker!r} within {within} s:\n{_output(log)}"
        time.sleep(0.1)


@contextmanager
def _killed_on_the_way_out() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to add child processes to; any still running when the block ends (a failed assertion) is killed."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()


# One row of people.toml's table per peer, both labels in each partition whatever the seed deals.
PEER_ROWS = ("20,red,yes", "35,blue,no", "50,green,yes", "65,red,no", "80,blue,yes", "45,green,no")
RELAYS = 2


def _trial_spec(folder: Path, http_port: int, sink_port: int) -> Path:
    """The README's ``people.toml`` and ``trial-round.toml`` written into ``folder``, the round's two ports
    changed to ``http_port`` and ``sink_port``."""
    (folder / "people.toml").write_text(readme_file("# people.toml"))
    trial = readme_file("# trial-round.toml")
    for field, port in (("http_port = 8080", http_port), ("sink_port = 8081", sink_port)):
        assert trial.count(field) == 1, field
        trial = trial.replace(field, f"{field.split(' = ')[0]} = {port}")
    (folder / "trial-round.toml").write_text(trial)
    return folder / "trial-round.toml"


def test_a_relay_file_carries_its_mirror_into_the_round(tmp_path: Path) -> None:
    """The README's relay row: `relay init --mirror` then `relay info --json > relay-N.json`, named in the spec.
    The round's relays keep each file's mirror (they were dropped: every peer then said no relay mirrors the
    round, and no receipt log could be checked)."""
    runner = CliRunner()
    identity, mirror = "ab" * 32, free_port()
    for n, mirrored in ((1, ["--mirror", f"127.0.0.1:{mirror}"]), (2, [])):
        relay = str(tmp_path / f"relay-{n}")
        made = runner.invoke(main, ["relay", "init", "--data-dir", relay, "--listen", f"127.0.0.1:{free_port()}",
                                    "--aggregator", f"{identity}@http://127.0.0.1:8080", *mirrored])
        assert made.exit_code == 0, made.output
        info = runner.invoke(main, ["relay", "info", "--data-dir", relay, "--json"])
        assert info.exit_code == 0, info.output
        (tmp_path / f"relay-{n}.json").write_text(info.stdout)
    spec = _trial_spec(tmp_path, free_port(), free_port())
    relays = read_round_spec(spec.read_bytes(), base_dir=tmp_path).network.relays
    assert [relay.mirror_port for relay in relays] == [mirror, None]


# System suite: two relays, the aggregator and six peers as processes, a round of about 85 s in wall-clock windows (registration 40 s
# of it: six peer processes start and register in it, 5 to 10 s at load 4 to 5).
@pytest.mark.system
def test_a_whole_round_from_the_readmes_commands_as_written(tmp_path: Path) -> None:
    written = readme_commands()
    relay_cmds, agg_cmds, peer_cmds = (dict((c.split()[1] + " " + c.split()[2], c) for c in written[r]) for r in ROLES)
    http_port = free_port()
    spec, url, agg = _trial_spec(tmp_path, http_port, free_port()), f"http://127.0.0.1:{http_port}", str(tmp_path / "agg")
    peers = [tmp_path / f"peer-{n}" for n in range(1, len(PEER_ROWS) + 1)]
    for folder, row in zip(peers, PEER_ROWS):
        folder.with_suffix(".csv").write_text(f"hours,team,late\n{row}\n")
    looker = tmp_path / "me"  # a peer who only looks: `--dry-run`, then its unspent budget
    with _killed_on_the_way_out() as running:
        # The peers' `peer init`s need nothing of the others: they run beside the operators' set-up.
        initialising = [_start(as_written(peer_cmds["peer init"], D=str(folder)), folder.with_name(f"{folder.name}-init"))
                        for folder in (*peers, looker)]
        running.extend(initialising)
        initialised = _run(as_written(agg_cmds["aggregator init"], D=agg))
        identity = re.search(r"identity ([0-9a-f]{64})", initialised.stdout).group(1)  # type: ignore[union-attr]
        relay_logs = [tmp_path / f"relay-{n}-run" for n in range(1, RELAYS + 1)]
        relay_runs: list[subprocess.Popen[bytes]] = []
        for n, log in enumerate(relay_logs, 1):
            relay, ports = str(tmp_path / f"relay-{n}"), [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
            assert _run(as_written(relay_cmds["relay init"], keep=("--mirror HOST:PORT",), D=relay,
                                   **{"HOST:PORT": ports, "IDENTITY@URL": f"{identity}@{url}"})).returncode == 0
            (tmp_path / f"relay-{n}.json").write_text(_run(as_written(relay_cmds["relay info"], keep=("--json",), D=relay)).stdout)
            relay_runs.append(_start(as_written(relay_cmds["relay run"], D=relay), log))
        running.extend(relay_runs)
        assert [process.wait(timeout=120) for process in initialising] == [0] * len(initialising)

        created = _run(as_written(agg_cmds["aggregator round"], D=agg, **{"round.toml": str(spec)}))
        assert created.returncode == 0 and "registration closes" in created.stderr, created.stderr
        assert created.stdout.strip()[:16] in _run(as_written(agg_cmds["aggregator rounds"], D=agg)).stdout
        codes_file = Path(re.search(r"invitation codes in (\S+)", created.stderr).group(1))  # type: ignore[union-attr]
        codes = [line for line in codes_file.read_text().splitlines() if line and not line.startswith("#")]
        ends = re.search(r"data delivery ends (\S+ \S+) UTC", created.stderr).group(1)  # type: ignore[union-attr]
        ends_in = datetime.fromisoformat(f"{ends}+00:00").timestamp() - time.time()
        served_log = tmp_path / "aggregator-run"
        served = _start(as_written(agg_cmds["aggregator run"], D=agg), served_log)
        running.append(served)
        _wait_for("live dashboard: ", served_log, served, within=60)

        join_logs = [folder.with_name(f"{folder.name}-join") for folder in peers]
        joins = [_start(as_written(peer_cmds["peer join"], keep=("--invitation CODE", "--yes"), D=str(folder), URL=url,
                                   **{"me.csv": str(folder.with_suffix(".csv")), "CODE": code}), log)
                 for folder, code, log in zip(peers, codes, join_logs)]
        running.extend(joins)
        shown = _run(as_written(peer_cmds["peer join"], keep=("--dry-run",), D=str(looker), URL=url,
                                **{"me.csv": str(peers[0].with_suffix(".csv"))}))
        assert shown.returncode == 0 and "nothing was sent" in shown.stdout, shown.stdout + shown.stderr
        assert "spent 0 of the lifetime budget" in _run(as_written(peer_cmds["peer budget"], D=str(looker))).stdout

        # The round's last window closes at `ends`; learning and the summary follow within seconds.
        assert served.wait(timeout=ends_in + 180) == 0, _output(served_log)
        summary = _output(served_log)
        assert "): done" in summary and f"registered {len(peers)}, credentials {len(peers)}" in summary, summary
        for process, log in zip(joins, join_logs):
            assert process.wait(timeout=60) == 0, _output(log)
            said = _output(log)
            assert "Traceback" not in said and ", 0 missing, 0 unconfirmed" in said, said
            # The relays' mirrors confirm the manifest and the receipt logs (the relay files carry them).
            assert "mirrors its manifest" not in said and "could not be checked against the relays' mirrors" not in said, said
        assert "spent 2 of the lifetime budget" in _run(as_written(peer_cmds["peer budget"], D=str(peers[0]))).stdout
        report = _run(as_written(agg_cmds["aggregator report"], D=agg))
        assert report.returncode == 0 and "report.html" in report.stdout, report.stdout + report.stderr

        for process in relay_runs:
            process.send_signal(signal.SIGINT)
        for process, log in zip(relay_runs, relay_logs):
            assert process.wait(timeout=60) == 0, _output(log)
            forwarded = re.search(r"event=stopped received=\d+ forwarded=(\d+)", _output(log))
            assert forwarded is not None and int(forwarded.group(1)) > 0 and "Traceback" not in _output(log), _output(log)
