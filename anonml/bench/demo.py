"""``anonml bench demo``: the demo's acceptance check on a busy machine.

Starts ``--hogs`` CPU-bound processes (each ``while True: pass``) to compete
for the cores, runs ``anonml demo`` ``--runs`` times one after another, and
records each run's exit code, accepted fraction (accepted over prepared
messages), lost messages, restarts and wall time. The demo passes when every
run exits 0 with at least 99% of its messages accepted. The hogs are stopped
with the benchmark, however it ends.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import trio

from anonml.base.process import anonml_command
from anonml.demo import open_children, until_signalled

HOG = "while True: pass"


async def one_run(index: int, work: Path, peers: int | None, seed: int) -> dict[str, Any]:
    summary_path = work / f"run-{index}.json"
    args = ["demo", "--work-dir", str(work / f"run-{index}"), "--json", str(summary_path), "--seed", str(seed)]
    if peers is not None:
        args += ["--peers", str(peers)]
    started = time.monotonic()
    with (work / f"run-{index}.log").open("wb") as log:
        result = await trio.run_process(anonml_command(*args), stdout=log, stderr=log, check=False)
    record: dict[str, Any] = {"run": index, "exit_code": result.returncode, "wall_seconds": round(time.monotonic() - started, 1)}
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        audit = summary["audit"]
        prepared, accepted = int(audit["prepared"]), int(audit["accepted"])
        record.update(
            phase=summary["phase"], prepared=prepared, accepted=accepted, lost=audit["lost"],
            lost_by_reason=audit["lost_by_reason"], counted_twice=audit["counted_twice"],
            accepted_fraction=round(accepted / prepared, 5) if prepared else None,
            registered=summary["registered"], peers=summary["peers"], restarted=summary["restarted"],
            missing=summary["missing"], missing_reasons=summary["missing_reasons"], unconfirmed=summary["unconfirmed"],
        )
    return record


async def run_acceptance(runs: int, hogs: int, peers: int | None, work: Path) -> dict[str, Any]:
    records = []
    async with open_children(work / "hogs") as children:
        for i in range(hogs):
            await children.start(f"hog-{i}", [sys.executable, "-c", HOG])
        for index in range(runs):
            records.append(await one_run(index, work, peers, seed=index))
            click.echo(json.dumps(records[-1]), err=True)
    passed = [r for r in records if r["exit_code"] == 0 and (r.get("accepted_fraction") or 0) >= 0.99]
    return {"runs": runs, "hogs": hogs, "passed": len(passed), "records": records, "work_dir": str(work)}


@click.command("demo")
@click.option("--runs", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--hogs", type=click.IntRange(min=0), default=4, show_default=True, help="CPU-bound processes competing for the cores.")
@click.option("--peers", type=click.IntRange(min=4), default=None, help="Peers per demo (default: the demo's default).")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def bench_demo(runs: int, hogs: int, peers: int | None, work_dir: Path | None, as_json: bool) -> None:
    """Run `anonml demo` RUNS times with HOGS busy processes; exit codes and accepted fractions."""
    work = work_dir or Path(tempfile.mkdtemp(prefix="anonml-bench-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    report = trio.run(until_signalled, run_acceptance, runs, hogs, peers, work)
    if isinstance(report, int):
        click.echo(f"stopped by signal {report}; the hogs and any demo were stopped", err=True)
        sys.exit(128 + report)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        for record in report["records"]:
            click.echo(
                f"run {record['run']}: exit {record['exit_code']}, accepted {record.get('accepted')} of "
                f"{record.get('prepared')} ({record.get('accepted_fraction')}), restarts {record.get('restarted')}, "
                f"{record['wall_seconds']} s"
            )
        click.echo(f"{report['passed']} of {runs} runs exited 0 with >= 99% accepted, with {hogs} CPU hogs")
    if report["passed"] != runs:
        sys.exit(1)
