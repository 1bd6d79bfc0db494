"""Privacy accounting: a peer's total budget (thesis §7.4, eq. 7.4) and the
shuffle-amplification bound of Feldman, McMillan and Talwar (2021)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from anonml.mechanisms._errors import BudgetExceeded
from anonml.mechanisms._validate import check_epsilon, check_positive_int, check_probability

# Budgets are sums of floats (0.1 + 0.2 > 0.3 in binary): a release is refused
# only when the total exceeds the promise by more than this relative slack.
_RELATIVE_SLACK = 1e-9


def _check_subsets(subsets: Sequence[tuple[Sequence[str], float]]) -> list[tuple[tuple[str, ...], float]]:
    checked = []
    for entry in subsets:
        try:
            features, epsilon = entry
        except (TypeError, ValueError):
            raise ValueError(f"each subset must be a (features, epsilon) pair, got {entry!r}") from None
        if isinstance(features, str):
            raise ValueError(f"subset features must be a sequence of names, not a string: {features!r}")
        names = tuple(features)
        if len(set(names)) != len(names):
            raise ValueError(f"subset features must be distinct, got {names!r}")
        checked.append((names, check_epsilon(epsilon, "subset epsilon")))
    return checked


def total_epsilon(
    median_eps_by_feature: Mapping[str, float],
    subsets: Sequence[tuple[Sequence[str], float]],
) -> float:
    """A peer's total epsilon by thesis eq. 7.4.

    Each subset release carries the label and its features, at its epsilon
    (eps_h^j). The feature budget is ``eps_f^i = eps_h(i) + eps_e^i``, where
    eps_h(i) is the epsilon of the subset(s) holding feature i (summed if a
    feature is released in several subsets; the thesis has one) and eps_e^i the
    median-query epsilon of feature i. The label budget is
    ``eps_l = sum_j eps_h^j``. The total is ``max(max_i eps_f^i, eps_l)``.
    """
    per_feature: dict[str, list[float]] = {}
    for feature, epsilon in median_eps_by_feature.items():
        per_feature.setdefault(feature, []).append(check_epsilon(epsilon, f"median epsilon of {feature!r}"))
    label: list[float] = []
    for features, epsilon in _check_subsets(subsets):
        label.append(epsilon)
        for feature in features:
            per_feature.setdefault(feature, []).append(epsilon)
    feature_budgets = [math.fsum(parts) for parts in per_feature.values()]
    return max([*feature_budgets, math.fsum(label)], default=0.0)


class PrivacyLedger:
    """What one peer has released, and the refusal of anything that would push
    its eq. 7.4 total past the promised ``epsilon_total`` (eps_T).

    ``record_median`` and ``record_subset`` either record the release or raise
    ``BudgetExceeded`` and record nothing. ``medians`` and ``subsets`` expose
    the records (for persistence, rebuild with ``PrivacyLedger(eps_T,
    medians=..., subsets=...)``, which refuses records already over budget).
    """

    def __init__(
        self,
        epsilon_total: float,
        *,
        medians: Mapping[str, float] | None = None,
        subsets: Sequence[tuple[Sequence[str], float]] = (),
    ) -> None:
        self.epsilon_total = check_epsilon(epsilon_total, "epsilon_total")
        self._medians: dict[str, float] = {}
        self._subsets: list[tuple[tuple[str, ...], float]] = []
        if medians or subsets:
            self._commit(dict(medians or {}), _check_subsets(subsets))

    @property
    def medians(self) -> dict[str, float]:
        """Median-query epsilon spent per feature (summed over queries)."""
        return dict(self._medians)

    @property
    def subsets(self) -> list[tuple[tuple[str, ...], float]]:
        """Subset releases as (features, epsilon), in release order."""
        return list(self._subsets)

    def spent(self) -> float:
        """The eq. 7.4 total of everything recorded so far."""
        return total_epsilon(self._medians, self._subsets)

    def remaining(self) -> float:
        """``epsilon_total - spent()``."""
        return self.epsilon_total - self.spent()

    def _with(
        self, medians: Mapping[str, float], subsets: Sequence[tuple[tuple[str, ...], float]]
    ) -> tuple[dict[str, float], list[tuple[tuple[str, ...], float]]]:
        merged = dict(self._medians)
        for feature, epsilon in medians.items():
            merged[feature] = merged.get(feature, 0.0) + check_epsilon(epsilon, f"median epsilon of {feature!r}")
        return merged, [*self._subsets, *subsets]

    def total_after(
        self,
        *,
        medians: Mapping[str, float] | None = None,
        subsets: Sequence[tuple[Sequence[str], float]] = (),
    ) -> float:
        """The eq. 7.4 total if these releases were added."""
        merged, all_subsets = self._with(medians or {}, _check_subsets(subsets))
        return total_epsilon(merged, all_subsets)

    def would_exceed(
        self,
        *,
        medians: Mapping[str, float] | None = None,
        subsets: Sequence[tuple[Sequence[str], float]] = (),
    ) -> bool:
        """Whether adding these releases would push the total past ``epsilon_total``."""
        return self.total_after(medians=medians, subsets=subsets) > self.epsilon_total * (1 + _RELATIVE_SLACK)

    def _commit(self, medians: Mapping[str, float], subsets: list[tuple[tuple[str, ...], float]]) -> None:
        merged, all_subsets = self._with(medians, subsets)
        total = total_epsilon(merged, all_subsets)
        if total > self.epsilon_total * (1 + _RELATIVE_SLACK):
            raise BudgetExceeded(
                f"release would bring the total epsilon to {total!r}, over epsilon_total={self.epsilon_total!r}"
            )
        self._medians, self._subsets = merged, all_subsets

    def record_median(self, feature: str, epsilon: float) -> None:
        """Record one median/quantile answer about ``feature`` at ``epsilon``."""
        self._commit({feature: epsilon}, [])

    def record_subset(self, features: Sequence[str], epsilon: float) -> None:
        """Record one subset release (these features and the label) at ``epsilon``."""
        self._commit({}, _check_subsets([(features, epsilon)]))


def shuffle_amplified_epsilon(epsilon0: float, n: int, delta: float) -> float:
    """Central epsilon of n shuffled epsilon0-LDP reports, at the given delta.

    Feldman, McMillan and Talwar, "Hiding Among the Clones: A Simple and Nearly
    Optimal Analysis of Privacy Amplification by Shuffling", FOCS 2021,
    Theorem 3.1: for ``epsilon0 <= log(n / (16 log(2/delta)))`` the shuffled
    output is (eps, delta)-DP with::

        eps = log(1 + (e^eps0 - 1)/(e^eps0 + 1)
                      * (8 sqrt(e^eps0 log(4/delta)) / sqrt(n) + 8 e^eps0 / n))

    Returns ``epsilon0`` itself when the condition fails or the bound is not
    smaller (the reports are epsilon0-DP anyway).
    """
    epsilon0 = check_epsilon(epsilon0, "epsilon0")
    n = check_positive_int(n, "n", minimum=1)
    delta = check_probability(delta, "delta")
    if epsilon0 > math.log(n / (16 * math.log(2 / delta))):
        return epsilon0
    lam = math.exp(epsilon0)
    bound = math.log1p((lam - 1) / (lam + 1) * (8 * math.sqrt(lam * math.log(4 / delta) / n) + 8 * lam / n))
    return min(bound, epsilon0)
