"""Private quantiles (thesis Algorithm 1 generalised to q quantiles)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anonml.mechanisms import (
    EpsilonOutOfRange,
    QuantileSearch,
    comparison_epsilon_range,
    answer_is_greater,
    answers_are_greater,
    assign_quantiles,
    estimate_quantiles,
)


def _partitions(count: int, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    # Every partition holds the same evenly spread values on [0, 100], so the
    # fraction above any threshold is known exactly in every sub-round.
    return [rng.permutation(np.linspace(0.0, 100.0, size)) for _ in range(count)]


def test_binary_random_response_keeps_the_truth_with_the_stated_probability() -> None:
    epsilon, n = 1.3, 40_000
    rng = np.random.default_rng(1)
    keep = math.exp(epsilon) / (1 + math.exp(epsilon))
    above = answers_are_greater(np.full(n, 10.0), np.full(n, 5.0), epsilon, rng)
    below = answers_are_greater(np.full(n, 1.0), np.full(n, 5.0), epsilon, rng)
    sd = math.sqrt(keep * (1 - keep) / n)
    assert abs(above.mean() - keep) <= 4.5 * sd
    assert abs((1 - below.mean()) - keep) <= 4.5 * sd
    # The likelihood ratio of an answer between any two inputs is e^eps.
    assert keep / (1 - keep) == pytest.approx(math.exp(epsilon))

def test_an_epsilon_at_which_the_truth_is_certain_is_refused() -> None:
    # Before: at eps = 50 the keep probability rounded to exactly 1.0, so the
    # answer was the truth every time while eps = 50 was stated.
    rng = np.random.default_rng(1)
    low, high = comparison_epsilon_range()
    assert 20 < high < 23 and low < 1e-8
    for epsilon in (50.0, high * 1.01, 800.0, low / 2, 1e-17):
        with pytest.raises(EpsilonOutOfRange):
            answer_is_greater(3.0, 2.0, epsilon, rng)
        with pytest.raises(EpsilonOutOfRange):
            QuantileSearch(0.0, 1.0, epsilon)
    assert answer_is_greater(3.0, 2.0, high, rng) in (0, 1)


def test_without_noise_the_search_is_an_exact_bisection() -> None:
    # At eps = 22 (the top of the range) a flip has probability 2.8e-10 and
    # the margin is below 1e-6: each sub-round halves the distance bound,
    # ending within the last step.
    rounds = 14
    estimate = estimate_quantiles(_partitions(rounds, 4001, np.random.default_rng(0)), 0.0, 100.0, 22.0, (0.5,), np.random.default_rng(1))
    assert abs(estimate[0] - 50.0) <= 100.0 / 2 ** (rounds + 1)


@pytest.mark.parametrize(
    ("quantiles", "epsilon", "size"),
    [((0.5,), 1.0, 4000), ((0.1, 0.5, 0.9), 2.0, 6000), ((0.25, 0.75), 0.5, 20000)],
)
def test_noisy_search_converges_within_its_margin(quantiles: tuple[float, ...], epsilon: float, size: int) -> None:
    rounds = 12
    rng = np.random.default_rng(2024)
    estimates = estimate_quantiles(_partitions(rounds, size, rng), 0.0, 100.0, epsilon, quantiles, rng)
    # Bound: while the estimate's fraction above is further than B = margin +
    # 4.5 sd from the target, the search moves towards it (w.p. > 1 - 7e-6 per
    # step), so the distance stays <= B + step, ending <= B + last step.
    search = QuantileSearch(0.0, 100.0, epsilon, quantiles)
    group = size // len(quantiles)
    keep = math.exp(epsilon) / (1 + math.exp(epsilon))
    sd = math.sqrt(keep * (1 - keep)) / ((2 * keep - 1) * math.sqrt(group))
    bound = 100.0 * (search.margin_of_error(group) + 4.5 * sd) + 100.0 / 2 ** (rounds + 1)
    truth = 100.0 * np.asarray(quantiles)
    assert np.all(np.abs(estimates - truth) <= bound), (estimates, truth, bound)
    # And the bound is informative: far tighter than the range.
    assert bound < 15


def test_each_member_answers_exactly_one_quantile_drawn_uniformly() -> None:
    which = assign_quantiles(3000, 3, np.random.default_rng(5))
    assert which.shape == (3000,) and set(which.tolist()) == {0, 1, 2}
    # Each member draws on its own, as a round's peer does: counts are Binomial(3000, 1/3),
    # sd 25.8, so each lies within 4.5 sd of 1000.
    assert all(abs(count - 1000) <= 4.5 * math.sqrt(3000 * (1 / 3) * (2 / 3)) for count in np.bincount(which, minlength=3))
    search = QuantileSearch(0.0, 1.0, 1.0, (0.2, 0.8))
    rng = np.random.default_rng(6)
    members = rng.random(500)
    which = assign_quantiles(members.size, 2, rng)
    bits = answers_are_greater(members, search.thresholds()[which], 1.0, rng)
    assert bits.shape == members.shape  # one answer per member per sub-round
    search.update(bits, which)
    assert search.sub_rounds == 1


def test_margin_is_eq_7_2_for_binary_random_response() -> None:
    search = QuantileSearch(0.0, 1.0, 1.0)
    p = math.e / (1 + math.e)
    q = 1 - p
    expected = math.sqrt(q * (1 - q) + p * (1 - p)) / ((p - q) * math.sqrt(400))
    assert search.margin_of_error(400) == pytest.approx(expected)
    assert QuantileSearch(0.0, 1.0, 1.0, margin=2.0).margin_of_error(400) == pytest.approx(2 * expected)


def test_uncertain_answers_keep_the_estimate_and_missing_quantiles_keep_their_step() -> None:
    search = QuantileSearch(0.0, 8.0, 1.0, (0.5, 0.9))
    # Exactly half the answers say "greater" for quantile 0: debiased 0.5,
    # on target, so it stays; quantile 1 got no answers and is untouched.
    search.update(np.array([1, 0] * 50), np.zeros(100, dtype=np.int64))
    np.testing.assert_array_equal(search.estimates(), [4.0, 4.0])
    # All "greater" for quantile 1: move up by half the initial step (4 / 2).
    search.update(np.ones(100, dtype=np.int64), np.ones(100, dtype=np.int64))
    np.testing.assert_array_equal(search.estimates(), [4.0, 6.0])


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="low and high"):
        QuantileSearch(1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="quantiles"):
        QuantileSearch(0.0, 1.0, 1.0, (0.0,))
    with pytest.raises(ValueError, match="quantiles"):
        QuantileSearch(0.0, 1.0, 1.0, ())
    with pytest.raises(ValueError, match="epsilon"):
        QuantileSearch(0.0, 1.0, -1.0)
    with pytest.raises(ValueError, match="margin"):
        QuantileSearch(0.0, 1.0, 1.0, margin=math.nan)
    search = QuantileSearch(0.0, 1.0, 1.0, (0.3, 0.6))
    with pytest.raises(ValueError, match="which is required"):
        search.update(np.array([0, 1]))
    with pytest.raises(ValueError, match="bits"):
        search.update(np.array([0, 2]), np.array([0, 1]))
    with pytest.raises(ValueError, match="bits"):
        search.update(np.array([0.0, 1.0]), np.array([0, 1]))
    with pytest.raises(ValueError, match="which"):
        search.update(np.array([0, 1]), np.array([0, 2]))
    with pytest.raises(ValueError, match="which"):
        search.update(np.array([0, 1]), np.array([0]))
    with pytest.raises(ValueError, match="finite"):
        answers_are_greater(np.array([math.nan]), np.array([0.0]), 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="partition"):
        estimate_quantiles([np.zeros((2, 2))], 0.0, 1.0, 1.0, (0.5,), np.random.default_rng(0))
    assert search.sub_rounds == 0
