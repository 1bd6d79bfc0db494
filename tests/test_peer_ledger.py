"""The peer's durable record-level ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from anonml.mechanisms import BudgetExceeded, ReleaseKind
from anonml.peer._ledger import PeerLedger
from anonml.peer._store import PeerStore
from anonml.protocol._survey import SurveyId

PEER = b"\x01" * 32
ROUND = b"\x02" * 32


def test_the_ledger_refuses_an_over_budget_release_and_records_nothing(tmp_path: Path) -> None:
    store = PeerStore(tmp_path / "peer.sqlite")
    ledger = PeerLedger(store, PEER, ROUND, epsilon_total=2.0)
    ledger.spend_median(SurveyId.median(ROUND, 0, 0), ("age", "hours"), 0.5)
    ledger.spend_labelled(SurveyId.data(ROUND, 0, 0), ("age", "sex"), 0.5)
    # Record level: two comparison bits and one report, 0.5 each -> 1.5
    # (eq. 7.4 called this 1.0).
    assert ledger.spent() == pytest.approx(1.5)
    with pytest.raises(BudgetExceeded):
        # 1.5 + 0.6 = 2.1 > 2.0, whatever the report is about
        ledger.spend_labelled(SurveyId.data(ROUND, 0, 1), ("race",), 0.6)
    assert len(store.spends(PEER, ROUND)) == 2
    ledger.spend_labelled(SurveyId.data(ROUND, 0, 1), ("race",), 0.5)
    store.close()

    reopened = PeerLedger(PeerStore(tmp_path / "peer.sqlite"), PEER, ROUND, epsilon_total=2.0)
    assert reopened.spent() == pytest.approx(2.0)
    with pytest.raises(BudgetExceeded):
        reopened.spend_median(SurveyId.median(ROUND, 1, 0), ("age",), 0.01)  # 2.01


def test_a_survey_is_spent_on_once(tmp_path: Path) -> None:
    from anonml.peer._store import StoreError

    ledger = PeerLedger(PeerStore(tmp_path / "peer.sqlite"), PEER, ROUND, epsilon_total=10.0)
    ledger.spend_labelled(SurveyId.data(ROUND, 0, 0), ("age",), 0.5)
    with pytest.raises(StoreError):
        ledger.spend_labelled(SurveyId.data(ROUND, 0, 0), ("age",), 0.5)
    assert ledger.spent() == pytest.approx(0.5)


def test_a_median_answer_listing_a_feature_twice_is_checked_as_two_bits_before_it_is_stored(tmp_path: Path) -> None:
    # A malicious aggregator's thresholds may name one feature many times; the
    # peer answers (and reveals) one bit per entry, so each must be counted
    # before anything is recorded: 3 x 0.5 = 1.5 > 1.0.
    store = PeerStore(tmp_path / "peer.sqlite")
    ledger = PeerLedger(store, PEER, ROUND, epsilon_total=1.0)
    with pytest.raises(BudgetExceeded):
        ledger.spend_median(SurveyId.median(ROUND, 0, 0), ("age", "age", "age"), 0.5)
    assert store.spends(PEER, ROUND) == []
    assert ledger.spent() == 0.0
    ledger.spend_median(SurveyId.median(ROUND, 0, 0), ("age", "age"), 0.5)
    store.close()
    assert PeerLedger(PeerStore(tmp_path / "peer.sqlite"), PEER, ROUND, epsilon_total=1.0).spent() == pytest.approx(1.0)


def test_a_stored_spend_is_one_release_per_median_bit_and_one_per_subset_report() -> None:
    # The one rule the ledger rebuild and the consent text's earlier-rounds sum both read.
    from anonml.mechanisms import Release, record_level_epsilon
    from anonml.peer._store import Spend

    median = Spend(SurveyId.median(ROUND, 0, 0).to_bytes(), ("age", "hours"), False, 0.5)
    subset = Spend(SurveyId.data(ROUND, 0, 0).to_bytes(), ("age", "sex"), True, 0.5)
    assert median.releases() == [Release.comparison("age", 0.5), Release.comparison("hours", 0.5)]
    assert subset.releases() == [Release.subset(("age", "sex"), 0.5)]
    assert record_level_epsilon([*median.releases(), *subset.releases()]) == pytest.approx(1.5)


def test_epsilons_add_up_across_rounds_and_the_lifetime_budget_caps_the_sum(tmp_path: Path) -> None:
    # DESIGN.md §8: the ledger enforces the record-level sum across rounds. Each
    # round below stays within its own promise (2.0); the third would take the
    # sum past the lifetime budget and is refused before anything is stored.
    from anonml.peer._store import DEFAULT_LIFETIME_EPSILON

    store = PeerStore(tmp_path / "peer.sqlite")
    assert store.lifetime_epsilon() == DEFAULT_LIFETIME_EPSILON
    store.set_lifetime_epsilon(5.0)
    rounds = [bytes([0x10 + i]) * 32 for i in range(3)]
    for round_id in rounds[:2]:
        ledger = PeerLedger(store, PEER, round_id, epsilon_total=2.0)
        ledger.spend_median(SurveyId.median(round_id, 0, 0), ("age",), 0.5)
        ledger.spend_labelled(SurveyId.data(round_id, 0, 0), ("age", "sex"), 1.5)
    third = PeerLedger(store, PEER, rounds[2], epsilon_total=2.0)
    assert third.earlier_rounds() == {rounds[0]: pytest.approx(2.0), rounds[1]: pytest.approx(2.0)}
    assert third.lifetime_after(medians={"age": 0.5}, subsets=[(("age",), 1.5)]) == pytest.approx(6.0)
    with pytest.raises(BudgetExceeded, match="lifetime budget of 5"):
        third.check(medians={"age": 0.5}, subsets=[(("age",), 1.5)])
    with pytest.raises(BudgetExceeded, match="lifetime budget"):
        third.spend_labelled(SurveyId.data(rounds[2], 0, 0), ("age",), 1.5)
    assert store.spends(PEER, rounds[2]) == []
    third.spend_labelled(SurveyId.data(rounds[2], 0, 0), ("age",), 1.0)  # 5.0: exactly the budget
    # Another identity in the same store has its own sum (the demo keeps many peers in one store).
    PeerLedger(store, b"\x03" * 32, rounds[2], epsilon_total=2.0).spend_labelled(SurveyId.data(rounds[2], 0, 1), ("age",), 2.0)
    store.close()

    # The budget and the sums persist; raising the budget lets the peer join again.
    reopened = PeerStore(tmp_path / "peer.sqlite")
    assert reopened.lifetime_epsilon() == 5.0
    with pytest.raises(BudgetExceeded):
        PeerLedger(reopened, PEER, b"\x20" * 32, epsilon_total=2.0).spend_labelled(SurveyId.data(b"\x20" * 32, 0, 0), ("age",), 0.1)
    reopened.set_lifetime_epsilon(7.0)
    PeerLedger(reopened, PEER, b"\x20" * 32, epsilon_total=2.0).spend_labelled(SurveyId.data(b"\x20" * 32, 0, 0), ("age",), 2.0)
    with pytest.raises(ValueError):
        reopened.set_lifetime_epsilon(0.0)
    reopened.close()


def test_a_gradient_report_is_stored_as_a_gradient_release_and_sums_to_the_promise(tmp_path: Path) -> None:
    store = PeerStore(tmp_path / "peer.sqlite")
    ledger = PeerLedger(store, PEER, ROUND, epsilon_total=4.0)
    with pytest.raises(ValueError, match="subset or a gradient"):
        ledger.spend_labelled(SurveyId.median(ROUND, 0, 1), ("age", "sex"), 4.0, kind=ReleaseKind.MODEL)
    ledger.spend_labelled(SurveyId.median(ROUND, 0, 1), ("age", "sex"), 4.0, kind=ReleaseKind.GRADIENT)
    # Rebuilt from the store (as a restarted peer does): one gradient release at exactly ε_T, not a subset report.
    reopened = PeerLedger(PeerStore(tmp_path / "peer.sqlite"), PEER, ROUND, epsilon_total=4.0)
    assert [(r.kind, r.features, r.epsilon) for r in reopened.releases()] == [(ReleaseKind.GRADIENT, ("age", "sex"), 4.0)]
    assert reopened.spent() == 4.0
    with pytest.raises(BudgetExceeded):
        reopened.spend_labelled(SurveyId.data(ROUND, 0, 0), ("age",), 1e-6)
