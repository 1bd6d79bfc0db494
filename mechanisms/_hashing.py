"""The oracles whose report is a random hash or projection and one bucket:
optimised local hashing (OLH) and Harmony's Hadamard response. The shared
contract and the exact estimator are in ``_oracle_base``.
"""

from __future__ import annotations

import math

import numpy as np

from anonml.mechanisms._names import OracleName
from anonml.mechanisms._oracle_base import FrequencyOracle, pure_variance_per_report
from anonml.mechanisms._sampling import bernoulli, floor_dyadic
from anonml.mechanisms._wire import bytes_for, pack_fields, unpack_fields


# Mersenne prime 2^31 - 1: the modulus of the universal hash family below.
# a*x + b stays far below 2^63 for any domain value x < 2^31.
_HASH_PRIME = (1 << 31) - 1
_SEED_COUNT = (_HASH_PRIME - 1) * _HASH_PRIME
# Cap on OLH's hash range so a hashed value fits two bytes on the wire; it only
# binds above eps = ln(65535) ~ 11, where GRR is far better anyway.
_MAX_OLH_RANGE = 1 << 16


def _olh_keep(epsilon: float, g: int) -> float:
    """The probability of reporting the true bucket, ``e^eps / (e^eps + g - 1)``
    rounded down (the loss is ``ln(p' (g-1) / (1-p'))``)."""
    lam = math.exp(epsilon)
    return floor_dyadic(lam / (lam + g - 1))


def _olh_probabilities(keep: float, g: int) -> tuple[float, float]:
    """(p, q) of OLH with hash range g under the hash family used here.

    A report (seed, y) supports value x when H_seed(x) = y. For the true value
    this happens with p' = ``keep`` (e^eps / (e^eps + g - 1)). For another value x it
    happens when x collides with the true value (probability c) and y is the
    true hash, or x does not collide and y is x's hash:
    ``q = c p' + (1 - c) (1 - p') / (g - 1)``. Wang et al. take c = 1/g; for
    H(x) = ((a x + b) mod P) mod g with a in [1, P), b in [0, P), the pair
    (H-input of x, of v) is uniform over ordered pairs of distinct residues
    mod P, so c is computed exactly here and the estimator stays exactly unbiased.
    """
    quotient, remainder = divmod(_HASH_PRIME, g)
    colliding_pairs = remainder * (quotient + 1) * quotient + (g - remainder) * quotient * (quotient - 1)
    collision = colliding_pairs / (_HASH_PRIME * (_HASH_PRIME - 1))
    q = collision * keep + (1 - collision) * (1 - keep) / (g - 1)
    return keep, q


