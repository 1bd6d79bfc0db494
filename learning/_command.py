"""``anonml experiment``'s options: the command that runs :mod:`learning._experiment`.

The experiment (numpy, scikit-learn, the planner) is imported when it runs,
so ``anonml experiment --help`` loads click and the names it lists (issue
29: every ``--help`` within 5 x ``python -c pass``).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import click

from anonml.learning._vocabulary import CSV, PLANNER, LearnerName, LinearSettings, TableName, Tuning
from anonml.mechanisms import OracleName, PostprocessMethod
from anonml.protocol import (
    DEFAULT_COMPARISON_POOL,
    DEFAULT_MEDIAN_STEPS,
    EPSILON_TOTAL_RANGE,
    MAX_MEDIAN_STEPS,
    Combiner,
    Learner,
    MedianPeers,
    PlanKind,
)


class ListOf(click.ParamType):  # type: ignore[type-arg]
    """A comma- or space-separated list of values of ``item`` in one
    argument (``--epsilon 0.5,1,2`` or ``--epsilon "0.5 1 2"``); with
    ``multiple=True`` the flag may also repeat."""

    def __init__(self, item: click.ParamType) -> None:  # type: ignore[type-arg]
        self.item = item
        self.name = f"list of {item.name}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        parts = [part for part in str(value).replace(",", " ").split() if part]
        if not parts:
            self.fail(f"expected at least one value, got {value!r}", param, ctx)
        return tuple(self.item.convert(part, param, ctx) for part in parts)


_DATASETS = [*(str(t) for t in TableName), CSV]


@click.command("experiment")
@click.argument("datasets", nargs=-1, required=True, type=click.Choice(_DATASETS))
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="adult: the directory with adult.data and adult.test.")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="csv: the feature-spec TOML file.")
@click.option("--train", "train_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="csv: the training CSV (header: every feature and the label).")
@click.option("--test", "test_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="csv: a test CSV (default: split the training CSV).")
@click.option("--test-fraction", type=click.FloatRange(0.05, 0.95), default=0.3, show_default=True, help="Held-out share for tables without a test split (seeded, stratified).")
@click.option("--epsilon", "epsilons", type=ListOf(click.FloatRange(*EPSILON_TOTAL_RANGE)), multiple=True, default=("1,2,4",), show_default=True, help="Record-level ε_T values, e.g. 0.5,1,2 (every release counted, the quantile search included).")
@click.option("--trials", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--learner", "learners", type=ListOf(click.Choice([str(name) for name in LearnerName])), multiple=True, default=(LearnerName.ENSEMBLE.value,), show_default=True, help="Learners to compare on the same split and ε_T: ensemble (the release plans below), ldp-sgd-lr / -svm / -linreg (Harmony's LDP gradient descent, one step per peer), model-averaging (003: output-perturbed local models), logreg (non-private reference).")
@click.option("--sgd-steps", type=click.IntRange(min=0), default=LinearSettings.sgd_steps, show_default=True, help="LDP SGD: gradient steps (the peers are dealt into this many groups); 0: Harmony's rule, groups of max(2 d ln d / ε², n/1000). With --linear-tuning fixed.")
@click.option("--sgd-learning-rate", type=click.FloatRange(min=0, min_open=True), default=LinearSettings.sgd_learning_rate, show_default=True, help="LDP SGD: γ0 (step k uses γ0/sqrt(k)). With --linear-tuning fixed.")
@click.option("--linear-tuning", type=click.Choice([str(t) for t in Tuning]), default=LinearSettings.tuning.value, show_default=True, help="Linear learners: validation chooses LDP SGD's steps and γ0 and model averaging's λ rule and categorical weight per learner and ε on 20% of the training rows held out (never the test rows); fixed uses --sgd-steps, --sgd-learning-rate, --averaging-rule and --averaging-categorical-weight.")
@click.option("--averaging-rule", type=click.FloatRange(min=0, min_open=True), default=LinearSettings.averaging_rule, show_default=True, help="Model averaging: λ = rule / (rows per peer · ε) (with --linear-tuning fixed).")
@click.option("--averaging-categorical-weight", type=click.FloatRange(min=0, min_open=True, max=1), default=LinearSettings.averaging_categorical_weight, show_default=True, help="Model averaging: the factor on the categorical columns (numeric ones 1) before rows are scaled into the unit ball (with --linear-tuning fixed).")
@click.option("--rows-per-peer", type=click.IntRange(min=100), default=LinearSettings.rows_per_peer, show_default=True, help="Model averaging: rows each peer holds (its slice of the table).")
@click.option("--statistics", is_flag=True, help="Also run every statistic task (count, means, histograms, medians, Harmony's mixed task) on the training rows at each ε_T, --trials times, and print each answer's measured error beside its formula.")
@click.option("--task", type=click.Choice(["ensemble", "statistics"]), default="ensemble", show_default=True, help="statistics: a statistics round's queries answered by its own estimator on the training rows (one peer each, dealt to one feature each, the round's unary encoding at each ε_T), --trials times; prints each query's measured error beside its formula. Cut points: the table's balanced cuts at each numeric feature's quantile levels (a round estimates them in its median search).")
@click.option("--query", "queries", multiple=True, help="With --task statistics: a query as a round spec's [task] queries writes it (count:label, histogram:F, mean:F, quantile:F:Q); repeat it. Default: the positive count, every histogram, every numeric mean and median.")
@click.option("--log-scale/--no-log-scale", default=LinearSettings.log_scale, show_default=True, help="Linear learners: encode numeric features whose public range is >= 0 and spans >= 1000 units on a log scale.")
@click.option("--plan", "plans", type=ListOf(click.Choice([PLANNER, *(str(k) for k in PlanKind)])), multiple=True, default=(f"{PlanKind.ONE},{PLANNER}",), show_default=True, help="one: the default plan, one release per peer at the full ε_T (3 cut points per numeric feature, a reserved comparison pool); planner: the planner's choice by simulation; split: the thesis's plan.")
@click.option("--planner-trials", type=click.IntRange(min=1), default=2, show_default=True, help="Simulations per candidate plan in the planner.")
@click.option("--kp", type=ListOf(click.IntRange(min=1)), multiple=True, help="Partitions (a sweep: several values).")
@click.option("--ks", type=ListOf(click.IntRange(min=1)), multiple=True, help="Features per subset (a sweep: several values).")
@click.option("--kh", type=ListOf(click.IntRange(min=1)), multiple=True, help="Subsets per partition for the split plan.")
@click.option("--quantiles", type=click.IntRange(min=1, max=8), default=None, help="Cut points per numeric feature for fixed plans (default: 3 with a reserved comparison pool, else the median) and --task statistics (default 3).")
@click.option("--median-peers", type=click.Choice([str(m) for m in MedianPeers]), default=None, help="Who answers the quantile search (default: one=reserved, split=all as the thesis).")
@click.option("--pool", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=DEFAULT_COMPARISON_POOL, show_default=True, help="Share of peers in a reserved comparison pool.")
@click.option("--median-steps", type=click.IntRange(1, MAX_MEDIAN_STEPS), default=DEFAULT_MEDIAN_STEPS, show_default=True, help="Steps of the quantile search (thesis Algorithm 1); each answering peer answers one.")
@click.option("--combiner", "--vote", "combiners", type=ListOf(click.Choice([str(c) for c in Combiner])), multiple=True, default=(",".join(Combiner),), show_default=True)
@click.option("--base", type=click.Choice([str(v) for v in Learner]), default=Learner.LOGREG.value, show_default=True)
@click.option("--scoring", type=click.Choice(["f1", "roc_auc", "accuracy"]), default="f1", show_default=True)
@click.option("--oracle", type=click.Choice([str(o) for o in OracleName]), default=OracleName.AUTO.value, show_default=True)
@click.option("--postprocess", type=click.Choice([str(m) for m in PostprocessMethod]), default=PostprocessMethod.NORM_SUB.value, show_default=True)
@click.option("--features", default=None, help="Comma-separated subset of the features to use.")
@click.option("--max-train-rows", type=click.IntRange(min=50), default=None, help="Subsample the training peers (for smoke tests).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--baselines/--no-baselines", default=True, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write all results as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Draw AUC vs ε_T (PNG).")
@click.option("--plot-x", type=click.Choice(["eps", "kp", "ks"]), default="eps", show_default=True, help="x axis of the plot: ε_T (Figure 8-2) or a swept k_p / k_s (Figures 8-3 to 8-5).")
def experiment(
    datasets: tuple[str, ...], data_dir: Path | None, spec_path: Path | None, train_path: Path | None, test_path: Path | None, test_fraction: float,
    epsilons: tuple[tuple[float, ...], ...], trials: int, learners: tuple[tuple[str, ...], ...], sgd_steps: int, sgd_learning_rate: float,
    linear_tuning: str, averaging_rule: float, averaging_categorical_weight: float, rows_per_peer: int, statistics: bool, task: str, queries: tuple[str, ...], log_scale: bool, plans: tuple[tuple[str, ...], ...], kp: tuple[tuple[int, ...], ...],
    ks: tuple[tuple[int, ...], ...], kh: tuple[tuple[int, ...], ...], quantiles: int | None, median_peers: str | None, pool: float,
    planner_trials: int, median_steps: int, combiners: tuple[tuple[str, ...], ...], base: str, scoring: str, oracle: str, postprocess: str, features: str | None,
    max_train_rows: int | None, seed: int, baselines: bool, json_path: Path | None, plot_path: Path | None, plot_x: str,
) -> None:
    """The thesis's chapter-8 experiments on each of DATASETS, in process
    (no network): AUC against record-level ε_T for the release plans, with
    non-private baselines on the same split. Several tables (e.g. ``adult
    breast-cancer affairs``) end with one comparison of every learner
    across them; ``--json`` then holds ``{"tables": [...]}`` and ``--plot``
    one panel per table."""
    from anonml.learning._compare_report import plot_tables_comparison, print_tables_comparison
    from anonml.learning._data import DataError
    from anonml.learning._experiment import plot_results, print_results, run_table
    from anonml.learning._statistics_report import print_statistic_errors
    from anonml.protocol import FeatureSpecError, PlanError

    if CSV in datasets and len(datasets) > 1:
        raise click.UsageError("csv runs alone (its --spec and --train name one table)")
    if task == "statistics":
        for dataset in datasets:
            _statistics_task(dataset, queries, epsilons, trials, seed, json_path, quantiles or STATISTICS_QUANTILES, **dict(
                data_dir=data_dir, spec_path=spec_path, train_path=train_path, test_path=test_path, test_fraction=test_fraction))
        return
    if queries:
        raise click.UsageError("--query asks a statistics task: add --task statistics")
    started = time.perf_counter()
    reports = []
    for dataset in datasets:
        try:
            reports.append(run_table(
                dataset, data_dir=data_dir, spec_path=spec_path, train_path=train_path, test_path=test_path, test_fraction=test_fraction,
                epsilons=epsilons, trials=trials, learners=learners, settings=LinearSettings(
                    sgd_steps=sgd_steps or None, sgd_learning_rate=sgd_learning_rate, rows_per_peer=rows_per_peer, log_scale=log_scale,
                    averaging_rule=averaging_rule, averaging_categorical_weight=averaging_categorical_weight, tuning=Tuning(linear_tuning)),
                plans=plans, kp=kp, ks=ks, kh=kh, quantiles=quantiles, median_peers=median_peers, pool=pool, planner_trials=planner_trials,
                median_steps=median_steps, combiners=combiners, base=base, scoring=scoring, oracle=oracle, postprocess=postprocess,
                features=features, max_train_rows=max_train_rows, seed=seed, baselines=baselines, statistics=statistics,
            ))
        except DataError as exc:
            raise click.UsageError(str(exc)) from None
        except FeatureSpecError as exc:
            raise click.UsageError(f"feature spec: {exc}") from None
        except PlanError as exc:
            raise click.UsageError(f"unsatisfiable plan parameters: {exc}") from None
        print_results(reports[-1])
        if statistics:
            print_statistic_errors(reports[-1]["statistics"], dataset)
    if len(reports) > 1:
        print_tables_comparison(reports)
    output: dict[str, Any] = reports[0] if len(reports) == 1 else {"tables": reports, "wall_seconds": time.perf_counter() - started}
    if json_path is not None:
        json_path.write_text(json.dumps(output, indent=2, allow_nan=False) + "\n")
        click.echo(f"wrote {json_path}")
    if plot_path is not None:
        if len(reports) == 1:
            plot_results(reports[0], plot_path, plot_x)
        else:
            plot_tables_comparison(reports, plot_path)
        click.echo(f"wrote {plot_path}")
    for report in reports:
        if any(not math.isfinite(r["auc"]["mean"]) for r in [*report["results"], *report.get("learners", [])]):
            raise click.ClickException("some trials produced a non-finite AUC")


STATISTICS_QUANTILES = 3
"""Cut points per numeric feature of ``--task statistics`` without ``--quantiles``: the statistics demo round's."""


