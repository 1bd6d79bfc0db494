"""DP averaging of locally trained models (seed 003, §3.2.1 and Algorithm 1,
after Pathak, Rane and Raj and Chaudhuri and Monteleoni): each peer holding
many rows trains an L2-regularised logistic regression on them, releases it
with output perturbation calibrated to its sensitivity, and the aggregator
averages the released models.

The sensitivity bound (003 eq. 3.10, Chaudhuri, Monteleoni and Sarwate,
JMLR 2011, Corollary 8) holds under these assumptions, each enforced here:

- the objective is ``F(w) = (1/n) sum_i l(y_i w'x_i) + (λ/2)||w||^2`` with
  ``l`` convex and 1-Lipschitz (the logistic loss: ``|l'| <= 1``) and
  ``λ > 0`` on every coordinate (the intercept too);
- ``||x_i||_2 <= 1``: rows are divided by the encoding's public norm bound
  and any row still longer is projected onto the unit ball;
- neighbouring slices differ in one row and have the same ``n``; the bound
  is computed at the public ``rows_per_peer``, at most any slice's ``n``
  (``2/(nλ)`` only shrinks as ``n`` grows);
- the released model is the exact minimiser. A numerical one is not; with
  ``||∇F(ŵ)|| <= g`` strong convexity gives ``||ŵ - w*|| <= g/λ``, so the
  bound used is ``2/(nλ) + 2g/λ`` and the solver refuses to release unless
  it reached ``g``.

Noise: 003 (Algorithm 1) adds Laplace noise of scale ``2/(n ε λ)`` to each
coordinate, but ``2/(nλ)`` bounds the L2 norm of a change, and per-coordinate
Laplace noise is ε-DP only for an L1 bound: with 003's scale the release is
``sqrt(d) ε``-DP, not ε-DP. Here the coordinate-wise Laplace mechanism of
003 is kept but calibrated to the L1 bound ``sqrt(d)`` times the L2 one, and
drawn as exact integer noise (:func:`discrete_laplace_mechanism`) on the
model rounded to a public grid (rounding moves each coordinate by at most
half a grid step, so the integer L1 sensitivity grows by at most ``d``). In
d dimensions this noise has ``sqrt(2d/(d+1))`` times the per-coordinate
standard deviation of Chaudhuri et al.'s Gamma-norm mechanism, which would
need floating-point noise on the secret model.

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
from anonml.mechanisms import PrivacyLedger, Release, ReleaseKind, discrete_laplace_epsilon, discrete_laplace_mechanism

FloatArray = npt.NDArray[np.float64]

# The released model's coordinates are rounded to multiples of
# l2_sensitivity / (GRID_STEPS sqrt(d)): fine enough that rounding adds 1/64
# to the noise (d extra grid steps against 64 d for the sensitivity itself).
GRID_STEPS = 64
# The solver must reach ||∇F|| <= this / n; it adds 1e-6 of the bound itself.
GRADIENT_TOLERANCE = 1e-6
_MAX_NEWTON_STEPS = 100
# Relative rounding error of the objective (a mean of n terms in float64).
_PRECISION = 1e-12


class NotConverged(AnonMLError, RuntimeError):
    """Raised by :func:`fit_regularized_logistic` when Newton's method does
    not reach the gradient tolerance the sensitivity bound assumes (the
    model is then not released)."""


def unit_ball_rows(X: npt.ArrayLike, norm_bound: float) -> FloatArray:
    """Rows divided by the public ``norm_bound``, then any row still longer
    than 1 projected onto the unit ball (``||x|| <= 1`` enforced)."""
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
    every figure is a function of public parameters only."""

    epsilon: float
    n_rows: int
    regularization: float
    dimension: int

    @property
    def gradient_tolerance(self) -> float:
        return GRADIENT_TOLERANCE / self.n_rows

    @property
    def l2_sensitivity(self) -> float:
        """``2/(nλ)`` (003 eq. 3.10) plus ``2g/λ`` for the solver's tolerance g."""
        return 2.0 / (self.n_rows * self.regularization) + 2.0 * self.gradient_tolerance / self.regularization

    @property
    def l1_sensitivity(self) -> float:
        return math.sqrt(self.dimension) * self.l2_sensitivity

    @property
    def grid(self) -> float:
        return self.l2_sensitivity / (GRID_STEPS * math.sqrt(self.dimension))

    @property
    def integer_sensitivity(self) -> int:
        """The L1 sensitivity of the rounded model, in grid steps."""
        return math.ceil(self.l1_sensitivity / self.grid) + self.dimension

    @property
    def noise_scale(self) -> float:
        """The Laplace scale per coordinate in model units:
        ``integer_sensitivity · grid / ε'`` (ε' is ε rounded down to 2^-32)."""
        return self.integer_sensitivity * self.grid / float(discrete_laplace_epsilon(self.epsilon))

    def release(self, model: FloatArray, rng: np.random.Generator) -> FloatArray:
        """The model rounded to the grid plus exact discrete Laplace noise."""
        steps = np.rint(np.asarray(model, dtype=np.float64) / self.grid).astype(np.int64)
        noisy = discrete_laplace_mechanism(steps, self.integer_sensitivity, self.epsilon, rng)
        released: FloatArray = noisy.astype(np.float64) * self.grid
        return released


