"""The area under the ROC curve, by its rank formula.

The experiments score thousands of fits (the settings search alone scores
every candidate on the validation rows), and ``sklearn.metrics.roc_auc_score``
spent 2.5 ms a call on input checks meant for every kind of target. The
area is the Mann-Whitney statistic: the chance that a random positive row
scores above a random negative one, ties counting one half. With average
ranks for ties it is ``(R+ - n+ (n+ + 1) / 2) / (n+ n-)``, where ``R+`` is the
sum of the positive rows' ranks: the same number sklearn computes.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.stats import rankdata


def roc_auc(labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """The ROC AUC of ``scores`` for binary ``labels`` (the larger label value is the positive class)."""
    y = np.asarray(labels)
    s = np.asarray(scores, dtype=np.float64)
    if y.ndim != 1 or s.shape != y.shape:
        raise ValueError(f"labels and scores must be 1-D of one length, got {y.shape!r} and {s.shape!r}")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    classes = np.unique(y)
    if classes.size != 2:
        raise ValueError(f"the ROC AUC needs exactly two label values, got {classes.size}")
    positive = y == classes[1]
    n_positive = int(positive.sum())
    n_negative = y.size - n_positive
    rank_sum = float(rankdata(s)[positive].sum())
    return (rank_sum - n_positive * (n_positive + 1) / 2) / (n_positive * n_negative)
