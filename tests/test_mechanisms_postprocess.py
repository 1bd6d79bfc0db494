"""Post-processing: valid outputs for every method, the defining property of
each, and lower error than the raw estimate on a skewed population."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from anonml.mechanisms import POSTPROCESS_METHODS, make_oracle, postprocess

finite_estimates = hnp.arrays(
    np.float64,
    st.integers(2, 20),
    elements=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=200, deadline=None)
@given(estimate=finite_estimates, n=st.integers(1, 10**6))
def test_outputs_are_valid_histograms(estimate: np.ndarray, n: int) -> None:
    for method in ("clip", "norm-sub", "project"):
        result = postprocess(estimate, n, method)
        assert result.shape == estimate.shape
        assert np.all(result >= 0)
        # Rounding scales with the largest input, not with n.
        assert result.sum() == pytest.approx(n, rel=1e-9, abs=1e-12 * np.abs(estimate).sum())


@settings(max_examples=200, deadline=None)
@given(estimate=finite_estimates, n=st.integers(1, 10**6))
def test_project_is_the_euclidean_projection(estimate: np.ndarray, n: int) -> None:
    # KKT conditions of min ||x - y||^2 s.t. x >= 0, sum x = n: there is a
    # theta with x_i = y_i - theta where x_i > 0 and y_i <= theta where x_i = 0.
    x = postprocess(estimate, n, "project")
    positive = x > 0
    theta = (estimate[positive] - x[positive]).mean()
    scale = max(1.0, np.abs(estimate).max(), n)
    assert np.allclose(estimate[positive] - x[positive], theta, atol=1e-9 * scale)
    assert np.all(estimate[~positive] <= theta + 1e-9 * scale)


def test_clip_is_the_thesis_rule() -> None:
    result = postprocess(np.array([-5.0, 10.0, 30.0, 0.0]), 100, "clip")
    np.testing.assert_allclose(result, [0.0, 25.0, 75.0, 0.0])


def test_norm_sub_shifts_only_the_positive_entries() -> None:
    # Positives sum to 60 < n = 100: each of the two positive entries gains 20
    # and the negative one stays at 0 (projection would raise it too).
    result = postprocess(np.array([-5.0, 10.0, 50.0]), 100, "norm-sub")
    np.testing.assert_allclose(result, [0.0, 30.0, 70.0])
    projected = postprocess(np.array([-5.0, 10.0, 50.0]), 100, "project")
    np.testing.assert_allclose(projected, [10.0, 25.0, 65.0])
    # Positives sum to more than n: shift down, dropping entries that cross 0.
    np.testing.assert_allclose(postprocess(np.array([90.0, 30.0, 4.0, -7.0]), 100, "norm-sub"), [80.0, 20.0, 0.0, 0.0])


def test_no_positive_entry_gives_the_uniform_histogram() -> None:
    for method in ("clip", "norm-sub"):
        np.testing.assert_allclose(postprocess(np.array([-1.0, -2.0, -3.0, -4.0]), 8, method), [2.0] * 4)


def _skewed_population(m: int, n: int) -> np.ndarray:
    counts = np.zeros(m, dtype=np.int64)
    counts[0], counts[1], counts[2] = int(0.85 * n), int(0.1 * n), n - int(0.85 * n) - int(0.1 * n)
    return np.repeat(np.arange(m), counts)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grr", "oue", "olh", "ss"])
def test_ibu_and_projection_reduce_error_on_a_skewed_population(name: str) -> None:
    m, n, repeats = 16, 4000, 8
    oracle = make_oracle(name, 1.0, m)
    values = _skewed_population(m, n)
    truth = np.bincount(values, minlength=m)
    rng = np.random.default_rng(17)
    errors: dict[str, list[float]] = {"raw": [], "project": [], "norm-sub": [], "ibu": [], "ibu-reports": []}
    for _ in range(repeats):
        reports = oracle.privatize(values, rng)
        estimate = oracle.estimate(reports)
        errors["raw"].append(float(((estimate - truth) ** 2).sum()))
        for method in ("project", "norm-sub", "ibu"):
            result = postprocess(estimate, n, method, oracle=oracle)
            assert np.all(result >= 0) and result.sum() == pytest.approx(n)
            errors[method].append(float(((result - truth) ** 2).sum()))
        from_reports = postprocess(estimate, n, "ibu", oracle=oracle, reports=reports)
        assert np.all(from_reports >= 0) and from_reports.sum() == pytest.approx(n)
        errors["ibu-reports"].append(float(((from_reports - truth) ** 2).sum()))
    mean = {method: np.mean(values_) for method, values_ in errors.items()}
    # Every consistent estimate has well under half the raw error here
    # (13 of the 16 true counts are 0).
    for method in ("project", "norm-sub", "ibu", "ibu-reports"):
        assert mean[method] < 0.5 * mean["raw"], (method, mean)


def test_ibu_on_grr_matches_report_level_em() -> None:
    # For GRR the aggregated support counts are a sufficient statistic, so
    # both IBU paths compute the same maximum-likelihood histogram.
    oracle = make_oracle("grr", 1.0, 6)
    values = _skewed_population(6, 3000)
    reports = oracle.privatize(values, np.random.default_rng(2))
    estimate = oracle.estimate(reports)
    aggregated = postprocess(estimate, 3000, "ibu", oracle=oracle)
    per_report = postprocess(estimate, 3000, "ibu", oracle=oracle, reports=reports)
    np.testing.assert_allclose(aggregated, per_report, atol=1e-3)


def test_bad_arguments_are_rejected() -> None:
    oracle = make_oracle("grr", 1.0, 4)
    with pytest.raises(ValueError, match="method"):
        postprocess(np.zeros(4), 10, "round")
    with pytest.raises(ValueError, match="oracle"):
        postprocess(np.zeros(4), 10, "ibu")
    with pytest.raises(ValueError, match="length m"):
        postprocess(np.zeros(5), 10, "ibu", oracle=oracle)
    with pytest.raises(ValueError, match="estimate"):
        postprocess(np.array([1.0, np.nan]), 10)
    with pytest.raises(ValueError, match="estimate"):
        postprocess(np.zeros((2, 2)), 10)
    with pytest.raises(ValueError, match="n must"):
        postprocess(np.zeros(4), 0)
    with pytest.raises(ValueError, match="not consistent"):
        postprocess(np.array([-100.0, 0.0, 0.0, 0.0]), 10, "ibu", oracle=oracle)
    assert set(POSTPROCESS_METHODS) == {"clip", "norm-sub", "project", "ibu"}
