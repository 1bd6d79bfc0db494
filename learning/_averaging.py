"""DP averaging of locally trained models (seed 003, §3.2.1 and Algorithm 1,
after Pathak, Rane and Raj and Chaudhuri and Monteleoni): each peer holding
many rows trains an L2-regularised logistic regression on them, releases it
with output perturbation calibrated to its sensitivity, and the aggregator
averages the released models.

The sensitivity bound (003 eq. 3.10, Chaudhuri, Monteleoni and Sarwate,
JMLR 2011, Corollary 8) holds under these assumptions, each enforced by the
peer itself (:func:`local_model`):

- the objective is ``F(w) = (1/n) sum_i l(y_i w'x_i) + (λ/2)||w||^2`` with
  ``l`` convex and 1-Lipschitz (the logistic loss: ``|l'| <= 1``) and
  ``λ > 0`` on every coordinate (the intercept too);
- ``||x_i||_2 <= 1``: the peer divides its rows by the encoding's public
  norm bound and projects any row still longer onto the unit ball;
- neighbouring slices differ in one row and have the same ``n``; the bound
  is computed at the public minimum ``n_rows`` and a peer holding fewer
  rows refuses to release (``2/(nλ)`` only shrinks as ``n`` grows);
- the released model is the exact minimiser. A numerical one is not; with
  ``||∇F(ŵ)|| <= g`` strong convexity gives ``||ŵ - w*|| <= g/λ``, so the
  bound used is ``2/(nλ) + 2g/λ`` and the solver refuses to release unless
  it reached ``g``.

Noise (Chaudhuri et al. 2011, Algorithm 1): a vector with density
``∝ exp(-ε ||b||_2 / Δ2)``, drawn as a norm ``~ Gamma(d, Δ2/ε)`` in a
uniform direction, which is ε-DP for an L2 sensitivity ``Δ2`` (the density
ratio at two points ``Δ2`` apart is at most ``e^ε`` by the triangle
inequality). 003's Algorithm 1 instead adds Laplace noise of scale
``2/(n ε λ)`` to each coordinate, which is ε-DP only for an L1 bound of
``2/(nλ)`` and so is ``sqrt(d) ε``-DP here; calibrated to the L1 bound
``sqrt(d) Δ2`` it has ``2d/(d+1)`` times the variance per coordinate of
the Gamma-norm noise (1.86 at Adult's d = 13).

No floating-point noise touches the secret: the model is rounded to a
public grid (integer steps), and the continuous noise, drawn independently
of the model, is rounded to integer steps before it is added, so the
release is ``steps + rint(b)`` in exact integer arithmetic. This is ε-DP
for integer inputs whose L2 distance is at most the integer sensitivity
``Δint`` (``Δ2`` in steps plus ``sqrt(d)`` for rounding both models):
``P[rint(b) = z]`` integrates the density over a unit cell, and the cell of
``z + s`` is the cell of ``z`` shifted by ``s``, so the pointwise ratio
``e^(ε ||s|| / Δint) <= e^ε`` bounds the ratio of the integrals. What is
not exact is numpy's Gamma and normal samplers themselves (their far tails
are those of floating-point algorithms), unlike the exactly sampled
discrete Laplace of :mod:`anonml.mechanisms`.

Privacy: each peer releases one model at ε; by parallel composition over
disjoint slices every row's record-level ε is that ε.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from anonml.base.errors import AnonMLError
from anonml.learning._vocabulary import AVERAGING_RULE
from anonml.mechanisms import Release, ReleaseKind, ledgers_of_one_release

FloatArray = npt.NDArray[np.float64]

# The released model's coordinates are rounded to multiples of
# l2_sensitivity / (GRID_STEPS sqrt(d)): rounding both neighbours adds
# sqrt(d) steps to the GRID_STEPS sqrt(d) of the sensitivity, i.e. 1/64 more noise.
GRID_STEPS = 64
# The fewest rows a peer may hold (seed 003's peers hold many rows; the
# bound 2/(nλ) is useless at a handful).
MIN_ROWS_PER_PEER = 100
# The solver must reach ||∇F|| <= this / n; it adds 1e-6 of the bound itself.
GRADIENT_TOLERANCE = 1e-6
_MAX_NEWTON_STEPS = 100
# Relative rounding error of the objective (a mean of n terms in float64).
_PRECISION = 1e-12
# The integer sensitivity is rounded up by this relative margin so that the
# float arithmetic computing it can never understate it.
_SENSITIVITY_MARGIN = 1e-9


class NotConverged(AnonMLError, RuntimeError):
    """Raised by :func:`fit_regularized_logistic` when Newton's method does
    not reach the gradient tolerance the sensitivity bound assumes (the
    model is then not released)."""


class TooFewRows(AnonMLError, ValueError):
    """Raised by :func:`local_model` when a peer holds fewer rows than the
    public minimum its noise is calibrated to (its sensitivity would exceed
    the bound)."""


def unit_ball_rows(X: npt.ArrayLike, norm_bound: float) -> FloatArray:
    """Rows divided by the public ``norm_bound``, then any row still longer
    than 1 projected onto the unit ball (``||x|| <= 1`` enforced)."""
    if not norm_bound > 0:
        raise ValueError(f"norm_bound must be > 0, got {norm_bound!r}")
    scaled = np.asarray(X, dtype=np.float64) / norm_bound
    norms = np.linalg.norm(scaled, axis=1)
    projected: FloatArray = scaled / np.maximum(norms, 1.0)[:, None]
    return projected


def _objective(w: FloatArray, X: FloatArray, y: FloatArray, lam: float) -> float:
    return float(np.mean(np.logaddexp(0.0, -y * (X @ w))) + 0.5 * lam * (w @ w))


def fit_regularized_logistic(X: FloatArray, y: FloatArray, regularization: float, tolerance: float) -> FloatArray:
    """The minimiser of ``(1/n) sum log(1 + exp(-y_i w'x_i)) + (λ/2)||w||^2``
    by Newton's method with backtracking, to ``||∇F|| <= tolerance``
    (:class:`NotConverged` otherwise)."""
    n, d = X.shape
    w = np.zeros(d)
    for _ in range(_MAX_NEWTON_STEPS):
        margin = y * (X @ w)
        sigma = 0.5 * (1 - np.tanh(0.5 * margin))  # σ(-margin)
        gradient = -(X.T @ (y * sigma)) / n + regularization * w
        if np.linalg.norm(gradient) <= tolerance:
            return w
        hessian = (X.T * (sigma * (1 - sigma))) @ X / n + regularization * np.eye(d)
        direction = np.linalg.solve(hessian, -gradient)
        step, current = 1.0, _objective(w, X, y, regularization)
        # Near the minimiser the predicted decrease falls below the
        # objective's rounding error and the Armijo test compares rounding
        # noise: the full Newton step is taken there (quadratic convergence),
        # else backtracking (measured: 3,000-row slices stalled at ||∇F|| ~ 1e-9).
        if -(gradient @ direction) > _PRECISION * max(1.0, abs(current)):
            while _objective(w + step * direction, X, y, regularization) > current + 1e-4 * step * (gradient @ direction) and step > 1e-10:
                step /= 2
        w = w + step * direction
    raise NotConverged(f"Newton's method did not reach ||grad|| <= {tolerance!r} in {_MAX_NEWTON_STEPS} steps")


@dataclass(frozen=True)
class OutputPerturbation:
    """The noise one peer adds to its model (see the module docstring):
    every figure is a function of public parameters only. ``n_rows`` is the
    public minimum a peer must hold (at least ``MIN_ROWS_PER_PEER``)."""

    epsilon: float
    n_rows: int
    regularization: float
    dimension: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be finite and > 0, got {self.epsilon!r}")
        if isinstance(self.n_rows, bool) or not isinstance(self.n_rows, int) or self.n_rows < MIN_ROWS_PER_PEER:
            raise ValueError(f"rows_per_peer must be an integer >= {MIN_ROWS_PER_PEER}, got {self.n_rows!r}")
        if not (math.isfinite(self.regularization) and self.regularization > 0):
            raise ValueError(f"regularization must be finite and > 0 (the bound needs strong convexity), got {self.regularization!r}")
        if isinstance(self.dimension, bool) or not isinstance(self.dimension, int) or self.dimension < 1:
            raise ValueError(f"dimension must be a positive integer, got {self.dimension!r}")

    @property
    def gradient_tolerance(self) -> float:
        return GRADIENT_TOLERANCE / self.n_rows

    @property
    def l2_sensitivity(self) -> float:
        """``2/(nλ)`` (003 eq. 3.10) plus ``2g/λ`` for the solver's tolerance g."""
        return 2.0 / (self.n_rows * self.regularization) + 2.0 * self.gradient_tolerance / self.regularization

    @property
    def grid(self) -> float:
        return self.l2_sensitivity / (GRID_STEPS * math.sqrt(self.dimension))

    @property
    def integer_sensitivity(self) -> float:
        """The L2 sensitivity of the rounded model, in grid steps:
        ``Δ2/grid + sqrt(d)`` (each coordinate of either model moves by at
        most half a step), rounded up by a relative 1e-9."""
        return (self.l2_sensitivity / self.grid + math.sqrt(self.dimension)) * (1 + _SENSITIVITY_MARGIN)

    @property
    def noise_norm_scale(self) -> float:
        """The Gamma scale of the noise's norm in model units,
        ``integer_sensitivity · grid / ε`` (about ``2/(nλε)``): the norm has
        mean ``d`` times this and each coordinate variance ``(d+1)`` times its square."""
        return self.integer_sensitivity * self.grid / self.epsilon

    def noise_steps(self, count: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
        """``count`` noise vectors in grid steps: a ``Gamma(d, Δint/ε)``
        norm in a uniform direction, each coordinate rounded to an integer.
        Drawn without reading any model."""
        direction = rng.standard_normal((count, self.dimension))
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        norms = rng.gamma(self.dimension, self.integer_sensitivity / self.epsilon, size=(count, 1))
        steps: npt.NDArray[np.int64] = np.rint(direction * norms).astype(np.int64)
        return steps

    def release_steps(self, model: npt.ArrayLike, rng: np.random.Generator) -> npt.NDArray[np.int64]:
        """The model (or a stack of models, one per row) rounded to the grid
        plus integer noise, added in integer arithmetic: the release, in grid steps."""
        steps = np.rint(np.asarray(model, dtype=np.float64) / self.grid).astype(np.int64)
        if steps.shape[-1] != self.dimension:
            raise ValueError(f"the model has {steps.shape[-1]} coordinates, the mechanism {self.dimension}")
        noisy: npt.NDArray[np.int64] = steps + self.noise_steps(int(np.prod(steps.shape[:-1], dtype=np.int64)), rng).reshape(steps.shape)
        return noisy

    def release(self, model: npt.ArrayLike, rng: np.random.Generator) -> FloatArray:
        """:meth:`release_steps` in model units."""
        released: FloatArray = self.release_steps(model, rng).astype(np.float64) * self.grid
        return released


def local_model(X: npt.ArrayLike, y: npt.ArrayLike, mechanism: OutputPerturbation, norm_bound: float) -> FloatArray:
    """What one peer computes before it releases (``mechanism.release``):
    refuses a slice of fewer rows than ``mechanism.n_rows``
    (:class:`TooFewRows`), clips its rows into the unit ball
    (:func:`unit_ball_rows` with the public ``norm_bound``) and fits the
    regularised logistic regression to the tolerance the bound assumes."""
    matrix = np.asarray(X, dtype=np.float64)
    target = np.asarray(y, dtype=np.float64)
    if matrix.ndim != 2 or target.shape != (matrix.shape[0],):
        raise ValueError(f"X must be (n, d) and y (n,), got {matrix.shape!r} and {target.shape!r}")
    if matrix.shape[1] != mechanism.dimension:
        raise ValueError(f"X has {matrix.shape[1]} columns, the mechanism {mechanism.dimension}")
    if matrix.shape[0] < mechanism.n_rows:
        raise TooFewRows(f"a peer with {matrix.shape[0]} rows may not release: its noise is calibrated to at least {mechanism.n_rows}")
    if not np.all(np.isin(target, (-1.0, 1.0))):
        raise ValueError("labels must be -1 or 1")
    return fit_regularized_logistic(unit_ball_rows(matrix, norm_bound), target, mechanism.regularization, mechanism.gradient_tolerance)


class ModelAveraging:
    """Peers with ``rows_per_peer`` rows or more each release an
    output-perturbed local model; the aggregator averages them.

    Parameters: ``epsilon`` (each peer's one release; every row's
    record-level ε), ``rows_per_peer`` (at least ``MIN_ROWS_PER_PEER``: the
    slice size; the rows are dealt at random into ``n // rows_per_peer``
    slices), ``regularization`` λ (None: ``AVERAGING_RULE / (rows_per_peer ε)``,
    which keeps the noise's norm scale at ``2 / AVERAGING_RULE`` model
    units whatever n and ε; ``anonml experiment`` chooses the rule on a
    validation split, see learning/_tuning.py) and ``random_state``.
    ``fit`` takes the encoded rows, the public ``norm_bound`` every peer
    divides them by (rows still longer are clipped) and labels in {-1, 1}.

    Learned: ``coef_`` (the average, over unit-ball rows: score rows with
    :func:`unit_ball_rows` and the same bound), ``noise_free_coef_`` (the
    average of the unperturbed local models: an experiment's diagnostic),
    ``peer_rows_`` (each slice's size), ``perturbation_`` (every peer's
    :class:`OutputPerturbation`), ``ledgers_`` (one per peer, one model
    release each).
    """

    def __init__(self, *, epsilon: float = 1.0, rows_per_peer: int = MIN_ROWS_PER_PEER, regularization: float | None = None,
                 random_state: int | None = None) -> None:
        self.epsilon = epsilon
        self.rows_per_peer = rows_per_peer
        self.regularization = regularization
        self.random_state = random_state

    def fit(self, X: npt.ArrayLike, y: npt.ArrayLike, *, norm_bound: float = 1.0, features: tuple[str, ...] = ("x",)) -> ModelAveraging:
        matrix = np.asarray(X, dtype=np.float64)
        if matrix.ndim != 2:
            raise ValueError(f"X must be (n, d), got {matrix.shape!r}")
        lam = AVERAGING_RULE / (self.rows_per_peer * self.epsilon) if self.regularization is None else self.regularization
        # Every slice holds rows_per_peer rows or one more; the bound uses
        # rows_per_peer (2/(nλ) only shrinks with n, so a slice one row
        # larger is still covered), which gives every peer the same public mechanism.
        mechanism = OutputPerturbation(self.epsilon, self.rows_per_peer, float(lam), matrix.shape[1])
        n = matrix.shape[0]
        if n < self.rows_per_peer:
            raise TooFewRows(f"need at least rows_per_peer={self.rows_per_peer} rows, got {n}")
        rng = np.random.default_rng(self.random_state)
        slices = np.array_split(rng.permutation(n), n // self.rows_per_peer)
        target = np.asarray(y, dtype=np.float64)
        if target.shape != (n,):
            raise ValueError(f"y must be ({n},), got {target.shape!r}")
        local = np.array([local_model(matrix[rows], target[rows], mechanism, norm_bound) for rows in slices])
        models = np.array([mechanism.release(model, rng) for model in local])
        ledgers = ledgers_of_one_release(Release.about(ReleaseKind.MODEL, features, self.epsilon), len(slices), self.epsilon)
        # Equal weights: every peer's noise has the same public scale, so
        # the plain mean has the least noise variance of any weighting.
        self.coef_ = np.mean(models, axis=0)
        # A diagnostic of the in-process experiment, never released: the
        # average the peers' models would have without noise (it separates
        # the regularisation's bias from the noise's harm).
        self.noise_free_coef_ = local.mean(axis=0)
        self.regularization_ = lam
        self.peer_rows_ = [int(rows.size) for rows in slices]
        self.perturbation_ = mechanism
        self.ledgers_ = ledgers
        return self

    def decision_function(self, X: npt.ArrayLike) -> FloatArray:
        if not hasattr(self, "coef_"):
            raise RuntimeError("ModelAveraging is not fitted; call fit first")
        scores: FloatArray = np.asarray(X, dtype=np.float64) @ self.coef_
        return scores
