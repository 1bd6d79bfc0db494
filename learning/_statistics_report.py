"""Every statistic task on one table (``anonml experiment TABLE
--statistics``): each answer's empirical error over seeded trials beside
the formula of its expected squared error, so a reader sees the formulas
hold on real data (the tests hold them to 1.5x over 100 trials).

The tasks, each one release per peer at ε: the count of positive labels
(randomized response), every numeric feature's mean (the 1-bit mechanism)
and median on a public grid of 15 cut points (unary encoding; the error is
the estimated CDF's at the true median's bin), every categorical
feature's histogram (the frequency oracle), and Harmony's mixed task over
every feature at once (one release for all means and frequencies).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from anonml.learning._data import Table
from anonml.learning._mixed import mixed_statistics
from anonml.learning._statistics import cdf_variances, count_task, histogram_task, mean_task, mean_variance, quantile_task
from anonml.mechanisms import OptimizedUnaryEncoding
from anonml.protocol import FeatureSpec, NumericFeature

# Cut points of the median task: this many, evenly spaced inside the public bounds.
QUANTILE_GRID = 15


def _row(task: str, column: str, epsilon: float, errors: Sequence[float], formula: float, stated: float, text: str) -> dict[str, Any]:
    empirical = float(np.mean(np.square(errors)))
    return {"task": task, "column": column, "epsilon": epsilon, "trials": len(errors), "empirical_mse": empirical, "formula_mse": formula,
            "stated_mse": stated, "ratio": empirical / formula, "formula": text}


def _trials(trials: int, rng: np.random.Generator, draw: Callable[[np.random.Generator], float]) -> list[float]:
    return [draw(rng) for _ in range(trials)]


def statistic_task_errors(spec: FeatureSpec, table: Table, epsilons: Sequence[float], trials: int, seed: int) -> list[dict[str, Any]]:
    """One row per task, column and ε: empirical mean squared error over
    ``trials``, the formula's value at the true data (``formula_mse``), the
    figure the answer states from public parameters (``stated_mse``, the
    worst case where the exact one needs the secret values), and their ratio."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    labels = spec.label.encode(table.labels).astype(bool)
    for eps in epsilons:
        count = count_task(labels, eps, rng, column=spec.label.name)
        rows.append(_row("count", spec.label.name, eps, _trials(trials, rng, lambda r: count_task(labels, eps, r).estimate - labels.sum()),
                         count.variance, count.variance, count.formula))
        for feature in spec.features:
            values = table.column(feature.name)
            if isinstance(feature, NumericFeature):
                low, high = feature.low, feature.high
                numeric = np.clip(values.astype(np.float64), low, high)
                exact = mean_variance(eps, numeric.size, low, high, numeric)
                stated = mean_variance(eps, numeric.size, low, high)
                rows.append(_row("mean", feature.name, eps, _trials(trials, rng, lambda r: mean_task(numeric, low, high, eps, r).estimate - numeric.mean()),
                                 exact, stated, "((high-low)/2)^2 (1/n^2) sum_i (c^2 - t_i^2)"))
                cuts = np.linspace(low, high, QUANTILE_GRID + 2)[1:-1]
                truth_counts = np.bincount(np.searchsorted(cuts, numeric, side="left"), minlength=cuts.size + 1)
                true_cdf = np.cumsum(truth_counts) / numeric.size
                median_bin = int(np.searchsorted(true_cdf, 0.5))
                formula = float(cdf_variances(OptimizedUnaryEncoding(eps, cuts.size + 1), truth_counts)[median_bin])
                rows.append(_row("median (CDF at its bin)", feature.name, eps,
                                 _trials(trials, rng, lambda r: quantile_task(numeric, cuts, 0.5, eps, r)[0][median_bin] - true_cdf[median_bin]),
                                 formula, formula, "sum_{i<=b} Var[n̂_i] / n^2"))
                continue
            codes = feature.bin(values)
            truth = np.bincount(codes, minlength=feature.n_bins)
            _, answer = histogram_task(codes, feature.n_bins, eps, rng)
            rows.append(_row("histogram (L2)", feature.name, eps,
                             _trials(trials, rng, lambda r: float(np.linalg.norm(histogram_task(codes, feature.n_bins, eps, r)[0] - truth))),
                             answer.variance, answer.variance, answer.formula))
        reports = [mixed_statistics(spec, table, eps, rng) for _ in range(trials)]
        for feature in spec.features:
            first = reports[0].answers[feature.name]
            if isinstance(feature, NumericFeature):
                truth_mean = float(np.clip(table.column(feature.name).astype(np.float64), feature.low, feature.high).mean())
                errors = [float(r.answers[feature.name].estimate[0]) - truth_mean for r in reports]
                rows.append(_row("Harmony mixed: mean", feature.name, eps, errors, float(first.variance[0]), first.worst_case_variance, first.formula))
                continue
            frequencies = np.bincount(feature.bin(table.column(feature.name)), minlength=feature.n_bins) / table.n_rows
            errors = [float(np.linalg.norm(r.answers[feature.name].estimate - frequencies)) for r in reports]
            rows.append(_row("Harmony mixed: frequencies (L2)", feature.name, eps, errors, float(first.variance.sum()),
                             feature.n_bins * first.worst_case_variance, "sum_l (d c^2 - f_l) / n"))
    return rows


def print_statistic_errors(rows: Sequence[dict[str, Any]], dataset: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table as RichTable

    table = RichTable(title=f"Statistic tasks on {dataset}: empirical error against its formula ({rows[0]['trials'] if rows else 0} trials)")
    for column in ("task", "column", "ε", "RMSE measured", "RMSE formula", "RMSE stated", "MSE ratio", "formula"):
        # The formula wraps: a long one would squeeze the figures' columns to nothing.
        table.add_column(column, justify="left" if column in ("task", "column", "formula") else "right", no_wrap=column != "formula")
    for row in rows:
        table.add_row(row["task"], row["column"], f"{row['epsilon']:g}", f"{row['empirical_mse'] ** 0.5:.4g}", f"{row['formula_mse'] ** 0.5:.4g}",
                      f"{row['stated_mse'] ** 0.5:.4g}", f"{row['ratio']:.2f}", escape(row["formula"]))
    Console(width=max(180, Console().width)).print(table)
