"""Statistic tasks over local-DP reports (Tiresias, seed 001: bounded
count, mean, histogram and quantile queries), each answer beside the exact
formula of its expected squared error.

Every peer answers one task with one release at ε (its record-level ε for
the task), through a mechanism that adds no floating-point noise to a
secret: randomized response for counts, Harmony's 1-bit mechanism for means
(Algorithm 2 with d = 1), a frequency oracle for histograms and unary
encoding for quantiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from anonml.mechanisms import (
    GeneralizedRandomResponse,
    OneBitMean,
    OptimizedUnaryEncoding,
    OracleName,
    PopulationLedgers,
    Release,
    ReleaseKind,
    ledgers_of_one_release,
    make_oracle,
    one_bit_mean_variance,
)

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class StatisticAnswer:
    """One task's answer: the ``estimate``, the ``variance`` formula's value
    (the expected squared error of the estimate, from public parameters and,
    where the formula needs them, the estimate itself), what that formula
    is, and one ledger per answering peer."""

    kind: str
    estimate: float
    variance: float
    formula: str
    epsilon: float
    ledgers: PopulationLedgers = field(repr=False)


def _ledgers(n: int, column: str, epsilon: float) -> PopulationLedgers:
    return ledgers_of_one_release(Release.about(ReleaseKind.STATISTIC, (column,), epsilon), n, epsilon)


def count_variance(epsilon: float, n: int) -> float:
    """Exact ``E[(ĉ - c)^2]`` of :func:`count_task`: binary randomized
    response keeps the bit with ``p = e^ε/(e^ε + 1)``, ``q = 1 - p``, and the
    unbiased count ``(S - qn)/(p - q)`` has variance ``n p q / (p - q)^2``
    whatever the true count (``p(1-p) = q(1-q)``)."""
    oracle = GeneralizedRandomResponse(epsilon, 2)
    return float(oracle.value_variances(np.array([n, 0]))[1])


def count_task(flags: npt.ArrayLike, epsilon: float, rng: np.random.Generator, *, column: str = "flag") -> StatisticAnswer:
    """How many peers hold a true flag, from one randomized-response bit each."""
    bits = np.asarray(flags, dtype=bool).astype(np.int64)
    ledgers = _ledgers(bits.size, column, epsilon)
    oracle = GeneralizedRandomResponse(epsilon, 2)
    estimate = float(oracle.estimate(oracle.privatize(bits, rng))[1])
    return StatisticAnswer("count", estimate, count_variance(epsilon, bits.size), "n p q / (p - q)^2", oracle.epsilon, ledgers)


def mean_variance(epsilon: float, n: int, low: float, high: float, values: npt.ArrayLike | None = None) -> float:
    """Exact ``E[(mean estimate - mean)^2]`` of :func:`mean_task`: the 1-bit
    mechanism's variance (:func:`one_bit_mean_variance`, d = 1) in the
    value's units, ``((high - low)/2)^2 (1/n^2) sum_i (c^2 - t_i^2)``; the
    worst case ``((high - low)/2)^2 c^2 / n`` without ``values``."""
    half = (high - low) / 2
    scaled = None if values is None else (_scaled(values, low, high)[:, None])
    return float(half**2 * one_bit_mean_variance(epsilon, 1, n, scaled)[0])


def _scaled(values: npt.ArrayLike, low: float, high: float) -> FloatArray:
    if not low < high:
        raise ValueError(f"need low < high, got {low!r}, {high!r}")
    clipped = np.clip(np.asarray(values, dtype=np.float64), low, high)
    scaled: FloatArray = 2 * (clipped - low) / (high - low) - 1
    return scaled


def mean_task(values: npt.ArrayLike, low: float, high: float, epsilon: float, rng: np.random.Generator, *, column: str = "value") -> StatisticAnswer:
    """The mean of values clipped to the public ``[low, high]``, one bit per
    peer; the variance stated is the worst case (the exact one needs the
    secret values)."""
    scaled = _scaled(values, low, high)
    ledgers = _ledgers(scaled.size, column, epsilon)
    mechanism = OneBitMean(epsilon, 1)
    unit_mean = float(mechanism.estimate(mechanism.privatize(scaled[:, None], rng))[0])
    estimate = low + (unit_mean + 1) * (high - low) / 2
    variance = mean_variance(epsilon, scaled.size, low, high)
    return StatisticAnswer("mean", estimate, variance, "((high-low)/2)^2 c^2 / n, c = (e^ε+1)/(e^ε-1)", mechanism.epsilon, ledgers)


def histogram_task(
    codes: npt.ArrayLike, m: int, epsilon: float, rng: np.random.Generator, *, oracle: OracleName | str = OracleName.AUTO, column: str = "value",
) -> tuple[FloatArray, StatisticAnswer]:
    """Unbiased counts of the values ``0..m-1`` from one frequency-oracle
    report each, and the answer whose variance is the oracle's exact total
    ``sum_i E[(n̂_i - n_i)^2]`` (``FrequencyOracle.variance``)."""
    values = np.asarray(codes, dtype=np.int64)
    chosen = make_oracle(oracle, epsilon, m, n=values.size)
    ledgers = _ledgers(values.size, column, epsilon)
    counts = chosen.estimate(chosen.privatize(values, rng))
    answer = StatisticAnswer("histogram", float(counts.sum()), chosen.variance(values.size), f"{chosen.name}: sum_i Var[n̂_i]", chosen.epsilon, ledgers)
    return counts, answer


def cdf_variances(oracle: OptimizedUnaryEncoding, counts: npt.ArrayLike) -> FloatArray:
    """Exact ``Var[F̂(b)]`` of the estimated CDF at every bin b given the
    bin counts: unary encoding perturbs each bit independently, so the bins'
    estimates are independent and ``Var[F̂(b)] = sum_{i<=b} Var[n̂_i] / n^2``."""
    counts_f = np.asarray(counts, dtype=np.float64)
    n = counts_f.sum()
    variances: FloatArray = np.cumsum(oracle.value_variances(counts_f)) / n**2
    return variances


def plug_in_counts(estimate: npt.ArrayLike, n: int) -> FloatArray:
    """What stands in for the true counts in a variance formula that needs them: the unbiased
    estimate clipped at 0 and rescaled to sum to ``n`` (uniform when nothing is left)."""
    clipped = np.clip(np.asarray(estimate, dtype=np.float64), 0, None)
    if clipped.sum() > 0:
        rescaled: FloatArray = clipped * (n / clipped.sum())
        return rescaled
    return np.full(clipped.size, n / clipped.size)


def grid_quantile(cdf: FloatArray, level: float, cut_points: int) -> int:
    """The index of the first of ``cut_points`` cut points whose estimated CDF reaches ``level`` (the last if none does)."""
    return min(int(np.searchsorted(cdf, level, side="left")), cut_points - 1)


def quantile_task(
    values: npt.ArrayLike, cut_points: npt.ArrayLike, level: float, epsilon: float, rng: np.random.Generator, *, column: str = "value",
) -> tuple[FloatArray, StatisticAnswer]:
    """The ``level`` quantile on a public grid of ``cut_points``: each peer
    sends its bin by optimized unary encoding, the aggregator returns the
    estimated CDF at every bin and the first cut point whose estimated CDF
    reaches ``level``. The variance is
    the CDF estimate's at that cut point (a rank error), with the estimated
    counts, clipped at 0, standing in for the true ones."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    cuts = np.asarray(cut_points, dtype=np.float64)
    bins = np.searchsorted(cuts, np.asarray(values, dtype=np.float64), side="left")
    oracle = OptimizedUnaryEncoding(epsilon, cuts.size + 1)
    ledgers = _ledgers(bins.size, column, epsilon)
    counts = oracle.estimate(oracle.privatize(bins, rng))
    cdf = np.cumsum(counts) / bins.size
    chosen = grid_quantile(cdf, level, cuts.size)
    variance = float(cdf_variances(oracle, plug_in_counts(counts, bins.size))[chosen])
    return cdf, StatisticAnswer("quantile", float(cuts[chosen]), variance, "Var[F̂(q)] = sum_{i<=b} Var[n̂_i]/n^2 (rank)", oracle.epsilon, ledgers)
