"""Numeric mechanisms: Harmony's 1-bit mean estimator and the discrete
Laplace and Gaussian mechanisms.

No floating-point noise is ever added to a secret: Laplace or Gaussian noise
drawn in floating point leaks the secret through the representation of the
sum (measured before this module, for input 0, 15-66% of the outputs of the
old float ``laplace`` were not multiples of 2^-53 near zero; for input 1
none were). The discrete mechanisms here add integer noise to an integer
query, drawn with exact integer arithmetic (Canonne, Kamath and Steinke,
"The Discrete Gaussian for Differential Privacy", NeurIPS 2020, Algorithms
1-3)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from anonml.mechanisms._errors import InvalidReport
from anonml.mechanisms._sampling import DYADIC_ONE, MIN_PROBABILITY, bernoulli, ceil_dyadic, epsilon_range, floor_dyadic, refuse
from anonml.mechanisms._validate import check_epsilon, check_positive_int, check_probability
from anonml.mechanisms._wire import bytes_for, join_blobs, pack_fields, unpack_fields

IntArray = npt.NDArray[np.int64]


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
        if not _one_bit_holds(self.epsilon):
            raise refuse("the 1-bit mean mechanism", self.epsilon, self.epsilon_range(), f"d={self.d}")
        lam = math.exp(self.epsilon)
        self.scale = (lam + 1) / (lam - 1)
        # P[u = 1] always lies between these two multiples of 2^-53, whose
        # ratio (and that of their complements) is at most e^eps, whatever
        # the float computation of a value's own probability rounds to.
        self._lowest = ceil_dyadic(1 / (lam + 1))
        self._highest = floor_dyadic(lam / (lam + 1))

    @staticmethod
    def epsilon_range() -> tuple[float, float]:
        """The epsilon interval in which the bit stays randomised in floating point."""
        return epsilon_range(_one_bit_holds)

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
        up = bernoulli(rng, self.probability_of_one(tuples[np.arange(n), attribute]), n)
        return np.stack([attribute, up.astype(np.int64)], axis=1)

    def probability_of_one(self, chosen: np.ndarray) -> np.ndarray:
        """``P[u = 1]`` given the chosen attribute's value (Algorithm 2, line 3),
        rounded down to a multiple of 2^-53 and kept inside the extremes
        reached at ``t = -1`` and ``t = 1``."""
        lam = math.exp(self.epsilon)
        ideal = (np.asarray(chosen, dtype=np.float64) * (lam - 1) + lam + 1) / (2 * lam + 2)
        grid = np.floor(ideal * DYADIC_ONE) / DYADIC_ONE
        clipped: np.ndarray = np.clip(grid, self._lowest, self._highest)
        return clipped

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
        """Exact ``E[(mean_j estimate - mean_j)^2]`` for each attribute
        (:func:`one_bit_mean_variance`; worst case over inputs without ``values``)."""
        n = check_positive_int(n, "n", minimum=1)
        if values is None:
            return one_bit_mean_variance(self.epsilon, self.d, n)
        tuples = self._check_tuples(values)
        if tuples.shape[0] != n:
            raise ValueError(f"values must have n={n} rows, got {tuples.shape[0]!r}")
        return one_bit_mean_variance(self.epsilon, self.d, n, tuples)

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


def one_bit_report_variance(epsilon: float, d: int, value: npt.ArrayLike = 0.0) -> npt.NDArray[np.float64]:
    """Exact ``Var[t*_j]`` of one report's coordinate j whose true value is
    ``value`` (Harmony, proof of Lemma 3): the coordinate is ``±d c`` with
    probability 1/d (sampled) and 0 otherwise, unbiased, so
    ``Var = (1/d)(d c)^2 - t_j^2 = d c^2 - t_j^2`` with
    ``c = (e^eps + 1)/(e^eps - 1)``. Largest at ``t_j = 0``."""
    epsilon = check_epsilon(epsilon)
    d = check_positive_int(d, "d", minimum=1)
    scale = (math.exp(epsilon) + 1) / math.expm1(epsilon)
    t = np.asarray(value, dtype=np.float64)
    variance: npt.NDArray[np.float64] = d * scale**2 - t**2
    return variance


def one_bit_mean_variance(epsilon: float, d: int, n: int, values: npt.ArrayLike | None = None) -> npt.NDArray[np.float64]:
    """Exact ``E[(Z_j - X_j)^2]`` per attribute for the mean ``Z`` of ``n``
    independent reports (Harmony Lemma 3's variance, before its Bernstein
    bound): ``(1/n^2) sum_i (d c^2 - t_ij^2)``; without ``values`` (shape
    (n, d)) the worst case over inputs, ``d c^2 / n``. The same formula is
    the variance of a mini-batch's mean perturbed gradient (Harmony §4.2)."""
    n = check_positive_int(n, "n", minimum=1)
    if values is None:
        return np.full(check_positive_int(d, "d", minimum=1), float(one_bit_report_variance(epsilon, d)) / n)
    tuples = np.asarray(values, dtype=np.float64)
    if tuples.shape != (n, d):
        raise ValueError(f"values must have shape ({n}, {d}), got {tuples.shape!r}")
    per_report = one_bit_report_variance(epsilon, d, tuples)
    exact: npt.NDArray[np.float64] = per_report.sum(axis=0) / n**2
    return exact


