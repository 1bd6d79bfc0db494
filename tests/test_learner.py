"""The partition ensemble, the planner, and one private trial's bookkeeping."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.utils.estimator_checks import parametrize_with_checks

from anonml.learning import (
    PartitionEnsemble,
    SubsetHistogram,
    adult_spec,
    choose_plan,
    exact_histogram,
    plan_objective,
    run_trial,
)
from anonml.learning._data import Table
from anonml.mechanisms import BudgetExceeded, QuantileSearch
from anonml.protocol import (
    CategoricalFeature,
    FeatureSpec,
    LabelSpec,
    NumericFeature,
    PlanError,
    ReleasePlan,
    assign_partitions,
    row_keys,
)


@parametrize_with_checks([PartitionEnsemble(), PartitionEnsemble(base="tree", vote="soft", scoring="roc_auc")])
def test_sklearn_estimator_checks(estimator: PartitionEnsemble, check: object) -> None:
    check(estimator)  # type: ignore[operator]


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Four binary features and a label that depends on them (logistic)."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 2, size=(n, 4))
    logit = -1.0 + 1.5 * X[:, 0] + 1.0 * X[:, 1] - 0.8 * X[:, 2] + 0.0 * X[:, 3]
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return X.astype(np.int64), y


SUBSETS = [((0, 1), 0), ((2, 3), 0), ((0, 2), 1), ((1, 3), 1)]


def exact_members(X: np.ndarray, y: np.ndarray) -> list[SubsetHistogram]:
    halves = [np.arange(len(y)) % 2 == p for p in range(2)]
    return [exact_histogram(cols, (2, 2), X[halves[p]], y[halves[p]], p) for cols, p in SUBSETS]


def test_exact_histograms_give_the_noise_free_ensemble() -> None:
    """Each member trained on its exact histogram is the logistic regression
    trained on that partition's actual rows (same objective, same weights),
    and the ensemble's score is eq. 6.2 over those members."""
    X, y = synthetic(4000, seed=1)
    model = PartitionEnsemble(balance=False, random_state=0).fit_histograms(exact_members(X, y), n_bins=(2, 2, 2, 2))
    halves = [np.arange(len(y)) % 2 == p for p in range(2)]
    cells = np.array([[0, 0, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
    members = model.member_probabilities(cells)
    for i, (cols, p) in enumerate(SUBSETS):
        rows = halves[p]
        # sklearn's objective with weights scaled to mean 1 over the m cells:
        # C_eff = C * m / n on the raw rows.
        reference = LogisticRegression(C=8 / rows.sum(), tol=1e-12, max_iter=10_000).fit(X[rows][:, cols], y[rows])
        assert members[:, i] == pytest.approx(reference.predict_proba(cells[:, cols])[:, 1], abs=1e-6)
    weights = model.scores_
    expected = (2.0 * (members >= 0.5) - 1.0) @ weights / weights.sum()
    assert model.decision_function(cells) == pytest.approx(expected)
    assert np.array_equal(model.predict(cells), (expected >= 0).astype(int))
    assert model.predict_proba(cells)[:, 1] == pytest.approx((expected + 1) / 2)
    soft = PartitionEnsemble(balance=False, vote="soft", random_state=0).fit_histograms(exact_members(X, y), n_bins=(2, 2, 2, 2))
    assert soft.decision_function(cells) == pytest.approx(members @ soft.scores_ / soft.scores_.sum() - 0.5)


def test_fit_on_rows_equals_fit_on_their_exact_histograms() -> None:
    rng = np.random.default_rng(2)
    raw = rng.normal(size=(3000, 4))
    y = (raw @ np.array([1.0, 0.5, -0.5, 0.0]) + rng.normal(size=3000) > 0).astype(np.int64)
    by_rows = PartitionEnsemble(random_state=3).fit(raw, y)
    assert by_rows.cut_points_ == pytest.approx(np.median(raw, axis=0))
    binned = (raw > np.median(raw, axis=0)).astype(np.int64)
    histograms = [exact_histogram((j,), (2,), binned, y) for j in range(4)]
    by_histograms = PartitionEnsemble(random_state=3).fit_histograms(histograms, n_bins=(2, 2, 2, 2))
    assert np.array_equal(by_rows.scores_, by_histograms.scores_)
    assert by_rows.decision_function(raw) == pytest.approx(by_histograms.decision_function(binned))


def test_cross_validated_weights_rank_informative_members_first() -> None:
    X, y = synthetic(20000, seed=4)
    histograms = [exact_histogram((j,), (2,), X, y) for j in range(4)]
    model = PartitionEnsemble(scoring="roc_auc", random_state=0).fit_histograms(histograms, n_bins=(2, 2, 2, 2))
    # Feature 0 has the largest effect, feature 3 none (AUC about 1/2).
    assert np.argmax(model.scores_) == 0
    assert model.scores_[3] == pytest.approx(0.5, abs=0.03)


def test_sampled_training_is_reproducible_and_close_to_weighted() -> None:
    X, y = synthetic(20000, seed=5)
    histograms = exact_members(X, y)
    first = PartitionEnsemble(training="sampled", vote="soft", random_state=7).fit_histograms(histograms, n_bins=(2,) * 4)
    second = PartitionEnsemble(training="sampled", vote="soft", random_state=7).fit_histograms(histograms, n_bins=(2,) * 4)
    weighted = PartitionEnsemble(vote="soft", random_state=7).fit_histograms(histograms, n_bins=(2,) * 4)
    assert np.array_equal(first.decision_function(X[:50]), second.decision_function(X[:50]))
    assert first.member_probabilities(X[:50]) == pytest.approx(weighted.member_probabilities(X[:50]), abs=0.05)


def test_predict_checks_fitted_and_bins() -> None:
    with pytest.raises(NotFittedError):
        PartitionEnsemble().predict(np.zeros((2, 4), dtype=int))
    X, y = synthetic(500, seed=6)
    model = PartitionEnsemble().fit_histograms(exact_members(X, y), n_bins=(2,) * 4)
    with pytest.raises(ValueError, match=r"X\[0, 2\] = 5"):
        model.predict(np.array([[0, 0, 5, 0]]))
    with pytest.raises(ValueError, match="features"):
        model.predict(np.zeros((1, 3), dtype=int))
    with pytest.raises(ValueError, match="n_bins"):
        PartitionEnsemble().fit_histograms(exact_members(X, y), n_bins=(2, 3, 2, 2))
    with pytest.raises(ValueError, match="vote"):
        PartitionEnsemble(vote="majority").fit_histograms(exact_members(X, y), n_bins=(2,) * 4)


def binary_spec(k_f: int) -> FeatureSpec:
    return FeatureSpec(tuple(CategoricalFeature(f"f{i}", ("a", "b")) for i in range(k_f)), LabelSpec("y", ("1",), ("0",)))


def test_planner_prefers_one_subset_per_peer_and_small_domains() -> None:
    """The marginal-error objective: splitting the budget over k_h subsets
    costs more than it pools, and larger subsets cost more than they pool."""
    spec = binary_spec(6)
    for eps in (0.5, 1.0, 4.0):
        choice = choose_plan(spec, 20_000, eps, b"seed")
        assert (choice.plan.kind, choice.plan.k_s, choice.plan.k_h) == ("one", 1, 1)
        assert choice.plan.k_p == 6  # the objective is flat in k_p; ties go to the fewest histograms
        assert choice.plan.epsilon_total == pytest.approx(eps)


def test_planner_uses_disjoint_median_peers_when_there_are_numeric_features() -> None:
    spec = FeatureSpec((NumericFeature("x", 0, 1), *binary_spec(5).features), LabelSpec("y", ("1",), ("0",)))
    choice = choose_plan(spec, 20_000, 1.0, b"seed")
    assert choice.plan.median_peers == "disjoint" and choice.plan.release_epsilon == pytest.approx(1.0)
    thesis = choose_plan(spec, 20_000, 1.0, b"seed", kinds=("split",), median_peers=("all",))
    assert plan_objective(spec, thesis.plan, 20_000) > choice.objective


def test_planner_oracle_follows_the_domain_size() -> None:
    """GRR wins for small domains at large ε; unary/subset encodings for large domains at small ε (thesis §7.3.4)."""
    spec = binary_spec(8)
    small = choose_plan(spec, 50_000, 4.0, b"s", k_s_values=(1,)).plan
    large = choose_plan(spec, 50_000, 0.5, b"s", kinds=("one",), k_s_values=(7,)).plan
    assert small.oracle == "grr"
    assert large.oracle != "grr"


def test_planner_reports_unsatisfiable_requests() -> None:
    with pytest.raises(PlanError, match="no satisfiable plan"):
        choose_plan(binary_spec(3), 10, 1.0, b"s")


def tiny_table(n: int, seed: int) -> Table:
    rng = np.random.default_rng(seed)
    age = rng.integers(17, 91, n).astype(np.float64)
    sex = rng.choice(["M", "F"], n)
    rich = (rng.random(n) < np.where(age > 40, 0.5, 0.1) * np.where(sex == "M", 1.5, 0.7)).astype(int)
    return Table({"age": age, "sex": sex}, np.where(rich == 1, "yes", "no"))


def test_a_private_trial_records_the_plans_cost_and_beats_chance() -> None:
    spec = FeatureSpec((NumericFeature("age", 17, 90), CategoricalFeature("sex", ("M", "F"))), LabelSpec("rich", ("yes",), ("no",)))
    train, test = tiny_table(20_000, 1), tiny_table(5_000, 2)
    plan = ReleasePlan.build(kind="one", features=spec.names, numeric_features=spec.numeric_names, k_p=4, k_h=1, k_s=1, epsilon_total=2.0, seed=b"trial", median_peers="disjoint")
    result = run_trial(spec, train, test, plan, np.random.default_rng(0), ensembles=[{"vote": "weighted"}, {"vote": "soft"}])
    # Recorded from the queries actually made, in one ledger per partition.
    assert result.epsilon_total == pytest.approx(plan.epsilon_total) == pytest.approx(2.0)
    thesis = ReleasePlan.build(kind="split", features=spec.names, numeric_features=spec.numeric_names, k_p=3, k_h=2, k_s=1, epsilon_total=1.0, seed=b"t")
    assert run_trial(spec, train, test, thesis, np.random.default_rng(1), epsilon_budget=1.0).epsilon_total == pytest.approx(1.0)
    overspending = dataclasses.replace(thesis, release_epsilon=0.6)  # label: 2 x 0.6 > 1
    with pytest.raises(BudgetExceeded):
        run_trial(spec, train, test, overspending, np.random.default_rng(1), epsilon_budget=1.0)
    assert sum(result.oracles.values()) == 4
    # Algorithm 1's error bound, as in test_mechanisms_quantiles: while the
    # estimate's "greater" fraction is further than the margin + 4.5 sd from
    # 1/2 the search moves towards it; ages are uniform on [17, 90], so a
    # fraction error is 73 times that in years.
    groups = plan.median_groups("age", assign_partitions(plan.seed, row_keys(train.n_rows), plan.k_p))
    search = QuantileSearch(17.0, 90.0, plan.median_epsilon)
    keep = math.exp(plan.median_epsilon) / (1 + math.exp(plan.median_epsilon))
    smallest = min(len(g) for g in groups)
    sd = math.sqrt(keep * (1 - keep)) / ((2 * keep - 1) * math.sqrt(smallest))
    bound = 73.0 * (search.margin_of_error(smallest) + 4.5 * sd) + 73.0 / 2 ** (len(groups) + 1)
    assert abs(result.cut_points["age"][0] - float(np.median(train.columns["age"]))) <= bound < 10.0
    assert all(auc > 0.6 for auc in result.aucs)
    exact = run_trial(spec, train, test, plan, np.random.default_rng(0), noise_free=True)
    assert exact.epsilon_total == 0.0 and exact.cut_points["age"] == [float(np.median(train.columns["age"]))]


def test_adult_spec_is_all_binary_and_drops_redundant_columns() -> None:
    spec = adult_spec()
    assert set(spec.n_bins) == {2} and len(spec.names) == 12
    assert "education" not in spec.names and "fnlwgt" not in spec.names
