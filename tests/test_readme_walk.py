"""Issue 29: the README's role commands (relay, aggregator, peer), taken from its table and run as written.

The commands come from the README's "By role" table; placeholders (``D``,
``HOST:PORT``, ``IDENTITY@URL``, ``me.csv``, ``ID``, …) are filled in and each
optional ``[…]`` part is left out unless the walk needs it (``relay info``'s
``--json`` writes ``relay-1.json``; ``peer join``'s ``--dry-run`` stops before
spending). The round is ``tests/test_aggregator_cli.py``'s short spec with its
relays named by the ``relay info --json`` file, as the README says.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import click
import pytest

from anonml.base.process import anonml_command
from anonml.cli import main
from test_aggregator_cli import free_port, write_spec

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


def as_written(command: str, keep: tuple[str, ...] = (), **values: str) -> list[str]:
    """The words of ``command`` with the optional parts in ``keep`` kept, the others dropped, and placeholders filled."""
    text = re.sub(r"\s*\[([^\]]+)\]", lambda m: f" {m.group(1)}" if m.group(1) in keep else "", command)
    return [values.get(word, word) for word in shlex.split(text)]


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


# Slow: a dozen CLI processes and two servers (about a minute at load 10).
@pytest.mark.slow
def test_the_readme_walk_as_written(tmp_path: Path) -> None:
    written = readme_commands()
    relay_cmds, agg_cmds, peer_cmds = (dict((c.split()[1] + " " + c.split()[2], c) for c in written[r]) for r in ROLES)
    agg, relay, me = str(tmp_path / "agg"), str(tmp_path / "relay"), str(tmp_path / "me")
    spec = write_spec(tmp_path / "round.toml", register=600)
    http_port = int(re.search(r"http_port = (\d+)", spec.read_text()).group(1))  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{http_port}"

    initialised = _run(as_written(agg_cmds["aggregator init"], D=agg))
    identity = re.search(r"identity ([0-9a-f]{64})", initialised.stdout).group(1)  # type: ignore[union-attr]
    assert _run(as_written(relay_cmds["relay init"], **{"D": relay, "HOST:PORT": f"127.0.0.1:{free_port()}",
                                                         "IDENTITY@URL": f"{identity}@{url}"})).returncode == 0
    info = _run(as_written(relay_cmds["relay info"], keep=("--json",), D=relay))
    (tmp_path / "relay-1.json").write_text(info.stdout)
    spec.write_text(re.sub(r"relays = \[.*\]", 'relays = ["relay-1.json"]', spec.read_text()))
    created = _run(as_written(agg_cmds["aggregator round"], D=agg, **{"round.toml": str(spec)}))
    assert created.returncode == 0 and "registration closes" in created.stderr, created.stderr
    short = created.stdout.strip()[:16]
    assert short in _run(as_written(agg_cmds["aggregator rounds"], D=agg)).stdout
    served = subprocess.Popen(anonml_command(*as_written(agg_cmds["aggregator run"], D=agg)[1:]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    forwarding = subprocess.Popen(anonml_command(*as_written(relay_cmds["relay run"], D=relay)[1:]),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert _run(as_written(peer_cmds["peer init"], D=me)).returncode == 0
        data = tmp_path / "me.csv"
        data.write_text("colour,size,y\nred,4,1\n")
        join = as_written(peer_cmds["peer join"], keep=("--dry-run",), D=me, URL=url, **{"me.csv": str(data)})
        deadline = time.monotonic() + 90
        while (shown := _run(join)).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.5)  # `aggregator run` is still starting
        assert shown.returncode == 0 and "nothing was sent" in shown.stdout, shown.stdout + shown.stderr
        assert "spent 0 of the lifetime budget" in _run(as_written(peer_cmds["peer budget"], D=me)).stdout
    finally:
        served.send_signal(signal.SIGINT)
        err = served.communicate(timeout=60)[1]
        forwarding.send_signal(signal.SIGINT)
        relay_err = forwarding.communicate(timeout=60)[1]
    assert "Traceback" not in err + relay_err and "live dashboard: " in err
    report = _run(as_written(agg_cmds["aggregator report"], D=agg))
    assert report.returncode == 1 and "has no report yet" in report.stderr
