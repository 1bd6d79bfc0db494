"""A statistics round's queries answered offline over seeded trials, each answer's
empirical error beside its formula (``anonml experiment TABLE --task statistics``;
the tests hold every ratio within 1.5x over 100 trials).

It runs the round's own estimator (:func:`survey_cells`, :func:`round_statistics`)
on the reports the peers would send: each row is one peer, dealt (seeded) to one
survey per feature the queries read, its bin and, when a query counts it, its
label encoded, perturbed by the round's unary encoding at ε and sent as bytes.
The cut points are given (``anonml experiment`` uses the table's balanced cuts at
each feature's quantile levels, ``learning.exact_cut_points``): in a round the median search estimates them from its
own comparison pool, at the cost of those peers' one release each.

What each error is measured against is what the formula states: the count of
positive labels; the true count of the value's bin among the feature's reporters
(``count:F=V``); the true bin counts (histogram, summed squared error); the mean of
the bins' midpoints (the binning's bias is not in the formula); and the true CDF at
the cut point the quantile answer chose (a rank error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from anonml.learning._binning import bin_table, exact_cut_points
from anonml.learning._data import Table
from anonml.learning._round_statistics import round_statistics, survey_cells
from anonml.mechanisms import OracleName, make_oracle
from anonml.protocol import FeatureSpec, QueryKind, StatisticQuery, check_queries, default_queries, queried_features, uses_label

IntArray = npt.NDArray[np.int64]


def _squared_error(query: StatisticQuery, answer: Mapping[str, Any], truth_bins: IntArray, positives: int) -> float:
    """The answer's squared error against what its formula is the variance of (module docstring)."""
    kind = query.kind
    if query.uses_label:
        return float((answer["estimate"] - positives) ** 2)
    if kind == QueryKind.COUNT:
        return float((answer["estimate"] - truth_bins[answer["bin"]]) ** 2)
    if kind == QueryKind.HISTOGRAM:
        return float(np.sum(np.square(np.asarray(answer["estimate"]) - truth_bins)))
    n = truth_bins.sum()
    if kind == QueryKind.MEAN:
        return float((answer["estimate"] - np.asarray(answer["bin_middles"]) @ truth_bins / n) ** 2)
    chosen = answer["cut_index"]
    return float((answer["cdf"][chosen] - np.cumsum(truth_bins)[chosen] / n) ** 2)


def round_statistic_errors(
    spec: FeatureSpec, bins: npt.ArrayLike, labels: npt.ArrayLike, cut_points: Mapping[str, Sequence[float]],
    queries: Sequence[StatisticQuery], *, epsilon: float, trials: int, rng: np.random.Generator, oracle: str = OracleName.OUE,
) -> list[dict[str, Any]]:
    """One row per query (none: the default set): its empirical mean squared error over
    ``trials`` (``empirical_mse``), the mean of the variance its answer stated
    (``formula_mse``, also ``stated_mse``: the round states this one), and their ratio.

    ``bins``: every peer's bin of every feature, ``(n, k_f)`` in the spec's order (numeric
    features cut at ``cut_points``); ``labels``: 0/1 per peer.
    """
    asked = tuple(queries) or default_queries(spec.names, spec.numeric_names)
    read = queried_features(asked, spec.names)
    labelled = uses_label(asked)
    all_bins, y = np.asarray(bins, dtype=np.int64), np.asarray(labels, dtype=np.int64)
    survey_of = rng.permutation(y.size) % len(read)  # the "one" plan: each peer reports one feature
    reporters = {name: np.flatnonzero(survey_of == index) for index, name in enumerate(read)}
    codes = {name: spec.encode((name,), all_bins[rows][:, [spec.index(name)]], y[rows] if labelled else None) for name, rows in reporters.items()}
    oracles = {name: make_oracle(oracle, epsilon, spec.domain_size((name,), labelled=labelled), n=rows.size) for name, rows in reporters.items()}
    truth = {name: np.bincount(all_bins[rows, spec.index(name)], minlength=spec.feature(name).n_bins) for name, rows in reporters.items()}
    errors: dict[str, list[float]] = {query.text: [] for query in asked}
    stated: dict[str, list[float]] = {query.text: [] for query in asked}
    subjects: dict[str, tuple[str, str]] = {}
    by_text = {query.text: query for query in asked}
    for _ in range(trials):
        surveys = [survey_cells(spec, name, oracles[name], oracles[name].encode_reports(oracles[name].privatize(codes[name], rng)),
                                labelled=labelled) for name in read]
        for answer in round_statistics(spec, surveys, cut_points, asked):
            query = by_text[answer["query"]]
            name = read[0] if query.feature is None else query.feature
            errors[query.text].append(_squared_error(query, answer, truth[name], int(y.sum())))
            stated[answer["query"]].append(answer["variance"])
            subjects[answer["query"]] = (answer["subject"], answer["formula"])
    rows = []
    for query in asked:
        empirical, formula = float(np.mean(errors[query.text])), float(np.mean(stated[query.text]))
        subject, text = subjects[query.text]
        rows.append({"task": query.text, "column": subject, "epsilon": epsilon, "trials": trials, "empirical_mse": empirical,
                     "formula_mse": formula, "stated_mse": formula, "ratio": empirical / formula, "formula": text})
    return rows


def table_statistic_errors(spec: FeatureSpec, table: Table, queries: Sequence[str], *, epsilons: Sequence[float], trials: int,
                           seed: int) -> list[dict[str, Any]]:
    """:func:`round_statistic_errors` on a table's rows (one peer each) at every ε: ``queries`` as a round
    spec writes them (none: the default set), the spec cut to the features they read, as ``round new`` cuts it."""
    asked = check_queries(list(queries), spec) if queries else default_queries(spec.names, spec.numeric_names)
    restricted = FeatureSpec(tuple(spec.feature(name) for name in queried_features(asked, spec.names)), spec.label)
    cut_points = {name: [float(c) for c in cuts] for name, cuts in exact_cut_points(restricted, table).items()}
    bins, labels = bin_table(restricted, table, cut_points)
    rng = np.random.default_rng(seed)
    return [row for epsilon in epsilons
            for row in round_statistic_errors(restricted, bins, labels, cut_points, asked, epsilon=epsilon, trials=trials, rng=rng)]
