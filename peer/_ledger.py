"""The peer's privacy ledger: record-level accounting made durable.

:class:`mechanisms.PrivacyLedger` decides whether a release fits the round's
promised ``ε_T``, the SUM of the ε of every release (DESIGN.md §8);
:class:`PeerLedger` rebuilds it from the peer's SQLite store and commits
every release there *before* the packet carrying it is sent, so a crash can
never leave a release unaccounted and a restarted peer can never spend again.
"""

from __future__ import annotations

from collections.abc import Sequence

from anonml.mechanisms import BudgetExceeded, PrivacyLedger, Release, releases_from
from anonml.peer._store import PeerStore, Spend
from anonml.protocol import SurveyId


class PeerLedger:
    """One peer's releases in one round, checked against ``epsilon_total``."""

    def __init__(self, store: PeerStore, peer: bytes, round_id: bytes, epsilon_total: float) -> None:
        self._store = store
        self._peer = peer
        self._round_id = round_id
        recorded = [release for spend in store.spends(peer, round_id) for release in spend.releases()]
        self._ledger = PrivacyLedger(epsilon_total, releases=recorded)

    @property
    def epsilon_total(self) -> float:
        return self._ledger.epsilon_total

    def spent(self) -> float:
        """The record-level ε of this round's releases so far."""
        return self._ledger.spent()

    def releases(self) -> list[Release]:
        """This round's recorded releases, in order."""
        return self._ledger.releases

    def total_after(self, *, medians: dict[str, float], subsets: Sequence[tuple[Sequence[str], float]]) -> float:
        return self._ledger.total_after(releases_from(medians, subsets))

    def check(self, *, medians: dict[str, float], subsets: Sequence[tuple[Sequence[str], float]]) -> None:
        """Raise BudgetExceeded if these releases would not fit (records nothing)."""
        self._check(releases_from(medians, subsets))

    def _check(self, releases: Sequence[Release]) -> None:
        if self._ledger.would_exceed(releases):
            total = self._ledger.total_after(releases)
            raise BudgetExceeded(f"these releases would bring the total epsilon to {total!r}, over {self.epsilon_total!r}")

    def spend_median(self, survey: SurveyId, features: Sequence[str], epsilon: float) -> None:
        """Record one median answer (one bit per feature, no label) at ``epsilon`` each.

        Each bit is its own release, checked together before anything is
        stored: a feature listed twice is answered, and counted, twice.
        """
        self._spend(Spend(survey.to_bytes(), tuple(features), False, epsilon))

    def spend_subset(self, survey: SurveyId, features: Sequence[str], epsilon: float) -> None:
        """Record one subset release (these features and the label) at ``epsilon``."""
        self._spend(Spend(survey.to_bytes(), tuple(features), True, epsilon))

    def _spend(self, spend: Spend) -> None:
        """Check, then store (durable before the packet exists), then hold in memory."""
        releases = spend.releases()
        self._check(releases)
        self._store.record_spend(self._peer, self._round_id, spend)
        self._ledger.record(*releases)
