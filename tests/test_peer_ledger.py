"""The peer's durable eq. 7.4 ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from anonml.mechanisms import BudgetExceeded
from anonml.peer._ledger import PeerLedger
from anonml.peer._store import PeerStore
from anonml.protocol._survey import SurveyId

PEER = b"\x01" * 32
ROUND = b"\x02" * 32


def test_the_ledger_refuses_an_over_budget_release_and_records_nothing(tmp_path: Path) -> None:
    store = PeerStore(tmp_path / "peer.sqlite")
    ledger = PeerLedger(store, PEER, ROUND, epsilon_total=1.0)
    ledger.spend_median(SurveyId.median(ROUND, 0), ("age", "hours"), 0.5)
    ledger.spend_subset(SurveyId.data(ROUND, 0, 0), ("age", "sex"), 0.5)
    # eq. 7.4: age 0.5 + 0.5 = 1.0, label 0.5, hours 0.5 -> total 1.0
    assert ledger.spent() == pytest.approx(1.0)
    with pytest.raises(BudgetExceeded):
        # the label would reach 0.5 + 0.6 = 1.1 > 1.0
        ledger.spend_subset(SurveyId.data(ROUND, 0, 1), ("race",), 0.6)
    with pytest.raises(BudgetExceeded):
        # hours would reach 0.5 + 0.6
        ledger.spend_subset(SurveyId.data(ROUND, 0, 1), ("hours",), 0.5 + 0.1)
    assert len(store.spends(PEER, ROUND)) == 2
    ledger.spend_subset(SurveyId.data(ROUND, 0, 1), ("race",), 0.5)
    store.close()

    reopened = PeerLedger(PeerStore(tmp_path / "peer.sqlite"), PEER, ROUND, epsilon_total=1.0)
    assert reopened.spent() == pytest.approx(1.0)
    with pytest.raises(BudgetExceeded):
        reopened.spend_median(SurveyId.median(ROUND, 1), ("age",), 0.01)  # age would reach 1.01


def test_a_survey_is_spent_on_once(tmp_path: Path) -> None:
    from anonml.peer._store import StoreError

    ledger = PeerLedger(PeerStore(tmp_path / "peer.sqlite"), PEER, ROUND, epsilon_total=10.0)
    ledger.spend_subset(SurveyId.data(ROUND, 0, 0), ("age",), 0.5)
    with pytest.raises(StoreError):
        ledger.spend_subset(SurveyId.data(ROUND, 0, 0), ("age",), 0.5)
    assert ledger.spent() == pytest.approx(0.5)
