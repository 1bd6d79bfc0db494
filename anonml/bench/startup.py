"""``anonml bench startup``: how long ``anonml --help`` takes to start, beside ``python -c pass``.

Both commands run as fresh processes, interleaved (one of each per
repetition) so that whatever else the machine is doing weighs on both
alike; the figures are the median and the fastest wall time of each, and
the median difference: what AnonML itself adds to an interpreter start.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

from anonml.base.process import anonml_command

TARGET_SECONDS = 0.5
"""Issue 15: ``anonml --help`` must answer within half a second."""


def anonml_help_command() -> list[str]:
    """The installed ``anonml`` script beside this interpreter (what a user types), else this interpreter running the CLI."""
    script = Path(sys.executable).parent / "anonml"
    if script.is_file():
        return [str(script), "--help"]
    return anonml_command("--help")


def _wall_time(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def measure(repetitions: int) -> dict[str, float]:
    """Median and fastest seconds of ``python -c pass`` and ``anonml --help``, run interleaved."""
    baseline_command = [sys.executable, "-c", "pass"]
    help_command = anonml_help_command()
    _wall_time(help_command)  # warm the file cache: the first start reads every .pyc from disk
    baseline: list[float] = []
    anonml: list[float] = []
    for _ in range(repetitions):
        baseline.append(_wall_time(baseline_command))
        anonml.append(_wall_time(help_command))
    return {
        "python_pass_median_s": statistics.median(baseline),
        "python_pass_min_s": min(baseline),
        "anonml_help_median_s": statistics.median(anonml),
        "anonml_help_min_s": min(anonml),
        "added_median_s": statistics.median(a - b for a, b in zip(anonml, baseline)),
        "ratio_median": statistics.median(anonml) / statistics.median(baseline),
        "repetitions": repetitions,
    }


@click.command("startup")
@click.option("--repetitions", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_startup(repetitions: int, as_json: bool) -> None:
    """`anonml --help` start-up time beside `python -c pass`, measured in the same run."""
    figures = measure(repetitions)
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    click.echo(f"python -c pass   median {figures['python_pass_median_s'] * 1000:7.1f} ms   fastest {figures['python_pass_min_s'] * 1000:7.1f} ms")
    click.echo(f"anonml --help    median {figures['anonml_help_median_s'] * 1000:7.1f} ms   fastest {figures['anonml_help_min_s'] * 1000:7.1f} ms")
    click.echo(
        f"anonml adds {figures['added_median_s'] * 1000:.1f} ms to an interpreter start "
        f"({figures['ratio_median']:.2f}x python -c pass, {repetitions} runs each, interleaved)"
    )
    verdict = "met" if figures["anonml_help_median_s"] < TARGET_SECONDS else "MISSED"
    click.echo(f"target: anonml --help under {TARGET_SECONDS:g} s: {verdict}")
