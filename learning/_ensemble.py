"""The partition-ensemble learner (thesis chapter 6, DESIGN.md §9).

One classifier per (partition, feature subset) histogram, trained on the
histogram's cells weighted by their estimated counts. Training a learner on
``n`` samples drawn from a histogram is the same as training it on the ``m``
distinct cells weighted by how often each was drawn, so weighting by the
estimated counts is the sampling of thesis §7.3.4 without the sampling noise
and ``O(m)`` instead of ``O(n)``; ``training="sampled"`` reproduces the thesis
literally by drawing the counts from a multinomial. Each member is scored by
k-fold cross-validation on the noisy data (the counts are split into folds as
the synthetic samples would be), and members vote by eq. 6.2 (weighted hard
votes) or by a weighted average of their probabilities ("soft"). The third
combiner, naive Bayes, fits no members: it pools every histogram's
(feature, label) marginals into one class-conditional table per feature
(pure post-processing of the same noisy histograms; measured +0.007 to
+0.014 AUC on Adult over the votes).

Each member's input domain is finite (the subset's cells), so its prediction
for every cell is computed once at fit time and prediction is a table lookup.
The ensemble takes bin indices; rows become bins in a transformer before it
(``learning.SpecBinner`` for a round's model, ``learning.QuantileBinner`` on
raw numeric rows), composed in a scikit-learn ``Pipeline``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import LabelEncoder
from sklearn.tree import DecisionTreeClassifier
# scikit-learn's declarative parameter validation, read by
# BaseEstimator._validate_params. It lives in a private module, so a future
# scikit-learn may move it; the estimator checks in tests/ would catch that.
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, check_random_state, validate_data

from anonml.mechanisms import FrequencyOracle, PostprocessMethod, postprocess
from anonml.protocol import Combiner, FeatureSpec, Learner, decode_cells, encode_cells

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class SubsetHistogram:
    """The estimated histogram of one (partition, subset): counts over the
    encoded domain of :func:`protocol._features.encode_cells` for the
    features at ``columns`` (indices into the full binned feature vector)
    with ``n_bins`` bins each."""

    columns: tuple[int, ...]
    n_bins: tuple[int, ...]
    counts: FloatArray
    partition: int = 0
    # The standard deviation of one cell's estimated count (0: exact counts).
    noise_sd: float = 0.0

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts, dtype=np.float64)
        m = 2 * int(np.prod(self.n_bins))
        if len(self.columns) != len(self.n_bins) or not self.columns:
            raise ValueError(f"columns {self.columns!r} and n_bins {self.n_bins!r} must be equal-length and non-empty")
        if counts.shape != (m,) or not np.all(np.isfinite(counts)):
            raise ValueError(f"counts: expected {m} finite values, got shape {counts.shape!r}")
        object.__setattr__(self, "counts", counts)

    @classmethod
    def from_spec(cls, spec: FeatureSpec, subset: Sequence[str], counts: npt.ArrayLike, partition: int = 0, noise_sd: float = 0.0) -> SubsetHistogram:
        names = spec.check_subset(subset)
        return cls(tuple(spec.index(n) for n in names), tuple(spec.feature(n).n_bins for n in names), np.asarray(counts, dtype=np.float64), partition, noise_sd)


def estimate_histogram(
    spec: FeatureSpec,
    subset: Sequence[str],
    oracle: FrequencyOracle,
    reports: np.ndarray | Sequence[bytes],
    *,
    partition: int,
    method: str = PostprocessMethod.NORM_SUB,
) -> SubsetHistogram:
    """The one histogram estimator (the round's and the experiments'): the
    oracle's unbiased counts from decoded ``reports`` (an array) or encoded
    ones (a sequence of bytes, estimated blockwise), post-processed by
    ``method`` into non-negative counts summing to the number of reports."""
    if isinstance(reports, np.ndarray):
        estimate, n = oracle.estimate(reports), reports.shape[0]
        decoded: np.ndarray | None = reports
    else:
        estimate, n = oracle.estimate_blobs(reports), len(reports)
        decoded = None
    counts = postprocess(estimate, n, method, oracle=oracle, reports=decoded)
    # The unbiased estimate's per-cell error (the oracle's exact total over m cells).
    noise_sd = float(np.sqrt(oracle.variance(n) / oracle.m))
    return SubsetHistogram.from_spec(spec, subset, counts, partition, noise_sd)


def exact_histogram(columns: Sequence[int], n_bins: Sequence[int], X: IntArray, y: IntArray, partition: int = 0) -> SubsetHistogram:
    """The noise-free histogram of binned rows ``X`` (all features) and 0/1 ``y``."""
    codes = encode_cells(n_bins, X[:, list(columns)], y)
    counts = np.bincount(codes, minlength=2 * int(np.prod(n_bins))).astype(np.float64)
    return SubsetHistogram(tuple(columns), tuple(n_bins), counts, partition)


def _one_hot(bins: IntArray, n_bins: Sequence[int]) -> FloatArray:
    """Per-feature one-hot without the first bin (a binary feature is its own 0/1 column)."""
    blocks = [(bins[:, j:j + 1] == np.arange(1, k)).astype(np.float64) for j, k in enumerate(n_bins)]
    return np.hstack(blocks)


def _fit_logreg(design: FloatArray, labels: IntArray, weights: FloatArray, C: float) -> FloatArray:
    """L2-regularised weighted logistic regression by damped Newton steps.

    Minimises ``C·Σ w_i logloss_i + ½‖coef‖²`` (scikit-learn's objective,
    intercept unpenalised). The design has at most ``m`` rows and a handful
    of columns, where a direct Newton solve takes microseconds and
    ``LogisticRegression``'s per-call overhead would dominate the learner's
    run time. Returns ``[intercept, coef...]``.
    """
    Z = np.hstack([np.ones((design.shape[0], 1)), design])
    penalty = np.ones(Z.shape[1])
    penalty[0] = 0.0
    theta = np.zeros(Z.shape[1])

    def objective(t: FloatArray) -> float:
        z = Z @ t
        return float(C * weights @ (np.logaddexp(0.0, z) - labels * z) + 0.5 * penalty @ (t * t))

    current = objective(theta)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(Z @ theta)))
        gradient = C * Z.T @ (weights * (p - labels)) + penalty * theta
        hessian = C * (Z.T * (weights * p * (1.0 - p))) @ Z + np.diag(penalty) + 1e-10 * np.eye(Z.shape[1])
        step = np.linalg.solve(hessian, gradient)
        scale = 1.0
        while True:
            candidate = theta - scale * step
            value = objective(candidate)
            if value <= current or scale < 1e-6:
                break
            scale /= 2.0
        theta, converged = candidate, current - value < 1e-12 * max(1.0, abs(current))
        current = value
        if converged:
            break
    return theta


def _weighted_score(scoring: str, labels: IntArray, proba: FloatArray, weights: FloatArray) -> float:
    """f1, ROC AUC or accuracy of predictions over cells with weights (the
    figures of scikit-learn's metrics with ``sample_weight``); 0 where undefined.

    f1 and accuracy are sums of weights, computed here: every member's
    cross-validation scores each fold, and sklearn's f1_score spent about
    3 ms a call checking its input (a third of an Adult experiment's time).
    """
    keep = weights > 0
    if not keep.any():
        return 0.0
    labels, proba, weights = labels[keep], proba[keep], weights[keep]
    if scoring == "roc_auc":
        if np.unique(labels).size < 2:
            return 0.0
        return float(roc_auc_score(labels, proba, sample_weight=weights))
    predicted_positive = proba >= 0.5
    positive = labels == 1
    if scoring == "accuracy":
        return float(weights[predicted_positive == positive].sum() / weights.sum())
    true_positive = weights[predicted_positive & positive].sum()
    # F1 = 2 TP / (2 TP + FP + FN); the denominator is the predicted plus the actual positives' weight.
    denominator = weights[predicted_positive].sum() + weights[positive].sum()
    return float(2 * true_positive / denominator) if denominator > 0 else 0.0


_SCORERS = ("f1", "roc_auc", "accuracy")


class PartitionEnsemble(ClassifierMixin, BaseEstimator):
    """Ensemble of one classifier per (partition, subset) histogram.

    Parameters
    ----------
    base : "logreg" or "tree" (:class:`~anonml.protocol.Learner`)
        The partition classifier (thesis §8.3: trees for low privacy and high
        cardinality, logistic regression under heavy perturbation).
    scoring : "f1", "roc_auc" or "accuracy"
        Cross-validation score used as each member's weight ``s_i`` (f1 as in
        the thesis).
    combiner : "weighted", "soft" or "naive-bayes" (:class:`~anonml.protocol.Combiner`)
        "weighted" is eq. 6.2, ``Σ s_i (2 g_i − 1)``; "soft" averages the
        members' probabilities with weights ``s_i``; "naive-bayes" pools the
        histograms' (feature, label) marginals (no members, no CV).
    alpha : naive Bayes's additive smoothing, in units of each histogram's
        per-cell noise standard deviation (plus one count): noisy cells
        estimated near zero otherwise give extreme likelihood ratios.
    training : "weighted" or "sampled"
        Train on cells weighted by the estimated counts, or on a multinomial
        draw of ``n_synthetic`` samples (thesis §7.3.4).
    n_synthetic : int or None
        Synthetic samples per histogram for "sampled" (default: its count total).
    balance : bool
        Reweight each histogram's classes to equal total weight. Adult's
        label is 24% positive, so an unbalanced member votes 0 almost always
        and eq. 6.2's hard votes carry no ranking information.
    cv : int
        Folds for the cross-validated scores.
    C, max_depth, min_weight_fraction_leaf : base-learner regularisation.
    random_state : seed for fold splits and synthetic draws.
    """

    _parameter_constraints: dict[str, list[Any]] = {
        "base": [StrOptions({str(v) for v in Learner})],
        "scoring": [StrOptions(set(_SCORERS))],
        "combiner": [StrOptions({str(c) for c in Combiner})],
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "training": [StrOptions({"weighted", "sampled"})],
        "n_synthetic": [Interval(Integral, 2, None, closed="left"), None],
        "balance": ["boolean"],
        "cv": [Interval(Integral, 2, None, closed="left")],
        "C": [Interval(Real, 0, None, closed="neither")],
        "max_depth": [Interval(Integral, 1, None, closed="left"), None],
        "min_weight_fraction_leaf": [Interval(Real, 0, 0.5, closed="both")],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        *,
        base: str = Learner.LOGREG,
        scoring: str = "f1",
        combiner: str = Combiner.WEIGHTED,
        alpha: float = 1.0,
        training: str = "weighted",
        n_synthetic: int | None = None,
        balance: bool = True,
        cv: int = 5,
        C: float = 1.0,
        max_depth: int | None = None,
        min_weight_fraction_leaf: float = 0.01,
        random_state: int | np.random.Generator | np.random.RandomState | None = None,
    ) -> None:
        self.base = base
        self.scoring = scoring
        self.combiner = combiner
        self.alpha = alpha
        self.training = training
        self.n_synthetic = n_synthetic
        self.balance = balance
        self.cv = cv
        self.C = C
        self.max_depth = max_depth
        self.min_weight_fraction_leaf = min_weight_fraction_leaf
        self.random_state = random_state

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        tags.input_tags.allow_nan = False
        return tags

    # -- fitting -------------------------------------------------------------

    def fit(self, X: npt.ArrayLike, y: npt.ArrayLike) -> PartitionEnsemble:
        """The noise-free path on binned rows (non-negative bin indices, as a
        binner in front of it produces): exact histograms of each single
        feature with the label, then :meth:`fit_histograms`'s fitting. A
        column's bin count is its largest bin plus one."""
        self._validate_params()
        X_checked, y_checked = validate_data(self, X, y, dtype=None)
        bins = _as_bins(X_checked)
        check_classification_targets(y_checked)
        if type_of_target(y_checked) != "binary":
            raise ValueError(f"Only binary classification is supported; y has classes {np.unique(y_checked)!r}")
        encoder = LabelEncoder().fit(y_checked)
        labels = encoder.transform(y_checked).astype(np.int64)
        n_bins = tuple(int(k) for k in bins.max(axis=0) + 1)
        histograms = [exact_histogram((j,), (n_bins[j],), bins, labels) for j in range(bins.shape[1])]
        self._fit_members(histograms, n_bins=n_bins)
        self.classes_ = encoder.classes_
        return self

    def fit_histograms(self, histograms: Sequence[SubsetHistogram], *, n_bins: Sequence[int]) -> PartitionEnsemble:
        """Fit on estimated histograms (one per partition and subset);
        ``n_bins`` gives every feature's bin count, in feature order. Predict
        then takes binned full feature vectors; classes are 0 and 1."""
        self._validate_params()
        if not histograms:
            raise ValueError("histograms: need at least one histogram")
        for h in histograms:
            for column, bins in zip(h.columns, h.n_bins):
                if not 0 <= column < len(n_bins) or n_bins[column] != bins:
                    raise ValueError(f"histogram column {column!r} with {bins!r} bins does not match n_bins {tuple(n_bins)!r}")
        self._fit_members(list(histograms), n_bins=tuple(n_bins))
        self.classes_ = np.array([0, 1])
        self.n_features_in_ = len(n_bins)
        return self

    def _fit_members(self, histograms: list[SubsetHistogram], *, n_bins: tuple[int, ...]) -> None:
        rng = np.random.default_rng(check_random_state(self.random_state).randint(2**32, dtype=np.int64))
        self.histogram_columns_ = [h.columns for h in histograms]
        self.histogram_bins_ = [h.n_bins for h in histograms]
        self.partitions_ = np.array([h.partition for h in histograms])
        self.n_bins_ = n_bins
        if self.combiner == Combiner.NAIVE_BAYES:
            self.log_prior_, self.log_likelihood_ = _naive_bayes(histograms, n_bins, self.alpha)
            self.tables_, self.scores_ = [], np.zeros(0)
            return
        tables: list[FloatArray] = []
        scores: list[float] = []
        for h in histograms:
            counts = np.clip(h.counts, 0.0, None)
            if self.training == "sampled":
                total = self.n_synthetic if self.n_synthetic is not None else int(round(counts.sum()))
                counts = rng.multinomial(total, counts / counts.sum()).astype(np.float64) if counts.sum() > 0 else counts
            bins, labels = decode_cells(h.n_bins, np.arange(counts.shape[0], dtype=np.int64))
            design = _one_hot(bins, h.n_bins)
            scores.append(self._cross_validate(design, labels, counts, rng))
            # Prediction table over the feature cells: cell c's two label
            # codes are 2c and 2c+1, so rows 0::2 list every feature cell once.
            tables.append(self._fit_one(design, labels, counts)(design[0::2]))
        self.tables_ = tables
        self.scores_ = np.array(scores)
        self.log_prior_, self.log_likelihood_ = 0.0, []

    def _weights(self, labels: IntArray, counts: FloatArray) -> FloatArray:
        if not self.balance:
            return counts
        totals = np.array([counts[labels == 0].sum(), counts[labels == 1].sum()])
        # Equal total weight per class; a class with no mass keeps weight 0.
        factor = np.divide(counts.sum() / 2.0, totals, out=np.zeros(2), where=totals > 0)
        return np.asarray(counts * factor[labels], dtype=np.float64)

    def _fit_one(self, design: FloatArray, labels: IntArray, counts: FloatArray) -> Any:
        """Train one member; returns ``cells -> P(y=1)`` for design rows."""
        weights = self._weights(labels, counts)
        mass = np.array([weights[labels == 0].sum(), weights[labels == 1].sum()])
        if mass.min() <= 0:
            # One class has no estimated mass: the member can only predict the other.
            constant = float(mass[1] > 0)
            return lambda cells: np.full(cells.shape[0], constant)
        # Scale weights to mean 1 so C means the same at every n.
        weights = weights * (weights.shape[0] / weights.sum())
        if self.base == "logreg":
            theta = _fit_logreg(design, labels, weights, self.C)
            return lambda cells: 1.0 / (1.0 + np.exp(-(theta[0] + cells @ theta[1:])))
        model = DecisionTreeClassifier(max_depth=self.max_depth, min_weight_fraction_leaf=self.min_weight_fraction_leaf, random_state=0)
        model.fit(design, labels, sample_weight=weights)
        return lambda cells: model.predict_proba(cells)[:, 1]

    def _cross_validate(self, design: FloatArray, labels: IntArray, counts: FloatArray, rng: np.random.Generator) -> float:
        """k-fold CV on the noisy counts: each cell's (rounded) count is dealt
        into folds by a multinomial, as ``n`` synthetic samples would be."""
        whole = np.floor(counts).astype(np.int64)
        whole += rng.random(counts.shape[0]) < counts - whole
        folds = rng.multinomial(whole, np.full(self.cv, 1.0 / self.cv))
        fold_scores = []
        for k in range(self.cv):
            held = folds[:, k].astype(np.float64)
            predict = self._fit_one(design, labels, counts - held)
            if held[labels == 0].sum() == 0 or held[labels == 1].sum() == 0:
                fold_scores.append(0.0)
                continue
            # Score with the class balance the member was trained for.
            fold_scores.append(_weighted_score(self.scoring, labels, predict(design), self._weights(labels, held)))
        return float(np.mean(fold_scores))

    # -- prediction ----------------------------------------------------------

    def _binned(self, X: npt.ArrayLike) -> IntArray:
        check_is_fitted(self)
        X_checked = validate_data(self, X, dtype=None, reset=False)
        bins = _as_bins(X_checked)
        bad = bins >= np.asarray(self.n_bins_)
        if np.any(bad):
            row, col = np.argwhere(bad)[0]
            raise ValueError(f"X[{row}, {col}] = {int(bins[row, col])!r} is not a bin index below {self.n_bins_[col]!r}")
        return bins

    def member_probabilities(self, X: npt.ArrayLike) -> FloatArray:
        """``(n, n_members)``: each member's P(y=1) for binned rows ``X``
        (no members under naive Bayes)."""
        binned = self._binned(X)
        out = np.empty((binned.shape[0], len(self.tables_)))
        for i, (columns, n_bins, table) in enumerate(zip(self.histogram_columns_, self.histogram_bins_, self.tables_)):
            cells = encode_cells(n_bins, binned[:, list(columns)], np.zeros(binned.shape[0], dtype=np.int64)) // 2
            out[:, i] = table[cells]
        return out

    def _member_weights(self) -> FloatArray:
        weights = np.clip(self.scores_, 0.0, None)
        # All members scoring 0 (e.g. f1 of constant voters) leaves eq. 6.2
        # undefined; fall back to equal weights rather than a constant score.
        return weights if weights.sum() > 0 else np.ones_like(weights)

    def decision_function(self, X: npt.ArrayLike) -> FloatArray:
        """Eq. 6.2's score normalised to [−1, 1] ("weighted"), the soft
        vote's average probability minus 1/2 ("soft"), or naive Bayes's log
        odds; > 0 predicts class 1."""
        if self.combiner == Combiner.NAIVE_BAYES:
            binned = self._binned(X)
            score = np.full(binned.shape[0], self.log_prior_)
            for column, table in self.log_likelihood_:
                score += table[binned[:, column]]
            return score
        proba = self.member_probabilities(X)
        weights = self._member_weights()
        if self.combiner == Combiner.WEIGHTED:
            votes = 2.0 * (proba >= 0.5) - 1.0
            return np.asarray(votes @ weights / weights.sum())
        return np.asarray(proba @ weights / weights.sum() - 0.5)

    def predict_proba(self, X: npt.ArrayLike) -> FloatArray:
        """For "weighted", the score-weighted share of members voting 1; for
        "soft", the weighted average member probability; for naive Bayes,
        the posterior."""
        decision = self.decision_function(X)
        if self.combiner == Combiner.NAIVE_BAYES:
            p1 = 1.0 / (1.0 + np.exp(-decision))
        elif self.combiner == Combiner.WEIGHTED:
            p1 = (decision + 1.0) / 2.0
        else:
            p1 = decision + 0.5
        return np.column_stack([1.0 - p1, p1])

    def predict(self, X: npt.ArrayLike) -> npt.NDArray[Any]:
        # A positive score predicts class 1 (scikit-learn's convention; a tie at 0 is class 0).
        positive = self.decision_function(X) > 0
        return np.asarray(self.classes_[positive.astype(int)])


def _as_bins(X: np.ndarray) -> IntArray:
    """``X`` as int64 bin indices, refusing anything that is not a non-negative integer."""
    array = np.asarray(X)
    if array.dtype == object or not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"X must hold bin indices (non-negative integers), got dtype {array.dtype!r}")
    as_int = array.astype(np.int64)
    if not np.array_equal(as_int, array) or np.any(as_int < 0):
        raise ValueError("X must hold bin indices (non-negative integers); put a binner before the ensemble")
    return as_int


