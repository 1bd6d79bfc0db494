"""Privacy accounting: record-level sums, the thesis's per-attribute figure,
and the shuffle-amplification bound (DESIGN.md §8).

The guarantee is record-level local DP by sequential composition: a peer's
epsilon is the sum of the epsilon of every release it makes (each
median/quantile comparison bit, each subset report), whatever features they
are about. :class:`PrivacyLedger` enforces that sum.

The thesis's eq. 7.4 (a per-attribute maximum, valid only if features were
independent) is kept as :func:`per_attribute_epsilon`, a labelled secondary
figure that never decides anything: a peer answering one comparison bit about
each of ``k`` numeric features at ``eps_e`` and ``k_h`` reports at ``eps_h``
spends ``k·eps_e + k_h·eps_h`` on its record, while eq. 7.4 states only the
largest per-feature or label sum (``eps_e + eps_h`` for a numeric feature in
one report, ``k_h·eps_h`` for the label).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import overload

import numpy as np
import numpy.typing as npt

from anonml.mechanisms._errors import BudgetExceeded
from anonml.mechanisms._validate import check_epsilon, check_positive_int, check_probability

# Budgets are sums of floats (0.1 + 0.2 > 0.3 in binary): a release is refused
# only when the total exceeds the promise by more than this relative slack.
_RELATIVE_SLACK = 1e-9


def over_budget(total: float, budget: float) -> bool:
    """Whether a record-level ``total`` breaks ``budget`` (beyond the float slack above)."""
    return total > budget * (1 + _RELATIVE_SLACK)


class ReleaseKind(StrEnum):
    """What one release says about a peer's record."""

    COMPARISON = "comparison"  # one "is my value greater than t?" bit about one numeric feature
    SUBSET = "subset"  # one perturbed report of a feature subset and the label
    GRADIENT = "gradient"  # one perturbed gradient of a linear model at the peer's record (features and label)
    MODEL = "model"  # one output-perturbed model trained on the peer's rows (each row: features and label)
    STATISTIC = "statistic"  # one perturbed answer to a statistic task about the named columns


@dataclass(frozen=True)
class Release:
    """One perturbed release at ``epsilon``; ``features`` are what it is about
    (a comparison has one; a subset report also carries the label)."""

    kind: ReleaseKind
    features: tuple[str, ...]
    epsilon: float

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ReleaseKind):
            object.__setattr__(self, "kind", ReleaseKind(self.kind))
        if isinstance(self.features, str):
            raise ValueError(f"features must be a sequence of names, not a string: {self.features!r}")
        names = tuple(self.features)
        if not names or len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"features must be distinct non-empty names, got {self.features!r}")
        if self.kind == ReleaseKind.COMPARISON and len(names) != 1:
            raise ValueError(f"a comparison is about exactly one feature, got {names!r}")
        object.__setattr__(self, "features", names)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, "release epsilon"))

    @classmethod
    def comparison(cls, feature: str, epsilon: float) -> Release:
        return cls(ReleaseKind.COMPARISON, (feature,), epsilon)

    @classmethod
    def subset(cls, features: Sequence[str], epsilon: float) -> Release:
        if isinstance(features, str):
            raise ValueError(f"features must be a sequence of names, not a string: {features!r}")
        return cls(ReleaseKind.SUBSET, tuple(features), epsilon)

    @classmethod
    def about(cls, kind: ReleaseKind | str, features: Sequence[str], epsilon: float) -> Release:
        """A release of any kind about ``features`` (a sequence of names, never one string)."""
        if isinstance(features, str):
            raise ValueError(f"features must be a sequence of names, not a string: {features!r}")
        return cls(ReleaseKind(kind), tuple(features), epsilon)

    @property
    def carries_label(self) -> bool:
        return self.kind in (ReleaseKind.SUBSET, ReleaseKind.GRADIENT, ReleaseKind.MODEL)


def releases_from(
    medians: Mapping[str, float] | None = None, subsets: Sequence[tuple[Sequence[str], float]] = ()
) -> list[Release]:
    """Releases from the older description: median/quantile epsilon spent per
    feature (summed over its comparisons) and ``(features, epsilon)`` subset reports."""
    out = [Release.comparison(feature, epsilon) for feature, epsilon in (medians or {}).items()]
    for entry in subsets:
        try:
            features, epsilon = entry
        except (TypeError, ValueError):
            raise ValueError(f"each subset must be a (features, epsilon) pair, got {entry!r}") from None
        out.append(Release.subset(features, epsilon))
    return out


def record_level_epsilon(releases: Iterable[Release]) -> float:
    """The record-level epsilon of these releases: their sum (sequential composition)."""
    return math.fsum(release.epsilon for release in releases)


def total_epsilon(
    median_eps_by_feature: Mapping[str, float],
    subsets: Sequence[tuple[Sequence[str], float]],
) -> float:
    """A peer's record-level epsilon: the sum over every median/quantile
    comparison (``median_eps_by_feature``: epsilon per feature, summed over its
    comparisons) and every subset report."""
    return record_level_epsilon(releases_from(median_eps_by_feature, subsets))


