"""Linear models over a public encoding of a table: Harmony's LDP mini-batch
gradient descent (Nguyen et al. 2016, §4, Algorithm 4 without its random
projection) for logistic regression, linear SVM and linear regression, and
the non-private logistic regression they are measured against.

Privacy (record-level LDP): the peers are dealt, in a random order, into
disjoint groups, one group per gradient step, so every peer takes part in
exactly one step and releases exactly one perturbed gradient, at the full
``epsilon`` (Harmony §4.2 explains why one step at ε beats m steps at ε/m).
The gradient of the peer's loss at the current model is clipped to
``[-1, 1]^d`` (Algorithm 4, lines 8-9) and released with the 1-bit mechanism
with dimension sampling (Algorithm 2, :class:`OneBitMean`), which is ε-LDP
for any input in that cube (Lemma 1). The model each peer sees is public
(it depends only on earlier groups' releases), and the regulariser's
gradient ``λβ`` depends only on the model, so the aggregator adds it
without noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from anonml.learning._data import Table
from anonml.mechanisms import OneBitMean, PopulationLedgers, Release, ReleaseKind
from anonml.protocol import FeatureSpec, NumericFeature, SgdLoss

FloatArray = npt.NDArray[np.float64]


Loss = SgdLoss
"""Harmony §4.1's three losses: the names an SGD round signs (``[task] loss``) are the learners' own."""


# A numeric feature whose public bounds satisfy ``low >= 0`` and
# ``high - low >= LOG_SCALE_SPAN`` is encoded on a log scale (see LinearEncoding).
LOG_SCALE_SPAN = 1000.0


def wide_range_features(spec: FeatureSpec) -> frozenset[str]:
    """The numeric features of ``spec`` whose public range is non-negative
    and spans at least ``LOG_SCALE_SPAN`` units (amounts such as Adult's
    capital gain, 0 to 99,999): decided from the bounds alone."""
    return frozenset(
        f.name for f in spec.features if isinstance(f, NumericFeature) and f.low >= 0 and f.high - f.low >= LOG_SCALE_SPAN
    )


@dataclass(frozen=True)
class LinearEncoding:
    """A table as vectors in ``[-1, 1]^d`` from the public feature spec only
    (no statistic of the data): an intercept column of 1; each numeric
    feature clipped to its public bounds and mapped linearly onto [-1, 1]
    (Harmony §5.1), or for the features in ``log_scaled`` mapped by
    ``log(1 + v - low) / log(1 + high - low)`` onto [-1, 1]; each categorical
    feature with k bins as k - 1 attributes in {-1, 1}, the l-th bin a 1 on
    the l-th attribute and -1 on the others, the last bin -1 on all
    (Harmony §5.3's encoding).

    Why the log scale: a linear map of a public range that is generous by
    orders of magnitude puts almost every row at -1 and leaves the model a
    coefficient of ~16 to learn on that coordinate (Adult's capital gain in
    the non-private fit), which LDP gradient descent's few damped steps and
    model averaging's strong regularisation cannot reach (measured on
    Adult: noise-free gradient descent with 32 steps, γ0 = 1, AUC 0.858
    linear, 0.869 log). The map is a fixed function of each peer's own value
    and the public bounds, so privacy is unchanged."""

    spec: FeatureSpec
    log_scaled: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        numeric = {f.name for f in self.spec.features if isinstance(f, NumericFeature)}
        if not self.log_scaled <= numeric:
            raise ValueError(f"log_scaled names features that are not numeric features of the spec: {sorted(self.log_scaled - numeric)!r}")
        if any(f.low < 0 for f in self.spec.features if isinstance(f, NumericFeature) and f.name in self.log_scaled):
            raise ValueError("a log-scaled feature needs a lower bound >= 0")

    @property
    def dimension(self) -> int:
        return 1 + sum(1 if f.kind == "numeric" else f.n_bins - 1 for f in self.spec.features)

    @property
    def categorical_columns(self) -> npt.NDArray[np.bool_]:
        """Which of the ``dimension`` columns encode a categorical feature."""
        kinds = [False] + [kind for f in self.spec.features for kind in ([False] if f.kind == "numeric" else [True] * (f.n_bins - 1))]
        return np.array(kinds, dtype=np.bool_)

    @property
    def max_norm(self) -> float:
        """A public bound on ``||x||_2`` (every coordinate in [-1, 1])."""
        return math.sqrt(self.dimension)

    def transform(self, table: Table) -> FloatArray:
        """The ``(n, dimension)`` matrix of ``table``'s rows."""
        columns: list[FloatArray] = [np.ones((table.n_rows, 1))]
        for feature in self.spec.features:
            raw = table.column(feature.name)
            if isinstance(feature, NumericFeature):
                clipped, _ = feature.clip(raw)
                if feature.name in self.log_scaled:
                    unit = np.log1p(clipped - feature.low) / math.log1p(feature.high - feature.low)
                else:
                    unit = (clipped - feature.low) / (feature.high - feature.low)
                columns.append((2 * unit - 1)[:, None])
                continue
            bins = feature.bin(raw)
            block = -np.ones((table.n_rows, feature.n_bins - 1))
            named = bins < feature.n_bins - 1
            block[np.flatnonzero(named), bins[named]] = 1.0
            columns.append(block)
        return np.hstack(columns)

    def record(self, features: Mapping[str, float | str]) -> FloatArray:
        """One record's vector (length ``dimension``), as :meth:`transform` maps a row: what a peer computes
        from its own features alone."""
        missing = [f.name for f in self.spec.features if f.name not in features]
        if missing:
            raise ValueError(f"the record lacks the features {missing!r}")
        columns: dict[str, npt.NDArray[np.generic]] = {
            f.name: np.asarray([features[f.name]], dtype=np.float64 if isinstance(f, NumericFeature) else np.str_)
            for f in self.spec.features
        }
        row: FloatArray = self.transform(Table(columns, np.asarray([""], dtype=np.str_)))[0]
        return row

    def signed_labels(self, table: Table) -> FloatArray:
        """The label as -1 / +1 (Harmony's y for logistic regression and SVM)."""
        signed: FloatArray = 2.0 * self.spec.label.encode(table.labels).astype(np.float64) - 1.0
        return signed


