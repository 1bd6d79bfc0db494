"""A statistics round's answers (``[task] kind = "statistics"``, issue 28).

Every data peer of the round sends ONE report, through the same surveys,
relays and tokens as the ensemble's: its bin of one feature and its label,
perturbed by a unary encoding at the round's whole ε_T (``aggregator._spec``
refuses any other plan or oracle for this kind). The aggregator estimates
each survey's unbiased cell counts over (bin, label) and answers, by
post-processing alone (no further ε):

* every feature's **histogram** (its bins summed over both labels);
* the **count** of positive labels (every survey's reports carry the label);
* every numeric feature's **mean** (of its bins' midpoints between the
  public bounds and the cut points the median search published) and its
  **median** on the grid of those cut points.

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
from anonml.protocol import CategoricalFeature, FeatureSpec, NumericFeature

CELL_VARIANCE = "Var[n̂_c] = (n_c p(1-p) + (n-n_c) q(1-q))/(p-q)^2, n_c estimated"


@dataclass(frozen=True)
class SurveyCells:
    """One data survey of a statistics round: its feature, the unbiased counts of its
    (bin, label) cells as an array ``[bin, label]``, each cell's variance, and its reports."""

    feature: str
    estimate: FloatArray
    variance: FloatArray
    reports: int


def survey_cells(spec: FeatureSpec, feature: str, oracle: FrequencyOracle, blobs: Sequence[bytes]) -> SurveyCells:
    """Estimate one survey's cells from its encoded reports (``FeatureSpec.encode``: the label least significant)."""
    n_bins = spec.features[spec.index(feature)].n_bins
    n = len(blobs)
    estimate = oracle.estimate_blobs(blobs)
    variance = oracle.value_variances(plug_in_counts(estimate, n))
    return SurveyCells(feature, estimate.reshape(n_bins, 2), variance.reshape(n_bins, 2), n)


def _answer(query: str, subject: str, estimate: Any, variance: float, reports: int, formula: str, **extra: Any) -> dict[str, Any]:
    return {"query": query, "subject": subject, "estimate": estimate, "variance": variance,
            "std_error": float(np.sqrt(variance)), "reports": reports, "formula": formula, **extra}


def _bin_edges(feature: NumericFeature, cut_points: Sequence[float]) -> FloatArray:
    """``[low, c_1, …, c_k, high]``: a value ``v`` falls in bin ``#{c : v > c}``, values outside the bounds in the end bins."""
    return np.array([feature.low, *cut_points, feature.high], dtype=np.float64)


def _numeric_answers(feature: NumericFeature, bins: FloatArray, variances: FloatArray, n: int,
                     cut_points: Sequence[float]) -> list[dict[str, Any]]:
    """The mean of the bins' midpoints and the median on the cut points' grid, from the bins' counts."""
    edges = _bin_edges(feature, cut_points)
    middles = (edges[:-1] + edges[1:]) / 2
    mean = float(middles @ bins / n)
    mean_variance = float(np.square(middles) @ variances / n**2)
    cdf = np.cumsum(bins) / n
    chosen = grid_quantile(cdf, 0.5, len(cut_points))
    rank_variance = float(variances[: chosen + 1].sum() / n**2)
    return [
        _answer("mean", feature.name, mean, mean_variance, n,
                "sum_b mid_b^2 Var[n̂_b] / n^2, Var[n̂_b] the sum of its cells' (the mean of the bins' midpoints: "
                "the binning's bias is not in it)", bin_middles=middles.tolist()),
        _answer("median", feature.name, float(cut_points[chosen]), rank_variance, n,
                "Var[F̂(b)] = sum_{i<=b} Var[n̂_i] / n^2 at the chosen cut point (a rank error)",
                cdf=cdf.tolist()),
    ]


def round_statistics(spec: FeatureSpec, surveys: Sequence[SurveyCells], cut_points: Mapping[str, Sequence[float]]) -> list[dict[str, Any]]:
    """Every answer of a statistics round from its surveys' cells (see the module docstring)."""
    answers: list[dict[str, Any]] = []
    if not surveys:
        return answers
    positives = sum(float(s.estimate[:, 1].sum()) for s in surveys)
    answers.append(_answer(
        "count", f"{spec.label.name} positive", positives, sum(float(s.variance[:, 1].sum()) for s in surveys),
        sum(s.reports for s in surveys), f"sum over the label-1 cells of every survey of {CELL_VARIANCE}",
    ))
    for feature in spec.features:
        own = [s for s in surveys if s.feature == feature.name and s.reports]
        if not own:
            continue
        n = sum(s.reports for s in own)
        bins = np.sum([s.estimate.sum(axis=1) for s in own], axis=0)
        variances = np.sum([s.variance.sum(axis=1) for s in own], axis=0)
        names = list(feature.bin_names) if isinstance(feature, CategoricalFeature) else None
        answers.append(_answer(
            "histogram", feature.name, bins.tolist(), float(variances.sum()), n,
            "sum_b Var[n̂_b] = n (p(1-p) + (m-1) q(1-q))/(p-q)^2 per survey (exact for any counts)",
            bin_variances=variances.tolist(), bins=names,
        ))
        if isinstance(feature, NumericFeature) and feature.name in cut_points:
            answers.extend(_numeric_answers(feature, bins, variances, n, cut_points[feature.name]))
    return answers


def describe_answer(answer: Mapping[str, Any]) -> str:
    """One line of the report's text: the answer, its standard error and its formula."""
    estimate = answer["estimate"]
    shown = ", ".join(f"{v:.4g}" for v in estimate) if isinstance(estimate, list) else f"{estimate:.4g}"
    return (f"{answer['query']} of {answer['subject']} ({answer['reports']} reports): {shown}; "
            f"std error {answer['std_error']:.3g} from {answer['formula']}")
