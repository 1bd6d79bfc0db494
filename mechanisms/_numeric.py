"""Numeric mechanisms: Harmony's 1-bit mean estimator, Laplace and Gaussian."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from anonml.mechanisms._errors import InvalidReport
from anonml.mechanisms._validate import check_epsilon, check_positive_int, check_probability
from anonml.mechanisms._wire import bytes_for, join_blobs, pack_fields, unpack_fields


class OneBitMean:
    """Harmony's mechanism for the means of d numeric attributes in [-1, 1]
    (Nguyen et al. 2016, Algorithm 2; epsilon-LDP by Lemma 1, unbiased by Lemma 2).

    Each peer samples one attribute j uniformly and sends one bit u with
    ``P[u = 1] = (t_j (e^eps - 1) + e^eps + 1) / (2 e^eps + 2)``; the value it
    stands for is ``±d (e^eps + 1)/(e^eps - 1)`` on attribute j and 0
    elsewhere. A report row is ``(j, u)``; Harmony notes j could come from
    public randomness, here it travels with the bit.
    """

    report_width = 2

    def __init__(self, epsilon: float, d: int) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.d = check_positive_int(d, "d", minimum=1)
        lam = math.exp(self.epsilon)
        self.scale = (lam + 1) / (lam - 1)

    @property
    def report_bytes(self) -> int:
        return bytes_for(2 * self.d - 1)

    def _check_tuples(self, values: np.ndarray) -> np.ndarray:
        array = np.asarray(values, dtype=np.float64)
        if array.ndim != 2 or array.shape[1] != self.d:
            raise ValueError(f"values must have shape (n, {self.d}), got {array.shape!r}")
        if not np.all((array >= -1) & (array <= 1)):
            raise ValueError(f"values must lie in [-1, 1] (nothing is clipped), got {array!r}")
        return array

    def privatize(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One (attribute, bit) report per row of ``values`` (shape (n, d), in [-1, 1])."""
        tuples = self._check_tuples(values)
        n = tuples.shape[0]
        attribute = rng.integers(0, self.d, size=n)
        up = rng.random(n) < self.probability_of_one(tuples[np.arange(n), attribute])
        return np.stack([attribute, up.astype(np.int64)], axis=1)

    def probability_of_one(self, chosen: np.ndarray) -> np.ndarray:
        """``P[u = 1]`` given the chosen attribute's value (Algorithm 2, line 3)."""
        lam = math.exp(self.epsilon)
        return (np.asarray(chosen, dtype=np.float64) * (lam - 1) + lam + 1) / (2 * lam + 2)

    def check_reports(self, reports: np.ndarray) -> np.ndarray:
        """``reports`` as int64 after checking shape (n, 2) and values."""
        array = np.asarray(reports)
        if array.ndim != 2 or array.shape[1] != 2:
            raise ValueError(f"reports must have shape (n, 2), got {array.shape!r}")
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"reports must have an integer dtype, got {array.dtype!r}")
        bad = (array[:, 0] < 0) | (array[:, 0] >= self.d) | ((array[:, 1] != 0) & (array[:, 1] != 1))
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise InvalidReport(f"reports[{first}] = {array[first].tolist()!r} is not a possible 1-bit report")
        return array.astype(np.int64, copy=False)

    def estimate(self, reports: np.ndarray) -> np.ndarray:
        """Unbiased means (length d): the average over all n reports of the
        vectors they stand for (Harmony, after Lemma 2)."""
        checked = self.check_reports(reports)
        n = checked.shape[0]
        if n == 0:
            raise ValueError("reports must hold at least one report")
        signed = (2 * checked[:, 1] - 1) * self.scale * self.d
        means: np.ndarray = np.bincount(checked[:, 0], weights=signed, minlength=self.d) / n
        return means

    def variance(self, n: int, values: np.ndarray | None = None) -> np.ndarray:
        """Exact ``E[(mean_j estimate - mean_j)^2]`` for each attribute.

        With the true ``values`` it is ``(1/n^2) sum_i (d c^2 - t_ij^2)``, c the
        scale (Harmony, proof of Lemma 3); without, the worst case over inputs,
        ``d c^2 / n`` (all values 0).
        """
        n = check_positive_int(n, "n", minimum=1)
        if values is None:
            return np.full(self.d, self.d * self.scale**2 / n)
        tuples = self._check_tuples(values)
        if tuples.shape[0] != n:
            raise ValueError(f"values must have n={n} rows, got {tuples.shape[0]!r}")
        exact: np.ndarray = (n * self.d * self.scale**2 - (tuples**2).sum(axis=0)) / n**2
        return exact

    def encode_report(self, report_row: np.ndarray) -> bytes:
        """One ``(j, u)`` row as ``report_bytes`` bytes holding ``2 j + u``."""
        row = self.check_reports(np.asarray(report_row).reshape(1, -1))
        return bytes(pack_fields(2 * row[:, :1] + row[:, 1:], [self.report_bytes])[0])

    def decode_reports(self, blobs: Sequence[bytes]) -> np.ndarray:
        """Strict inverse of ``encode_report`` for a batch; ``InvalidReport`` otherwise."""
        raw = join_blobs(blobs, self.report_bytes)
        packed = unpack_fields(raw, [self.report_bytes])[:, 0]
        bad = (packed < 0) | (packed >= 2 * self.d)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise InvalidReport(f"report {first} = {bytes(raw[first])!r} is not a canonical 1-bit report")
        return np.stack([packed // 2, packed % 2], axis=1)


def laplace_mechanism(value: np.ndarray | float, sensitivity: float, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """``value`` plus Laplace noise of scale ``sensitivity / epsilon``: epsilon-DP
    for a query with that L1 sensitivity (Dwork and Roth 2014, Thm 3.6)."""
    epsilon = check_epsilon(epsilon)
    sensitivity = check_epsilon(sensitivity, "sensitivity")
    array = np.asarray(value, dtype=np.float64)
    return array + rng.laplace(0.0, sensitivity / epsilon, size=array.shape)


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def _analytic_gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    # Balle and Wang 2018, Theorem 8: the exact delta of N(0, sigma^2) noise
    # at this epsilon for a query of this L2 sensitivity.
    a = sensitivity / (2 * sigma)
    b = epsilon * sigma / sensitivity
    return _normal_cdf(a - b) - math.exp(epsilon) * _normal_cdf(-a - b)


def gaussian_sigma(sensitivity: float, epsilon: float, delta: float, *, method: str = "classic") -> float:
    """The Gaussian mechanism's noise scale for (epsilon, delta)-DP.

    ``"classic"``: ``sigma = sensitivity * sqrt(2 ln(1.25/delta)) / epsilon``
    (Dwork and Roth 2014, Thm A.1), proven only for epsilon in (0, 1), so
    other epsilons are refused. ``"analytic"``: the smallest sigma whose exact
    privacy curve meets delta (Balle and Wang, "Improving the Gaussian
    Mechanism for Differential Privacy", ICML 2018, Thm 8), for any epsilon,
    found by bisection to a relative 1e-12.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_probability(delta, "delta")
    sensitivity = check_epsilon(sensitivity, "sensitivity")
    if method == "classic":
        if epsilon >= 1.0:
            raise ValueError(f"epsilon must be < 1 for the classic Gaussian mechanism, got {epsilon!r}")
        return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    if method != "analytic":
        raise ValueError(f"method must be 'classic' or 'analytic', got {method!r}")
    # delta(sigma) decreases in sigma: bracket, then bisect.
    low, high = sensitivity, sensitivity
    while _analytic_gaussian_delta(high, sensitivity, epsilon) > delta:
        high *= 2
    while _analytic_gaussian_delta(low, sensitivity, epsilon) <= delta and low > 1e-12 * sensitivity:
        low /= 2
    while high - low > 1e-12 * high:
        middle = (low + high) / 2
        if _analytic_gaussian_delta(middle, sensitivity, epsilon) > delta:
            low = middle
        else:
            high = middle
    return high


def gaussian_mechanism(
    value: np.ndarray | float,
    sensitivity: float,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    *,
    method: str = "classic",
) -> np.ndarray:
    """``value`` plus N(0, sigma^2) noise with ``sigma = gaussian_sigma(...)``:
    (epsilon, delta)-DP for a query with that L2 sensitivity."""
    sigma = gaussian_sigma(sensitivity, epsilon, delta, method=method)
    array = np.asarray(value, dtype=np.float64)
    return array + rng.normal(0.0, sigma, size=array.shape)
