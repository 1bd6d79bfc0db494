"""``anonml demo``: the click command, and what ends the demo early.

SIGINT and SIGTERM both cancel the round and stop every child process
(:func:`._children.open_children`); the demo then exits 128 + the signal's
number, as a shell reports a process the signal ended.
"""

from __future__ import annotations

import json
import signal
import tempfile
from functools import partial
from pathlib import Path

import click

# The demo's modules (trio, the roles, scipy) are imported when it runs, so
# `anonml demo --help` loads click alone (issue 29).


@click.command("demo")
@click.option("--peers", type=click.IntRange(min=4), default=None, help="How many peers (default: every training row).")
@click.option("--dataset", type=click.Choice(["breast-cancer", "adult"]), default="breast-cancer", show_default=True)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Directory with adult.data and adult.test (for --dataset adult).")
@click.option("--epsilon", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True, help="Record-level epsilon promised to each peer (the sum over every release).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="Peer worker processes.")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None, help="Keep every process's files here (default: a new temporary directory).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Also write the summary as JSON.")
@click.option("--task", type=click.Choice(["ensemble", "statistics", "model-averaging"]), default="ensemble", show_default=True,
              help="What the round computes: the partition ensemble, statistic answers (histograms, a count, means, medians) each with "
                   "its error, or an average of the peers' output-perturbed local logistic regressions.")
@click.option("--rows-per-peer", type=click.IntRange(min=1), default=None,
              help="Rows each peer holds (--task model-averaging only; default and minimum: the learner's 100).")
@click.option("--linger", type=click.FloatRange(0, 3600), default=0.0, help="Keep the aggregator's dashboard up this many seconds after the round.")
def demo(peers: int | None, dataset: str, data_dir: Path | None, epsilon: float, workers: int, work_dir: Path | None, seed: int, json_out: Path | None, linger: float, task: str,
         rows_per_peer: int | None) -> None:
    """Run one complete round on loopback: 5 relays (paths of 3), the aggregator, N peers.

    Exits 0 when the round is done and the aggregator accepted at least 99%
    of the messages the peers prepared (each counted once), 3 when the round
    failed, 4 when more was lost (or a message counted twice), 5 when the
    round ended degraded (a survey got fewer reports than the round's
    minimum), and 128 + N when signal N stopped it.
    """
    import trio
    from rich.console import Console

    from anonml.demo._children import until_signalled
    from anonml.demo._data import adult_data, breast_cancer_data, write_experiment_files
    from anonml.demo._run import run_demo
    from anonml.demo._summary import exit_code, experiment_command, print_summary
    from anonml.protocol import TaskKind

    console = Console()
    if dataset == "adult":
        if data_dir is None:
            raise click.UsageError("--dataset adult needs --data-dir (the directory with adult.data and adult.test)")
        missing = [name for name in ("adult.data", "adult.test") if not (data_dir / name).is_file()]
        if missing:
            raise click.BadParameter(
                f"{str(data_dir)!r} has no {' or '.join(missing)}: pass the directory holding UCI Adult's adult.data and "
                "adult.test (e.g. --data-dir ../shared/data/adult)", param_hint="--data-dir")
        data = adult_data(data_dir)
    else:
        data = breast_cancer_data(seed)
    rows = demo_rows_per_peer(TaskKind(task), rows_per_peer)
    n = min(peers or len(data.train_rows) // rows, len(data.train_rows) // rows)
    work = work_dir or Path(tempfile.mkdtemp(prefix="anonml-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    result = trio.run(until_signalled, partial(run_demo, data, peers=n, epsilon=epsilon, workers=workers, seed=seed, work=work,
                                               console=console, linger=linger, task=TaskKind(task), rows_per_peer=rows))
    if isinstance(result, int):
        console.print(f"stopped by {signal.Signals(result).name}; every child process was stopped; files in {work}")
        raise SystemExit(128 + result)
    summary, params = result
    # `anonml experiment` scores the ensemble's plan: a statistics round has no model to compare with it.
    if params.task == TaskKind.ENSEMBLE and dataset == "adult" and data_dir is not None:
        summary["experiment_command"] = experiment_command(params, ["adult", "--data-dir", str(data_dir)], len(data.train_rows))
    elif params.task == TaskKind.ENSEMBLE:
        dataset_args = write_experiment_files(data, data.train_rows[:n], work)
        summary["experiment_command"] = experiment_command(params, dataset_args, n)
    print_summary(console, summary, params)
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=2, default=str))
    code = exit_code(summary)
    if code:
        raise SystemExit(code)


def demo_rows_per_peer(task: object, rows_per_peer: int | None) -> int:
    """Each peer's rows: ``--rows-per-peer`` for a model-averaging round (at least the learner's minimum), one otherwise."""
    from anonml.learning import MIN_ROWS_PER_PEER
    from anonml.protocol import TaskKind

    if task != TaskKind.MODEL_AVERAGING:
        if rows_per_peer is not None:
            raise click.UsageError("--rows-per-peer is for --task model-averaging: every other task's peer holds one row")
        return 1
    if rows_per_peer is not None and rows_per_peer < MIN_ROWS_PER_PEER:
        raise click.BadParameter(f"a model-averaging peer holds at least {MIN_ROWS_PER_PEER} rows (its noise is calibrated to "
                                 f"them), got {rows_per_peer}", param_hint="--rows-per-peer")
    return MIN_ROWS_PER_PEER if rows_per_peer is None else rows_per_peer
