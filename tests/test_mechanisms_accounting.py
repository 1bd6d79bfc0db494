"""Privacy accounting: record-level sums, eq. 7.4 as a secondary figure, the FMT21 shuffle bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anonml.base.errors import AnonMLError
from anonml.mechanisms import (
    BudgetExceeded,
    PopulationLedgers,
    PrivacyLedger,
    Release,
    ReleaseKind,
    ledgers_of_one_release,
    per_attribute_epsilon,
    releases_from,
    shuffle_central_privacy,
    total_epsilon,
)


def test_record_level_epsilon_is_the_sum_of_every_release() -> None:
    # Four features in two subsets (each with the label), medians for two.
    medians = {"age": 0.2, "hours": 0.3}
    subsets = [(("age", "sex"), 0.5), (("hours", "race"), 0.5)]
    # Record level: 0.2 + 0.3 + 0.5 + 0.5, every release counted.
    assert total_epsilon(medians, subsets) == pytest.approx(1.5)
    # Eq. 7.4 (the thesis's per-attribute maximum) said 1.0 for the same
    # releases: it survives only as a secondary figure.
    assert per_attribute_epsilon(releases_from(medians, subsets)) == pytest.approx(1.0)
    assert per_attribute_epsilon(releases_from({"age": 0.9, "hours": 0.3}, subsets)) == pytest.approx(1.4)
    assert total_epsilon({"age": 0.9, "hours": 0.3}, subsets) == pytest.approx(2.2)
    assert total_epsilon({}, [(("a",), 0.4), (("b",), 0.4), (("c",), 0.4)]) == pytest.approx(1.2)
    assert total_epsilon({}, []) == 0.0


def test_a_plan_promised_under_eq_7_4_releases_several_times_its_epsilon() -> None:
    # One comparison bit per numeric feature (six, as Adult's planner asked)
    # and one subset report, each at 1: eq. 7.4 called it 2, the record
    # spends 7. The ledger promised 2 refuses the third release.
    releases = [Release.comparison(f"x{i}", 1.0) for i in range(6)] + [Release.subset(("x0", "y"), 1.0)]
    assert per_attribute_epsilon(releases) == pytest.approx(2.0)
    ledger = PrivacyLedger(2.0)
    ledger.record(*releases[:2])
    with pytest.raises(BudgetExceeded):
        ledger.record(releases[2])
    assert ledger.spent() == pytest.approx(2.0) and ledger.releases == releases[:2]


def test_ledger_records_and_refuses_an_over_budget_release_recording_nothing() -> None:
    ledger = PrivacyLedger(1.0)
    ledger.record_median("age", 0.2)
    ledger.record_median("hours", 0.3)
    ledger.record_subset(["age", "sex"], 0.5)
    assert ledger.spent() == pytest.approx(1.0)
    assert ledger.per_attribute() == pytest.approx(0.7)
    assert ledger.would_exceed([Release.subset(["hours", "race"], 0.5)])
    ledger = PrivacyLedger(1.5, releases=ledger.releases)
    assert not ledger.would_exceed([Release.subset(["hours", "race"], 0.5)])
    assert ledger.would_exceed([Release.subset(["hours", "race"], 0.6)])
    assert ledger.would_exceed([Release.comparison("age", 0.51)])
    before = ledger.releases
    with pytest.raises(BudgetExceeded, match="1.6"):
        ledger.record_subset(["hours", "race"], 0.6)
    with pytest.raises(BudgetExceeded):
        ledger.record_median("age", 0.51)
    assert ledger.releases == before
    ledger.record_subset(["hours", "race"], 0.5)
    assert ledger.spent() == pytest.approx(1.5)
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
    assert PrivacyLedger(2.0, releases=ledger.releases).releases == ledger.releases
    with pytest.raises(BudgetExceeded):
        PrivacyLedger(1.4, releases=ledger.releases)


def test_copies_of_a_ledger_are_independent_and_a_group_release_is_checked_against_the_budget() -> None:
    """A simulated population's ledgers (``PopulationLedgers``, ``ledgers_of_one_release``): each peer's is its
    own, a release that does not fit is refused for the whole group, and a copy refuses what its original would."""
    release = Release.subset(["a"], 1.5)
    ledgers = ledgers_of_one_release(release, 3, 2.0)
    assert [ledger.releases for ledger in ledgers] == [[release]] * 3 and {ledger.spent() for ledger in ledgers} == {1.5}
    ledgers.record([0], Release.subset(["b"], 0.5))
    assert ledgers[0].spent() == 2.0 and ledgers[1].spent() == 1.5 and ledgers[1].releases == [release]
    assert (ledgers.max_spent(), ledgers.max_releases()) == (2.0, 2)
    with pytest.raises(BudgetExceeded):
        ledgers.record([1, 0], Release.subset(["b"], 0.3))  # fits peer 1, not peer 0: neither records it
    assert [ledger.spent() for ledger in ledgers] == [2.0, 1.5, 1.5] and ledgers[1].releases == [release]
    copy = ledgers[2]
    with pytest.raises(BudgetExceeded):
        copy.record(Release.subset(["b"], 0.6))
    copy.record(Release.subset(["b"], 0.5))
    assert ledgers[2].spent() == 1.5  # a peer's ledger is a copy: changing it changes no one else's
    with pytest.raises(BudgetExceeded):
        ledgers_of_one_release(Release.subset(["a"], 2.5), 3, 2.0)
    assert len(ledgers_of_one_release(release, 0, 2.0)) == 0 and [ledger.spent() for ledger in ledgers[1:]] == [1.5, 1.5]


def test_a_population_refuses_a_peer_listed_twice_or_unknown_and_records_nothing() -> None:
    ledgers = PopulationLedgers(4, 1.0)
    release = Release.about(ReleaseKind.GRADIENT, ("x",), 0.5)
    for bad in ([0, 0], [4], [-1], [[0, 1]], [0.0, 1.0]):
        with pytest.raises(ValueError, match="peers"):
            ledgers.record(bad, release)
    ledgers.record(np.array([], dtype=np.int64), release)
    ledgers.record(np.arange(4), release)
    ledgers.record([1, 3], release)
    assert [len(ledger.releases) for ledger in ledgers] == [1, 2, 1, 2] and ledgers.max_spent() == 1.0
    with pytest.raises(BudgetExceeded):
        ledgers.record([0, 1], release)  # peer 1 has spent its ε_T: a third gradient is refused, for peer 0 too
    assert [ledger.spent() for ledger in ledgers] == [0.5, 1.0, 0.5, 1.0]


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
    central = shuffle_central_privacy(epsilon0, n, delta)
    assert central.epsilon == pytest.approx(expected) and central.delta == delta
    assert expected < epsilon0
    assert f"({expected:.3g}, 1e-06)" in central.describe() 
    # More reports, more amplification.
    bigger = shuffle_central_privacy(epsilon0, 10 * n, delta).epsilon
    assert bigger is not None and bigger < expected


def test_shuffle_bound_is_stated_only_where_valid_and_tiny_n_is_flagged() -> None:
    delta = 1e-6
    n = 1000
    limit = math.log(n / (16 * math.log(2 / delta)))  # about 1.46
    assert shuffle_central_privacy(limit + 0.01, n, delta).epsilon is None
    inside = shuffle_central_privacy(limit - 0.01, n, delta).epsilon
    assert inside is not None and inside < limit - 0.01
    # Before, n = 2 gave a figure at delta = 0.25 with no flag.
    tiny = shuffle_central_privacy(1.0, 2)
    assert tiny.epsilon is None and "no central guarantee" in tiny.describe() and "has 2" in tiny.describe()
    # A delta of 1/n or more means nothing: no figure.
    assert shuffle_central_privacy(0.1, 10**6, 1e-6).epsilon is None
    with pytest.raises(ValueError, match="delta"):
        shuffle_central_privacy(1.0, n, 0.0)
    with pytest.raises(ValueError, match="n must"):
        shuffle_central_privacy(1.0, 0, delta)
    with pytest.raises(ValueError, match="epsilon0"):
        shuffle_central_privacy(0.0, n, delta)
