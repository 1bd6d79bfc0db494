"""``anonml bench startup``: how long every command's ``--help`` takes, as a ratio to ``python -c pass``.

Every command of the ``anonml`` tree (``anonml``, ``anonml relay``, ``anonml
relay run``, …) is started as a fresh process with ``--help``, each run
right after a ``python -c pass`` so that whatever else the machine is doing
weighs on both alike. A command's figure is the median of its runs over the
median of the ``python -c pass`` runs of the same pass. The benchmark exits
1 when any command is above :data:`MAX_RATIO` (issue 29: lazy imports keep
trio, numpy, scikit-learn and petlib out of every help).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click

from anonml.base.process import anonml_command

MAX_RATIO = 5.0
"""The most any ``--help`` may take, in ``python -c pass`` times (issue 29)."""


def anonml_script() -> list[str]:
    """The installed ``anonml`` script beside this interpreter (what a user types), else this interpreter running the CLI."""
    script = Path(sys.executable).parent / "anonml"
    if script.is_file():
        return [str(script)]
    return anonml_command()


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command below ``group`` (its own path first), as the words a user types after ``anonml``."""
    yield prefix
    context = click.Context(group, info_name=" ".join(("anonml", *prefix)))
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if isinstance(command, click.Group):
            yield from command_paths(command, (*prefix, name))
        elif command is not None:
            yield (*prefix, name)


def _wall_time(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def measure(paths: list[tuple[str, ...]], repetitions: int) -> dict[str, object]:
    """Per command: the median seconds of its ``--help`` and the ratio to ``python -c pass`` timed beside it."""
    baseline_command = [sys.executable, "-c", "pass"]
    script = anonml_script()
    _wall_time([*script, "--help"])  # warm the file cache: the first start reads every .pyc from disk
    rows = []
    for path in paths:
        command = [*script, *path, "--help"]
        baseline: list[float] = []
        helped: list[float] = []
        for _ in range(repetitions):
            baseline.append(_wall_time(baseline_command))
            helped.append(_wall_time(command))
        rows.append({
            "command": " ".join(("anonml", *path, "--help")),
            "help_median_s": statistics.median(helped),
            "python_pass_median_s": statistics.median(baseline),
            "ratio": statistics.median(helped) / statistics.median(baseline),
        })
    return {"max_ratio": MAX_RATIO, "repetitions": repetitions, "commands": rows}


@click.command("startup")
@click.option("--repetitions", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Runs of each command's --help (each beside its own python -c pass).")
@click.option("--command", "only", multiple=True, metavar="WORDS",
              help="Only this command, e.g. 'relay run' (repeatable; default: every command).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_startup(repetitions: int, only: tuple[str, ...], as_json: bool) -> None:
    """Every command's `--help` time as a ratio to `python -c pass`, measured in the same run; exits 1 above 5x."""
    root = click.get_current_context().find_root().command  # the `anonml` tree this benchmark is mounted in
    assert isinstance(root, click.Group)
    every = list(command_paths(root))
    paths = [tuple(words.split()) for words in only] or every
    unknown = [" ".join(path) for path in paths if path not in every]
    if unknown:
        raise click.BadParameter(f"no such command: {', '.join(unknown)} (give the words after `anonml`, e.g. 'relay run')",
                                 param_hint="--command")
    figures = measure(paths, repetitions)
    rows = figures["commands"]
    assert isinstance(rows, list)
    slow = [row for row in rows if row["ratio"] > MAX_RATIO]
    if as_json:
        click.echo(json.dumps(figures, indent=2))
    else:
        for row in rows:
            mark = "  SLOW" if row["ratio"] > MAX_RATIO else ""
            click.echo(f"{row['ratio']:5.2f}x  {row['help_median_s'] * 1000:7.1f} ms  "
                       f"(python -c pass {row['python_pass_median_s'] * 1000:5.1f} ms)  {row['command']}{mark}")
        click.echo(f"{len(rows) - len(slow)} of {len(rows)} commands within {MAX_RATIO:g}x python -c pass "
                   f"(median of {repetitions} runs each, each run beside its own python -c pass)")
    if slow:
        raise SystemExit(1)
