"""Harmony's mean and frequency estimation over a tuple of mixed numeric
and categorical attributes (Nguyen et al. 2016, §3.2, "multiple numeric and
categorical attributes"), as a statistic task: one release per peer at ε
answers every attribute's mean or histogram at once.

Each peer draws one of the d attributes uniformly and reports one bit about
it with the 1-bit mechanism (:class:`OneBitMean` with one attribute, at the
full ε):

- a numeric attribute: its value scaled from the public bounds onto
  [-1, 1] (Algorithm 2);
- a categorical attribute with k bins: Algorithm 3 with Harmony's
  orthogonal k×k matrix in place of the random projection: the peer draws a
  row s of the Sylvester Hadamard matrix H of order K (the power of two
  >= k) and reports the bit for ``H[s, v] ∈ {-1, 1}``, v its bin.

The bit stands for ``z = ±c`` (``c = (e^ε + 1)/(e^ε - 1)``), unbiased for the
value it was about. The aggregator scales by d (the attribute sampling):
the mean of numeric attribute j is ``(d/n) sum_{i chose j} z_i`` and the
frequency of bin l of categorical attribute j is
``(d/n) sum_{i chose j} z_i H[s_i, l]`` (rows of H are orthogonal, so
``E_s[H[s, v] H[s, l]] = [v = l]``).

Exact variances (each peer's term is ``E[X^2] - (E X)^2`` with
``E[X^2] = (1/d)(d c)^2``): a numeric mean ``(1/n^2) sum_i (d c^2 - t_i^2)``
in [-1, 1] units, worst case ``d c^2 / n``; a frequency
``(d c^2 - f_l) / n``, worst case ``d c^2 / n`` (Lemma 4's O(d/(n ε^2))).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from anonml.learning._data import Table
from anonml.mechanisms import OneBitMean, PopulationLedgers, Release, ReleaseKind, ledgers_of_one_release
from anonml.protocol import FeatureSpec, NumericFeature

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def hadamard_entries(rows: npt.ArrayLike, columns: npt.ArrayLike) -> IntArray:
    """``H[s, v] = (-1)^{popcount(s & v)}`` of the Sylvester Hadamard matrix,
    element-wise (any order that is a power of two above both indices)."""
    parity = np.bitwise_count(np.bitwise_and(np.asarray(rows, dtype=np.int64), np.asarray(columns, dtype=np.int64))) & 1
    entries: IntArray = 1 - 2 * parity.astype(np.int64)
    return entries


def hadamard_order(k: int) -> int:
    """The smallest power of two >= ``k`` (at least 1)."""
    return 1 << max(0, int(k) - 1).bit_length()


@dataclass(frozen=True)
class MixedAnswer:
    """One attribute's answer: its ``kind`` (``mean`` or ``frequency``), the
    estimate (the mean in the feature's units, or the k bin frequencies),
    the exact variance at the true values beside the worst-case one stated
    from public parameters, and the formula."""

    feature: str
    kind: str
    estimate: FloatArray
    variance: FloatArray
    worst_case_variance: float
    formula: str


@dataclass(frozen=True)
class MixedReport:
    """Every attribute's answer, and one ledger per peer (one release each)."""

    answers: dict[str, MixedAnswer]
    epsilon: float
    ledgers: PopulationLedgers = field(repr=False)


def mixed_statistics(spec: FeatureSpec, table: Table, epsilon: float, rng: np.random.Generator) -> MixedReport:
    """Harmony's mixed-attribute task over ``spec``'s features of ``table``
    (see the module docstring): one 1-bit report per row."""
    features = spec.features
    d, n = len(features), table.n_rows
    if n == 0:
        raise ValueError("the table has no rows")
    mechanism = OneBitMean(epsilon, 1)
    c = mechanism.scale
    chosen = rng.integers(0, d, size=n)
    # Each peer's secret value in [-1, 1] for the attribute it drew (its
    # Hadamard entry for a categorical one), and its Hadamard row.
    secret = np.zeros(n)
    rows = np.zeros(n, dtype=np.int64)
    codes: dict[str, IntArray] = {}
    scaled: dict[str, FloatArray] = {}
    for j, feature in enumerate(features):
        mine = chosen == j
        if isinstance(feature, NumericFeature):
            clipped, _ = feature.clip(table.column(feature.name))
            scaled[feature.name] = 2 * (clipped - feature.low) / (feature.high - feature.low) - 1
            secret[mine] = scaled[feature.name][mine]
            continue
        codes[feature.name] = np.asarray(feature.bin(table.column(feature.name)), dtype=np.int64)
        rows[mine] = rng.integers(0, hadamard_order(feature.n_bins), size=int(mine.sum()))
        secret[mine] = hadamard_entries(rows[mine], codes[feature.name][mine])
    bits = mechanism.privatize(secret[:, None], rng)[:, 1]
    z = c * (2.0 * bits - 1.0)
    ledgers = ledgers_of_one_release(Release.about(ReleaseKind.STATISTIC, spec.names, mechanism.epsilon), n, mechanism.epsilon)
    worst = d * c * c / n
    answers: dict[str, MixedAnswer] = {}
    for j, feature in enumerate(features):
        mine = chosen == j
        if isinstance(feature, NumericFeature):
            unit_mean = d * float(z[mine].sum()) / n
            half = (feature.high - feature.low) / 2
            exact = half**2 * float(np.sum(d * c * c - scaled[feature.name] ** 2)) / n**2
            answers[feature.name] = MixedAnswer(
                feature.name, "mean", np.array([feature.low + (unit_mean + 1) * half]), np.array([exact]), half**2 * worst,
                "((high-low)/2)^2 (1/n^2) sum_i (d c^2 - t_i^2); worst d c^2/n",
            )
            continue
        k = feature.n_bins
        bins = np.arange(k)
        weights = hadamard_entries(rows[mine][:, None], bins[None, :]) * z[mine][:, None]
        frequencies = d * weights.sum(axis=0) / n
        truth = np.bincount(codes[feature.name], minlength=k) / n
        answers[feature.name] = MixedAnswer(
            feature.name, "frequency", frequencies, (d * c * c - truth) / n, worst, "(d c^2 - f_l) / n; worst d c^2/n",
        )
    return MixedReport(answers, mechanism.epsilon, ledgers)
