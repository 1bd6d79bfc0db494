"""``anonml demo``: the click command, and what ends the demo early.

SIGINT, SIGTERM and SIGHUP (its terminal closing) each cancel the round and stop every child process
(:func:`._children.open_children`); the demo then exits 128 + the signal's
number, as a shell reports a process the signal ended.
"""

from __future__ import annotations

import json
import signal
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import click

from anonml.learning import ROUND_CATEGORICAL_WEIGHT, ROUND_REGULARIZATION_RULE
from anonml.protocol import SGD_LOSSES

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
@click.option("--task", type=click.Choice(["ensemble", "statistics", "sgd", "model-averaging"]), default="ensemble", show_default=True,
              help="What the round computes: the partition ensemble, statistic answers (histograms, a count, means, medians) each with "
                   "its error, a logistic regression by Harmony's LDP gradient descent (sgd: one gradient per peer), or an average "
                   "of the peers' output-perturbed local logistic regressions (model-averaging).")
@click.option("--query", "queries", multiple=True, help="With --task statistics: one of the round's [task] queries (count:label, histogram:F, mean:F, quantile:F:Q); repeat it. Peers then release only the features the queries read, and no label unless count:label is asked.")
@click.option("--rows-per-peer", type=click.IntRange(min=1), default=None,
              help="Rows each peer holds (--task model-averaging only; default and minimum: the learner's 100).")
@click.option("--sgd-steps", type=click.IntRange(min=1), default=None,
              help="Gradient steps of --task sgd (its median sub-rounds, one partition each; default 4).")
@click.option("--sgd-learning-rate", type=click.FloatRange(min=0, min_open=True, max=100), default=None,
              help="γ0 of --task sgd (step k moves by γ0/√k), signed in the manifest as [task] learning_rate; default 1.")
@click.option("--sgd-loss", type=click.Choice([str(loss) for loss in SGD_LOSSES]), default=None,
              help="The loss of --task sgd, signed in the manifest as [task] loss: logistic regression, linear SVM (hinge) "
                   "or linear regression (squared); default logistic.")
@click.option("--regularization-rule", type=click.FloatRange(min=0, min_open=True, max=100), default=None,
              help="--task model-averaging: λ = RULE / (rows per peer · ε), signed as [task] regularization_rule; default "
                   f"{ROUND_REGULARIZATION_RULE:g} (chosen on Adult's validation rows).")
@click.option("--categorical-weight", type=click.FloatRange(min=0, min_open=True, max=1), default=None,
              help="--task model-averaging: the public weight of the categorical columns before each peer divides its rows "
                   "into the unit ball, signed as [task] categorical_weight; default "
                   f"{ROUND_CATEGORICAL_WEIGHT:g} (chosen on Adult's validation rows).")
@click.option("--sink-workers", type=click.IntRange(0, 16), default=0, show_default=True,
              help="Ingest workers (`aggregator worker`) beside the aggregator, listed in the manifest: relays spread "
                   "their deliveries over them and its own sink.")
@click.option("--linger", type=click.FloatRange(0, 3600), default=0.0, help="Keep the aggregator's dashboard up this many seconds after the round.")
@click.option("--explain-anonymity", "explain", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Run no round: split the send-vs-arrival rank correlation of the finished demo in this --work-dir by stage "
                   "(each relay hop, the arrival), and write its per-message trace there.")