def _statistics_task(dataset: str, queries: tuple[str, ...], epsilons: tuple[tuple[float, ...], ...], trials: int, seed: int,
                     json_path: Path | None, quantiles: int, **tables: Any) -> None:
    """``--task statistics``: each query's empirical error over ``trials`` beside its formula, at each ε_T."""
    import numpy as np

    from anonml.learning._data import DataError
    from anonml.learning._experiment import load_tables
    from anonml.learning._round_statistics_trials import table_statistic_errors
    from anonml.learning._statistics_report import print_statistic_errors
    from anonml.protocol import FeatureSpecError, QueryError

    eps_values = sorted({eps for group in epsilons for eps in group})
    try:
        spec, train, _ = load_tables(dataset, rng=np.random.default_rng(seed), **tables)
        rows = table_statistic_errors(spec.with_quantiles(quantiles), train, queries, epsilons=eps_values,
                                      trials=trials, seed=seed)
    except QueryError as exc:
        raise click.UsageError(f"--query {exc}") from None
    except (DataError, FeatureSpecError) as exc:
        raise click.UsageError(str(exc)) from None
    print_statistic_errors(rows, f"{dataset} ({train.n_rows} peers, a statistics round's estimator)")
    if json_path is not None:
        json_path.write_text(json.dumps({"dataset": dataset, "task": "statistics", "statistics": rows}, indent=2, allow_nan=False) + "\n")
        click.echo(f"wrote {json_path}")