def loss_gradients(loss: Loss | str, beta: FloatArray, X: FloatArray, y: FloatArray) -> FloatArray:
    """Each row's gradient of the unregularised ``loss`` at ``beta`` (shape of ``X``)."""
    margin = X @ beta
    kind = Loss(loss)
    if kind == Loss.LOGISTIC:
        # d/dβ log(1 + e^{-y x'β}) = -y x σ(-y x'β); tanh form avoids overflow.
        weight = -y * 0.5 * (1 - np.tanh(0.5 * y * margin))
    elif kind == Loss.HINGE:
        weight = np.where(y * margin < 1, -y, 0.0)
    else:
        weight = 2 * (margin - y)
    gradients: FloatArray = weight[:, None] * X
    return gradients


def harmony_group_size(n: int, d: int, epsilon: float) -> int:
    """Harmony §5.3's mini-batch size ``max(2 d log d / ε^2, n / 1000)``
    (at least 1; at most n: a single step)."""
    wanted = max(2 * d * math.log(max(d, 2)) / epsilon**2, n / 1000)
    return int(min(n, max(1, math.ceil(wanted))))


def clipped_gradients(loss: Loss | str, beta: FloatArray, X: FloatArray, y: FloatArray) -> FloatArray:
    """Each row's gradient clipped to ``[-1, 1]^d`` (Algorithm 4, lines 8-9): the input the 1-bit mechanism
    is ε-LDP for."""
    clipped: FloatArray = np.clip(loss_gradients(loss, beta, X, y), -1.0, 1.0)
    return clipped


def harmony_step(beta: FloatArray, noisy_mean: FloatArray, step: int, learning_rate: float, regularization: float) -> FloatArray:
    """Step ``step`` (from 1) of Algorithm 4: ``β - γ0 / sqrt(step) · (ḡ + λβ)``, where ``ḡ`` is the group's
    estimated mean gradient; the regulariser's gradient ``λβ`` depends only on the public model, so it is
    added without noise."""
    if step < 1:
        raise ValueError(f"step counts from 1, got {step!r}")
    stepped: FloatArray = beta - learning_rate / math.sqrt(step) * (noisy_mean + regularization * beta)
    return stepped


