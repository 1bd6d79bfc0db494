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

This module holds that contract (:class:`FrequencyOracle`) and the base of
the oracles whose report is an m-bit vector; the oracles themselves are in
``_unary`` (one value or one m-bit vector per report) and ``_hashing`` (a
hash seed or Hadamard row and one bucket per report), the ``auto`` policy in
``_oracles``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import ClassVar

import numpy as np

from anonml.mechanisms._errors import InvalidReport
from anonml.mechanisms._names import OracleName
from anonml.mechanisms._sampling import epsilon_range, in_range, refuse
from anonml.mechanisms._validate import check_counts, check_epsilon, check_positive_int, check_values
from anonml.mechanisms._wire import check_blobs, join_blobs, pack_bits, unpack_bits

# Reports are privatised and estimated in blocks whose temporaries hold at
# most this many elements (8 bytes each: 32 MiB), so memory stays bounded
# whatever n and m are (before: OLH's (n, m) hash table needed 488 GiB at
# n >= 65,536 with m = 1e6).
BLOCK_ELEMENTS = 1 << 22
_MAX_BLOCK_ROWS = 1 << 16

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
    docstring) in ``_configure`` and implement the hooks ``_privatize``,
    ``_support_counts``, ``_invalid_rows``, ``log_likelihood``,
    ``_encode_rows``, ``_decode_rows`` and ``report_bytes``; the hooks
    ``_drawn_probabilities``, ``_row_elements`` and ``estimate_work`` have a
    default that states the common case, overridden where an oracle differs.
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

    def _drawn_probabilities(self) -> list[float]:
        """Every probability a Bernoulli draw of ``_privatize`` uses, and its complement.

        By default one draw, keeping the truth with probability ``p``; an
        oracle that draws anything else overrides this, or its epsilon range
        would not cover that draw.
        """
        return [self.p, 1.0 - self.p]

    def _row_elements(self) -> int:
        """Elements of temporary memory one report row needs in estimation:
        by default the row itself; more where estimation expands a row over
        the domain."""
        return self.report_width

    def estimate_work(self, n: int) -> int:
        """Element operations ``estimate`` performs for ``n`` reports (what
        ``auto`` bounds): by default each report's row elements."""
        return n * self._row_elements()

    def _block_rows(self) -> int:
        return max(1, min(_MAX_BLOCK_ROWS, BLOCK_ELEMENTS // self._row_elements()))

    def _blocks(self, rows: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """``rows`` in consecutive blocks of ``_block_rows()``, each with the
        index of its first row: a hook that works block by block keeps its
        temporaries within ``BLOCK_ELEMENTS``."""
        size = self._block_rows()
        for start in range(0, rows.shape[0], size):
            yield start, rows[start : start + size]

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

class BitVectorOracle(FrequencyOracle):
    """An oracle whose report is an m-bit vector, one bit per value, that
    supports the values whose bit is set (the unary encodings and subset
    selection): the support counts are the column sums, and the wire is the
    bits packed eight to a byte."""

    _report_dtype = np.uint8

    def __init__(self, epsilon: float, m: int) -> None:
        super().__init__(epsilon, m)
        self.report_width = self.m

    @property
    def report_bytes(self) -> int:
        return (self.m + 7) // 8

    def _support_counts(self, reports: np.ndarray) -> np.ndarray:
        counts: np.ndarray = reports.sum(axis=0, dtype=np.int64)
        return counts

    def _invalid_rows(self, reports: np.ndarray) -> np.ndarray:
        not_bits: np.ndarray = ((reports != 0) & (reports != 1)).any(axis=1)
        return not_bits

    def _encode_rows(self, reports: np.ndarray) -> np.ndarray:
        return pack_bits(reports)

    def _decode_rows(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return unpack_bits(raw, self.m)


def pure_variance_per_report(p: float, q: float, m: int) -> float:
    """``variance(n) / n`` of a pure oracle with support probabilities (p, q)
    over m values (the module docstring's total): what an oracle minimises
    when it chooses its own parameter (OLH's g, subset selection's k)."""
    return (p * (1 - p) + (m - 1) * q * (1 - q)) / (p - q) ** 2


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