def _one_bit_holds(epsilon: float) -> bool:
    try:
        lam = math.exp(epsilon)
    except OverflowError:
        return False
    low, high = 1 / (lam + 1), lam / (lam + 1)
    return low >= MIN_PROBABILITY and high - low >= MIN_PROBABILITY


# Epsilon enters the discrete mechanisms as a rational with this denominator,
# rounded down (less epsilon, more noise): epsilon' = floor(eps 2^32) / 2^32.
_EPSILON_DENOMINATOR = 1 << 32
# The noise scale's numerator stays below 2^62 so integer draws fit int64.
DISCRETE_EPSILON_RANGE = (2.0**-20, 2.0**10)


def _check_integers(value: npt.ArrayLike, name: str) -> IntArray:
    array = np.asarray(value)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must be integers (the discrete mechanisms add integer noise to an integer query), got {array.dtype!r}")
    return array.astype(np.int64)


def _check_sensitivity(sensitivity: int) -> int:
    return check_positive_int(sensitivity, "sensitivity", minimum=1)


def _bernoulli_exp(rng: np.random.Generator, numerators: IntArray, denominator: int) -> npt.NDArray[np.bool_]:
    """Draws that are True with probability ``exp(-numerators / denominator)``
    exactly, for ``0 <= numerators <= denominator`` (CKS Algorithm 1: the
    parity of the first K with a failed Bernoulli(gamma / K))."""
    n = numerators.shape[0]
    result = np.zeros(n, dtype=bool)
    active = np.arange(n)
    k = np.ones(n, dtype=np.int64)
    while active.size:
        success = rng.integers(0, denominator * k[active]) < numerators[active]
        stopped = active[~success]
        result[stopped] = k[stopped] % 2 == 1
        active = active[success]
        k[active] += 1
    return result


def _geometric_exp(rng: np.random.Generator, n: int) -> IntArray:
    """How many Bernoulli(exp(-1)) draws succeed before the first failure."""
    count = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        success = _bernoulli_exp(rng, np.ones(active.size, dtype=np.int64), 1)
        count[active[success]] += 1
        active = active[success]
    return count


