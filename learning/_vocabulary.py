"""The experiment's names and settings, without numpy or scikit-learn: what ``anonml experiment --help`` lists."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from anonml.protocol import SgdLoss

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


SGD_LEARNER_LOSS = {LearnerName.SGD_LR: SgdLoss.LOGISTIC, LearnerName.SGD_SVM: SgdLoss.HINGE, LearnerName.SGD_LINREG: SgdLoss.SQUARED}
"""The loss each LDP SGD learner trains: an SGD round signing ``[task] loss`` trains the same model."""

AVERAGING_RULE = 2.0
"""Model averaging's default ``λ = AVERAGING_RULE / (rows_per_peer ε)``."""
AVERAGING_CATEGORICAL_WEIGHT = 0.5
"""Model averaging's default weight of the categorical columns (the
intercept and numeric columns weigh 1): see ``LinearSettings``."""


ROUND_REGULARIZATION_RULE = 1.5
"""A model-averaging round's λ rule unless its spec sets another (``[task] regularization_rule``, signed): the rule
``anonml experiment``'s validation rows chose on Adult at ε_T 1 with 100 rows per peer (never the test rows)."""
ROUND_CATEGORICAL_WEIGHT = 0.35
"""A model-averaging round's categorical-column weight unless its spec sets another (``[task] categorical_weight``,
signed): the weight the same validation chose."""


class Tuning(StrEnum):
    """How the linear learners' hyperparameters are chosen (``--linear-tuning``)."""

    VALIDATION = "validation"  # per learner and ε, on rows held out of the training split (learning/_tuning.py)
    FIXED = "fixed"  # the settings as given


@dataclass(frozen=True)
class LinearSettings:
    """Hyperparameters of the linear learners. With ``tuning`` validation
    (the default) the step count, γ0 and the averaging rule are chosen per
    learner and ε on a validation split of the training rows and the values
    here are only the starting point; with fixed they are used as given.
    ``sgd_steps`` None is Harmony §5.3's own rule (groups of
    ``harmony_group_size``); ``averaging_rule`` sets model averaging's
    ``λ = rule / (rows_per_peer ε)``; ``averaging_categorical_weight`` is
    the factor model averaging's peers multiply their categorical columns
    by before dividing every row by the weights' norm (the public bound on
    ``||x||``): a smaller weight leaves the numeric columns, whose
    coefficients must be large, more of the unit ball, so a strong λ biases
    them less (on Adult's validation rows at ε 1 and 100 rows per peer,
    0.871 at weight 0.5 against 0.855 at 1). ``log_scale``: encode the wide-range
    numeric features on a log scale (``wide_range_features``)."""

    sgd_steps: int | None = 32
    sgd_learning_rate: float = 1.0
    rows_per_peer: int = 100
    log_scale: bool = True
    averaging_rule: float = AVERAGING_RULE
    averaging_categorical_weight: float = AVERAGING_CATEGORICAL_WEIGHT
    tuning: Tuning = Tuning.VALIDATION
