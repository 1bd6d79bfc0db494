"""A statistics round's answers (``[task] kind = "statistics"``, issue 28).

Every data peer of the round sends ONE report, through the same surveys,
relays and tokens as the ensemble's: its bin of one feature, and its label
when a query counts it, perturbed by a unary encoding at the round's whole
ε_T (``aggregator._spec`` refuses any other plan or oracle for this kind).
The aggregator estimates each survey's unbiased cell counts over (bin,
label), or over the bins alone in a label-free round, and answers the
round's queries (``[task] queries``, :mod:`protocol._queries`; without them
the default set: the positive count, every histogram, every numeric
feature's mean and median) by post-processing alone (no further ε):

* ``count:label``: the positive labels over every survey (every report carries the label);
* ``count:F=V``: the bin ``V`` of ``F``'s bins summed over both labels, among the peers who
  reported ``F``, and its share of them (their number is public, so the share's variance is the
  count's over ``n^2``);
* ``histogram:F``: ``F``'s bins summed over both labels;
* ``mean:F``: of ``F``'s bins' midpoints between the public bounds and the
  cut points the median search published;
* ``quantile:F:Q``: the first of those cut points whose estimated CDF reaches ``Q``.

Each answer carries the variance its formula gives and the formula. A unary
encoding perturbs each cell's bit independently, so a sum of cells has the
sum of the cells' variances, ``Var[n̂_c] = (n_c p(1-p) + (n - n_c) q(1-q)) / (p-q)^2``
(thesis appendix); where that needs the true counts ``n_c`` the estimate
stands in (:func:`plug_in_counts`). The histogram's total is exact whatever
the counts: ``sum_c Var[n̂_c] = n (p(1-p) + (m-1) q(1-q)) / (p-q)^2``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from anonml.learning._statistics import FloatArray, grid_quantile, plug_in_counts
from anonml.mechanisms import FrequencyOracle
from anonml.protocol import (
    CategoricalFeature,
    Feature,
    FeatureSpec,
    NumericFeature,
    QueryError,
    QueryKind,
    StatisticQuery,
    counted_bin,
    default_queries,
)

CELL_VARIANCE = "Var[n̂_c] = (n_c p(1-p) + (n-n_c) q(1-q))/(p-q)^2, n_c estimated"


@dataclass(frozen=True)
class SurveyCells:
    """One data survey of a statistics round: its feature, the unbiased counts of its
    cells as an array ``[bin, label]`` (one label column when the reports carry none),
    each cell's variance, and its reports."""

    feature: str
    estimate: FloatArray
    variance: FloatArray
    reports: int


def survey_cells(spec: FeatureSpec, feature: str, oracle: FrequencyOracle, blobs: Sequence[bytes], *, labelled: bool = True) -> SurveyCells:
    """Estimate one survey's cells from its encoded reports (``FeatureSpec.encode``: the label least significant)."""
    n_bins = spec.features[spec.index(feature)].n_bins
    n = len(blobs)
    estimate = oracle.estimate_blobs(blobs)
    variance = oracle.value_variances(plug_in_counts(estimate, n))
    shape = (n_bins, 2 if labelled else 1)
    return SurveyCells(feature, estimate.reshape(shape), variance.reshape(shape), n)


def _answer(query: StatisticQuery, subject: str, estimate: Any, variance: float, reports: int, formula: str, **extra: Any) -> dict[str, Any]:
    return {"query": query.text, "kind": str(query.kind), "subject": subject, "estimate": estimate, "variance": variance,
            "std_error": float(np.sqrt(variance)), "reports": reports, "formula": formula, **extra}


def _bin_edges(feature: NumericFeature, cut_points: Sequence[float]) -> FloatArray:
    """``[low, c_1, …, c_k, high]``: a value ``v`` falls in bin ``#{c : v > c}``, values outside the bounds in the end bins."""
    return np.array([feature.low, *cut_points, feature.high], dtype=np.float64)


@dataclass(frozen=True)
class _FeatureBins:
    """One feature's bin counts over every survey of it, their variances, and its reports."""

    bins: FloatArray
    variances: FloatArray
    reports: int


def _feature_bins(surveys: Sequence[SurveyCells], feature: str) -> _FeatureBins | None:
    own = [s for s in surveys if s.feature == feature and s.reports]
    if not own:
        return None
    return _FeatureBins(np.sum([s.estimate.sum(axis=1) for s in own], axis=0), np.sum([s.variance.sum(axis=1) for s in own], axis=0),
                        sum(s.reports for s in own))


