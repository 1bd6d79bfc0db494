"""Mechanisms at the edges: the epsilon range each oracle states and refuses
outside, exact probabilities on the 2^-53 grid, bounded memory in estimation
and ``auto``'s report-size limit.

Each test here failed on the code before this change (named in its comment).
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from anonml.mechanisms import (
    DEFAULT_MAX_REPORT_BYTES,
    MIN_PROBABILITY,
    ORACLE_NAMES,
    EpsilonOutOfRange,
    InvalidReport,
    OracleName,
    make_oracle,
)
from anonml.mechanisms._oracle_base import pure_variance_per_report
from anonml.mechanisms._oracles import _ORACLE_CLASSES
from anonml.mechanisms._unary import SubsetSelection, _subset_probabilities

CONCRETE = [name for name in ORACLE_NAMES if name != "auto"]


@pytest.mark.parametrize("name", CONCRETE)
@pytest.mark.parametrize("m", [2, 16, 1024])
def test_epsilon_above_or_below_the_stated_range_is_refused(name: str, m: int) -> None:
    # Before: GRR and SS told the truth with probability exactly 1.0 at eps
    # ~40, HR at ~38, OLH at ~100 while stating a finite epsilon; eps below
    # ~1e-16 gave inf or ZeroDivisionError, eps >= 710 OverflowError.
    low, high = _ORACLE_CLASSES[OracleName(name)].epsilon_range(m)
    assert 0 < low < 1e-3 and 20 < high < 50
    outside = [e for e in (high * 1.001, 40.0, 100.0, 710.0, 1e4, low * 0.999, 1e-17, 1e-300) if not low <= e <= high]
    for epsilon in outside:
        with pytest.raises(EpsilonOutOfRange, match="outside the range"):
            make_oracle(name, epsilon, m)
    for epsilon in (low * 1.001, high * 0.999):
        oracle = make_oracle(name, epsilon, m)
        # Inside the range every drawn probability is randomised and on the grid.
        assert oracle.p - oracle.q >= MIN_PROBABILITY
        assert 0.0 < oracle.p < 1.0 and oracle.p * 2**53 == math.floor(oracle.p * 2**53)


@pytest.mark.parametrize(("name", "epsilon", "m"), [("grr", 1.0, 5), ("ss", 2.0, 9), ("hr", 0.7, 6), ("oue", 1.5, 4), ("sue", 1.0, 3), ("pq", 2.5, 7)])
def test_rounded_probabilities_never_exceed_the_stated_epsilon(name: str, epsilon: float, m: int) -> None:
    # The sampler's exact loss is computed from the rounded probabilities it
    # draws with: never above epsilon, and within 2^-20 of it.
    oracle = make_oracle(name, epsilon, m)
    p, q = oracle.p, oracle.q
    if name == "grr":
        loss = math.log(p * (m - 1) / (1 - p))
    elif name == "ss":
        assert isinstance(oracle, SubsetSelection)
        loss = math.log(p * (m - oracle.k) / ((1 - p) * oracle.k))
    elif name == "hr":
        loss = math.log(p / (1 - p))
    else:
        loss = math.log(p * (1 - q) / ((1 - p) * q))
    assert epsilon * (1 - 2**-20) <= loss <= epsilon * (1 + 1e-15)


def test_subset_size_window_finds_the_best_k_of_the_full_search() -> None:
    for m in range(2, 65):
        for epsilon in (0.1, 0.5, 1.0, 2.0, 4.0, 8.0):
            full = min(range(1, m), key=lambda k: pure_variance_per_report(*_subset_probabilities(epsilon, m, k), m))
            oracle = make_oracle("ss", epsilon, m)
            assert isinstance(oracle, SubsetSelection)
            best = pure_variance_per_report(*_subset_probabilities(epsilon, m, full), m)
            assert oracle.variance(1) == pytest.approx(best, rel=1e-12), (m, epsilon, oracle.k, full)


def test_auto_keeps_reports_inside_the_packet_budget_at_a_million_values() -> None:
    # Before: auto picked Subset Selection with 125,000-byte reports at m = 1e6.
    oracle = make_oracle("auto", 1.0, 1_000_000, n=100_000)
    assert oracle.report_bytes <= DEFAULT_MAX_REPORT_BYTES
    assert oracle.name == "hr"
    small = make_oracle("auto", 1.0, 1024, n=100_000, max_report_bytes=16)
    assert small.report_bytes <= 16
    with pytest.raises(EpsilonOutOfRange, match="no frequency oracle"):
        make_oracle("auto", 1.0, 1024, n=100_000, max_report_bytes=1)


def _peak_bytes(action: object) -> int:
    tracemalloc.start()
    try:
        action()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_olh_estimation_is_blockwise() -> None:
    # Before: one (n, m) hash table per 65,536 reports (488 GiB at n >= 65,536
    # and m = 1e6); here 500 reports over 2^17 values took 1.5 GB.
    m, n = 1 << 17, 500
    oracle = make_oracle("olh", 1.0, m)
    rng = np.random.default_rng(0)
    reports = oracle.privatize(rng.integers(0, m, size=n), rng)
    blobs = oracle.encode_reports(reports)
    peak = _peak_bytes(lambda: oracle.estimate_blobs(blobs))
    assert peak < 256 * 2**20, peak
    np.testing.assert_allclose(oracle.estimate_blobs(blobs), oracle.estimate(reports))


def test_hadamard_estimation_is_a_transform_not_a_table() -> None:
    # Before: a K x m table of signs (7.6 TiB at m = 1e6).
    for m in (2, 3, 16, 100):
        oracle = make_oracle("hr", 1.0, m)
        rng = np.random.default_rng(m)
        reports = oracle.privatize(rng.integers(0, m, size=3000), rng)
        brute = np.zeros(m)
        for row, bit in reports:
            for x in range(m):
                positive = bin(int(row) & x).count("1") % 2 == 0
                brute[x] += positive == (bit == 1)
        np.testing.assert_array_equal(oracle.support_counts(reports), brute)
    oracle = make_oracle("hr", 1.0, 1_000_000)
    rng = np.random.default_rng(1)
    reports = oracle.privatize(rng.integers(0, 1_000_000, size=1000), rng)
    peak = _peak_bytes(lambda: oracle.estimate(reports))
    assert peak < 128 * 2**20, peak


@pytest.mark.parametrize("name", CONCRETE)
def test_blockwise_estimation_matches_and_names_the_bad_report_by_its_place(name: str) -> None:
    oracle = make_oracle(name, 1.0, 40)
    rng = np.random.default_rng(5)
    reports = oracle.privatize(rng.integers(0, 40, size=300), rng)
    blobs = oracle.encode_reports(reports)
    np.testing.assert_allclose(oracle.estimate_blobs(blobs), oracle.estimate(reports))
    with pytest.raises(InvalidReport, match="report 299 "):
        oracle.estimate_blobs([*blobs[:299], b"\xff" * (oracle.report_bytes + 1)])
