"""DP averaging of local models (learning/_averaging.py): the sensitivity
bound's assumptions enforced by each peer (a minimum row count, rows
clipped into the unit ball) and the noise drawn with Chaudhuri et al.'s
Gamma-norm law at the scale its formula gives."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anonml.learning import (
    MIN_ROWS_PER_PEER,
    ModelAveraging,
    OutputPerturbation,
    TooFewRows,
    fit_regularized_logistic,
    local_model,
    unit_ball_rows,
)
from anonml.learning._averaging import GRADIENT_TOLERANCE, GRID_STEPS


def _rows(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, d))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def test_noise_norm_and_variance_match_chaudhuris_formula() -> None:
    """Chaudhuri et al.'s output perturbation: the noise's norm is
    Gamma(d, Δ/ε) with Δ = 2/(nλ) (plus the solver's 2g/λ and the grid's
    1/GRID_STEPS), in a uniform direction; so its mean norm is dΔ/ε and each
    coordinate's variance (d+1)Δ²/ε². 003's per-coordinate Laplace at the
    L1 bound sqrt(d)Δ has mean norm ~1.4 dΔ/ε and fails this."""
    n, lam, d, epsilon, draws = 100, 0.05, 13, 1.0, 4_000
    mechanism = OutputPerturbation(epsilon=epsilon, n_rows=n, regularization=lam, dimension=d)
    delta = (2 / (n * lam) + 2 * GRADIENT_TOLERANCE / (n * lam)) * (1 + 1 / GRID_STEPS)
    scale = delta / epsilon
    noise = mechanism.release(np.zeros((draws, d)), np.random.default_rng(7))
    norms = np.linalg.norm(noise, axis=1)
    # Rounding each coordinate to the grid moves a norm by at most sqrt(d)/2 steps.
    rounding = math.sqrt(d) / 2 * mechanism.grid
    # The mean of `draws` Gamma(d, scale) norms has sd sqrt(d) scale / sqrt(draws); 4 sd.
    assert abs(norms.mean() - d * scale) <= 4 * math.sqrt(d) * scale / math.sqrt(draws) + rounding
    # Each coordinate: variance (d+1) scale^2; 52,000 values, the estimate's sd is ~1% here.
    assert np.var(noise) == pytest.approx((d + 1) * scale**2, rel=0.05)
    # Uniform direction: the mean vector is within 4 sd of zero on every coordinate.
    assert np.all(np.abs(noise.mean(axis=0)) <= 4 * math.sqrt((d + 1) * scale**2 / draws))
    assert mechanism.noise_norm_scale == pytest.approx(scale, rel=1e-8)


def test_release_adds_integer_noise_to_the_rounded_model() -> None:
    """No floating-point noise on the secret: the release is an integer
    number of grid steps, the model's rounding plus noise drawn without it."""
    mechanism = OutputPerturbation(epsilon=1.0, n_rows=100, regularization=0.05, dimension=5)
    model = np.linspace(-1, 1, 5)
    released = mechanism.release(model, np.random.default_rng(3))
    steps = released / mechanism.grid
    assert np.allclose(steps, np.rint(steps), atol=1e-6)
    noise = mechanism.noise_steps(1, np.random.default_rng(3))[0]
    assert np.array_equal(np.rint(steps).astype(np.int64), np.rint(model / mechanism.grid).astype(np.int64) + noise)


def test_a_peer_with_fewer_rows_than_the_minimum_is_refused() -> None:
    X, y = _rows(MIN_ROWS_PER_PEER, 4, 1)
    mechanism = OutputPerturbation(epsilon=1.0, n_rows=MIN_ROWS_PER_PEER, regularization=0.05, dimension=4)
    with pytest.raises(TooFewRows, match="99 rows"):
        local_model(X[:-1], y[:-1], mechanism, norm_bound=2.0)
    assert local_model(X, y, mechanism, norm_bound=2.0).shape == (4,)
    # The public minimum itself may not be set below MIN_ROWS_PER_PEER.
    with pytest.raises(ValueError, match="rows_per_peer"):
        OutputPerturbation(epsilon=1.0, n_rows=MIN_ROWS_PER_PEER - 1, regularization=0.05, dimension=4)
    with pytest.raises(ValueError, match="rows_per_peer"):
        ModelAveraging(epsilon=1.0, rows_per_peer=50).fit(np.zeros((200, 2)), np.ones(200))
    with pytest.raises(ValueError, match="regularization"):
        OutputPerturbation(epsilon=1.0, n_rows=100, regularization=0.0, dimension=4)


def test_rows_longer_than_the_bound_are_clipped_so_the_sensitivity_holds() -> None:
    """A replaced row far outside the public norm bound moves the local model
    by no more than the stated sensitivity, because the peer clips it (the
    old fit refused such rows outright, leaving clipping to the caller)."""
    X, y = _rows(100, 5, 42)
    mechanism = OutputPerturbation(epsilon=1.0, n_rows=100, regularization=0.05, dimension=5)
    bound = math.sqrt(5)
    base = local_model(X, y, mechanism, norm_bound=bound)
    for row in range(5):
        X2, y2 = X.copy(), y.copy()
        X2[row], y2[row] = -50.0 * X[row], -y[row]  # far outside the bound, label flipped
        other = local_model(X2, y2, mechanism, norm_bound=bound)
        assert np.linalg.norm(other - base) <= mechanism.l2_sensitivity
        clipped = fit_regularized_logistic(unit_ball_rows(X2, bound), y2, 0.05, mechanism.gradient_tolerance)
        assert np.allclose(other, clipped)
    model = ModelAveraging(epsilon=1.0, rows_per_peer=100, regularization=0.05, random_state=0).fit(50.0 * X, y, norm_bound=bound)
    assert model.ledgers_[0].spent() == 1.0 and model.coef_.shape == (5,)


def test_the_categorical_weight_scales_only_categorical_columns() -> None:
    """The weight is a public map of each row: Adult's 7 two-bin categorical
    features are its only weighted columns, and a table without categorical
    features gives the same released model whatever the weight."""
    import dataclasses

    from anonml.learning import EncodedSplit, LearnerName, LinearSettings, adult_spec, linear_encoding, linear_trial
    from anonml.learning._tables import load_builtin

    mask = linear_encoding(LinearSettings(), adult_spec()).categorical_columns
    assert mask.shape == (13,) and int(mask.sum()) == 7 and not mask[0]
    spec, train, test = load_builtin("breast-cancer", data_dir=None, test_fraction=0.3, rng=np.random.default_rng(5))
    split = EncodedSplit.of(linear_encoding(LinearSettings(), spec), train, test)
    assert not split.categorical.any()
    plain = LinearSettings(averaging_categorical_weight=1.0)
    outcomes = [linear_trial(LearnerName.AVERAGING, split, 4.0, 11, dataclasses.replace(plain, averaging_categorical_weight=w)) for w in (1.0, 0.35)]
    assert outcomes[0]["auc"] == outcomes[1]["auc"] and outcomes[0]["noise_free_auc"] == outcomes[1]["noise_free_auc"]