def _numeric_answer(query: StatisticQuery, feature: NumericFeature, counted: _FeatureBins, cut_points: Sequence[float]) -> dict[str, Any]:
    """The mean of the bins' midpoints, or a quantile on the cut points' grid, from the bins' counts."""
    bins, variances, n = counted.bins, counted.variances, counted.reports
    if query.kind == QueryKind.MEAN:
        edges = _bin_edges(feature, cut_points)
        middles = (edges[:-1] + edges[1:]) / 2
        return _answer(query, feature.name, float(middles @ bins / n), float(np.square(middles) @ variances / n**2), n,
                       "sum_b mid_b^2 Var[n̂_b] / n^2, Var[n̂_b] the sum of its cells' (the mean of the bins' midpoints: "
                       "the binning's bias is not in it)", bin_middles=middles.tolist())
    assert query.level is not None
    cdf = np.cumsum(bins) / n
    chosen = grid_quantile(cdf, query.level, len(cut_points))
    return _answer(query, feature.name, float(cut_points[chosen]), float(variances[: chosen + 1].sum() / n**2), n,
                   "Var[F̂(b)] = sum_{i<=b} Var[n̂_i] / n^2 at the chosen cut point (a rank error)", level=query.level, cut_index=chosen, cdf=cdf.tolist())


def _value_count_answer(query: StatisticQuery, feature: Feature, counted: _FeatureBins) -> dict[str, Any]:
    """``count:F=V``: bin ``V``'s count among ``F``'s reports, and its share of them."""
    if not isinstance(feature, CategoricalFeature) or query.category is None:
        raise QueryError(f"{query.text!r}: a count of a value needs a categorical feature; {feature.name!r} is numeric")
    index = counted_bin(feature, query.category)
    n = counted.reports
    count, variance = float(counted.bins[index]), float(counted.variances[index])
    return _answer(query, f"{feature.name} = {query.category}", count, variance, n,
                   f"Var[n̂_b] = the sum of the bin's cells' {CELL_VARIANCE}; its share n̂_b / n: Var[n̂_b] / n^2 "
                   f"(n: the reports of {feature.name})", bin=index, share=count / n, share_std_error=float(np.sqrt(variance)) / n)


def _count_answer(spec: FeatureSpec, query: StatisticQuery, surveys: Sequence[SurveyCells]) -> dict[str, Any]:
    positives = sum(float(s.estimate[:, 1].sum()) for s in surveys)
    return _answer(query, f"{spec.label.name} positive", positives, sum(float(s.variance[:, 1].sum()) for s in surveys),
                   sum(s.reports for s in surveys), f"sum over the label-1 cells of every survey of {CELL_VARIANCE}")


def round_statistics(spec: FeatureSpec, surveys: Sequence[SurveyCells], cut_points: Mapping[str, Sequence[float]],
                     queries: Sequence[StatisticQuery] = ()) -> list[dict[str, Any]]:
    """The answer to each of ``queries`` (none: :func:`protocol.default_queries`) from the round's
    surveys' cells (see the module docstring). A query whose feature got no report, or whose
    numeric feature got no published cut points, has no answer."""
    answers: list[dict[str, Any]] = []
    if not surveys:
        return answers
    for query in queries or default_queries(spec.names, spec.numeric_names):
        if query.uses_label:
            answers.append(_count_answer(spec, query, surveys))
            continue
        feature = spec.feature(query.subject)
        counted = _feature_bins(surveys, feature.name)
        if counted is None:
            continue
        if query.kind == QueryKind.COUNT:
            answers.append(_value_count_answer(query, feature, counted))
        elif query.kind == QueryKind.HISTOGRAM:
            names = list(feature.bin_names) if isinstance(feature, CategoricalFeature) else None
            answers.append(_answer(
                query, feature.name, counted.bins.tolist(), float(counted.variances.sum()), counted.reports,
                "sum_b Var[n̂_b] = n (p(1-p) + (m-1) q(1-q))/(p-q)^2 per survey (exact for any counts)",
                bin_variances=counted.variances.tolist(), bins=names,
            ))
        elif isinstance(feature, NumericFeature) and feature.name in cut_points:
            answers.append(_numeric_answer(query, feature, counted, cut_points[feature.name]))
    return answers


def describe_answer(answer: Mapping[str, Any]) -> str:
    """One line of the report's text: the answer, its standard error and its formula."""
    estimate = answer["estimate"]
    shown = ", ".join(f"{v:.4g}" for v in estimate) if isinstance(estimate, list) else f"{estimate:.4g}"
    if "share" in answer:
        shown += f" (a share of {answer['share']:.4g} ± {answer['share_std_error']:.2g})"
    return (f"{answer['query']} ({answer['subject']}, {answer['reports']} reports): {shown}; "
            f"std error {answer['std_error']:.3g} from {answer['formula']}")
