"""Cut points and bins: private (thesis Algorithm 1, run on the peers the plan
asks) or exact (the noise-free baseline, thesis §8.2.1's dashed lines), and
the two scikit-learn transformers that turn rows into bin indices.

A bin is ``#{cut points c : v > c}``, the side of each cut a peer's "is my
value greater than t?" answer reports. Exact cut points are chosen between
observed values (:func:`balanced_cuts`): the old rule, ``x > median``, put a
0/1 column with 60% ones entirely in bin 0 (its median is 1), which made the
column constant (AUC 0.566 against 0.730 for that feature alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from anonml.learning._data import Table
from anonml.mechanisms import estimate_quantiles
from anonml.protocol import Assignment, FeatureSpec, NumericFeature, ReleasePlan

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def balanced_cuts(values: npt.ArrayLike, levels: Sequence[float]) -> FloatArray:
    """For each quantile level, the cut between two consecutive distinct
    values whose share of values at or below it is closest to the level.
    A column with one distinct value gets that value (everything in bin 0)."""
    column = np.asarray(values, dtype=np.float64)
    distinct, counts = np.unique(column, return_counts=True)
    if distinct.size < 2:
        return np.full(len(levels), distinct[0] if distinct.size else 0.0)
    below = np.cumsum(counts)[:-1] / column.size  # share <= distinct[i] for each candidate cut
    midpoints = (distinct[:-1] + distinct[1:]) / 2
    chosen = [midpoints[int(np.argmin(np.abs(below - level)))] for level in levels]
    return np.sort(np.asarray(chosen, dtype=np.float64))


def exact_cut_points(spec: FeatureSpec, table: Table) -> dict[str, FloatArray]:
    """The balanced cuts at each numeric feature's quantile levels (no privacy)."""
    out = {}
    for name in spec.numeric_names:
        feature = spec.feature(name)
        assert isinstance(feature, NumericFeature)
        out[name] = balanced_cuts(table.column(name), feature.quantile_levels)
    return out


def private_cut_points(spec: FeatureSpec, table: Table, plan: ReleasePlan, assignment: Assignment, rng: np.random.Generator) -> dict[str, FloatArray]:
    """Algorithm 1 for every numeric feature in parallel: step ``t`` of the
    search for feature ``f`` asks ``plan.median_groups(f)[t]``, each peer
    answering once with ``plan.median_epsilon``. Values are clipped into the
    public bounds first (what a peer's answer assumes). Cut points are sorted
    so the bins stay ordered when q > 1 searches cross."""
    out = {}
    for name in spec.numeric_names:
        feature = spec.feature(name)
        assert isinstance(feature, NumericFeature)
        values, _ = feature.clip(table.column(name))
        groups = [values[g] for g in plan.median_groups(name, assignment)]
        estimates = estimate_quantiles(groups, feature.low, feature.high, plan.median_epsilon, feature.quantile_levels, rng)
        out[name] = np.sort(np.asarray(estimates, dtype=np.float64))
    return out


def table_matrix(spec: FeatureSpec, table: Table) -> npt.NDArray[np.object_]:
    """The raw columns of ``table`` in feature order, as one object array
    (what :class:`SpecBinner` and a published model's ``predict`` take)."""
    return np.column_stack([np.asarray(table.column(name)).astype(object) for name in spec.names])


def bin_table(spec: FeatureSpec, table: Table, cut_points: Mapping[str, Sequence[float] | FloatArray]) -> tuple[IntArray, IntArray]:
    """``(X, y)``: bin indices ``(n, k_f)`` in feature order and 0/1 labels."""
    columns = {name: table.column(name) for name in spec.names}
    return spec.bin_columns(columns, {k: list(v) for k, v in cut_points.items()}), spec.label.encode(table.labels)


class SpecBinner(TransformerMixin, BaseEstimator):
    """Raw rows (feature order, as :func:`table_matrix` makes them) to bin
    indices by a feature spec and published cut points: the first step of a
    round's published model. Nothing is learned: ``fit`` only checks."""

    def __init__(self, *, spec: Mapping[str, Any] | None = None, cut_points: Mapping[str, Sequence[float]] | None = None) -> None:
        self.spec = spec
        self.cut_points = cut_points

    def fit(self, X: npt.ArrayLike, y: npt.ArrayLike | None = None) -> SpecBinner:
        self.spec_ = FeatureSpec.from_dict(self.spec)
        self.cut_points_ = {name: [float(c) for c in cuts] for name, cuts in (self.cut_points or {}).items()}
        self.n_features_in_ = len(self.spec_.names)
        return self

    def transform(self, X: npt.ArrayLike) -> IntArray:
        check_is_fitted(self)
        rows = np.asarray(X, dtype=object)
        if rows.ndim != 2 or rows.shape[1] != self.n_features_in_:
            raise ValueError(f"X must have {self.n_features_in_} columns in feature order {list(self.spec_.names)!r}, got shape {rows.shape!r}")
        columns: dict[str, npt.ArrayLike] = {}
        for j, feature in enumerate(self.spec_.features):
            column = rows[:, j]
            columns[feature.name] = column.astype(np.float64) if isinstance(feature, NumericFeature) else column.astype(str)
        return self.spec_.bin_columns(columns, self.cut_points_)


class QuantileBinner(TransformerMixin, BaseEstimator):
    """Numeric columns to bin indices at ``n_cuts`` balanced cuts each
    (:func:`balanced_cuts`, learned in ``fit``): the noise-free path of a
    ``Pipeline(QuantileBinner(), PartitionEnsemble())``."""

    def __init__(self, *, n_cuts: int = 1) -> None:
        self.n_cuts = n_cuts

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        # The output is bin indices (int64), whatever the input's float dtype.
        tags.transformer_tags.preserves_dtype = []
        return tags

    def fit(self, X: npt.ArrayLike, y: npt.ArrayLike | None = None) -> QuantileBinner:
        if isinstance(self.n_cuts, bool) or not isinstance(self.n_cuts, (int, np.integer)) or self.n_cuts < 1:
            raise ValueError(f"n_cuts must be an integer >= 1, got {self.n_cuts!r}")
        data = validate_data(self, X, dtype=np.float64)
        levels = [(i + 1) / (self.n_cuts + 1) for i in range(self.n_cuts)]
        self.cut_points_ = np.column_stack([balanced_cuts(data[:, j], levels) for j in range(data.shape[1])])
        return self

    def transform(self, X: npt.ArrayLike) -> IntArray:
        check_is_fitted(self)
        data = validate_data(self, X, dtype=np.float64, reset=False)
        bins: IntArray = np.sum(data[:, None, :] > self.cut_points_[None, :, :], axis=1).astype(np.int64)
        return bins
