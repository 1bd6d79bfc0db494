"""The ``anonml fuzz`` command: each target in a worker process, one at a time, and the counts."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

TARGET_NAMES: tuple[str, ...] = (
    "link-session", "link-client", "sphinx", "token", "message", "manifest", "manifest-body", "signed-document",
    "roster-head", "thresholds", "medians", "tree-head", "status", "http-register", "http-credential",
    "issuance-request", "issuance-response", "register-response", "credential-response", "roster-response",
    "receipt-segment", "heads-response", "error-response", "beacon-statement", "peer-csv", "round-spec", "relay-directory",
)
"""Every target :func:`anonml.fuzz._targets.build_targets` builds (kept here so listing them imports nothing)."""


def run_targets(names: Sequence[str], runs: int, work: Path, seed: int, *, coverage: bool,
                hang_seconds: float) -> Iterator[dict[str, Any]]:
    """Fuzz each target in turn (:mod:`anonml.fuzz._worker`: one process imports them, a child forked
    from it runs each); each target's counts as it ends, with ``crashes`` (0 or 1) and the exit status."""
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (work / "worker.log").open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "anonml.fuzz._worker", str(work), str(runs), str(seed), "1" if coverage else "0",
             str(hang_seconds), *names],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,  # stdin: its tie to this process
        )
        assert worker.stdout is not None
        statuses = {}
        for line in worker.stdout:
            ended = json.loads(line)
            statuses[ended["target"]] = ended["exit_status"]
            yield _result(ended["target"], runs, work / ended["target"], ended["exit_status"], time.monotonic() - started)
            started = time.monotonic()
        returncode = worker.wait()
    for name in names:  # the worker itself died: every target it did not report
        if name not in statuses:
            yield _result(name, runs, work / name, returncode or 70, 0.0)


def _result(name: str, runs: int, work: Path, exit_status: int, seconds: float) -> dict[str, Any]:
    result_path, log_path = work / f"{name}.json", work / f"{name}.log"
    result: dict[str, Any] = (json.loads(result_path.read_text()) if result_path.exists()
                              else {"target": name, "inputs": 0, "parsed": 0, "refused": {}, "untyped": {}})
    result["seconds"] = round(seconds, 1)
    result["exit_status"] = exit_status
    result["crashes"] = int(exit_status != 0 or result["inputs"] < runs)
    if result["crashes"]:
        log = log_path.read_text(errors="replace") if log_path.exists() else "(no log: the worker process died)"
        result["log_tail"] = log[-2000:]
    return result


def _line(result: dict[str, Any]) -> str:
    refused = sum(result["refused"].values())
    untyped = sum(entry["count"] for entry in result["untyped"].values())
    rate = result["inputs"] / result["seconds"] if result["seconds"] else 0.0
    return (f"{result['target']:<20} {result['inputs']:>10,} {result['parsed']:>9,} {refused:>10,} {untyped:>8,} "
            f"{result['crashes']:>7} {result['seconds']:>8.0f} {rate:>8,.0f}")


@click.command(name="fuzz")
@click.option("--runs", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Inputs per target.")
@click.option("--target", "targets", multiple=True, type=click.Choice(TARGET_NAMES),
              help="Fuzz only this target (repeatable). Default: all.")
@click.option("--coverage/--no-coverage", default=True, show_default=True,
              help="Coverage-guided (every anonml module instrumented), or libFuzzer's mutations of the valid "
                   "inputs without coverage (about 20x more inputs per second).")
@click.option("--seed", type=int, default=13, show_default=True, help="libFuzzer's random seed.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where corpora, logs and results go (default: a temporary directory).")
@click.option("--hang-seconds", type=float, default=6 * 3600.0, show_default=True,
              help="A target still running after this long is stopped and counted as a crash.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def fuzz(runs: int, targets: tuple[str, ...], coverage: bool, seed: int, work_dir: Path | None,
         hang_seconds: float, as_json: bool) -> None:
    """Run RUNS coverage-guided inputs (atheris) through every parser: each must parse or be refused
    with a typed error. Exits 1 on any untyped error or crash."""
    try:
        import atheris  # noqa: F401 - only its presence is checked here; the workers use it
    except ImportError:
        raise click.ClickException("the fuzzer needs atheris: pip install 'anonml[dev]' (or pip install atheris)") \
            from None
    chosen = targets or TARGET_NAMES
    with tempfile.TemporaryDirectory(prefix="anonml-fuzz-") as temporary:
        work = work_dir or Path(temporary)
        if not as_json:
            click.echo(f"{'target':<20} {'inputs':>10} {'parsed':>9} {'refused':>10} {'untyped':>8} {'crashes':>7} "
                       f"{'seconds':>8} {'per s':>8}")
        results = []
        for result in run_targets(chosen, runs, work, seed, coverage=coverage, hang_seconds=hang_seconds):
            results.append(result)
            if not as_json:
                click.echo(_line(result))
                for error, entry in result["untyped"].items():
                    click.echo(f"    untyped x{entry['count']}: {error}  (input {entry['examples'][0][:160]})")
                if result["crashes"]:
                    click.echo(f"    crashed (exit status {result['exit_status']}): {result['log_tail'][-600:]}")
    if as_json:
        click.echo(json.dumps({"runs_per_target": runs, "coverage_guided": coverage, "targets": results}, indent=2,
                              sort_keys=True))
    if any(r["crashes"] or r["untyped"] for r in results):
        sys.exit(1)
