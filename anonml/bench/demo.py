"""``anonml bench demo``: the demo's acceptance check on a busy machine.

Starts ``--hogs`` CPU-bound processes (each ``while True: pass``) to compete
for the cores, runs ``anonml demo`` ``--runs`` times one after another, and
records each run's exit code, accepted fraction (accepted over prepared
messages), lost messages, restarts, wall time, and its send-vs-arrival rho
split by stage (``anonml.demo._trace``). The demo passes when every
run exits 0 with at least 99% of its messages accepted. The hogs are stopped
with the benchmark, however it ends.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
import trio

from anonml.base.process import anonml_command
from anonml.demo import open_children

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
        # Beside the load, which stage of the paths carried any send-vs-arrival correlation (issue 24).
        anonymity = summary.get("anonymity") or {}
        stages = anonymity.get("stages") or {}
        record.update(rho=anonymity.get("spearman_rho"), rho_drawn_send_vs=stages.get("rho_drawn_send_vs"),
                      taken_in_after_window_opened=stages.get("taken_in_after_window_opened"),
                      window_mismatches=stages.get("window_mismatches"))
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