class OptimizedLocalHashing(FrequencyOracle):
    """OLH (Wang et al. 2017, §4.4): hash the value into g buckets with a
    per-report random universal hash, then random-respond over the g buckets.

    A report is ``(seed, y)``: seed encodes (a, b) of
    ``H(x) = ((a x + b) mod (2^31 - 1)) mod g``, y the perturbed bucket. g is
    the integer near ``e^eps + 1`` (Wang et al.'s optimum) with the smallest
    exact variance.
    """

    name = OracleName.OLH
    report_width = 2

    def __init__(self, epsilon: float, m: int) -> None:
        if isinstance(m, (int, np.integer)) and not isinstance(m, bool) and m >= _HASH_PRIME:
            raise ValueError(f"m must be < {_HASH_PRIME} for OLH, got {m!r}")
        super().__init__(epsilon, m)

    def _configure(self) -> None:
        ideal = math.exp(self.epsilon) + 1 if self.epsilon < math.log(_MAX_OLH_RANGE) else float(_MAX_OLH_RANGE)
        candidates = {max(2, min(_MAX_OLH_RANGE, int(g))) for g in (math.floor(ideal), math.ceil(ideal))}
        self.g = min(
            sorted(candidates),
            key=lambda g: pure_variance_per_report(*_olh_probabilities(_olh_keep(self.epsilon, g), g), self.m),
        )
        self.p_bucket = _olh_keep(self.epsilon, self.g)
        self.p, self.q = _olh_probabilities(self.p_bucket, self.g)

    def _drawn_probabilities(self) -> list[float]:
        return [self.p_bucket, 1.0 - self.p_bucket]

    def _row_elements(self) -> int:
        # Estimation hashes every domain value for each report.
        return self.m

    @property
    def report_bytes(self) -> int:
        return 8 + bytes_for(self.g - 1)

    def _hash(self, seeds: np.ndarray, values: np.ndarray) -> np.ndarray:
        a = seeds // _HASH_PRIME + 1
        b = seeds % _HASH_PRIME
        hashed: np.ndarray = ((a * values + b) % _HASH_PRIME) % self.g
        return hashed

    def _privatize(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n = values.shape[0]
        seeds = np.asarray(rng.integers(0, _SEED_COUNT, size=n, dtype=np.int64))
        hashed = self._hash(seeds, values)
        keep = bernoulli(rng, self.p_bucket, n)
        # Another bucket uniformly: shift by a uniform non-zero offset mod g.
        other = (hashed + rng.integers(1, self.g, size=n)) % self.g
        return np.stack([seeds, np.where(keep, hashed, other)], axis=1)

    def _support_counts(self, reports: np.ndarray) -> np.ndarray:
        domain = np.arange(self.m, dtype=np.int64)[None, :]
        counts = np.zeros(self.m, dtype=np.int64)
        for _, block in self._blocks(reports):
            hashed = self._hash(block[:, :1], domain)
            counts += (hashed == block[:, 1:2]).sum(axis=0)
        return counts

    def _invalid_rows(self, reports: np.ndarray) -> np.ndarray:
        seeds, buckets = reports[:, 0], reports[:, 1]
        return (seeds < 0) | (seeds >= _SEED_COUNT) | (buckets < 0) | (buckets >= self.g)

    def log_likelihood(self, reports: np.ndarray) -> np.ndarray:
        domain = np.arange(self.m, dtype=np.int64)[None, :]
        hit = self._hash(reports[:, :1].astype(np.int64), domain) == reports[:, 1:2]
        seed_log_probability = -math.log(_SEED_COUNT)
        on = math.log(self.p_bucket)
        off = math.log((1 - self.p_bucket) / (self.g - 1))
        return seed_log_probability + np.where(hit, on, off)

    def _encode_rows(self, reports: np.ndarray) -> np.ndarray:
        return pack_fields(reports, [8, bytes_for(self.g - 1)])

    def _decode_rows(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return unpack_fields(raw, [8, bytes_for(self.g - 1)]), np.zeros(raw.shape[0], dtype=bool)


def _walsh_hadamard(vector: np.ndarray) -> np.ndarray:
    """``H v`` for the Sylvester Hadamard matrix of the vector's (power of two)
    length, in integers, by the in-place butterfly."""
    out = np.array(vector, dtype=np.int64)
    size = out.shape[0]
    half = 1
    while half < size:
        pairs = out.reshape(-1, 2, half)
        top = pairs[:, 0, :].copy()
        pairs[:, 0, :] += pairs[:, 1, :]
        pairs[:, 1, :] = top - pairs[:, 1, :]
        half *= 2
    return out


class HadamardResponse(FrequencyOracle):
    """Harmony's categorical oracle (Nguyen et al. 2016, §3.2): Bassily and
    Smith's random projection with the random matrix replaced by a K x K
    Hadamard matrix (K the smallest power of two >= m), whose columns are
    exactly orthogonal.

    The peer draws a row s uniformly and reports (s, b), b a binary random
    response (truth with probability ``p = e^eps / (e^eps + 1)``) of whether
    ``H[s, v] = +1``. The report supports x when ``H[s, x]`` matches b; two
    distinct Hadamard columns agree on exactly half the rows, so q = 1/2
    exactly. Same error as OLH with g = 2, in one or two bytes.
    """

    name = OracleName.HR
    report_width = 2

    def _configure(self) -> None:
        self.rows = 1 << (self.m - 1).bit_length()
        lam = math.exp(self.epsilon)
        self.p = floor_dyadic(lam / (lam + 1))
        self.q = 0.5

    def estimate_work(self, n: int) -> int:
        return n + self.rows * max(1, self.rows.bit_length())

    @property
    def report_bytes(self) -> int:
        return bytes_for(2 * self.rows - 1)

    @staticmethod
    def _positive(rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        # Sylvester's construction: H[s, v] = (-1)^popcount(s AND v).
        positive: np.ndarray = np.bitwise_count(np.bitwise_and(rows, values)) % 2 == 0
        return positive

    def _privatize(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n = values.shape[0]
        rows = np.asarray(rng.integers(0, self.rows, size=n))
        truth = self._positive(rows, values)
        keep = bernoulli(rng, self.p, n)
        return np.stack([rows, np.where(keep, truth, ~truth).astype(np.int64)], axis=1)

    def _support_counts(self, reports: np.ndarray) -> np.ndarray:
        # Aggregate to a (row, bit) histogram, then one fast Walsh-Hadamard
        # transform: a report (s, b) supports x when H[s, x] = 2b - 1, so
        # counts[x] = (n + sum_s H[s, x] (ones[s] - zeros[s])) / 2.
        # O(n + K log K) time and O(K) memory (before: a K x m table, 7.6 TiB at m = 1e6).
        histogram = np.bincount(2 * reports[:, 0] + reports[:, 1], minlength=2 * self.rows).reshape(self.rows, 2)
        transformed = _walsh_hadamard(histogram[:, 1] - histogram[:, 0])
        counts: np.ndarray = (reports.shape[0] + transformed[: self.m]) // 2
        return counts

    def _invalid_rows(self, reports: np.ndarray) -> np.ndarray:
        rows, bits = reports[:, 0], reports[:, 1]
        invalid: np.ndarray = (rows < 0) | (rows >= self.rows) | ((bits != 0) & (bits != 1))
        return invalid

    def log_likelihood(self, reports: np.ndarray) -> np.ndarray:
        positive = self._positive(reports[:, :1].astype(np.int64), np.arange(self.m)[None, :])
        agree = positive == (reports[:, 1:2] == 1)
        log_probabilities: np.ndarray = -math.log(self.rows) + np.where(agree, math.log(self.p), math.log1p(-self.p))
        return log_probabilities

    def _encode_rows(self, reports: np.ndarray) -> np.ndarray:
        return pack_fields(2 * reports[:, :1] + reports[:, 1:], [self.report_bytes])

    def _decode_rows(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        packed = unpack_fields(raw, [self.report_bytes])[:, 0]
        # Negative marks an over-wide field; keep it negative so it is rejected.
        rows = np.where(packed < 0, -1, packed // 2)
        return np.stack([rows, packed % 2], axis=1), np.zeros(raw.shape[0], dtype=bool)
