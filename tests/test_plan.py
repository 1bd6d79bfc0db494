"""Release plans: seeded partitions and subsets, and their record-level cost."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter

import numpy as np
import pytest

from anonml.mechanisms import per_attribute_epsilon, releases_from, total_epsilon
from anonml.protocol import (
    Assignment,
    FeatureSpec,
    PeerRole,
    PlanError,
    ReleasePlan,
    assign_partitions,
    derive_subsets,
    release_roles,
    row_keys,
    worst_case_releases,
)

FEATURES = tuple(f"f{i}" for i in range(12))
NUMERIC = ("f0", "f3", "f7")


def build(**overrides: object) -> ReleasePlan:
    params: dict[str, object] = dict(kind="split", features=FEATURES, numeric_features=NUMERIC, k_p=5, k_h=2, k_s=3, epsilon_total=1.0, seed=b"public seed", median_peers="all")
    params.update(overrides)
    return ReleasePlan.build(**params)  # type: ignore[arg-type]


def test_assignment_is_the_seeded_hash_order_dealt_round_robin() -> None:
    keys = [bytes([i]) * 32 for i in range(23)]
    assignment = assign_partitions(b"seed", keys, 4)
    order = sorted(range(len(keys)), key=lambda i: hashlib.sha256(b"seed" + b"anonml/partition/v1" + keys[i]).digest())
    assert [int(assignment.partition[i]) for i in order] == [r % 4 for r in range(len(keys))]
    sizes = np.bincount(assignment.partition, minlength=4)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == 23
    again = assign_partitions(b"seed", keys, 4)
    assert np.array_equal(again.partition, assignment.partition)
    other = assign_partitions(b"other seed", keys, 4)
    assert not np.array_equal(other.partition, assignment.partition)


@pytest.mark.parametrize(("n", "k_p"), [(1, 1), (10, 3), (1000, 7), (32561, 12)])
def test_partitions_are_balanced(n: int, k_p: int) -> None:
    sizes = np.bincount(assign_partitions(b"s", row_keys(n), k_p).partition, minlength=k_p)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == n


def test_split_subsets_are_disjoint_per_partition_and_seeded() -> None:
    subsets = derive_subsets(b"seed", FEATURES, "split", 6, 3, 4)
    assert subsets == derive_subsets(b"seed", FEATURES, "split", 6, 3, 4)
    assert subsets != derive_subsets(b"seed2", FEATURES, "split", 6, 3, 4)
    for part in subsets:
        names = [n for s in part for n in s]
        assert len(part) == 3 and all(len(s) == 4 for s in part) and len(set(names)) == 12


@pytest.mark.parametrize(("k_p", "k_s"), [(12, 1), (8, 3), (16, 3), (7, 2), (5, 12)])
def test_one_plan_covers_features_evenly_without_repeats(k_p: int, k_s: int) -> None:
    subsets = derive_subsets(b"seed", FEATURES, "one", k_p, 1, k_s)
    assert len(subsets) == k_p and all(len(part) == 1 for part in subsets)
    counts = Counter(n for (s,) in subsets for n in s)
    assert set(counts) == set(FEATURES)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert all(len(set(s)) == k_s for (s,) in subsets)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(k_h=5, k_s=3), "k_h: 5 disjoint subsets of 3 features need 15"),
        (dict(k_s=13), "k_s"),
        (dict(kind="one", k_h=2), "k_h"),
        (dict(kind="one", k_h=1, k_p=3, k_s=3), "cannot cover 12 features"),
        (dict(kind="both"), "kind"),
        (dict(k_p=0), "k_p"),
        (dict(epsilon_total=0.0), "epsilon_total"),
        (dict(median_peers="some"), "median_peers"),
        (dict(k_p=1, k_h=4, k_s=3, median_peers="disjoint"), "every partition releases"),
    ],
)
def test_unsatisfiable_parameters_raise_plan_error(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(PlanError, match=field):
        build(**overrides)


def by_hand_sum(plan: ReleasePlan, partition: int) -> float:
    """The record-level cost of one peer, written out: one comparison per numeric feature it is asked about, and its k_h reports."""
    return len(plan.median_epsilon_by_feature(partition)) * plan.median_epsilon + plan.k_h * plan.release_epsilon


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),  # the thesis's plan, every peer also answering the quantile search
        dict(k_h=1, k_s=3),
        dict(k_h=3, k_s=2, median_share=0.25),
        dict(kind="one", k_p=12, k_h=1, k_s=1, median_peers="disjoint"),
        dict(kind="one", k_p=8, k_h=1, k_s=3),
        dict(k_p=8, k_h=2, k_s=3, median_peers="disjoint", epsilon_total=4.0),
        dict(kind="one", k_p=12, k_h=1, k_s=1, median_peers="reserved", epsilon_total=2.0),
    ],
)
def test_every_peers_record_level_sum_meets_the_target(overrides: dict[str, object]) -> None:
    plan = build(**overrides)
    target = float(overrides.get("epsilon_total", 1.0))  # type: ignore[arg-type]
    for p in range(plan.k_p):
        assert plan.epsilon_of_partition(p) == pytest.approx(by_hand_sum(plan, p))
        releases = [(s, plan.release_epsilon) for s in plan.subsets[p]]
        assert plan.epsilon_of_partition(p) == pytest.approx(total_epsilon(plan.median_epsilon_by_feature(p), releases))
        assert plan.epsilon_of_partition(p) <= target * (1 + 1e-12)
    assert plan.epsilon_total == pytest.approx(target)


def test_the_thesis_plan_divides_the_budget_over_every_release() -> None:
    # Eq. 7.4 gave the thesis's plan eps_e = eps_h = eps_T/2 and called it
    # eps_T, while each peer released 3 comparisons and 2 reports: 2.5 eps_T.
    plan = build()
    assert plan.release_epsilon == pytest.approx(0.25) and plan.median_epsilon == pytest.approx(0.5 / 3)
    releases = releases_from(plan.median_epsilon_by_feature(0), [(s, plan.release_epsilon) for s in plan.subsets[0]])
    assert per_attribute_epsilon(releases) < plan.epsilon_total == pytest.approx(1.0)
    disjoint = build(kind="one", k_p=12, k_h=1, k_s=1, median_peers="disjoint")
    assert disjoint.release_epsilon == pytest.approx(0.5) and disjoint.median_epsilon == pytest.approx(0.5 / 3)


def test_reserved_pool_makes_every_peer_release_exactly_once_at_the_full_budget() -> None:
    plan = build(kind="one", k_p=12, k_h=1, k_s=1, median_peers="reserved", comparison_pool=0.2, median_steps=4, epsilon_total=2.0)
    assert plan.release_epsilon == plan.median_epsilon == 2.0
    assignment = plan.assign(row_keys(1000))
    pool = assignment.members(Assignment.COMPARISON_POOL)
    assert pool.size == 200 and set(assignment.rank[pool].tolist()) == set(range(200))
    answered: list[int] = []
    for feature in NUMERIC:
        groups = plan.median_groups(feature, assignment)
        assert len(groups) == 4
        answered.extend(np.concatenate(groups).tolist())
    # Every pool peer answers exactly one comparison, and no data peer answers any.
    assert sorted(answered) == sorted(pool.tolist())
    for p in range(plan.k_p):
        assert plan.median_epsilon_by_feature(p) == {} and len(plan.subsets[p]) == 1
    assert plan.epsilon_of_partition(Assignment.COMPARISON_POOL) == pytest.approx(2.0)
    assert ReleasePlan.from_dict(plan.to_dict()) == plan


def test_disjoint_median_groups_exclude_releasing_peers_and_use_each_peer_once() -> None:
    plan = build(kind="one", k_p=12, k_h=1, k_s=1, median_peers="disjoint", median_steps=7)
    assignment = assign_partitions(plan.seed, row_keys(1000), plan.k_p)
    for feature in NUMERIC:
        groups = plan.median_groups(feature, assignment)
        members = np.concatenate(groups)
        assert len(groups) == 7 and len(set(members.tolist())) == members.size
        releasing = [p for p in range(plan.k_p) if feature in plan.released_features(p)]
        assert not np.isin(assignment.partition[members], releasing).any()
        assert members.size == np.isin(assignment.partition, releasing, invert=True).sum()
        sizes = [g.size for g in groups]
        assert max(sizes) - min(sizes) <= 1


def test_plan_round_trips_and_rejects_tampering() -> None:
    plan = build(kind="one", k_p=8, k_h=1, k_s=3, oracle="grr")
    assert ReleasePlan.from_dict(plan.to_dict()) == plan
    tampered = plan.to_dict()
    tampered["subsets"][0][0][0], tampered["subsets"][1][0][0] = tampered["subsets"][1][0][0], tampered["subsets"][0][0][0]
    with pytest.raises(PlanError, match="subsets"):
        ReleasePlan.from_dict(tampered)
    for key, value, field in [("seed", "zz", "seed"), ("k_p", True, "k_p"), ("release_epsilon", math.inf, "release_epsilon"), ("subsets", "x", "subsets")]:
        bad = plan.to_dict()
        bad[key] = value
        with pytest.raises(PlanError, match=field):
            ReleasePlan.from_dict(bad)
    with pytest.raises(PlanError, match="missing"):
        ReleasePlan.from_dict({k: v for k, v in plan.to_dict().items() if k != "oracle"})


# Categorical and numeric features interleaved, so "costliest first" has to reorder them.
MIXED_SPEC = FeatureSpec.from_dict({
    "features": [
        {"name": "colour", "type": "categorical", "categories": ["red", "green", "blue"]},
        {"name": "age", "type": "numeric", "low": 0, "high": 100},
        {"name": "shape", "type": "categorical", "categories": ["round", "square"]},
        {"name": "size", "type": "numeric", "low": 0, "high": 10},
        {"name": "city", "type": "categorical", "categories": ["a", "b", "c", "d"]},
    ],
    "label": {"name": "y", "positive": ["1"], "negative": ["0"]},
})


@pytest.mark.parametrize(
    ("k_h", "k_s", "eps_median", "eps_data", "median_rounds"),
    [(2, 2, 0.7, 0.5, 1), (2, 2, 0.1, 0.5, 2), (1, 3, 1.0, 1.0, 1), (3, 1, 0.4, 0.3, 1), (2, 1, 0.9, 0.5, 0)],
)
def test_worst_case_releases_count_every_release_whatever_the_deal(
    k_h: int, k_s: int, eps_median: float, eps_data: float, median_rounds: int
) -> None:
    medians, subsets = worst_case_releases(
        MIXED_SPEC, k_h=k_h, k_s=k_s, eps_median=eps_median, eps_data=eps_data, median_rounds=median_rounds
    )
    assert medians == ({"age": eps_median, "size": eps_median} if median_rounds else {})
    assert len(subsets) == k_h and all(len(s) == k_s and eps == eps_data for s, eps in subsets)
    released = [name for subset, _ in subsets for name in subset]
    assert len(set(released)) == len(released)  # disjoint, as one peer's subsets are (thesis §6.1)
    if median_rounds:
        # The numeric features, which also paid for the median search, are dealt first.
        assert released[:2] == ["age", "size"]
    worst = total_epsilon(medians, subsets)
    # Record level: every comparison and every report, whatever the deal.
    assert worst == pytest.approx((2 * eps_median if median_rounds else 0.0) + k_h * eps_data)
    # The secondary per-attribute figure (eq. 7.4) by hand: a numeric feature
    # released with its comparison, or the label over k_h subsets; the deal
    # named is the worst for it.
    secondary = per_attribute_epsilon(releases_from(medians, subsets))
    assert secondary == pytest.approx(max(eps_data + (eps_median if median_rounds else 0.0), k_h * eps_data))
    deals = [
        [(tuple(order[j * k_s:(j + 1) * k_s]), eps_data) for j in range(k_h)]
        for order in itertools.permutations(MIXED_SPEC.names, k_h * k_s)
    ]
    assert max(per_attribute_epsilon(releases_from(medians, deal)) for deal in deals) == pytest.approx(secondary)
    assert all(total_epsilon(medians, deal) == pytest.approx(worst) for deal in deals[:50])


def test_worst_case_releases_charge_the_label_for_slots_no_deal_can_fill() -> None:
    # k_h·k_s > k_f: no plan exists (derive_subsets refuses it); the fourth slot, left
    # empty, re-counts the first feature, and the label still pays for all four.
    medians, subsets = worst_case_releases(MIXED_SPEC, k_h=4, k_s=2, eps_median=0.2, eps_data=0.5, median_rounds=1)
    assert [s for s, _ in subsets] == [("age", "size"), ("colour", "shape"), ("city",), ("colour",)]
    assert total_epsilon(medians, subsets) == pytest.approx(2 * 0.2 + 4 * 0.5)
    with pytest.raises(PlanError, match="k_h"):
        derive_subsets(b"seed", MIXED_SPEC.names, "split", 2, 4, 2)


def test_a_round_with_a_comparison_pool_has_two_kinds_of_peer_and_promises_the_costlier() -> None:
    """Issue 11: with a reserved pool a peer learns only from the seed whether it answers one comparison
    (a pool peer) or sends its subsets (a data peer), never both; the promise and each peer's consent
    are the costlier kind's record-level sum."""
    roles = release_roles(MIXED_SPEC, k_h=1, k_s=2, eps_median=2.0, eps_data=2.0, median_rounds=2, comparison_pool=True)
    assert roles == {
        PeerRole.COMPARISON_POOL: ({"age": 2.0}, []),
        PeerRole.DATA: ({}, [(("colour", "age"), 2.0)]),  # no feature paid for a comparison too: spec order
    }
    # The one-release plan: either kind spends exactly ε_T = 2.
    assert [total_epsilon(*releases) for releases in roles.values()] == [2.0, 2.0]
    more_data = worst_case_releases(MIXED_SPEC, k_h=2, k_s=2, eps_median=2.0, eps_data=1.5, median_rounds=2, comparison_pool=True)
    assert more_data[0] == {} and total_epsilon(*more_data) == pytest.approx(3.0)
    more_median = worst_case_releases(MIXED_SPEC, k_h=2, k_s=2, eps_median=2.0, eps_data=0.5, median_rounds=2, comparison_pool=True)
    assert more_median == ({"age": 2.0}, [])
    # No median phase, no pool: one kind of peer, as without the option.
    assert list(release_roles(MIXED_SPEC, k_h=1, k_s=2, eps_median=0.0, eps_data=2.0, median_rounds=0, comparison_pool=True)) == [PeerRole.PEER]
