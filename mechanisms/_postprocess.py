"""Post-processing of unbiased noisy counts into a valid histogram.

The unbiased estimates of a frequency oracle can be negative and need not sum
to n. Post-processing uses nothing but the released reports, so it costs no
privacy. Methods (Wang et al., "Locally Differentially Private Frequency
Estimation with Consistency", NDSS 2020, compare them):

- ``"clip"``: the thesis's correction (§7.3.4): negatives to 0, then rescale to n.
- ``"norm-sub"``: negatives to 0, then add one constant to the positive
  entries (subtract if their sum exceeds n) so they sum to n, repeating while
  that makes an entry negative.
- ``"project"``: the Euclidean projection onto {x >= 0, sum x = n}.
- ``"ibu"``: iterative Bayesian update (Agrawal and Aggarwal 2001; an EM for
  the maximum-likelihood histogram given the oracle's channel).
"""

from __future__ import annotations


import numpy as np

from anonml.base.display import one_of
from anonml.mechanisms._names import PostprocessMethod
from anonml.mechanisms._oracle_base import FrequencyOracle
from anonml.mechanisms._validate import check_positive_int

POSTPROCESS_METHODS: tuple[str, ...] = tuple(PostprocessMethod)

# IBU stops when no frequency moves by more than this between iterations, or
# after _IBU_MAX_ITERATIONS (EM creeps towards zero-frequency boundaries at a
# 1/t rate; every iterate is already a valid histogram).
_IBU_TOLERANCE = 1e-7
_IBU_MAX_ITERATIONS = 2_000


def _check_estimate(estimate: np.ndarray) -> np.ndarray:
    array = np.asarray(estimate, dtype=np.float64)
    if array.ndim != 1 or array.shape[0] < 2:
        raise ValueError(f"estimate must be a 1-D array of at least 2 counts, got shape {array.shape!r}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"estimate must be finite, got {array!r}")
    return array


def _clip(estimate: np.ndarray, n: int) -> np.ndarray:
    clipped = np.maximum(estimate, 0.0)
    total = clipped.sum()
    if total == 0.0:
        # Nothing survived: no information, so the uniform histogram.
        return np.full(estimate.shape, n / estimate.shape[0])
    # Divide first: n / total overflows for subnormal totals.
    rescaled: np.ndarray = clipped / total * n
    return rescaled


def _norm_sub(estimate: np.ndarray, n: int) -> np.ndarray:
    active = estimate > 0
    if not active.any():
        return np.full(estimate.shape, n / estimate.shape[0])
    while True:
        # The common shift delta that makes the active entries sum to n.
        delta = (estimate[active].sum() - n) / active.sum()
        shifted = estimate - delta
        still_positive = active & (shifted > 0)
        if still_positive.sum() == active.sum():
            return np.where(active, shifted, 0.0)
        active = still_positive


def _project(estimate: np.ndarray, n: int) -> np.ndarray:
    # Euclidean projection onto the scaled simplex (Held, Wolfe and Crowder
    # 1974; Duchi et al. 2008): x_i = max(y_i - theta, 0) with theta chosen so
    # the result sums to n.
    ordered = np.sort(estimate)[::-1]
    cumulative = np.cumsum(ordered) - n
    ranks = np.arange(1, estimate.shape[0] + 1)
    support = ordered - cumulative / ranks > 0
    rho = int(np.flatnonzero(support)[-1])
    theta = cumulative[rho] / (rho + 1)
    projected: np.ndarray = np.maximum(estimate - theta, 0.0)
    return projected


def _ibu_from_reports(oracle: FrequencyOracle, reports: np.ndarray, n: int) -> np.ndarray:
    checked = oracle.check_reports(reports)
    if checked.shape[0] == 0:
        raise ValueError("reports must hold at least one report for IBU")
    # Identical reports have identical likelihood rows: EM over the distinct
    # rows weighted by multiplicity is the same EM, and much smaller for GRR
    # and unary encodings.
    distinct, multiplicity = np.unique(checked, axis=0, return_counts=True)
    log_lik = oracle.log_likelihood(distinct)
    likelihood = np.exp(log_lik - log_lik.max(axis=1, keepdims=True))
    weights = multiplicity / multiplicity.sum()
    frequencies = np.full(oracle.m, 1.0 / oracle.m)
    for _ in range(_IBU_MAX_ITERATIONS):
        joint = likelihood * frequencies[None, :]
        posterior = joint / joint.sum(axis=1, keepdims=True)
        updated = weights @ posterior
        converged = np.abs(updated - frequencies).max() < _IBU_TOLERANCE
        frequencies = updated
        if converged:
            break
    return frequencies * n


def _ibu_from_estimate(oracle: FrequencyOracle, estimate: np.ndarray, n: int) -> np.ndarray:
    # Without individual reports, IBU runs on the aggregated support counts
    # ñ_i = (p - q) n̂_i + q n, treating "report supports i" as the observed
    # outcome with channel A[i, v] = p if i == v else q, normalised per true
    # value. For GRR these outcomes partition the reports and this is the
    # exact EM; for the other oracles it is the composite-likelihood IBU.
    support = (oracle.p - oracle.q) * estimate + oracle.q * n
    if np.any(support < -1e-9 * max(n, 1)):
        raise ValueError(f"estimate is not consistent with {oracle.name} and n={n!r}: implied support {support!r}")
    observed = np.maximum(support, 0.0)
    observed /= observed.sum()
    channel = np.full((oracle.m, oracle.m), oracle.q)
    np.fill_diagonal(channel, oracle.p)
    channel /= channel.sum(axis=0, keepdims=True)
    frequencies = np.full(oracle.m, 1.0 / oracle.m)
    for _ in range(_IBU_MAX_ITERATIONS):
        predicted = channel @ frequencies
        updated = frequencies * (channel.T @ (observed / predicted))
        converged = np.abs(updated - frequencies).max() < _IBU_TOLERANCE
        frequencies = updated
        if converged:
            break
    return frequencies * n


def postprocess(
    estimate: np.ndarray,
    n: int,
    method: str = PostprocessMethod.NORM_SUB,
    *,
    oracle: FrequencyOracle | None = None,
    reports: np.ndarray | None = None,
) -> np.ndarray:
    """Turn unbiased noisy counts into non-negative counts summing to ``n``.

    ``method`` is one of ``POSTPROCESS_METHODS``. ``"ibu"`` needs ``oracle``
    (its channel); given ``reports`` it runs the EM on the exact per-report
    likelihoods (``oracle.log_likelihood``), otherwise on the aggregated
    support counts implied by ``estimate`` (exact EM for GRR, a composite
    likelihood for the others). For the other methods ``oracle`` and
    ``reports`` are not used.
    """
    checked = _check_estimate(estimate)
    n = check_positive_int(n, "n", minimum=1)
    if method == "clip":
        return _clip(checked, n)
    if method == "norm-sub":
        return _norm_sub(checked, n)
    if method == "project":
        return _project(checked, n)
    if method == "ibu":
        if oracle is None:
            raise ValueError("oracle is required for method 'ibu', got None")
        if checked.shape[0] != oracle.m:
            raise ValueError(f"estimate must have length m={oracle.m}, got {checked.shape[0]!r}")
        if reports is not None:
            return _ibu_from_reports(oracle, reports, n)
        return _ibu_from_estimate(oracle, checked, n)
    raise ValueError(f"method must be one of {one_of(POSTPROCESS_METHODS)}, got {method!r}")
