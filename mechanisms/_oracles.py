"""Frequency oracles: local-DP histogram estimation over a domain {0..m-1}.

Every oracle here is a *pure* protocol (Wang et al., "Locally Differentially
Private Protocols for Frequency Estimation", USENIX Security 2017, §3): each
report "supports" a set of values, the true value is supported with
probability ``p`` and any other value with probability ``q``, independently of
everything else. That single fact gives every oracle the same unbiased
estimator (thesis §7.3.4, ``n̂_i = (ñ_i - q n) / (p - q)``) and the same exact
variance (thesis appendix, proof of Theorem 2)::

    Var[n̂_i] = (n_i p(1-p) + (n - n_i) q(1-q)) / (p - q)^2
    sum_i Var[n̂_i] = n (p(1-p) + (m-1) q(1-q)) / (p - q)^2

The total does not depend on the true counts because they sum to ``n``; it is
``n**2`` times the square of the thesis's eq. 7.2. So the base class states the
contract and implements ``estimate`` and ``variance`` once; each oracle only
says how to perturb, which values a report supports, its exact likelihood and
its wire layout.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from enum import StrEnum
from functools import lru_cache
from typing import ClassVar

import numpy as np

from anonml.mechanisms._errors import EpsilonOutOfRange, InvalidReport
from anonml.mechanisms._sampling import bernoulli, ceil_dyadic, epsilon_range, floor_dyadic, in_range, refuse
from anonml.mechanisms._validate import check_counts, check_epsilon, check_positive_int, check_values
from anonml.mechanisms._wire import bytes_for, check_blobs, join_blobs, pack_bits, pack_fields, unpack_bits, unpack_fields

# Reports are privatised and estimated in blocks whose temporaries hold at
# most this many elements (8 bytes each: 32 MiB), so memory stays bounded
# whatever n and m are (before: OLH's (n, m) hash table needed 488 GiB at
# n >= 65,536 with m = 1e6).
BLOCK_ELEMENTS = 1 << 22
_MAX_BLOCK_ROWS = 1 << 16

# ``auto``'s defaults. A report travels inside one Sphinx packet (DESIGN.md
# §5, 2 KiB by default) beside the token (~300 bytes) and the survey id;
# 1 KiB leaves that room. Estimation work is counted in element operations
# (``FrequencyOracle.estimate_work``): OLH's hashing took 48 ns per element
# here (``anonml bench mechanisms``, 2 loaded cores), so 2^28 is about 13 s;
# OLH at n = 1e5 and m = 1e6 would be 1e11.
DEFAULT_MAX_REPORT_BYTES = 1024
DEFAULT_MAX_ESTIMATE_WORK = 1 << 28


class OracleName(StrEnum):
    """The frequency oracles by their wire name; ``AUTO`` lets :func:`make_oracle` choose."""

    GRR = "grr"
    SUE = "sue"
    PQ = "pq"
    OUE = "oue"
    OLH = "olh"
    SS = "ss"
    HR = "hr"
    AUTO = "auto"


def _check_rng(rng: np.random.Generator) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {rng!r}")
    return rng


class FrequencyOracle(ABC):
    """An epsilon-LDP frequency oracle over the domain {0..m-1}.

    Peer side: ``privatize(values, rng)`` turns a batch of true values into a
    batch of reports, an ``(n, report_width)`` integer array, one row per peer.
    Each row travels alone, as ``encode_report(row)`` (``report_bytes`` bytes).

    Aggregator side: ``decode_reports(blobs)`` strictly parses the received
    rows, ``estimate(reports)`` returns the unbiased estimated counts (not
    post-processed: they may be negative and need not sum to n), and
    ``variance(n)`` the exact expected total squared error
    ``sum_i E[(n̂_i - n_i)^2]`` of ``estimate`` for n reports.

    Subclasses set ``p`` and ``q`` (support probabilities, see the module
    docstring) in ``__init__`` after calling ``super().__init__`` and implement
    the hooks ``_privatize``, ``_support_counts``, ``_invalid_rows``,
    ``log_likelihood``, ``_encode_rows`` and ``_decode_rows``.
    """

    name: ClassVar[OracleName]
    report_width: int
    _report_dtype: ClassVar[type[np.integer]] = np.int64
    p: float
    q: float

    def __init__(self, epsilon: float, m: int) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.m = check_positive_int(m, "m", minimum=2)
        try:
            self._configure()
            holds = in_range(self._drawn_probabilities(), self.p, self.q)
        except (OverflowError, ZeroDivisionError):
            holds = False
        if not holds:
            raise refuse(self.name.value, self.epsilon, self.epsilon_range(self.m), f"m={self.m}")

    @classmethod
    def epsilon_range(cls, m: int) -> tuple[float, float]:
        """The epsilon interval in which this oracle over ``m`` values stays
        randomised in floating point (``mechanisms._sampling``); the
        constructor refuses any epsilon outside it."""
        return _oracle_range(cls, check_positive_int(m, "m", minimum=2))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon={self.epsilon!r}, m={self.m!r}, p={self.p:.6g}, q={self.q:.6g})"

    # ----------------------------------------------------------------- hooks
    @abstractmethod
    def _configure(self) -> None:
        """Set ``p`` and ``q`` (and any other parameter) for ``self.epsilon``
        and ``self.m``, every drawn probability rounded to the 2^-53 grid in
        the direction that cannot raise the privacy loss."""

    @abstractmethod
    def _drawn_probabilities(self) -> list[float]:
        """Every probability a Bernoulli draw of ``_privatize`` uses, and its complement."""

    @abstractmethod
    def estimate_work(self, n: int) -> int:
        """Element operations ``estimate`` performs for ``n`` reports (what
        ``auto`` bounds)."""

    def _row_elements(self) -> int:
        """Elements of temporary memory one report row needs in estimation."""
        return 1

    def _block_rows(self) -> int:
        return max(1, min(_MAX_BLOCK_ROWS, BLOCK_ELEMENTS // self._row_elements()))

    @abstractmethod
    def _privatize(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Perturb validated int64 ``values``; return (n, report_width) reports."""

    @abstractmethod
    def _support_counts(self, reports: np.ndarray) -> np.ndarray:
        """For valid reports, how many support each value (length m, int)."""

    @abstractmethod
    def _invalid_rows(self, reports: np.ndarray) -> np.ndarray:
        """Boolean mask of rows (any integer dtype) no honest peer could send."""

    @abstractmethod
    def log_likelihood(self, reports: np.ndarray) -> np.ndarray:
        """The exact ``log P[report_j | value v]`` as an (n, m) array.

        Used for the exact privacy checks (max ratio over values is e^eps) and
        for IBU on individual reports.
        """

    @abstractmethod
    def _encode_rows(self, reports: np.ndarray) -> np.ndarray:
        """Valid reports to an (n, report_bytes) uint8 array."""

    @abstractmethod
    def _decode_rows(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(n, report_bytes) uint8 to (reports, mask of non-canonical rows)."""

    @property
    @abstractmethod
    def report_bytes(self) -> int:
        """The fixed length of one encoded report."""

    # ------------------------------------------------------- the contract
    def privatize(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Perturb each true value in ``values`` (ints in {0..m-1}) independently."""
        checked = check_values(values, self.m)
        return self._privatize(checked, _check_rng(rng))

    def check_reports(self, reports: np.ndarray) -> np.ndarray:
        """Return ``reports`` in this oracle's dtype after checking shape and values.

        Raises ``ValueError`` naming ``reports`` for a wrong shape or dtype and
        ``InvalidReport`` for a row no honest peer could have produced.
        """
        array = np.asarray(reports)
        if array.ndim != 2 or array.shape[1] != self.report_width:
            raise ValueError(f"reports must have shape (n, {self.report_width}), got {array.shape!r}")
        if array.size == 0:
            return array.astype(self._report_dtype)
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"reports must have an integer dtype, got {array.dtype!r}")
        bad = self._invalid_rows(array)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise InvalidReport(f"reports[{first}] = {array[first].tolist()!r} is not a possible {self.name} report")
        return array.astype(self._report_dtype, copy=False)

    def support_counts(self, reports: np.ndarray) -> np.ndarray:
        """How many reports support each value (the thesis's noisy counts ñ_i)."""
        return self._support_counts(self.check_reports(reports)).astype(np.float64)

    def estimate(self, reports: np.ndarray) -> np.ndarray:
        """Unbiased estimated counts: ``(ñ_i - q n) / (p - q)`` (thesis §7.3.4)."""
        checked = self.check_reports(reports)
        return self.estimate_from_support(self._support_counts(checked).astype(np.float64), checked.shape[0])

    def support_counts_from_blobs(self, blobs: Sequence[bytes]) -> np.ndarray:
        """``support_counts`` of encoded reports, decoded and counted in
        blocks so memory stays bounded (``BLOCK_ELEMENTS``); ``InvalidReport``
        names the first bad report by its index in ``blobs``."""
        check_blobs(blobs)
        counts = np.zeros(self.m, dtype=np.int64)
        rows = self._block_rows()
        for start in range(0, len(blobs), rows):
            counts += self._support_counts(self._decode(blobs[start : start + rows], start))
        return counts.astype(np.float64)

    def estimate_blobs(self, blobs: Sequence[bytes]) -> np.ndarray:
        """``estimate`` of encoded reports, blockwise (see ``support_counts_from_blobs``)."""
        return self.estimate_from_support(self.support_counts_from_blobs(blobs), len(blobs))

    def estimate_from_support(self, support: np.ndarray, n: int) -> np.ndarray:
        """The unbiased estimator applied to already aggregated support counts."""
        return (np.asarray(support, dtype=np.float64) - self.q * n) / (self.p - self.q)

    def variance(self, n: int, counts: np.ndarray | None = None) -> float:
        """Exact ``sum_i E[(n̂_i - n_i)^2]`` of ``estimate`` over ``n`` reports.

        Exact for every vector of true counts: for a pure oracle the total is
        ``n (p(1-p) + (m-1) q(1-q)) / (p-q)^2`` whatever the counts are (they
        sum to n). ``counts``, if given, is validated (length m, non-negative,
        sums to n) and does not change the value.
        """
        n = check_positive_int(n, "n", minimum=0)
        if counts is not None:
            check_counts(counts, self.m, n)
        p, q = self.p, self.q
        return n * (p * (1 - p) + (self.m - 1) * q * (1 - q)) / (p - q) ** 2

    def value_variances(self, counts: np.ndarray) -> np.ndarray:
        """Exact ``Var[n̂_i]`` for each value given the true counts (thesis appendix)."""
        counts_f = np.asarray(counts, dtype=np.float64)
        n = int(round(float(counts_f.sum())))
        counts_f = check_counts(counts_f, self.m, n)
        p, q = self.p, self.q
        return (counts_f * p * (1 - p) + (n - counts_f) * q * (1 - q)) / (p - q) ** 2

    def likelihood(self, reports: np.ndarray) -> np.ndarray:
        """``P[report_j | value v]`` as an (n, m) array (see ``log_likelihood``)."""
        probabilities: np.ndarray = np.exp(self.log_likelihood(self.check_reports(reports)))
        return probabilities

    # ------------------------------------------------------------ the wire
    def encode_reports(self, reports: np.ndarray) -> list[bytes]:
        """Each valid report row as its canonical fixed-length byte string."""
        raw = self._encode_rows(self.check_reports(reports))
        return [row.tobytes() for row in raw]

    def encode_report(self, report_row: np.ndarray) -> bytes:
        """One report row (shape (report_width,)) as ``report_bytes`` bytes."""
        row = np.asarray(report_row)
        if row.shape != (self.report_width,):
            raise ValueError(f"report_row must have shape ({self.report_width},), got {row.shape!r}")
        return self.encode_reports(row.reshape(1, -1))[0]

    def decode_reports(self, blobs: Sequence[bytes]) -> np.ndarray:
        """Strictly parse encoded reports into an (n, report_width) array.

        Total: anything other than a sequence of ``report_bytes``-long byte
        strings, each the canonical encoding of a possible report, raises
        ``InvalidReport`` naming the first bad one.
        """
        return self._decode(blobs, 0)

    def _decode(self, blobs: Sequence[bytes], offset: int) -> np.ndarray:
        raw = join_blobs(blobs, self.report_bytes, offset)
        if raw.shape[0] == 0:
            return np.zeros((0, self.report_width), dtype=self._report_dtype)
        reports, non_canonical = self._decode_rows(raw)
        bad = non_canonical | self._invalid_rows(reports)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise InvalidReport(f"report {offset + first} = {bytes(raw[first])!r} is not a canonical {self.name} report")
        return reports.astype(self._report_dtype, copy=False)


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

    def _drawn_probabilities(self) -> list[float]:
        return [self.p, 1.0 - self.p]

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


