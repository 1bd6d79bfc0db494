"""The oracles whose report is one value or one m-bit vector: random response
(GRR), the unary encodings of the thesis's §7.3 (SUE, its (p, q) encoding
with eq. 7.3's p, OUE) and k-subset selection. The shared contract and the
exact estimator are in ``_oracle_base``.
"""

from __future__ import annotations

import math
from abc import abstractmethod

import numpy as np

from anonml.mechanisms._names import OracleName
from anonml.mechanisms._oracle_base import BitVectorOracle, FrequencyOracle, pure_variance_per_report
from anonml.mechanisms._sampling import bernoulli, ceil_dyadic, floor_dyadic
from anonml.mechanisms._validate import check_epsilon, check_positive_int
from anonml.mechanisms._wire import bytes_for, pack_fields, unpack_fields


class GeneralizedRandomResponse(FrequencyOracle):
    """Random response over m values (thesis §7.3.1; "GRR"/"DE" in Wang et al. 2017).

    Report the true value with probability ``p = e^eps / (e^eps + m - 1)``,
    otherwise one of the other m-1 values uniformly. One value per report.
    """

    name = OracleName.GRR
    report_width = 1

    def _configure(self) -> None:
        lam = math.exp(self.epsilon)
        # Keep the truth with p rounded down: p/q = p (m-1)/(1-p) <= e^eps.
        self.p = floor_dyadic(lam / (lam + self.m - 1))
        self.q = (1.0 - self.p) / (self.m - 1)

    def estimate_work(self, n: int) -> int:
        return n + self.m

    @property
    def report_bytes(self) -> int:
        return bytes_for(self.m - 1)

    def _privatize(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        keep = bernoulli(rng, self.p, values.shape[0])
        # A uniform draw from the m-1 other values: draw from {0..m-2} and skip
        # over the true value.
        other = rng.integers(0, self.m - 1, size=values.shape[0])
        other += other >= values
        return np.where(keep, values, other).reshape(-1, 1)

    def _support_counts(self, reports: np.ndarray) -> np.ndarray:
        return np.bincount(reports[:, 0], minlength=self.m)

    def _invalid_rows(self, reports: np.ndarray) -> np.ndarray:
        return (reports[:, 0] < 0) | (reports[:, 0] >= self.m)

    def log_likelihood(self, reports: np.ndarray) -> np.ndarray:
        hit = reports[:, :1] == np.arange(self.m)[None, :]
        return np.where(hit, math.log(self.p), math.log(self.q))

    def _encode_rows(self, reports: np.ndarray) -> np.ndarray:
        return pack_fields(reports, [self.report_bytes])

    def _decode_rows(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return unpack_fields(raw, [self.report_bytes]), np.zeros(raw.shape[0], dtype=bool)


class UnaryEncoding(BitVectorOracle):
    """The thesis's (p, q) bit-string perturbation (§7.3.3), parent of SUE and OUE.

    The peer one-hot encodes its value into m bits, keeps a 1 bit as 1 with
    probability p and turns each 0 bit into 1 with probability q. Theorem 1:
    this is ``ln(p(1-q) / ((1-p)q))``-LDP; subclasses choose p and q so that
    this equals ``epsilon`` exactly.
    """

    def _configure(self) -> None:
        p, q = self._probabilities()
        # Theorem 1's loss ln(p(1-q) / ((1-p)q)) grows with p and falls with
        # q: round p down and q up.
        self.p, self.q = floor_dyadic(p), ceil_dyadic(q)

    def _drawn_probabilities(self) -> list[float]:
        return [self.p, 1.0 - self.p, self.q, 1.0 - self.q]

    @abstractmethod
    def _probabilities(self) -> tuple[float, float]:
        """The ideal (p, q) for ``self.epsilon`` and ``self.m``."""

    def _privatize(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        bits = np.empty((values.shape[0], self.m), dtype=np.uint8)
        for start, block in self._blocks(values):
            # Each 0 bit becomes 1 with probability q, the true bit stays 1
            # with probability p (thesis §7.3.3).
            bits[start : start + block.shape[0]] = bernoulli(rng, self.q, (block.shape[0], self.m))
            bits[start + np.arange(block.shape[0]), block] = bernoulli(rng, self.p, block.shape[0])
        return bits

    def log_likelihood(self, reports: np.ndarray) -> np.ndarray:
        # Theorem 1's product: every bit contributes q or 1-q, except bit v,
        # which contributes p or 1-p.
        bits = reports.astype(np.float64)
        base = bits @ np.full(self.m, math.log(self.q)) + (1 - bits) @ np.full(self.m, math.log1p(-self.q))
        one = math.log(self.p) - math.log(self.q)
        zero = math.log1p(-self.p) - math.log1p(-self.q)
        log_probabilities: np.ndarray = base[:, None] + np.where(bits == 1, one, zero)
        return log_probabilities


class SymmetricUnaryEncoding(UnaryEncoding):
    """Basic one-time RAPPOR (thesis §7.3.2): q = 1 - p and
    ``eps = ln(p^2 / (1-p)^2)``, i.e. each bit is a binary random response with eps/2."""

    name = OracleName.SUE

    def _probabilities(self) -> tuple[float, float]:
        half = math.exp(self.epsilon / 2)
        p = half / (1 + half)
        return p, 1 - p


def optimal_pq_p(epsilon: float, m: int) -> float:
    """The error-minimising p of the thesis's (p, q) encoding, eq. 7.3."""
    lam = math.exp(check_epsilon(epsilon))
    m = check_positive_int(m, "m", minimum=2)
    root = math.sqrt((m - 1) * (lam**3 + lam) + ((m - 1) ** 2 + 1) * lam**2)
    return (lam**2 + m * lam - lam - root) / (lam**2 - 1)


def pq_q_for(p: float, epsilon: float) -> float:
    """The q that makes (p, q) perturbation exactly eps-LDP (solves Theorem 1 for q)."""
    lam = math.exp(epsilon)
    return p / (lam * (1 - p) + p)


class OptimizedPQEncoding(UnaryEncoding):
    """The thesis's (p, q) perturbation with p from eq. 7.3, which minimises the
    exact error of eq. 7.2 over all (p, q) with ``ln(p(1-q)/((1-p)q)) = eps``."""

    name = OracleName.PQ

    def _probabilities(self) -> tuple[float, float]:
        p = optimal_pq_p(self.epsilon, self.m)
        return p, pq_q_for(p, self.epsilon)


class OptimizedUnaryEncoding(UnaryEncoding):
    """OUE (Wang et al. 2017, §4.2): p = 1/2, q = 1/(e^eps + 1); minimises the
    approximate variance that ignores the p(1-p) term."""

    name = OracleName.OUE

    def _probabilities(self) -> tuple[float, float]:
        return 0.5, 1.0 / (math.exp(self.epsilon) + 1.0)


def _subset_probabilities(epsilon: float, m: int, k: int) -> tuple[float, float]:
    """(p, q) of k-Subset Selection (Wang et al., "Mutual information optimally
    local private discrete distribution estimation", 2016; Ye and Barg 2018).

    The true value is in the reported k-subset with probability
    ``p = k e^eps / (k e^eps + m - k)`` (rounded down: the loss is
    ``ln(p (m-k) / ((1-p) k))``); another value is in it with
    ``q = p (k-1)/(m-1) + (1-p) k/(m-1)``.
    """
    lam = math.exp(epsilon)
    p = floor_dyadic(k * lam / (k * lam + m - k))
    q = p * (k - 1) / (m - 1) + (1 - p) * k / (m - 1)
    return p, q


# k candidates either side of Ye and Barg's m / (e^eps + 1): the exact
# variance is unimodal in k, so the best integer is next to the continuous
# optimum (tests compare with the search over every k for small m).
_SUBSET_K_WINDOW = 3


class SubsetSelection(BitVectorOracle):
    """k-Subset Selection: report a k-subset of the domain as an m-bit mask.

    With probability p the subset holds the true value and k-1 other values
    drawn uniformly; otherwise k values drawn uniformly from the m-1 others.
    ``P[S | v] = p / C(m-1, k-1)`` if v in S, else ``(1-p) / C(m-1, k)``; the
    ratio is exactly e^eps. k in 1..m-1 is chosen to minimise the exact
    variance (near ``m / (e^eps + 1)``); k = 1 is GRR.
    """

    name = OracleName.SS

    def _configure(self) -> None:
        centre = int(self.m / (math.exp(self.epsilon) + 1))
        window = range(max(1, centre - _SUBSET_K_WINDOW), min(self.m - 1, centre + _SUBSET_K_WINDOW + 1) + 1)
        self.k = min(
            window,
            key=lambda k: pure_variance_per_report(*_subset_probabilities(self.epsilon, self.m, k), self.m),
        )
        self.p, self.q = _subset_probabilities(self.epsilon, self.m, self.k)

    def _privatize(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        mask = np.zeros((values.shape[0], self.m), dtype=np.uint8)
        for start, block in self._blocks(values):
            rows = np.arange(block.shape[0])
            # A uniformly random order of the m-1 other values (Fisher-Yates
            # on exact integer draws, per row); the subset is the true value
            # and the first k-1 of them with probability p, else the first k.
            others = np.tile(np.arange(self.m - 1, dtype=np.int64), (block.shape[0], 1))
            rng.permuted(others, axis=1, out=others)
            others += others >= block[:, None]
            include = bernoulli(rng, self.p, block.shape[0])
            first = others[:, : self.k]
            mask[start + rows[:, None], first] = 1
            # With the true value included, drop the k-th other value instead.
            mask[start + rows[include], first[include, self.k - 1]] = 0
            mask[start + rows[include], block[include]] = 1
        return mask

    def _invalid_rows(self, reports: np.ndarray) -> np.ndarray:
        # Bits, and exactly k of them set.
        invalid: np.ndarray = super()._invalid_rows(reports) | (reports.sum(axis=1, dtype=np.int64) != self.k)
        return invalid

    def log_likelihood(self, reports: np.ndarray) -> np.ndarray:
        log_choose = math.lgamma(self.m) - math.lgamma(self.k) - math.lgamma(self.m - self.k + 1)
        log_choose_k = math.lgamma(self.m) - math.lgamma(self.k + 1) - math.lgamma(self.m - self.k)
        inside = math.log(self.p) - log_choose
        outside = math.log1p(-self.p) - log_choose_k
        return np.where(reports == 1, inside, outside)