def demo(peers: int | None, dataset: str, data_dir: Path | None, epsilon: float, workers: int, work_dir: Path | None, seed: int,
         json_out: Path | None, linger: float, task: str, queries: tuple[str, ...], rows_per_peer: int | None, sgd_steps: int | None,
         sgd_learning_rate: float | None, sgd_loss: str | None, regularization_rule: float | None, categorical_weight: float | None,
         sink_workers: int, explain: Path | None) -> None:
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
    from anonml.demo._ports import free_port
    from anonml.demo._run import Network, run_demo
    from anonml.demo._schedule import SGD_STEPS
    from anonml.demo._summary import EXIT_REASONS, exit_code, experiment_command, print_summary, sgd_experiment_command
    from anonml.protocol import QueryError, TaskKind, check_queries

    console = Console()
    if explain is not None:
        _explain(console, explain, json_out)
        return
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
    if queries and task != TaskKind.STATISTICS:
        raise click.UsageError("--query asks a statistics task: add --task statistics")
    try:
        if queries:
            check_queries(list(queries), data.spec)
    except QueryError as exc:
        raise click.BadParameter(str(exc), param_hint="--query") from None
    if (sgd_steps is not None or sgd_learning_rate is not None or sgd_loss is not None) and task != TaskKind.SGD:
        raise click.UsageError("--sgd-steps, --sgd-learning-rate and --sgd-loss are for --task sgd: no other task takes gradient steps")
    if (regularization_rule is not None or categorical_weight is not None) and task != TaskKind.MODEL_AVERAGING:
        raise click.UsageError("--regularization-rule and --categorical-weight are for --task model-averaging: no other task averages models")
    rows = demo_rows_per_peer(TaskKind(task), rows_per_peer)
    n = min(peers or len(data.train_rows) // rows, len(data.train_rows) // rows)
    work = work_dir or Path(tempfile.mkdtemp(prefix="anonml-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    result = trio.run(until_signalled, partial(run_demo, data, peers=n, epsilon=epsilon, workers=workers, seed=seed, work=work,
                                               console=console, linger=linger, task=TaskKind(task), queries=queries,
                                               rows_per_peer=rows, sgd_steps=sgd_steps or SGD_STEPS,
                                               sgd_learning_rate=sgd_learning_rate, sgd_loss=sgd_loss,
                                               regularization_rule=regularization_rule, categorical_weight=categorical_weight,
                                               network=Network(sink_worker_ports=[free_port() for _ in range(sink_workers)])))
    if isinstance(result, int):
        console.print(f"stopped by {signal.Signals(result).name}; every child process was stopped; files in {work}")
        raise SystemExit(128 + result)
    summary, params = result
    # `anonml experiment` scores the ensemble's plan and LDP SGD: a statistics round has no model to compare with them.
    if params.task == TaskKind.ENSEMBLE and dataset == "adult" and data_dir is not None:
        summary["experiment_command"] = experiment_command(params, ["adult", "--data-dir", str(data_dir)], len(data.train_rows))
    elif params.task == TaskKind.ENSEMBLE:
        dataset_args = write_experiment_files(data, data.train_rows[:n], work)
        summary["experiment_command"] = experiment_command(params, dataset_args, n)
    elif params.task == TaskKind.SGD:
        # The same learner, rows and ε without the network (its AUC is the round's yardstick).
        dataset_args = (["adult", "--data-dir", str(data_dir)] if dataset == "adult" and data_dir is not None
                        else write_experiment_files(data, data.train_rows[:n], work))
        summary["experiment_command"] = sgd_experiment_command(params, dataset_args, len(data.train_rows) if dataset == "adult" else n)
    print_summary(console, summary, params)
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=2, default=str))
    code = exit_code(summary)
    if code:
        console.print(f"exit status {code}: {EXIT_REASONS[code]}")
        raise SystemExit(code)


def _explain(console: Any, work: Path, json_out: Path | None) -> None:
    """``--explain-anonymity``: the per-stage table of a finished demo's work directory."""
    from rich.table import Table

    from anonml.demo._schedule import RELAYS
    from anonml.demo._trace import TRACE_FILE, explain_lines, explain_work_dir

    try:
        figures = explain_work_dir(work, RELAYS)
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    table = Table(title=f"anonymity by stage: {work}", show_header=False)
    table.add_column("what")
    table.add_column("figure")
    for what, figure in explain_lines(figures):
        table.add_row(what, figure)
    console.print(table)
    console.print(f"per-message trace: {work / TRACE_FILE}")
    if json_out is not None:
        json_out.write_text(json.dumps(figures, indent=2))


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
