"""Cut points for the numeric features: private (thesis Algorithm 1, run on
the training peers with the plan's median budget) or exact (the noise-free
baseline, thesis §8.2.1's dashed lines)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from anonml.learning._data import Table
from anonml.mechanisms import estimate_quantiles
from anonml.protocol import Assignment, FeatureSpec, NumericFeature, ReleasePlan

IntArray = npt.NDArray[np.int64]


def exact_cut_points(spec: FeatureSpec, table: Table) -> dict[str, npt.NDArray[np.float64]]:
    """The true quantiles of each numeric feature (no privacy)."""
    out = {}
    for name in spec.numeric_names:
        feature = spec.feature(name)
        assert isinstance(feature, NumericFeature)
        out[name] = np.quantile(np.asarray(table.column(name), dtype=np.float64), feature.quantile_levels)
    return out


def private_cut_points(spec: FeatureSpec, table: Table, plan: ReleasePlan, assignment: Assignment, rng: np.random.Generator) -> dict[str, npt.NDArray[np.float64]]:
    """Algorithm 1 for every numeric feature in parallel: step ``t`` of the
    search for feature ``f`` asks ``plan.median_groups(f)[t]``, each peer
    answering once with ``plan.median_epsilon``. Cut points are sorted so the
    bins stay ordered when q > 1 searches cross."""
    out = {}
    for name in spec.numeric_names:
        feature = spec.feature(name)
        assert isinstance(feature, NumericFeature)
        values = np.asarray(table.column(name), dtype=np.float64)
        groups = [values[g] for g in plan.median_groups(name, assignment)]
        estimates = estimate_quantiles(groups, feature.low, feature.high, plan.median_epsilon, feature.quantile_levels, rng)
        out[name] = np.sort(np.asarray(estimates, dtype=np.float64))
    return out


def bin_table(spec: FeatureSpec, table: Table, cut_points: dict[str, npt.NDArray[np.float64]]) -> tuple[IntArray, IntArray]:
    """``(X, y)``: bin indices ``(n, k_f)`` in feature order and 0/1 labels."""
    columns = {name: table.column(name) for name in spec.names}
    return spec.bin_columns(columns, {k: list(v) for k, v in cut_points.items()}), spec.label.encode(table.labels)