def per_attribute_epsilon(releases: Iterable[Release]) -> float:
    """The thesis's eq. 7.4, a SECONDARY, per-attribute figure only.

    Feature i's budget is the sum of the releases about it, the label's the
    sum of the subset reports; the figure is the maximum of these. It is not
    a bound on what a peer reveals about its record (features are not
    independent); :func:`record_level_epsilon` is.
    """
    per_feature: dict[str, list[float]] = {}
    label: list[float] = []
    for release in releases:
        if release.carries_label:
            label.append(release.epsilon)
        for feature in release.features:
            per_feature.setdefault(feature, []).append(release.epsilon)
    return max([*(math.fsum(parts) for parts in per_feature.values()), math.fsum(label)], default=0.0)


class PrivacyLedger:
    """What one peer has released, and the refusal of anything that would push
    the record-level sum past the promised ``epsilon_total`` (ε_T).

    ``record`` (and its shorthands ``record_median``, ``record_subset``) either
    records the release or raises ``BudgetExceeded`` and records nothing.
    ``releases`` lists the records in order; a store persists them and
    rebuilds the ledger with ``PrivacyLedger(eps_T, releases=...)``, which
    refuses records already over budget. A ledger has no notion of rounds:
    the peer keeps one per round, capped by the manifest's promise, and
    checks the sum over all its rounds against its lifetime budget
    (``peer.PeerLedger``).
    """

    def __init__(self, epsilon_total: float, *, releases: Iterable[Release] = ()) -> None:
        self.epsilon_total = check_epsilon(epsilon_total, "epsilon_total")
        self._releases: list[Release] = []
        self._spent = 0.0
        earlier = list(releases)
        if earlier:
            self._commit(earlier)

    def copy(self) -> PrivacyLedger:
        """An independent ledger with this one's budget and records: one per peer of a group that made
        the same releases, checked against the budget once (a simulated population's millions of peers)."""
        twin = PrivacyLedger.__new__(PrivacyLedger)
        twin.epsilon_total = self.epsilon_total
        twin._releases = list(self._releases)
        twin._spent = self._spent
        return twin

    @property
    def releases(self) -> list[Release]:
        """Every recorded release, in order."""
        return list(self._releases)

    def spent(self) -> float:
        """The record-level epsilon of everything recorded so far (its sum, kept as each record is made)."""
        return self._spent

    def per_attribute(self) -> float:
        """Eq. 7.4 of everything recorded (secondary figure, see :func:`per_attribute_epsilon`)."""
        return per_attribute_epsilon(self._releases)

    def total_after(self, releases: Iterable[Release]) -> float:
        """The record-level epsilon if these releases were added."""
        return record_level_epsilon([*self._releases, *releases])

    def would_exceed(self, releases: Iterable[Release]) -> bool:
        """Whether adding these releases would push the sum past ``epsilon_total``."""
        return over_budget(self.total_after(releases), self.epsilon_total)

    def _commit(self, releases: list[Release]) -> None:
        total = self.total_after(releases)
        if over_budget(total, self.epsilon_total):
            raise BudgetExceeded(
                f"release would bring the record-level epsilon to {total!r}, over epsilon_total={self.epsilon_total!r}"
            )
        self._releases.extend(releases)
        self._spent = total

    def record(self, *releases: Release) -> None:
        """Record these releases together, or none of them."""
        self._commit(list(releases))

    def record_median(self, feature: str, epsilon: float) -> None:
        """Record one median/quantile comparison about ``feature`` at ``epsilon``."""
        self.record(Release.comparison(feature, epsilon))

    def record_subset(self, features: Sequence[str], epsilon: float) -> None:
        """Record one subset release (these features and the label) at ``epsilon``."""
        self.record(Release.subset(features, epsilon))


@dataclass(frozen=True)
class CentralPrivacy:
    """The central (shuffle) figure for ``n`` unlinkable ``local_epsilon``-LDP
    reports at ``delta``; ``epsilon`` is None where the bound does not apply."""

    local_epsilon: float
    n: int
    delta: float
    epsilon: float | None
    minimum_n: int

    def describe(self) -> str:
        """The figure in plain words."""
        if self.epsilon is None:
            return (
                f"no central guarantee beyond the local one: the shuffle bound needs at least {self.minimum_n} "
                f"reports at local epsilon {self.local_epsilon:.3g} and delta {self.delta:.2g}, this survey has {self.n}"
            )
        return (
            f"if the {self.n} reports of a survey cannot be linked to their senders, the set of them is "
            f"({self.epsilon:.3g}, {self.delta:.2g})-differentially private about any one peer's report "
            f"(Feldman-McMillan-Talwar shuffle bound; each report is {self.local_epsilon:.3g}-LDP)"
        )


