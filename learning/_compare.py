"""The seeds' other learners beside the partition ensemble, on the same
split and record-level ε (``anonml experiment --learner ...``): Harmony's
LDP gradient descent (logistic regression, linear SVM, linear regression
used as a classifier), DP averaging of local models (003), and
non-private logistic regression on the same encoding as the reference.

Every private learner's ε is record-level: the largest sum in any peer's
ledger, read back after the trial (each peer releases once, at ε)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from anonml.learning._averaging import ModelAveraging
from anonml.learning._data import Table
from anonml.learning._linear import FloatArray, LDPGradientDescent, LinearEncoding, fit_logistic_reference, wide_range_features
from anonml.learning._metrics import roc_auc
from anonml.learning._tuning import choose_settings, describe, validation_rows
from anonml.learning._vocabulary import SGD_LEARNER_LOSS, LearnerName, LinearSettings, Tuning
from anonml.mechanisms import PopulationLedgers
from anonml.protocol import FeatureSpec


def linear_encoding(settings: LinearSettings, spec: FeatureSpec) -> LinearEncoding:
    """The linear learners' encoding of ``spec``: its wide-range numeric features on a log scale if ``settings`` say so."""
    return LinearEncoding(spec, wide_range_features(spec) if settings.log_scale else frozenset())


def summary(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample std, min, max and count of a list of AUCs."""
    array = np.asarray(values)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if array.size > 1 else 0.0, "min": float(array.min()), "max": float(array.max()), "n": int(array.size)}


def _max_spent(ledgers: PopulationLedgers) -> tuple[float, int]:
    """The costliest peer's record-level ε and the most releases any peer made."""
    return ledgers.max_spent(), ledgers.max_releases()


@dataclass(frozen=True)
class EncodedSplit:
    """A split encoded once for every trial (:class:`LinearEncoding`)."""

    X: FloatArray
    y: FloatArray
    X_test: FloatArray
    y_test: FloatArray
    features: tuple[str, ...]
    categorical: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, encoding: LinearEncoding, train: Table, test: Table) -> EncodedSplit:
        return cls(encoding.transform(train), encoding.signed_labels(train), encoding.transform(test), encoding.signed_labels(test),
                   encoding.spec.names, encoding.categorical_columns)


def linear_trial(learner: LearnerName, split: EncodedSplit, epsilon: float, seed: int, settings: LinearSettings) -> dict[str, Any]:
    """One trial of one linear learner: AUC on the test rows, the
    record-level ε spent and the most releases any peer made."""
    started = time.perf_counter()
    X, y, X_test, y_test, features = split.X, split.y, split.X_test, split.y_test, split.features
    details: dict[str, Any] = {}
    if learner in SGD_LEARNER_LOSS:
        sgd = LDPGradientDescent(
            loss=SGD_LEARNER_LOSS[learner], epsilon=epsilon, steps=settings.sgd_steps, learning_rate=settings.sgd_learning_rate, random_state=seed,
        ).fit(X, y, features=features)
        scores, (spent, releases) = sgd.decision_function(X_test), _max_spent(sgd.ledgers_)
        details = {"steps": sgd.steps_, "group_size": sgd.group_size_}
    elif learner == LearnerName.AVERAGING:
        averaging = ModelAveraging(
            epsilon=epsilon, rows_per_peer=settings.rows_per_peer, regularization=settings.averaging_rule / (settings.rows_per_peer * epsilon),
            random_state=seed,
        )
        # Every column lies in [-1, 1], so the weights' norm bounds ||x ∘ weights||.
        weights = np.where(split.categorical, settings.averaging_categorical_weight, 1.0)
        averaging.fit(X * weights, y, norm_bound=float(np.linalg.norm(weights)), features=features)
        X_test = X_test * weights
        scores, (spent, releases) = averaging.decision_function(X_test), _max_spent(averaging.ledgers_)
        details = {"peers": len(averaging.peer_rows_), "min_rows": min(averaging.peer_rows_), "regularization": averaging.regularization_,
                   "noise_norm_scale": averaging.perturbation_.noise_norm_scale,
                   "noise_free_auc": roc_auc(y_test, X_test @ averaging.noise_free_coef_)}
    elif learner == LearnerName.LOGREG:
        scores, spent, releases = X_test @ fit_logistic_reference(X, y), 0.0, 0
    else:
        raise ValueError(f"{learner!r} is not a linear learner")
    return {"auc": roc_auc(y_test, scores), "epsilon_total": spent, "releases_per_peer": releases,
            "seconds": time.perf_counter() - started, **details}


