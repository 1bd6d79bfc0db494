"""The plan's vocabulary and bounds, without numpy: what a command's help lists (``anonml experiment --help``).

:mod:`protocol._plan` builds release plans from them.
"""

from __future__ import annotations

from enum import StrEnum


class PlanKind(StrEnum):
    """How subsets are dealt to partitions (module docstring)."""

    SPLIT = "split"
    ONE = "one"


class MedianPeers(StrEnum):
    """Who answers the quantile search (module docstring)."""

    RESERVED = "reserved"
    ALL = "all"
    DISJOINT = "disjoint"


class Learner(StrEnum):
    """The partition classifier of the ensemble (thesis §8.3)."""

    LOGREG = "logreg"
    TREE = "tree"


class Combiner(StrEnum):
    """How the ensemble combines its histograms: eq. 6.2's weighted hard vote,
    the weighted soft vote, or naive Bayes over the same noisy histograms."""

    WEIGHTED = "weighted"
    SOFT = "soft"
    NAIVE_BAYES = "naive-bayes"


class TaskKind(StrEnum):
    """What a round computes from its reports (``[task] kind``, signed in the manifest).

    Every kind runs through the same surveys, relays, tokens and receipt logs. In the ensemble and statistics
    rounds every data peer sends its plan's subset reports (feature bins and the label, which a statistics
    round without a label query leaves out); in an SGD round it sends one perturbed gradient instead, and in a
    model-averaging round its model's blocks.
    """

    ENSEMBLE = "ensemble"
    """The partition ensemble (the default): a classifier fitted to the partitions' histograms."""
    STATISTICS = "statistics"
    """Statistic answers (histogram, count, mean, quantile) from one-feature reports, each beside its error formula."""
    SGD = "sgd"
    """Harmony's LDP gradient descent for logistic regression: each data peer sends one perturbed gradient, in the
    one iteration its partition is dealt (``learning.sgd_iteration``), against the model published for it."""
    MODEL_AVERAGING = "model-averaging"
    """Seed 003's averaging: each data peer releases its local logistic regression once, output-perturbed at
    ε_T, cut into fixed blocks of coordinates, one data survey per block; the aggregator averages each block."""


class SgdLoss(StrEnum):
    """The loss an SGD round's peers take the gradient of (``[task] loss``, signed in the manifest): Harmony §4.1's
    three, the names ``anonml experiment``'s ``ldp-sgd-lr``, ``ldp-sgd-svm`` and ``ldp-sgd-linreg`` train."""

    LOGISTIC = "logistic"  # log(1 + exp(-y x'β)), y in {-1, 1}
    HINGE = "hinge"  # max(0, 1 - y x'β) (linear SVM), y in {-1, 1}
    SQUARED = "squared"  # (x'β - y)^2 (linear regression), y in [-1, 1]

    @property
    def model(self) -> str:
        """The model this loss trains, in words (the consent preview, the report and the dashboard name it)."""
        return {SgdLoss.LOGISTIC: "logistic regression", SgdLoss.HINGE: "linear SVM", SgdLoss.SQUARED: "linear regression"}[self]


PLAN_KINDS = tuple(PlanKind)
TASK_KINDS = tuple(TaskKind)
SGD_LOSSES = tuple(SgdLoss)
EPSILON_TOTAL_RANGE = (1e-6, 20.0)
"""The record-level ε_T a round or an experiment may promise. At ε = 1e-300 a
randomised response's two probabilities are the same float; 1e-6 keeps them
apart. The top is where the mechanisms stay randomised in floating point: a
plan may put all of ε_T on one comparison bit, whose range ends at 22.18
(``mechanisms.comparison_epsilon_range``); 20 is inside every oracle's range
for the domains a round allows."""
MEDIAN_PEERS = tuple(MedianPeers)
# The default share of peers answering the quantile search in a reserved pool.
DEFAULT_COMPARISON_POOL = 0.1
MAX_PARTITIONS = 4096
MAX_MEDIAN_STEPS = 64
DEFAULT_MEDIAN_STEPS = 10  # steps of Algorithm 1 in the experiments: 1/2**11 of the public range
