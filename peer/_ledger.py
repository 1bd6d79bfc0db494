"""The peer's privacy ledger: record-level accounting made durable.

:class:`mechanisms.PrivacyLedger` decides whether a release fits the round's
promised ``ε_T``, the SUM of the ε of every release (DESIGN.md §8);
:class:`PeerLedger` rebuilds it from the peer's SQLite store, checks the
sum over every round against the store's lifetime budget, and commits
every release there, in one transaction with the packet carrying it, *before*
that packet is sent: a crash can never leave a release unaccounted, a
restarted peer can never spend again, and it finds the packet to send.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from anonml.mechanisms import BudgetExceeded, PrivacyLedger, Release, ReleaseKind, record_level_epsilon, releases_from
from anonml.peer._store import PeerStore, Spend
from anonml.protocol import SealedReport, SurveyId


def releases_by_round(spends: Iterable[Spend]) -> dict[bytes, list[Release]]:
    """Recorded spends as each round's releases (a survey id names its round), oldest round first."""
    rounds: dict[bytes, list[Release]] = {}
    for spend in spends:
        rounds.setdefault(SurveyId.from_bytes(spend.survey).round_id, []).extend(spend.releases())
    return rounds


class PeerLedger:
    """One peer's releases in one round, checked against the round's
    ``epsilon_total`` and, with its releases in every other round, against
    the store's lifetime budget (DESIGN.md §8: ε adds up across rounds)."""

    def __init__(self, store: PeerStore, peer: bytes, round_id: bytes, epsilon_total: float) -> None:
        self._store = store
        self._peer = peer
        self._round_id = round_id
        self._earlier = releases_by_round(store.spends(peer))
        self._ledger = PrivacyLedger(epsilon_total, releases=self._earlier.pop(round_id, []))
        # Holds nothing itself: every check passes it all of this identity's releases.
        self._lifetime = PrivacyLedger(store.lifetime_epsilon())

    @property
    def epsilon_total(self) -> float:
        return self._ledger.epsilon_total

    @property
    def lifetime_epsilon(self) -> float:
        return self._lifetime.epsilon_total

    def spent(self) -> float:
        """The record-level ε of this round's releases so far."""
        return self._ledger.spent()

    def earlier_rounds(self) -> dict[bytes, float]:
        """The record-level ε this identity spent in each other round."""
        return {round_id: record_level_epsilon(releases) for round_id, releases in self._earlier.items()}

    def releases(self) -> list[Release]:
        """This round's recorded releases, in order."""
        return self._ledger.releases

    def total_after(self, *, medians: dict[str, float], subsets: Sequence[tuple[Sequence[str], float]]) -> float:
        return self._ledger.total_after(releases_from(medians, subsets))

    def lifetime_after(self, *, medians: dict[str, float], subsets: Sequence[tuple[Sequence[str], float]]) -> float:
        """The record-level ε over every round, this one's planned releases included."""
        return self._lifetime.total_after(self._everything(releases_from(medians, subsets)))

    def check(self, *, medians: dict[str, float], subsets: Sequence[tuple[Sequence[str], float]]) -> None:
        """Raise BudgetExceeded if these releases would not fit (records nothing)."""
        self._check(releases_from(medians, subsets))

    def _everything(self, releases: Sequence[Release]) -> list[Release]:
        earlier = [release for round_releases in self._earlier.values() for release in round_releases]
        return [*earlier, *self._ledger.releases, *releases]

    def _check(self, releases: Sequence[Release]) -> None:
        if self._ledger.would_exceed(releases):
            total = self._ledger.total_after(releases)
            raise BudgetExceeded(f"these releases would bring the total epsilon to {total!r}, over {self.epsilon_total!r}")
        if self._lifetime.would_exceed(self._everything(releases)):
            total = self._lifetime.total_after(self._everything(releases))
            raise BudgetExceeded(
                f"these releases would bring the epsilon spent over all rounds to {total:.4g}, over this peer's lifetime "
                f"budget of {self.lifetime_epsilon:g} (`anonml peer budget` shows it and sets another)"
            )

    def spend_median(self, survey: SurveyId, features: Sequence[str], epsilon: float, *, sealed: SealedReport | None = None) -> None:
        """Record one median answer (one bit per feature, no label) at ``epsilon`` each,
        with ``sealed``, the message carrying it.

        Each bit is its own release, checked together before anything is
        stored: a feature listed twice is answered, and counted, twice.
        """
        self._spend(Spend(survey.to_bytes(), tuple(features), False, epsilon), sealed)

    def spend_labelled(self, survey: SurveyId, features: Sequence[str], epsilon: float, *,
                       kind: ReleaseKind = ReleaseKind.SUBSET, sealed: SealedReport | None = None) -> None:
        """Record one release about these features and the label at ``epsilon``, with ``sealed``, the message
        carrying it: a subset report (``kind`` SUBSET) or an SGD round's one gradient report (GRADIENT: a
        gradient of a linear model at the peer's record reveals, at most, every feature it is computed from and
        the label). Either is one release at ``epsilon`` in the record-level sum; the kind says what was sent."""
        if kind not in (ReleaseKind.SUBSET, ReleaseKind.GRADIENT):
            raise ValueError(f"a labelled report is a subset or a gradient release, got {kind!r} "
                             f"(a median answer is spend_median's, a model spend_model's)")
        # A subset report is stored as it always was (label set, no kind): the kind column names the others.
        self._spend(Spend(survey.to_bytes(), tuple(features), True, epsilon, None if kind == ReleaseKind.SUBSET else kind), sealed)

    def spend_model(self, blocks: Sequence[SealedReport], features: Sequence[str], epsilon: float) -> None:
        """Record one output-perturbed model (every row's features and label) at ``epsilon``, carried by
        ``blocks``, one sealed message per block of its coordinates (``learning.ModelBlocks``).

        The ledger holds ONE release of ``epsilon`` for the whole model, recorded under the first block's
        survey, and every block's packet is stored with it in the same transaction. Why once: the noise is
        drawn once for the whole vector, calibrated to the L2 sensitivity of the whole vector, so the vector
        is one ε-DP release; the blocks are a fixed, data-independent cut of it, i.e. post-processing, which
        costs nothing more. Charging ε per packet would state ``blocks·ε``, a promise the round never made.
        So a model round's ledger equals its promise ε_T exactly (one release at ε_T), for any block count.
        """
        if not blocks:
            raise ValueError("a model is carried by at least one block")
        first, *rest = blocks
        spend = Spend(first.survey.to_bytes(), tuple(features), True, epsilon, ReleaseKind.MODEL)
        self._spend(spend, first, further=[(out.survey.to_bytes(), out.message, out.receipt) for out in rest])

    def _spend(self, spend: Spend, sealed: SealedReport | None, *, further: Sequence[tuple[bytes, bytes, bytes]] = ()) -> None:
        """Check, then store the release with its message(s) (one transaction, before anything is sent), then hold it in memory."""
        releases = spend.releases()
        self._check(releases)
        packet = None if sealed is None else (sealed.message, sealed.receipt)
        self._store.record_spend(self._peer, self._round_id, spend, packet, further=further)
        self._ledger.record(*releases)
