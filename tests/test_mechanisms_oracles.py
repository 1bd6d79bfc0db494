"""Frequency oracles: unbiasedness and variance against the exact formulas,
exact privacy of each output distribution, ``auto``, the wire encoding, and
rejection of bad input.

Statistical checks use fixed seeds and tolerances derived from the exact
variance: a mean of T independent estimates within 4.5 standard deviations,
an empirical variance inside chi-square quantiles at 1e-5 each side.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.optimize import minimize_scalar

from anonml.mechanisms import (
    ORACLE_NAMES,
    FrequencyOracle,
    InvalidReport,
    make_oracle,
    optimal_pq_p,
)

CONCRETE = [name for name in ORACLE_NAMES if name != "auto"]


def _skewed_values(m: int, n: int) -> np.ndarray:
    """A fixed population with very unequal counts (half on value 0)."""
    counts = np.zeros(m, dtype=np.int64)
    counts[0] = n // 2
    rest = n - counts[0]
    counts[1:] = rest // (m - 1)
    counts[1] += rest - counts[1:].sum()
    return np.repeat(np.arange(m), counts)


def _repeated_estimates(oracle: FrequencyOracle, values: np.ndarray, repeats: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([oracle.estimate(oracle.privatize(values, rng)) for _ in range(repeats)])


@pytest.mark.parametrize("name", CONCRETE)
@pytest.mark.parametrize(("epsilon", "m"), [(1.0, 8), (3.0, 5)])
def test_estimate_is_unbiased_and_variance_matches_formula(name: str, epsilon: float, m: int) -> None:
    n, repeats = 2000, 300
    oracle = make_oracle(name, epsilon, m)
    values = _skewed_values(m, n)
    truth = np.bincount(values, minlength=m).astype(float)
    estimates = _repeated_estimates(oracle, values, repeats, seed=100 * CONCRETE.index(name) + m)
    per_value = oracle.value_variances(truth)
    # The per-value variances add up to the exact total.
    assert per_value.sum() == pytest.approx(oracle.variance(n), rel=1e-12)
    assert oracle.variance(n, truth) == oracle.variance(n)
    # Unbiased: the mean of T estimates is within 4.5 sd of the truth.
    sd_of_mean = np.sqrt(per_value / repeats)
    assert np.all(np.abs(estimates.mean(axis=0) - truth) <= 4.5 * sd_of_mean)
    # Variance: (T-1) s^2 / sigma^2 ~ chi-square(T-1) for near-normal estimates.
    low, high = stats.chi2.ppf([1e-5, 1 - 1e-5], repeats - 1) / (repeats - 1)
    ratios = estimates.var(axis=0, ddof=1) / per_value
    assert np.all((ratios > low) & (ratios < high)), ratios
    # The total squared error, averaged, sits near the exact total. Its
    # relative sd is at most sqrt(2 / T) (totals of squared normals).
    total = ((estimates - truth) ** 2).sum(axis=1).mean()
    assert abs(total / oracle.variance(n) - 1) <= 4 * math.sqrt(2 / repeats)


def _all_outputs(oracle: FrequencyOracle) -> np.ndarray:
    """Every report the oracle can emit (not OLH, whose seed space is 2^62)."""
    if oracle.name == "grr":
        return np.arange(oracle.m).reshape(-1, 1)
    if oracle.name == "hr":
        return np.array([(row, bit) for row in range(oracle.rows) for bit in (0, 1)], dtype=np.int64)
    bits = np.array(list(itertools.product([0, 1], repeat=oracle.m)), dtype=np.uint8)
    if oracle.name == "ss":
        return bits[bits.sum(axis=1) == oracle.k]
    return bits


@pytest.mark.parametrize("name", ["grr", "sue", "pq", "oue", "ss", "hr"])
@pytest.mark.parametrize(("epsilon", "m"), [(0.7, 5), (2.5, 6)])
def test_output_distribution_is_exactly_epsilon_ldp(name: str, epsilon: float, m: int) -> None:
    oracle = make_oracle(name, epsilon, m)
    outputs = _all_outputs(oracle)
    likelihood = oracle.likelihood(outputs)
    # A distribution over every possible output for each true value...
    assert likelihood.sum(axis=0) == pytest.approx(np.ones(m), abs=1e-12)
    # ...whose worst-case ratio between two true values is exactly e^eps.
    worst = (likelihood.max(axis=1) / likelihood.min(axis=1)).max()
    assert worst == pytest.approx(math.exp(epsilon), rel=1e-9)


@pytest.mark.parametrize("name", ["grr", "sue", "pq", "oue", "ss", "hr"])
def test_privatize_samples_the_stated_distribution(name: str) -> None:
    # Ties privatize() to log_likelihood(), on which the exact check relies:
    # chi-square goodness of fit of 40,000 reports of one value.
    oracle = make_oracle(name, 1.2, 4)
    outputs = _all_outputs(oracle)
    rng = np.random.default_rng(7)
    for value in (0, 3):
        reports = oracle.privatize(np.full(40_000, value), rng)
        index = {tuple(row): k for k, row in enumerate(outputs.tolist())}
        observed = np.bincount([index[tuple(row)] for row in reports.tolist()], minlength=len(outputs))
        expected = oracle.likelihood(outputs)[:, value] * len(reports)
        assert stats.chisquare(observed, expected).pvalue > 1e-5


def test_olh_output_distribution_is_exactly_epsilon_ldp_for_every_seed() -> None:
    epsilon, m = 1.5, 7
    oracle = make_oracle("olh", epsilon, m)
    seeds = np.random.default_rng(3).integers(0, (2**31 - 2) * (2**31 - 1), size=300)
    outputs = np.array([(seed, y) for seed in seeds for y in range(oracle.g)], dtype=np.int64)
    likelihood = oracle.likelihood(outputs).reshape(len(seeds), oracle.g, m)
    # Given the seed (uniform, independent of the value), y is a distribution...
    per_seed = likelihood.sum(axis=1) * (2**31 - 2) * (2**31 - 1)
    assert per_seed == pytest.approx(np.ones((len(seeds), m)), rel=1e-9)
    # ...and the ratio between two true values is at most, and reaches, e^eps.
    flat = likelihood.reshape(-1, m)
    assert (flat.max(axis=1) / flat.min(axis=1)).max() == pytest.approx(math.exp(epsilon), rel=1e-9)


def test_olh_reports_the_true_bucket_with_the_stated_probability() -> None:
    oracle = make_oracle("olh", 2.0, 10)
    n = 50_000
    reports = oracle.privatize(np.full(n, 4), np.random.default_rng(11))
    hit = oracle.likelihood(reports)[:, 4] > oracle.likelihood(reports)[:, 4].min()
    p = oracle.p_bucket
    assert abs(hit.mean() - p) <= 4.5 * math.sqrt(p * (1 - p) / n)


def test_hadamard_columns_agree_on_exactly_half_the_rows() -> None:
    # The fact behind q = 1/2 (Harmony §3.2): distinct columns are orthogonal.
    oracle = make_oracle("hr", 1.0, 12)
    rows = np.arange(oracle.rows)[:, None]
    signs = np.where(oracle._positive(rows, np.arange(oracle.m)[None, :]), 1, -1)
    np.testing.assert_array_equal(signs.T @ signs, oracle.rows * np.eye(oracle.m, dtype=np.int64))


def test_sue_and_pq_meet_their_thesis_definitions() -> None:
    for epsilon, m in [(0.5, 4), (1.0, 16), (4.0, 64)]:
        sue = make_oracle("sue", epsilon, m)
        assert sue.q == pytest.approx(1 - sue.p)
        assert math.log(sue.p**2 / (1 - sue.p) ** 2) == pytest.approx(epsilon)  # thesis §7.3.2
        pq = make_oracle("pq", epsilon, m)
        assert math.log(pq.p * (1 - pq.q) / ((1 - pq.p) * pq.q)) == pytest.approx(epsilon)  # Theorem 1


@pytest.mark.parametrize("epsilon", [0.25, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("m", [2, 3, 16, 64])
def test_eq_7_3_minimises_eq_7_2(epsilon: float, m: int) -> None:
    lam = math.exp(epsilon)

    def eq_7_2(p: float) -> float:
        q = p / (lam * (1 - p) + p)
        return math.sqrt((m - 1) * q * (1 - q) + p * (1 - p)) / (p - q)

    best = minimize_scalar(eq_7_2, bounds=(1e-9, 1 - 1e-9), method="bounded", options={"xatol": 1e-12})
    p_min = optimal_pq_p(epsilon, m)
    assert p_min == pytest.approx(best.x, abs=1e-6)
    assert eq_7_2(p_min) <= best.fun * (1 + 1e-12)
    # And the oracle's exact variance is n^2 times the square of eq. 7.2.
    n = 1000
    assert make_oracle("pq", epsilon, m).variance(n) == pytest.approx(n * eq_7_2(p_min) ** 2, rel=1e-12)
    if m == 2:
        # Thesis §7.3.4: at m = 2 the optimum is one-time RAPPOR.
        assert p_min == pytest.approx(make_oracle("sue", epsilon, 2).p)


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("m", [2, 4, 8, 16, 32, 64, 256])
def test_auto_picks_the_minimum_variance_oracle(epsilon: float, m: int) -> None:
    n = 10_000
    auto = make_oracle("auto", epsilon, m, n=n)
    variances = {name: make_oracle(name, epsilon, m).variance(n) for name in CONCRETE}
    assert auto.variance(n) == pytest.approx(min(variances.values()), rel=1e-12)
    assert auto.name in CONCRETE
    # pq is the best unary encoding (eq. 7.3 minimises the exact error).
    assert variances["pq"] <= min(variances["sue"], variances["oue"]) * (1 + 1e-12)


def test_auto_beats_pq_where_grr_or_subset_selection_win() -> None:
    n = 10_000
    small = make_oracle("auto", 4.0, 4, n=n)
    assert make_oracle("pq", 4.0, 4).variance(n) / small.variance(n) > 5
    large = make_oracle("auto", 1.0, 64, n=n)
    assert large.name == "ss"
    assert make_oracle("pq", 1.0, 64).variance(n) > large.variance(n)


@pytest.mark.parametrize("name", CONCRETE)
def test_reports_have_the_declared_shape_and_round_trip_on_the_wire(name: str) -> None:
    oracle = make_oracle(name, 1.0, 11)
    reports = oracle.privatize(np.arange(11).repeat(20), np.random.default_rng(5))
    assert reports.shape == (220, oracle.report_width)
    assert np.issubdtype(reports.dtype, np.integer)
    blobs = oracle.encode_reports(reports)
    assert {len(blob) for blob in blobs} == {oracle.report_bytes}
    assert oracle.encode_report(reports[3]) == blobs[3]
    decoded = oracle.decode_reports(blobs)
    np.testing.assert_array_equal(decoded, reports)
    np.testing.assert_array_equal(oracle.estimate(decoded), oracle.estimate(reports))
    assert oracle.decode_reports([]).shape == (0, oracle.report_width)


@pytest.mark.parametrize("name", CONCRETE)
def test_decode_rejects_wrong_lengths_and_non_bytes(name: str) -> None:
    oracle = make_oracle(name, 1.0, 11)
    good = oracle.encode_reports(oracle.privatize(np.array([1, 2]), np.random.default_rng(0)))
    for bad in ([good[0] + b"\x00"], [good[0][:-1]], [b""], [good[0], "text"], [None], b"abc", 17):
        with pytest.raises(InvalidReport):
            oracle.decode_reports(bad)  # type: ignore[arg-type]


def test_decode_rejects_impossible_values() -> None:
    grr = make_oracle("grr", 1.0, 5)
    with pytest.raises(InvalidReport):
        grr.decode_reports([bytes([5])])
    sue = make_oracle("sue", 1.0, 5)
    assert sue.decode_reports([bytes([0b11111000])]).tolist() == [[1, 1, 1, 1, 1]]
    with pytest.raises(InvalidReport, match="canonical"):
        sue.decode_reports([bytes([0b11111100])])  # a padding bit set
    ss = make_oracle("ss", 1.0, 8)
    assert ss.k >= 1
    with pytest.raises(InvalidReport):
        ss.decode_reports([bytes([(1 << (ss.k + 1)) - 1])])  # k + 1 members
    hr = make_oracle("hr", 1.0, 5)  # 8 Hadamard rows: (row, bit) packs into 0..15
    assert hr.decode_reports([bytes([15])]).tolist() == [[7, 1]]
    with pytest.raises(InvalidReport):
        hr.decode_reports([bytes([16])])
    olh = make_oracle("olh", 1.0, 8)
    too_big_seed = (2**31 - 2) * (2**31 - 1)
    with pytest.raises(InvalidReport):
        olh.decode_reports([too_big_seed.to_bytes(8, "big") + bytes(olh.report_bytes - 8)])
    with pytest.raises(InvalidReport):
        olh.decode_reports([bytes(8) + (olh.g).to_bytes(olh.report_bytes - 8, "big")])
    with pytest.raises(InvalidReport):
        olh.decode_reports([b"\xff" * olh.report_bytes])


@pytest.mark.parametrize("name", CONCRETE)
@settings(max_examples=60, deadline=None)
@given(blobs=st.lists(st.binary(min_size=0, max_size=12), max_size=4))
def test_decode_is_total(name: str, blobs: list[bytes]) -> None:
    oracle = make_oracle(name, 1.0, 11)
    try:
        decoded = oracle.decode_reports(blobs)
    except InvalidReport:
        return
    # Whatever decodes is canonical: it re-encodes to the same bytes.
    assert oracle.encode_reports(decoded) == blobs


@pytest.mark.parametrize("name", CONCRETE)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_decode_is_total_on_right_length_input(name: str, data: st.DataObject) -> None:
    oracle = make_oracle(name, 1.0, 11)
    blobs = data.draw(st.lists(st.binary(min_size=oracle.report_bytes, max_size=oracle.report_bytes), max_size=5))
    try:
        decoded = oracle.decode_reports(blobs)
    except InvalidReport:
        return
    assert oracle.encode_reports(decoded) == blobs


@pytest.mark.parametrize("epsilon", [0, -1.0, math.nan, math.inf, "1", None])
def test_bad_epsilon_is_rejected_naming_the_parameter(epsilon: object) -> None:
    for name in ORACLE_NAMES:
        with pytest.raises(ValueError, match="epsilon"):
            make_oracle(name, epsilon, 4, n=10)  # type: ignore[arg-type]


@pytest.mark.parametrize("m", [1, 0, -3, 2.5, True])
def test_bad_domain_size_is_rejected(m: object) -> None:
    for name in CONCRETE:
        with pytest.raises(ValueError, match="m must"):
            make_oracle(name, 1.0, m)  # type: ignore[arg-type]


def test_bad_names_and_missing_n_are_rejected() -> None:
    with pytest.raises(ValueError, match="name"):
        make_oracle("rappor", 1.0, 4)
    with pytest.raises(ValueError, match="n is required"):
        make_oracle("auto", 1.0, 4)
    with pytest.raises(ValueError, match="n must"):
        make_oracle("auto", 1.0, 4, n=0)


@pytest.mark.parametrize("name", CONCRETE)
def test_values_and_reports_are_checked_not_clipped(name: str) -> None:
    oracle = make_oracle(name, 1.0, 4)
    rng = np.random.default_rng(0)
    for values in (np.array([0, 4]), np.array([-1]), np.array([[0, 1]]), np.array([0.0, 1.0])):
        with pytest.raises(ValueError, match="values"):
            oracle.privatize(values, rng)
    with pytest.raises(ValueError, match="rng"):
        oracle.privatize(np.array([0]), 42)  # type: ignore[arg-type]
    reports = oracle.privatize(np.array([0, 1, 2]), rng)
    with pytest.raises(ValueError, match="reports"):
        oracle.estimate(reports[:, :1] if reports.shape[1] > 1 else np.hstack([reports, reports]))
    with pytest.raises(ValueError, match="reports"):
        oracle.estimate(reports.astype(float))
    with pytest.raises(ValueError, match="reports"):
        oracle.estimate(reports.ravel())
    impossible = reports.astype(np.int64)
    impossible[0, -1] = 7
    with pytest.raises(InvalidReport):
        oracle.estimate(impossible)
    with pytest.raises(ValueError, match="counts"):
        oracle.variance(3, np.array([1.0, 1.0, 0.0, 0.0]))
    assert oracle.estimate(np.zeros((0, oracle.report_width), dtype=np.int64)).tolist() == [0.0] * 4