class UnaryEncoding(FrequencyOracle):
    """The thesis's (p, q) bit-string perturbation (§7.3.3), parent of SUE and OUE.

    The peer one-hot encodes its value into m bits, keeps a 1 bit as 1 with
    probability p and turns each 0 bit into 1 with probability q. Theorem 1:
    this is ``ln(p(1-q) / ((1-p)q))``-LDP; subclasses choose p and q so that
    this equals ``epsilon`` exactly.
    """

    report_width: int
    _report_dtype = np.uint8

    def _configure(self) -> None:
        self.report_width = self.m
        p, q = self._probabilities()
        # Theorem 1's loss ln(p(1-q) / ((1-p)q)) grows with p and falls with
        # q: round p down and q up.
        self.p, self.q = floor_dyadic(p), ceil_dyadic(q)

    def _drawn_probabilities(self) -> list[float]:
        return [self.p, 1.0 - self.p, self.q, 1.0 - self.q]

    def estimate_work(self, n: int) -> int:
        return n * self.m

    def _row_elements(self) -> int:
        return self.m

    @abstractmethod
    def _probabilities(self) -> tuple[float, float]:
        """The ideal (p, q) for ``self.epsilon`` and ``self.m``."""

    @property
    def report_bytes(self) -> int:
        return (self.m + 7) // 8

    def _privatize(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n = values.shape[0]
        bits = np.empty((n, self.m), dtype=np.uint8)
        rows_per_block = self._block_rows()
        for start in range(0, n, rows_per_block):
            block = values[start : start + rows_per_block]
            # Each 0 bit becomes 1 with probability q, the true bit stays 1
            # with probability p (thesis §7.3.3).
            bits[start : start + block.shape[0]] = bernoulli(rng, self.q, (block.shape[0], self.m))
            bits[start + np.arange(block.shape[0]), block] = bernoulli(rng, self.p, block.shape[0])
        return bits

    def _support_counts(self, reports: np.ndarray) -> np.ndarray:
        counts: np.ndarray = reports.sum(axis=0, dtype=np.int64)
        return counts

    def _invalid_rows(self, reports: np.ndarray) -> np.ndarray:
        not_bits: np.ndarray = ((reports != 0) & (reports != 1)).any(axis=1)
        return not_bits

    def log_likelihood(self, reports: np.ndarray) -> np.ndarray:
        # Theorem 1's product: every bit contributes q or 1-q, except bit v,
        # which contributes p or 1-p.
        bits = reports.astype(np.float64)
        base = bits @ np.full(self.m, math.log(self.q)) + (1 - bits) @ np.full(self.m, math.log1p(-self.q))
        one = math.log(self.p) - math.log(self.q)
        zero = math.log1p(-self.p) - math.log1p(-self.q)
        log_probabilities: np.ndarray = base[:, None] + np.where(bits == 1, one, zero)
        return log_probabilities

    def _encode_rows(self, reports: np.ndarray) -> np.ndarray:
        return pack_bits(reports)

    def _decode_rows(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return unpack_bits(raw, self.m)


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


def _pure_variance_per_report(p: float, q: float, m: int) -> float:
    return (p * (1 - p) + (m - 1) * q * (1 - q)) / (p - q) ** 2


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
            key=lambda g: _pure_variance_per_report(*_olh_probabilities(_olh_keep(self.epsilon, g), g), self.m),
        )
        self.p_bucket = _olh_keep(self.epsilon, self.g)
        self.p, self.q = _olh_probabilities(self.p_bucket, self.g)

    def _drawn_probabilities(self) -> list[float]:
        return [self.p_bucket, 1.0 - self.p_bucket]

    def estimate_work(self, n: int) -> int:
        return n * self.m

    def _row_elements(self) -> int:
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
        rows = self._block_rows()
        for start in range(0, reports.shape[0], rows):
            block = reports[start : start + rows]
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


class SubsetSelection(FrequencyOracle):
    """k-Subset Selection: report a k-subset of the domain as an m-bit mask.

    With probability p the subset holds the true value and k-1 other values
    drawn uniformly; otherwise k values drawn uniformly from the m-1 others.
    ``P[S | v] = p / C(m-1, k-1)`` if v in S, else ``(1-p) / C(m-1, k)``; the
    ratio is exactly e^eps. k in 1..m-1 is chosen to minimise the exact
    variance (near ``m / (e^eps + 1)``); k = 1 is GRR.
    """

    name = OracleName.SS
    report_width: int
    _report_dtype = np.uint8

    def _configure(self) -> None:
        self.report_width = self.m
        centre = int(self.m / (math.exp(self.epsilon) + 1))
        window = range(max(1, centre - _SUBSET_K_WINDOW), min(self.m - 1, centre + _SUBSET_K_WINDOW + 1) + 1)
        self.k = min(
            window,
            key=lambda k: _pure_variance_per_report(*_subset_probabilities(self.epsilon, self.m, k), self.m),
        )
        self.p, self.q = _subset_probabilities(self.epsilon, self.m, self.k)

    def _drawn_probabilities(self) -> list[float]:
        return [self.p, 1.0 - self.p]

    def estimate_work(self, n: int) -> int:
        return n * self.m

    def _row_elements(self) -> int:
        return self.m

    @property
    def report_bytes(self) -> int:
        return (self.m + 7) // 8

    def _privatize(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n = values.shape[0]
        mask = np.zeros((n, self.m), dtype=np.uint8)
        rows_per_block = self._block_rows()
        for start in range(0, n, rows_per_block):
            block = values[start : start + rows_per_block]
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

    def _support_counts(self, reports: np.ndarray) -> np.ndarray:
        counts: np.ndarray = reports.sum(axis=0, dtype=np.int64)
        return counts

    def _invalid_rows(self, reports: np.ndarray) -> np.ndarray:
        not_bits = ((reports != 0) & (reports != 1)).any(axis=1)
        invalid: np.ndarray = not_bits | (reports.sum(axis=1, dtype=np.int64) != self.k)
        return invalid

    def log_likelihood(self, reports: np.ndarray) -> np.ndarray:
        log_choose = math.lgamma(self.m) - math.lgamma(self.k) - math.lgamma(self.m - self.k + 1)
        log_choose_k = math.lgamma(self.m) - math.lgamma(self.k + 1) - math.lgamma(self.m - self.k)
        inside = math.log(self.p) - log_choose
        outside = math.log1p(-self.p) - log_choose_k
        return np.where(reports == 1, inside, outside)

    def _encode_rows(self, reports: np.ndarray) -> np.ndarray:
        return pack_bits(reports)

    def _decode_rows(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return unpack_bits(raw, self.m)


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

    def _drawn_probabilities(self) -> list[float]:
        return [self.p, 1.0 - self.p]

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


_ORACLE_CLASSES: dict[str, type[FrequencyOracle]] = {
    cls.name: cls
    for cls in (
        GeneralizedRandomResponse,
        SymmetricUnaryEncoding,
        OptimizedPQEncoding,
        OptimizedUnaryEncoding,
        OptimizedLocalHashing,
        SubsetSelection,
        HadamardResponse,
    )
}

ORACLE_NAMES: tuple[str, ...] = tuple(OracleName)


@lru_cache(maxsize=1024)
def _oracle_range(cls: type[FrequencyOracle], m: int) -> tuple[float, float]:
    def holds(epsilon: float) -> bool:
        probe = cls.__new__(cls)
        probe.epsilon, probe.m = epsilon, m
        try:
            probe._configure()
            return in_range(probe._drawn_probabilities(), probe.p, probe.q)
        except (OverflowError, ZeroDivisionError):
            return False

    return epsilon_range(holds)


def make_oracle(
    name: str,
    epsilon: float,
    m: int,
    *,
    n: int | None = None,
    max_report_bytes: int = DEFAULT_MAX_REPORT_BYTES,
    max_estimate_work: int = DEFAULT_MAX_ESTIMATE_WORK,
) -> FrequencyOracle:
    """Build the oracle called ``name`` (an :class:`OracleName`) for (epsilon, m).

    ``"auto"`` needs ``n`` and returns, among the concrete oracles whose
    epsilon range holds ``epsilon``, whose report fits ``max_report_bytes``
    (what fits the packet: the caller passes its budget) and whose
    estimation for ``n`` reports costs at most ``max_estimate_work`` element
    operations (memory is bounded for all of them: estimation is blockwise),
    the one with the lowest exact expected error ``variance(n)``. Ties go to
    the earlier name in :class:`OracleName`. A concrete name ignores the two
    limits. Raises :class:`EpsilonOutOfRange` when nothing qualifies.
    """
    try:
        chosen = OracleName(name)
    except ValueError:
        raise ValueError(f"name must be one of {ORACLE_NAMES!r}, got {name!r}") from None
    if chosen != OracleName.AUTO:
        return _ORACLE_CLASSES[chosen](epsilon, m)
    if n is None:
        raise ValueError("n is required for the 'auto' oracle, got None")
    n = check_positive_int(n, "n", minimum=1)
    best: FrequencyOracle | None = None
    for cls in _ORACLE_CLASSES.values():
        try:
            candidate = cls(epsilon, m)
        except EpsilonOutOfRange:
            continue
        except ValueError:
            if cls is OptimizedLocalHashing:  # m too large for its hash family
                continue
            raise
        if candidate.report_bytes > max_report_bytes or candidate.estimate_work(n) > max_estimate_work:
            continue
        # Relative slack so that mathematically equal variances (SS with
        # k = 1 is GRR) tie on rounding and go to the earlier name.
        if best is None or candidate.variance(n) < best.variance(n) * (1 - 1e-12):
            best = candidate
    if best is None:
        raise EpsilonOutOfRange(
            f"no frequency oracle holds epsilon={epsilon!r} for m={m!r} with reports of at most "
            f"{max_report_bytes!r} bytes and estimation work of at most {max_estimate_work!r} for n={n!r}"
        )
    return best