def shuffle_central_privacy(epsilon0: float, n: int, delta: float | None = None) -> CentralPrivacy:
    """Central epsilon of n shuffled epsilon0-LDP reports at ``delta``
    (default ``1/n^2``, below the ``1/n`` at which delta stops meaning anything).

    Feldman, McMillan and Talwar, "Hiding Among the Clones: A Simple and Nearly
    Optimal Analysis of Privacy Amplification by Shuffling", FOCS 2021,
    Theorem 3.1: for ``epsilon0 <= log(n / (16 log(2/delta)))`` the shuffled
    output is (eps, delta)-DP with::

        eps = log(1 + (e^eps0 - 1)/(e^eps0 + 1)
                      * (8 sqrt(e^eps0 log(4/delta)) / sqrt(n) + 8 e^eps0 / n))

    Outside that condition (always at tiny n: at n = 2 the old report stated
    delta = 0.25) or where the bound is no smaller than epsilon0, ``epsilon``
    is None: the reports are epsilon0-LDP and nothing more is claimed.
    """
    epsilon0 = check_epsilon(epsilon0, "epsilon0")
    n = check_positive_int(n, "n", minimum=1)
    delta = check_probability(delta if delta is not None else 1.0 / (n * n) if n > 1 else 0.5, "delta")
    lam = math.exp(epsilon0)
    # The smallest n meeting the condition at this delta.
    minimum_n = math.ceil(16 * math.log(2 / delta) * lam)
    if delta >= 1.0 / n or n < minimum_n:
        return CentralPrivacy(epsilon0, n, delta, None, max(minimum_n, 2))
    bound = math.log1p((lam - 1) / (lam + 1) * (8 * math.sqrt(lam * math.log(4 / delta) / n) + 8 * lam / n))
    return CentralPrivacy(epsilon0, n, delta, bound if bound < epsilon0 else None, minimum_n)


class PopulationLedgers(Sequence[PrivacyLedger]):
    """The ledgers of a simulated population's ``peers`` peers (an in-process experiment: one peer a row),
    kept by history rather than by peer.

    Such peers release in groups (LDP gradient descent: one group a step),
    so many hold the same ledger. One :class:`PrivacyLedger` object a peer
    cost LDP gradient descent on Adult (26,700 peers a fit) three quarters of
    its time, nearly all of it the garbage collector walking the fresh
    objects. This keeps each distinct history once, as a ledger, and for each
    peer the history it holds. :meth:`record` checks a release on each
    history's ledger, as each peer's own would, and records it for the whole
    group or none of it.

    ``population[i]`` is peer i's ledger (an independent copy).
    """

    def __init__(self, peers: int, epsilon_total: float) -> None:
        self._histories = [PrivacyLedger(epsilon_total)]
        self._held = np.zeros(check_positive_int(peers, "peers", minimum=0), dtype=np.intp)

    def record(self, peers: npt.ArrayLike, *releases: Release) -> None:
        """Record ``releases`` for each of ``peers`` (peer numbers, each at most once), or for none of them:
        ``BudgetExceeded`` if any peer's record-level sum would pass the budget."""
        group = np.asarray(peers)
        if group.ndim != 1 or (group.size and not np.issubdtype(group.dtype, np.integer)):
            raise ValueError(f"peers must be a 1-D array of peer numbers, got {group!r}")
        if group.size == 0:
            return
        if group.min() < 0 or group.max() >= len(self) or np.unique(group).size != group.size:
            raise ValueError(f"peers must be distinct numbers in [0, {len(self)}), got {group!r}")
        held = self._held[group]
        extended: dict[int, PrivacyLedger] = {}
        for history in np.unique(held).tolist():
            ledger = self._histories[history].copy()
            ledger.record(*releases)  # raises before anything of this call is kept
            extended[history] = ledger
        for history, ledger in extended.items():
            self._held[group[held == history]] = len(self._histories)
            self._histories.append(ledger)

    def _held_histories(self) -> list[PrivacyLedger]:
        return [self._histories[history] for history in np.unique(self._held).tolist()]

    def max_spent(self) -> float:
        """The costliest peer's record-level epsilon (0 for no peers)."""
        return max((ledger.spent() for ledger in self._held_histories()), default=0.0)

    def max_releases(self) -> int:
        """The most releases any one peer made."""
        return max((len(ledger.releases) for ledger in self._held_histories()), default=0)

    def __len__(self) -> int:
        return int(self._held.size)

    @overload
    def __getitem__(self, peer: int) -> PrivacyLedger: ...

    @overload
    def __getitem__(self, peer: slice) -> list[PrivacyLedger]: ...

    def __getitem__(self, peer: int | slice) -> PrivacyLedger | list[PrivacyLedger]:
        if isinstance(peer, slice):
            return [self[i] for i in range(len(self))[peer]]
        return self._histories[int(self._held[peer])].copy()


def ledgers_of_one_release(release: Release, peers: int, epsilon_total: float) -> PopulationLedgers:
    """``peers`` ledgers of budget ``epsilon_total``, each holding ``release``: every peer of a simulated
    population made the same one release (raises ``BudgetExceeded`` if it does not fit the budget)."""
    population = PopulationLedgers(peers, epsilon_total)
    population.record(np.arange(peers), release)
    return population