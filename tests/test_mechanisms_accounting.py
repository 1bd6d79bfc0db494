"""Privacy accounting: thesis eq. 7.4 and the FMT21 shuffle bound."""

from __future__ import annotations

import math

import pytest

from anonml.errors import AnonMLError
from anonml.mechanisms import (
    BudgetExceeded,
    PrivacyLedger,
    shuffle_amplified_epsilon,
    total_epsilon,
)


def test_eq_7_4_worked_example() -> None:
    # Four features in two subsets (each with the label), medians for two.
    # eps_f: age 0.2+0.5, sex 0.5, hours 0.3+0.5, race 0.5; eps_l = 0.5+0.5.
    medians = {"age": 0.2, "hours": 0.3}
    subsets = [(("age", "sex"), 0.5), (("hours", "race"), 0.5)]
    assert total_epsilon(medians, subsets) == pytest.approx(1.0)  # the label dominates
    # A costlier median makes a feature dominate: 0.9 + 0.5 = 1.4.
    assert total_epsilon({"age": 0.9, "hours": 0.3}, subsets) == pytest.approx(1.4)
    # Three subsets: the label budget adds up (k_h * eps_h, thesis §7.4).
    assert total_epsilon({}, [(("a",), 0.4), (("b",), 0.4), (("c",), 0.4)]) == pytest.approx(1.2)
    # A feature released in two subsets pays both.
    assert total_epsilon({"a": 1.0}, [(("a",), 0.4), (("a", "b"), 0.4)]) == pytest.approx(1.8)
    assert total_epsilon({}, []) == 0.0


def test_ledger_records_and_refuses_an_over_budget_release_recording_nothing() -> None:
    ledger = PrivacyLedger(1.0)
    ledger.record_median("age", 0.2)
    ledger.record_median("hours", 0.3)
    ledger.record_subset(["age", "sex"], 0.5)
    assert ledger.spent() == pytest.approx(0.7)
    assert not ledger.would_exceed(subsets=[(["hours", "race"], 0.5)])
    assert ledger.would_exceed(subsets=[(["hours", "race"], 0.6)])
    assert ledger.would_exceed(medians={"age": 0.31})
    before = (ledger.medians, ledger.subsets)
    with pytest.raises(BudgetExceeded, match="1.1"):
        ledger.record_subset(["hours", "race"], 0.6)
    with pytest.raises(BudgetExceeded):
        ledger.record_median("age", 0.5)
    assert (ledger.medians, ledger.subsets) == before
    ledger.record_subset(["hours", "race"], 0.5)
    assert ledger.spent() == pytest.approx(1.0)
    assert ledger.remaining() == pytest.approx(0.0)
    assert ledger.spent() == total_epsilon(ledger.medians, ledger.subsets)
    assert isinstance(BudgetExceeded("x"), AnonMLError) and not isinstance(BudgetExceeded("x"), ValueError)


def test_ledger_tolerates_float_rounding_but_not_more() -> None:
    ledger = PrivacyLedger(0.3)
    ledger.record_subset(["a"], 0.1)
    ledger.record_subset(["b"], 0.2)  # 0.1 + 0.2 = 0.30000000000000004
    with pytest.raises(BudgetExceeded):
        ledger.record_subset(["c"], 1e-6)


def test_ledger_rebuilds_from_its_records_and_refuses_over_budget_records() -> None:
    ledger = PrivacyLedger(2.0)
    ledger.record_median("age", 0.5)
    ledger.record_subset(("age", "sex"), 1.0)
    rebuilt = PrivacyLedger(2.0, medians=ledger.medians, subsets=ledger.subsets)
    assert rebuilt.spent() == ledger.spent()
    with pytest.raises(BudgetExceeded):
        PrivacyLedger(1.0, medians=ledger.medians, subsets=ledger.subsets)


def test_bad_ledger_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="epsilon_total"):
        PrivacyLedger(0.0)
    ledger = PrivacyLedger(1.0)
    with pytest.raises(ValueError, match="epsilon"):
        ledger.record_median("age", -0.1)
    with pytest.raises(ValueError, match="string"):
        ledger.record_subset("age", 0.1)
    with pytest.raises(ValueError, match="distinct"):
        ledger.record_subset(["age", "age"], 0.1)
    with pytest.raises(ValueError, match="pair"):
        total_epsilon({}, [("age",)])  # type: ignore[list-item]
    assert ledger.spent() == 0.0


def test_shuffle_bound_matches_fmt21_theorem_3_1() -> None:
    epsilon0, n, delta = 1.0, 10_000, 1e-6
    lam = math.e
    expected = math.log(1 + (lam - 1) / (lam + 1) * (8 * math.sqrt(lam * math.log(4 / delta)) / math.sqrt(n) + 8 * lam / n))
    assert shuffle_amplified_epsilon(epsilon0, n, delta) == pytest.approx(expected)
    assert expected < epsilon0
    # More reports, more amplification.
    assert shuffle_amplified_epsilon(epsilon0, 100 * n, delta) < expected


def test_shuffle_bound_returns_epsilon0_outside_its_validity() -> None:
    delta = 1e-6
    n = 1000
    limit = math.log(n / (16 * math.log(2 / delta)))  # about 1.46
    assert shuffle_amplified_epsilon(limit + 0.01, n, delta) == limit + 0.01
    assert shuffle_amplified_epsilon(0.5, 10, delta) == 0.5  # n too small: limit < 0
    # Inside the bound's validity it amplifies: strictly below the local epsilon.
    assert shuffle_amplified_epsilon(limit - 0.01, n, delta) < limit - 0.01
    with pytest.raises(ValueError, match="delta"):
        shuffle_amplified_epsilon(1.0, n, 0.0)
    with pytest.raises(ValueError, match="n must"):
        shuffle_amplified_epsilon(1.0, 0, delta)
    with pytest.raises(ValueError, match="epsilon0"):
        shuffle_amplified_epsilon(0.0, n, delta)