class LDPGradientDescent:
    """Harmony's LDP mini-batch gradient descent (see the module docstring).

    Parameters: ``loss`` (:class:`Loss`), ``epsilon`` (each peer's one
    release, hence its record-level ε), ``steps`` (gradient steps: the
    peers are dealt into that many groups; None: groups of
    :func:`harmony_group_size`), ``learning_rate`` γ0 with step k
    using ``γ0 / sqrt(k)`` (Algorithm 4, line 13), ``regularization`` λ,
    ``average`` (predict with the mean of the second half of the iterates,
    which averages out the gradient noise; False: the last iterate, as
    Algorithm 4) and ``random_state``.

    Learned: ``coef_``, ``steps_``, ``group_size_``, ``ledgers_`` (a
    :class:`PopulationLedgers`: one ledger per training row, each holding the
    one gradient release of that peer).
    """

    def __init__(
        self, *, loss: Loss | str = Loss.LOGISTIC, epsilon: float = 1.0, steps: int | None = None,
        learning_rate: float = 1.0, regularization: float = 1e-4, average: bool = True, random_state: int | None = None,
    ) -> None:
        self.loss = loss
        self.epsilon = epsilon
        self.steps = steps
        self.learning_rate = learning_rate
        self.regularization = regularization
        self.average = average
        self.random_state = random_state

    def fit(self, X: npt.ArrayLike, y: npt.ArrayLike, *, features: tuple[str, ...] = ("x",)) -> LDPGradientDescent:
        """Train on rows ``X`` in ``[-1, 1]^d`` (each row one peer) and
        targets ``y``; ``features`` names what each release is about (for
        the ledgers)."""
        matrix = np.asarray(X, dtype=np.float64)
        target = np.asarray(y, dtype=np.float64)
        if matrix.ndim != 2 or target.shape != (matrix.shape[0],) or matrix.shape[0] == 0:
            raise ValueError(f"X must be (n, d) and y (n,), got {matrix.shape!r} and {target.shape!r}")
        if not np.all(np.abs(matrix) <= 1) or not np.all(np.abs(target) <= 1):
            raise ValueError("X and y must lie in [-1, 1] (Harmony §4.1)")
        rng = np.random.default_rng(self.random_state)
        n, d = matrix.shape
        mechanism = OneBitMean(self.epsilon, d)
        if self.steps is None:
            steps = max(1, n // harmony_group_size(n, d, mechanism.epsilon))
        elif isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps <= n:
            raise ValueError(f"steps must be an integer in [1, n={n}], got {self.steps!r}")
        else:
            steps = self.steps
        # Every peer in exactly one group: np.array_split deals all n rows.
        groups = np.array_split(rng.permutation(n), steps)
        # One ledger per peer, each recording its gradient below (a second release would be refused).
        ledgers = PopulationLedgers(n, mechanism.epsilon)
        release = Release.about(ReleaseKind.GRADIENT, features, mechanism.epsilon)
        beta = np.zeros(d)
        tail_sum, tail_count = np.zeros(d), 0
        for k, group in enumerate(groups, start=1):
            gradients = clipped_gradients(self.loss, beta, matrix[group], target[group])
            ledgers.record(group, release)
            noisy_mean = mechanism.estimate(mechanism.privatize(gradients, rng))
            beta = harmony_step(beta, noisy_mean, k, self.learning_rate, self.regularization)
            if 2 * k > steps:
                tail_sum += beta
                tail_count += 1
        self.coef_ = tail_sum / tail_count if self.average else beta
        self.steps_ = steps
        self.group_size_ = n // steps
        self.ledgers_ = ledgers
        return self

    def decision_function(self, X: npt.ArrayLike) -> FloatArray:
        if not hasattr(self, "coef_"):
            raise RuntimeError("LDPGradientDescent is not fitted; call fit first")
        scores: FloatArray = np.asarray(X, dtype=np.float64) @ self.coef_
        return scores


def fit_logistic_reference(X: FloatArray, y: FloatArray) -> FloatArray:
    """Non-private, (almost) unregularised logistic regression on the same
    encoding: the reference every private learner is measured against."""
    from sklearn.linear_model import LogisticRegression

    # The intercept is column 0 of X already.
    model = LogisticRegression(C=1e4, fit_intercept=False, max_iter=5000).fit(X, y)
    coef: FloatArray = model.coef_[0]
    return coef
