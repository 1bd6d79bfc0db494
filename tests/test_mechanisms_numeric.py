"""Harmony's 1-bit mean mechanism, Laplace and Gaussian mechanisms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from anonml.mechanisms import (
    InvalidReport,
    OneBitMean,
    gaussian_mechanism,
    gaussian_sigma,
    laplace_mechanism,
)


def test_one_bit_output_distribution_is_exactly_epsilon_ldp() -> None:
    # An output is (j, u); j is uniform whatever the input, so the ratio of
    # output probabilities is that of P[u | t_j], worst at t_j = +-1 (Lemma 1).
    epsilon = 1.7
    mechanism = OneBitMean(epsilon, 3)
    grid = np.linspace(-1.0, 1.0, 201)
    one = mechanism.probability_of_one(grid)
    assert np.all((one > 0) & (one < 1))
    assert one.max() / one.min() == pytest.approx(math.exp(epsilon))
    assert (1 - one).max() / (1 - one).min() == pytest.approx(math.exp(epsilon))


def test_one_bit_means_are_unbiased_with_the_exact_variance() -> None:
    epsilon, d, n, repeats = 1.0, 4, 3000, 300
    mechanism = OneBitMean(epsilon, d)
    rng = np.random.default_rng(8)
    values = np.clip(rng.normal([0.5, -0.3, 0.0, 0.9], 0.2, size=(n, d)), -1, 1)
    truth = values.mean(axis=0)
    estimates = np.array([mechanism.estimate(mechanism.privatize(values, rng)) for _ in range(repeats)])
    variance = mechanism.variance(n, values)
    assert np.all(variance <= mechanism.variance(n))  # the worst case bounds it
    assert np.all(np.abs(estimates.mean(axis=0) - truth) <= 4.5 * np.sqrt(variance / repeats))
    # The sampled attribute makes each estimate a sum of n independent terms;
    # with n = 3000 the chi-square band for the empirical variance applies.
    low, high = stats.chi2.ppf([1e-5, 1 - 1e-5], repeats - 1) / (repeats - 1)
    ratio = estimates.var(axis=0, ddof=1) / variance
    assert np.all((ratio > low) & (ratio < high)), ratio


def test_one_bit_reports_round_trip_and_bad_input_is_rejected() -> None:
    mechanism = OneBitMean(1.0, 5)
    rng = np.random.default_rng(0)
    reports = mechanism.privatize(rng.uniform(-1, 1, size=(50, 5)), rng)
    blobs = [mechanism.encode_report(row) for row in reports]
    assert {len(blob) for blob in blobs} == {mechanism.report_bytes}
    np.testing.assert_array_equal(mechanism.decode_reports(blobs), reports)
    with pytest.raises(InvalidReport):
        mechanism.decode_reports([bytes([10])])  # attribute 5 of 5
    with pytest.raises(InvalidReport):
        mechanism.decode_reports([b"\x00\x00"])
    with pytest.raises(InvalidReport):
        mechanism.estimate(np.array([[0, 2]]))
    with pytest.raises(ValueError, match="values"):
        mechanism.privatize(np.full((2, 5), 1.5), rng)  # not clipped
    with pytest.raises(ValueError, match="values"):
        mechanism.privatize(np.zeros((2, 4)), rng)
    with pytest.raises(ValueError, match="d must"):
        OneBitMean(1.0, 0)
    with pytest.raises(ValueError, match="epsilon"):
        OneBitMean(0.0, 2)


def test_laplace_noise_has_scale_sensitivity_over_epsilon() -> None:
    n = 20_000
    noisy = laplace_mechanism(np.zeros(n), 2.0, 0.5, np.random.default_rng(4))
    scale = 2.0 / 0.5
    # The mean absolute deviation of Laplace(b) is b with variance b^2.
    assert abs(np.abs(noisy).mean() - scale) <= 4.5 * scale / math.sqrt(n)
    with pytest.raises(ValueError, match="sensitivity"):
        laplace_mechanism(1.0, 0.0, 1.0, np.random.default_rng(0))


def test_gaussian_sigma_is_the_classic_formula_and_its_domain_is_enforced() -> None:
    assert gaussian_sigma(1.0, 0.5, 1e-5) == pytest.approx(math.sqrt(2 * math.log(1.25e5)) / 0.5)
    n = 20_000
    noisy = gaussian_mechanism(np.full(n, 3.0), 1.0, 0.5, 1e-5, np.random.default_rng(9))
    sigma = gaussian_sigma(1.0, 0.5, 1e-5)
    low, high = stats.chi2.ppf([1e-5, 1 - 1e-5], n - 1) / (n - 1)
    assert low < noisy.var(ddof=1) / sigma**2 < high
    with pytest.raises(ValueError, match="epsilon"):
        gaussian_sigma(1.0, 1.0, 1e-5)
    for delta in (0.0, 1.0, -1e-3):
        with pytest.raises(ValueError, match="delta"):
            gaussian_sigma(1.0, 0.5, delta)


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 3.0])
def test_analytic_gaussian_sigma_meets_delta_exactly(epsilon: float) -> None:
    # Independent check: the hockey-stick divergence between N(0, s^2) and
    # N(1, s^2), integrated numerically, equals delta at the returned sigma.
    delta = 1e-4
    sigma = gaussian_sigma(1.0, epsilon, delta, method="analytic")
    grid = np.linspace(-40 * sigma, 40 * sigma, 2_000_001)

    def hockey_stick(s: float) -> float:
        excess = np.maximum(stats.norm.pdf(grid, 0, s) - math.exp(epsilon) * stats.norm.pdf(grid, 1, s), 0)
        return float(excess.sum() * (grid[1] - grid[0]))

    assert hockey_stick(sigma) == pytest.approx(delta, rel=1e-4)
    assert hockey_stick(0.99 * sigma) > delta  # and no smaller sigma would do
    if epsilon < 1:
        assert sigma < gaussian_sigma(1.0, epsilon, delta)  # tighter than the classic bound
    with pytest.raises(ValueError, match="method"):
        gaussian_sigma(1.0, epsilon, delta, method="rdp")