class ModelAveraging:
    """Peers with ``rows_per_peer`` rows or more each release an
    output-perturbed local model; the aggregator averages them.

    Parameters: ``epsilon`` (each peer's one release; every row's
    record-level ε), ``rows_per_peer`` (at least 100: the slice size; the
    rows are dealt at random into ``n // rows_per_peer`` slices),
    ``regularization`` λ (None: ``AVERAGING_RULE / (rows_per_peer ε)``,
    which keeps the noise scale at ``2 sqrt(d) / AVERAGING_RULE``
    model units whatever n and ε; ``anonml experiment`` chooses the rule
    on a validation split, see learning/_tuning.py) and
    ``random_state``. ``fit`` takes rows already in
    the unit ball (:func:`unit_ball_rows`) and labels in {-1, 1}.

    Learned: ``coef_`` (the average), ``noise_free_coef_`` (the average of
    the unperturbed local models: an experiment's diagnostic), ``peer_rows_`` (each slice's size),
    ``perturbations_`` (each peer's :class:`OutputPerturbation`),
    ``ledgers_`` (one per peer, one model release each).
    """

    def __init__(self, *, epsilon: float = 1.0, rows_per_peer: int = 100, regularization: float | None = None, random_state: int | None = None) -> None:
        self.epsilon = epsilon
        self.rows_per_peer = rows_per_peer
        self.regularization = regularization
        self.random_state = random_state

    def fit(self, X: npt.ArrayLike, y: npt.ArrayLike, *, features: tuple[str, ...] = ("x",)) -> ModelAveraging:
        matrix = np.asarray(X, dtype=np.float64)
        target = np.asarray(y, dtype=np.float64)
        if matrix.ndim != 2 or target.shape != (matrix.shape[0],):
            raise ValueError(f"X must be (n, d) and y (n,), got {matrix.shape!r} and {target.shape!r}")
        if np.any(np.linalg.norm(matrix, axis=1) > 1 + 1e-12):
            raise ValueError("rows must lie in the unit ball (the sensitivity bound assumes ||x|| <= 1); see unit_ball_rows")
        if not np.all(np.isin(target, (-1.0, 1.0))):
            raise ValueError("labels must be -1 or 1")
        if isinstance(self.rows_per_peer, bool) or not isinstance(self.rows_per_peer, int) or self.rows_per_peer < 100:
            raise ValueError(f"rows_per_peer must be an integer >= 100, got {self.rows_per_peer!r}")
        lam = AVERAGING_RULE / (self.rows_per_peer * self.epsilon) if self.regularization is None else self.regularization
        if not lam > 0:
            raise ValueError(f"regularization must be > 0 (the bound needs strong convexity), got {lam!r}")
        n, d = matrix.shape
        if n < self.rows_per_peer:
            raise ValueError(f"need at least rows_per_peer={self.rows_per_peer} rows, got {n}")
        rng = np.random.default_rng(self.random_state)
        slices = np.array_split(rng.permutation(n), n // self.rows_per_peer)
        # Every slice holds rows_per_peer rows or one more; the bound uses
        # rows_per_peer (2/(nλ) only shrinks with n, so a slice one row
        # larger is still covered), which gives every peer the same public
        # mechanism and lets the simulation draw all peers' noise at once.
        mechanism = OutputPerturbation(self.epsilon, self.rows_per_peer, float(lam), d)
        local = np.array([
            fit_regularized_logistic(matrix[rows], target[rows], mechanism.regularization, mechanism.gradient_tolerance) for rows in slices
        ])
        models = mechanism.release(local, rng)
        ledgers = []
        for _ in slices:
            ledger = PrivacyLedger(self.epsilon)
            ledger.record(Release.about(ReleaseKind.MODEL, features, self.epsilon))
            ledgers.append(ledger)
        perturbations = [mechanism] * len(slices)
        self.coef_ = np.mean(models, axis=0)
        # A diagnostic of the in-process experiment, never released: the
        # average the peers' models would have without noise (it separates
        # the regularisation's bias from the noise's harm).
        self.noise_free_coef_ = local.mean(axis=0)
        self.regularization_ = lam
        self.peer_rows_ = [int(rows.size) for rows in slices]
        self.perturbations_ = perturbations
        self.ledgers_ = ledgers
        return self

    def decision_function(self, X: npt.ArrayLike) -> FloatArray:
        if not hasattr(self, "coef_"):
            raise RuntimeError("ModelAveraging is not fitted; call fit first")
        scores: FloatArray = np.asarray(X, dtype=np.float64) @ self.coef_
        return scores