def tuned_settings(
    learners: Sequence[str], split: EncodedSplit, epsilons: Sequence[float], seed: int, settings: LinearSettings,
) -> tuple[dict[tuple[LearnerName, float | None], LinearSettings], dict[tuple[LearnerName, float | None], dict[str, Any]]]:
    """Each private linear learner's settings at each ε, chosen on rows held
    out of the training split (learning/_tuning.py; none with
    ``settings.tuning`` fixed), and what the choice saw: the chosen
    hyperparameters and every candidate's validation score (mean AUC minus
    its std over the tuning seeds)."""
    chosen: dict[tuple[LearnerName, float | None], LinearSettings] = {}
    seen: dict[tuple[LearnerName, float | None], dict[str, Any]] = {}
    if settings.tuning != Tuning.VALIDATION:
        return chosen, seen
    fit, held = validation_rows(split.X.shape[0], seed)
    tuning_split = EncodedSplit(split.X[fit], split.y[fit], split.X[held], split.y[held], split.features, split.categorical)
    for learner in [LearnerName(name) for name in learners]:
        if learner in (LearnerName.ENSEMBLE, LearnerName.LOGREG):
            continue
        for eps in epsilons:
            def score(candidate: LinearSettings, tuning_seed: int) -> float:
                auc: float = linear_trial(learner, tuning_split, eps, tuning_seed, candidate)["auc"]
                return auc

            best, means = choose_settings(learner, settings, score)
            chosen[(learner, eps)] = best
            seen[(learner, eps)] = {"tuned": describe(learner, best), "validation_scores": means, "validation_rows": int(held.size)}
    return chosen, seen


def run_comparison(
    *, spec: FeatureSpec, train: Table, test: Table, learners: Sequence[str], epsilons: Sequence[float], trials: int, seed: int,
    settings: LinearSettings = LinearSettings(), progress: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """One result line per (linear learner, ε_T): AUC summary over
    ``trials``, the worst record-level ε any peer spent, and the learner's
    details; the non-private reference has one line (ε ``None``)."""
    split = EncodedSplit.of(linear_encoding(settings, spec), train, test)
    chosen, tuning = tuned_settings(learners, split, epsilons, seed, settings)
    rng = np.random.default_rng(seed)
    lines: dict[tuple[str, float | None], dict[str, Any]] = {}
    for _ in range(trials):
        trial_seed = int(rng.integers(2**31))
        for name in learners:
            learner = LearnerName(name)
            if learner == LearnerName.ENSEMBLE:
                continue
            for eps in [None] if learner == LearnerName.LOGREG else epsilons:
                if learner == LearnerName.LOGREG and (learner, None) in lines:
                    continue  # deterministic: one fit is the reference
                outcome = linear_trial(learner, split, eps or 1.0, trial_seed, chosen.get((learner, eps), settings))
                line = lines.setdefault((learner, eps), {"learner": str(learner), "epsilon_total_requested": eps, "aucs": [], "seconds": [],
                                                         "epsilon_total": 0.0, "releases_per_peer": 0, **tuning.get((learner, eps), {})})
                line["aucs"].append(outcome.pop("auc"))
                line["seconds"].append(outcome.pop("seconds"))
                line["epsilon_total"] = max(line["epsilon_total"], outcome.pop("epsilon_total"))
                line["releases_per_peer"] = max(line["releases_per_peer"], outcome.pop("releases_per_peer"))
                if "noise_free_auc" in outcome:
                    line.setdefault("noise_free_aucs", []).append(outcome.pop("noise_free_auc"))
                line.update(outcome)
                if progress is not None:
                    progress()
    out = []
    for line in lines.values():
        line["auc"] = summary(line.pop("aucs"))
        line["seconds_per_trial"] = float(np.mean(line.pop("seconds")))
        if "noise_free_aucs" in line:
            line["noise_free_auc"] = summary(line.pop("noise_free_aucs"))
        out.append(line)
    return out


def comparison_table(report: dict[str, Any]) -> list[tuple[str, float | None, dict[str, float], float]]:
    """Rows ``(learner, ε_T requested, AUC summary, record-level ε spent)``
    for every learner of ``report``: the linear learners and each ensemble
    plan and combiner."""
    rows = [(line["learner"], line["epsilon_total_requested"], line["auc"], line["epsilon_total"]) for line in report.get("learners", [])]
    for line in report.get("results", []):
        rows.append((f"ensemble {line['plan']} {line['combiner']}", line["epsilon_total_requested"], line["auc"], line["epsilon_total"]))
    return sorted(rows, key=lambda row: (row[0], row[1] or 0.0))