def _discrete_laplace_noise(rng: np.random.Generator, size: int, numerator: int, denominator: int) -> IntArray:
    """``size`` draws with ``P[y] ∝ exp(-|y| denominator / numerator)``, i.e.
    the discrete Laplace of scale ``numerator / denominator`` (CKS Algorithm 2
    with t = numerator, s = denominator), vectorised over the pending draws."""
    out = np.zeros(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        u = rng.integers(0, numerator, size=pending.size, dtype=np.int64)
        accepted = _bernoulli_exp(rng, u, numerator)
        v = _geometric_exp(rng, pending.size)
        y = (u + numerator * v) // denominator
        negative = rng.integers(0, 2, size=pending.size).astype(bool)
        # A negative zero is rejected so that 0 is not counted twice.
        done = accepted & ~(negative & (y == 0))
        out[pending[done]] = np.where(negative[done], -y[done], y[done])
        pending = pending[~done]
    return out


def discrete_laplace_epsilon(epsilon: float) -> Fraction:
    """The epsilon the discrete Laplace mechanism runs at: ``epsilon`` rounded
    down to a multiple of 2^-32 (never more private loss than stated).
    Raises ``EpsilonOutOfRange`` outside ``DISCRETE_EPSILON_RANGE``."""
    epsilon = check_epsilon(epsilon)
    if not DISCRETE_EPSILON_RANGE[0] <= epsilon <= DISCRETE_EPSILON_RANGE[1]:
        raise refuse("the discrete Laplace mechanism", epsilon, DISCRETE_EPSILON_RANGE, "integer noise scale")
    return Fraction(math.floor(epsilon * _EPSILON_DENOMINATOR), _EPSILON_DENOMINATOR)


def discrete_laplace_mechanism(value: npt.ArrayLike, sensitivity: int, epsilon: float, rng: np.random.Generator) -> IntArray:
    """``value`` (integers) plus discrete Laplace noise of scale
    ``sensitivity / epsilon'``: epsilon-DP for an integer query with that L1
    sensitivity, since ``P[y | x] / P[y | x'] = exp(-(|y-x| - |y-x'|) epsilon' / sensitivity)
    <= exp(epsilon')`` (CKS §2.2), with ``epsilon' <= epsilon`` from
    :func:`discrete_laplace_epsilon`. Every output is an integer."""
    array = _check_integers(value, "value")
    sensitivity = _check_sensitivity(sensitivity)
    rational = discrete_laplace_epsilon(epsilon)
    # scale = sensitivity / epsilon' = sensitivity * 2^32 / floor(eps 2^32).
    noise = _discrete_laplace_noise(rng, array.size, sensitivity * rational.denominator, rational.numerator)
    return array + noise.reshape(array.shape)


def discrete_laplace_pmf(k: npt.ArrayLike, sensitivity: int, epsilon: float) -> npt.NDArray[np.float64]:
    """The exact noise distribution ``P[noise = k]`` of :func:`discrete_laplace_mechanism`."""
    rate = float(discrete_laplace_epsilon(epsilon)) / _check_sensitivity(sensitivity)
    ks = np.abs(np.asarray(k, dtype=np.float64))
    pmf: npt.NDArray[np.float64] = math.tanh(rate / 2) * np.exp(-rate * ks)
    return pmf


# The discrete Gaussian's variance enters as a rational with this denominator, rounded up.
_SIGMA2_DENOMINATOR = 1 << 16
_DISCRETE_SIGMA_RANGE = (2.0**-4, 2.0**20)


def _uniform_below(rng: np.random.Generator, bound: int) -> int:
    """A uniform integer in ``[0, bound)`` for any positive Python int (rejection on whole 64-bit words)."""
    words = (bound.bit_length() + 63) // 64
    limit = (1 << (64 * words)) - ((1 << (64 * words)) % bound)
    while True:
        value = 0
        for word in rng.integers(0, 1 << 64, size=words, dtype=np.uint64).tolist():
            value = (value << 64) | int(word)
        if value < limit:
            return value % bound


def _bernoulli_exp_rational(rng: np.random.Generator, gamma: Fraction) -> bool:
    """True with probability ``exp(-gamma)`` exactly, any rational ``gamma >= 0`` (CKS Algorithm 1)."""
    while gamma > 1:
        if not _bernoulli_exp(rng, np.ones(1, dtype=np.int64), 1)[0]:
            return False
        gamma -= 1
    k = 1
    while _uniform_below(rng, gamma.denominator * k) < gamma.numerator:
        k += 1
    return k % 2 == 1


def discrete_gaussian_sigma2(sigma: float) -> Fraction:
    """The variance parameter the discrete Gaussian runs at: ``sigma^2``
    rounded up to a multiple of 2^-16 (more noise, never less)."""
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not math.isfinite(sigma):
        raise ValueError(f"sigma must be a finite number, got {sigma!r}")
    if not _DISCRETE_SIGMA_RANGE[0] <= sigma <= _DISCRETE_SIGMA_RANGE[1]:
        raise ValueError(f"sigma must lie in {_DISCRETE_SIGMA_RANGE!r}, got {sigma!r}")
    return Fraction(math.ceil(sigma * sigma * _SIGMA2_DENOMINATOR), _SIGMA2_DENOMINATOR)


def discrete_gaussian_mechanism(value: npt.ArrayLike, sigma: float, rng: np.random.Generator) -> IntArray:
    """``value`` (integers) plus discrete Gaussian noise,
    ``P[y] ∝ exp(-y^2 / (2 sigma^2))`` (CKS Algorithm 3: a discrete Laplace
    proposal of scale ``floor(sigma) + 1`` accepted with the exact
    probability). For L2 sensitivity ``Δ`` it is ``Δ^2 / (2 sigma^2)``-zCDP
    (CKS Theorem 4); :func:`discrete_gaussian_delta` gives its exact
    (epsilon, delta). A per-draw Python loop: for scalars and small batches."""
    array = _check_integers(value, "value")
    sigma2 = discrete_gaussian_sigma2(sigma)
    t = math.isqrt(sigma2.numerator // sigma2.denominator) + 1
    noise = np.empty(array.size, dtype=np.int64)
    for index in range(array.size):
        while True:
            y = int(_discrete_laplace_noise(rng, 1, t, 1)[0])
            if _bernoulli_exp_rational(rng, (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)):
                noise[index] = y
                break
    return array + noise.reshape(array.shape)


def _discrete_gaussian_weights(sigma2: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    reach = int(math.ceil(40 * math.sqrt(sigma2))) + 2
    support = np.arange(-reach, reach + 1, dtype=np.float64)
    weights = np.exp(-support * support / (2 * sigma2))
    return support, weights / weights.sum()


def discrete_gaussian_delta(sigma: float, sensitivity: int, epsilon: float) -> float:
    """The exact delta at ``epsilon`` of :func:`discrete_gaussian_mechanism`
    for an integer query of L1 = L2 sensitivity ``sensitivity`` (CKS
    Theorem 7): ``P[Y > eps s^2/Δ - Δ/2] - e^eps P[Y > eps s^2/Δ + Δ/2]``
    with ``Y`` the discrete Gaussian (the public parameters only; the tails
    are summed in floating point over 40 standard deviations)."""
    sigma2 = float(discrete_gaussian_sigma2(sigma))
    delta_q = _check_sensitivity(sensitivity)
    epsilon = check_epsilon(epsilon)
    support, pmf = _discrete_gaussian_weights(sigma2)
    centre = epsilon * sigma2 / delta_q
    upper = float(pmf[support > centre - delta_q / 2].sum())
    lower = float(pmf[support > centre + delta_q / 2].sum())
    return max(0.0, upper - math.exp(epsilon) * lower)


def discrete_gaussian_sigma(sensitivity: int, epsilon: float, delta: float) -> float:
    """The smallest sigma (to a relative 1e-9) whose exact delta at
    ``epsilon`` (:func:`discrete_gaussian_delta`) is at most ``delta``."""
    delta = check_probability(delta, "delta")
    epsilon = check_epsilon(epsilon)
    low, high = _DISCRETE_SIGMA_RANGE
    if discrete_gaussian_delta(high, sensitivity, epsilon) > delta:
        raise ValueError(f"no sigma up to {high!r} reaches delta={delta!r} at epsilon={epsilon!r}")
    if discrete_gaussian_delta(low, sensitivity, epsilon) <= delta:
        return low
    while high - low > 1e-9 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if discrete_gaussian_delta(middle, sensitivity, epsilon) > delta else (low, middle)
    return high