def _naive_bayes(histograms: Sequence[SubsetHistogram], n_bins: Sequence[int], alpha: float) -> tuple[float, list[tuple[int, FloatArray]]]:
    """Naive Bayes from noisy histograms: every histogram holding feature j
    adds its (bin of j, label) marginal to j's pooled table; the label prior
    pools every histogram. Returns the log prior odds and, per feature some
    histogram holds, the log likelihood ratio of each bin (``alpha``-smoothed)."""
    pooled: dict[int, FloatArray] = {}
    label_counts = np.zeros(2)
    for h in histograms:
        counts = np.clip(h.counts, 0.0, None) + alpha * (1.0 + h.noise_sd)
        bins, labels = decode_cells(h.n_bins, np.arange(counts.shape[0], dtype=np.int64))
        label_counts += np.bincount(labels, weights=counts, minlength=2)
        for j, column in enumerate(h.columns):
            table = pooled.setdefault(column, np.zeros((n_bins[column], 2)))
            np.add.at(table, (bins[:, j], labels), counts)
    log_prior = float(np.log(label_counts[1]) - np.log(label_counts[0]))
    likelihood = []
    for column in sorted(pooled):
        table = pooled[column]
        conditional = np.log(table) - np.log(table.sum(axis=0, keepdims=True))
        likelihood.append((column, conditional[:, 1] - conditional[:, 0]))
    return log_prior, likelihood
