"""The linear learners' hyperparameters chosen on a validation split carved
from the training rows, never on the test rows (``anonml experiment``'s
default, ``--linear-tuning validation``).

For each private learner and ε, a seeded ``VALIDATION_FRACTION`` of the
training rows is held out; every candidate is trained on the rest with
``TUNING_SEEDS`` seeds and scored by its mean AUC on the held-out rows; the
best candidate is then trained on all the training rows and scored once on
the test rows. A candidate's score is its mean validation AUC minus its
standard deviation over the seeds: a deployment trains once, so a setting
that is good on average but swings from run to run (LDP SGD's many small
groups at a large γ0) serves it worse than a steadier one. Candidates: LDP SGD's step count (Harmony's own group-size
rule among them) and γ0; model averaging's regularisation rule
``λ = rule / (rows_per_peer ε)`` and the weight of its categorical columns.

What the choice costs in privacy: the selection reads the training rows'
labels in the clear, as held-out tuning in any experiment does; it is not
part of any peer's ledger. A deployment fixes the settings before its
round (from a public table, or from the choices printed here); the peers'
record-level ε is then exactly the one release each ledger holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from anonml.learning._vocabulary import LearnerName, LinearSettings

VALIDATION_FRACTION = 0.2
TUNING_SEEDS = 5
# LDP SGD: the step counts (None: Harmony §5.3's group size) and γ0 tried.
SGD_STEP_CHOICES: tuple[int | None, ...] = (8, 16, 32, 64, 128, None)
SGD_RATE_CHOICES = (0.3, 1.0, 3.0)
# Model averaging: λ = rule / (rows_per_peer ε); the noise's norm scale is
# 2 / rule model units whatever n and ε (learning/_averaging.py).
AVERAGING_RULE_CHOICES = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0)
# ... and the weight of its categorical columns (1: the plain encoding).
AVERAGING_CATEGORICAL_WEIGHTS = (1.0, 0.5, 0.35)


def candidates(learner: LearnerName, base: LinearSettings) -> list[LinearSettings]:
    """The settings tried for ``learner`` (``base`` with one choice each)."""
    if learner == LearnerName.AVERAGING:
        return [dataclasses.replace(base, averaging_rule=rule, averaging_categorical_weight=weight)
                for weight in AVERAGING_CATEGORICAL_WEIGHTS for rule in AVERAGING_RULE_CHOICES]
    if learner in (LearnerName.SGD_LR, LearnerName.SGD_SVM, LearnerName.SGD_LINREG):
        return [dataclasses.replace(base, sgd_steps=steps, sgd_learning_rate=rate) for steps in SGD_STEP_CHOICES for rate in SGD_RATE_CHOICES]
    raise ValueError(f"{learner!r} has no hyperparameters to tune")


def validation_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(fit, validation)`` row indices of ``n`` training rows: a seeded
    ``VALIDATION_FRACTION`` held out (at least one row each side)."""
    if n < 2:
        raise ValueError(f"need at least 2 training rows to hold some out, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    held = min(n - 1, max(1, int(round(VALIDATION_FRACTION * n))))
    return np.sort(order[held:]), np.sort(order[:held])


def choose_settings(
    learner: LearnerName, base: LinearSettings, score: Callable[[LinearSettings, int], float],
) -> tuple[LinearSettings, dict[str, float]]:
    """The candidate with the best mean minus standard deviation of
    ``score(settings, seed)`` over ``TUNING_SEEDS`` seeds (ties: the earlier
    candidate), and every candidate's mean minus std (keyed by
    :func:`describe`). ``score`` must train on the fit rows and score on the
    validation rows only."""
    steady = {}
    best: tuple[float, LinearSettings] | None = None
    for settings in candidates(learner, base):
        scores = [score(settings, seed) for seed in range(TUNING_SEEDS)]
        value = float(np.mean(scores) - np.std(scores))
        steady[describe(learner, settings)] = value
        if best is None or value > best[0]:
            best = (value, settings)
    assert best is not None
    return best[1], steady


def describe(learner: LearnerName, settings: LinearSettings) -> str:
    """The tuned hyperparameters of ``learner`` in ``settings``, as text."""
    if learner == LearnerName.AVERAGING:
        return f"rule={settings.averaging_rule:g} categorical-weight={settings.averaging_categorical_weight:g}"
    return f"steps={settings.sgd_steps or 'harmony'} rate={settings.sgd_learning_rate:g}"
