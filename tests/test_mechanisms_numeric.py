"""Harmony's 1-bit mean mechanism and the discrete Laplace and Gaussian mechanisms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from anonml.mechanisms import (
    DISCRETE_EPSILON_RANGE,
    EpsilonOutOfRange,
    InvalidReport,
    OneBitMean,
    discrete_gaussian_delta,
    discrete_gaussian_mechanism,
    discrete_gaussian_sigma,
    discrete_laplace_mechanism,
    discrete_laplace_pmf,
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


def test_one_bit_refuses_an_epsilon_at_which_its_bit_is_certain() -> None:
    low, high = OneBitMean.epsilon_range()
    assert 20 < high < 23
    for epsilon in (40.0, high * 1.01, 800.0, low / 2, 1e-17):
        with pytest.raises(EpsilonOutOfRange):
            OneBitMean(epsilon, 2)
    # Inside the range the extremes stay exactly e^eps apart or less.
    mechanism = OneBitMean(high, 1)
    one = mechanism.probability_of_one(np.array([-1.0, 1.0]))
    assert 0 < one[0] < one[1] < 1 and one[1] / one[0] <= math.exp(high)


def _audit(counts_0: np.ndarray, counts_1: np.ndarray, epsilon: float, z: float) -> None:
    """Every output seen often under both inputs: the log ratio of its two
    frequencies is at most epsilon plus z standard errors (delta method:
    Var[log c] <= 1/c for a binomial count c)."""
    for c0, c1 in zip(counts_0, counts_1):
        if min(c0, c1) < 500:
            continue
        margin = z * math.sqrt(1 / c0 + 1 / c1)
        assert abs(math.log(c0 / c1)) <= epsilon + margin, (c0, c1)


def test_discrete_laplace_audit_at_small_integer_inputs() -> None:
    # Neighbouring inputs 0 and 1 (sensitivity 1), 200,000 draws each, fixed
    # seed: every output's probability ratio is at most e^eps (within the
    # delta-method band, z = 4.5 over about 20 outputs), each output's
    # frequency matches the exact pmf within 4.5 binomial sd, and every
    # output is an integer.
    epsilon, n = 1.0, 200_000
    rng = np.random.default_rng(20240601)
    support = np.arange(-12, 13)
    counts = {}
    for value in (0, 1):
        out = discrete_laplace_mechanism(np.full(n, value, dtype=np.int64), 1, epsilon, rng)
        assert out.dtype == np.int64
        counts[value] = np.array([(out == k).sum() for k in support])
        expected = n * discrete_laplace_pmf(support - value, 1, epsilon)
        assert np.all(np.abs(counts[value] - expected) <= 4.5 * np.sqrt(expected) + 1)
    _audit(counts[0], counts[1], epsilon, 4.5)
    # The exact pmf's ratio is exactly e^eps between neighbours at every output.
    ratio = discrete_laplace_pmf(support, 1, epsilon) / discrete_laplace_pmf(support - 1, 1, epsilon)
    assert ratio.max() == pytest.approx(math.exp(epsilon)) and ratio.min() == pytest.approx(math.exp(-epsilon))


def test_the_floating_point_attack_finds_nothing_to_tell_inputs_apart() -> None:
    # Mironov's attack on float Laplace: outputs near zero that are not
    # multiples of 2^-53 occur for some inputs and never for others (the old
    # float mechanism: 15-66% for input 0, none for input 1). Integer noise
    # on an integer query has one representation for each output.
    rng = np.random.default_rng(3)
    fractions = []
    for value in (0, 1):
        out = discrete_laplace_mechanism(np.full(50_000, value, dtype=np.int64), 1, 0.5, rng).astype(np.float64)
        near = out[np.abs(out) < 1]
        fractions.append(float(np.mean(near * 2.0**53 != np.round(near * 2.0**53))) if near.size else 0.0)
    assert fractions == [0.0, 0.0]
    with pytest.raises(ValueError, match="integers"):
        discrete_laplace_mechanism(np.array([0.5]), 1, 1.0, rng)


def test_discrete_laplace_refuses_epsilon_outside_its_range() -> None:
    low, high = DISCRETE_EPSILON_RANGE
    rng = np.random.default_rng(0)
    for epsilon in (low / 2, high * 2, 1e-17, 1e6):
        with pytest.raises(EpsilonOutOfRange):
            discrete_laplace_mechanism(np.zeros(1, dtype=np.int64), 1, epsilon, rng)
    with pytest.raises(ValueError, match="sensitivity"):
        discrete_laplace_mechanism(np.zeros(1, dtype=np.int64), 0, 1.0, rng)


def test_discrete_gaussian_has_its_pmf_and_its_delta_is_the_hockey_stick() -> None:
    sigma, n = 2.0, 4000
    rng = np.random.default_rng(11)
    out = discrete_gaussian_mechanism(np.zeros(n, dtype=np.int64), sigma, rng)
    assert out.dtype == np.int64
    support = np.arange(-60, 61)
    pmf = np.exp(-support.astype(float) ** 2 / (2 * sigma**2))
    pmf /= pmf.sum()
    # Goodness of fit on the central outputs (chi-square, fixed seed).
    central = np.abs(support) <= 5
    observed = np.array([(out == k).sum() for k in support[central]] + [int((np.abs(out) > 5).sum())])
    expected = n * np.append(pmf[central], pmf[~central].sum())
    assert stats.chisquare(observed, expected).pvalue > 1e-4
    # Independent check of the exact delta: the hockey-stick divergence between
    # N_Z(0, s^2) and N_Z(1, s^2), summed over the support.
    epsilon = 1.0
    shifted = np.exp(-(support.astype(float) - 1) ** 2 / (2 * sigma**2)) / np.exp(-support.astype(float) ** 2 / (2 * sigma**2)).sum()
    hockey = float(np.maximum(pmf - math.exp(epsilon) * shifted, 0).sum())
    assert discrete_gaussian_delta(sigma, 1, epsilon) == pytest.approx(hockey, rel=1e-9)
    found = discrete_gaussian_sigma(1, epsilon, 1e-5)
    assert discrete_gaussian_delta(found, 1, epsilon) <= 1e-5 < discrete_gaussian_delta(found * 0.999, 1, epsilon)
