"""The seeds' other learners and tasks (issue 28): Harmony's dimension
sampling and LDP gradient descent, DP averaging of local models, statistic
tasks and their error formulas, and the experiment's learner comparison."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from anonml.learning import (
    LDPGradientDescent,
    Loss,
    ModelAveraging,
    OutputPerturbation,
    cdf_variances,
    count_task,
    count_variance,
    Table,
    experiment,
    fit_regularized_logistic,
    hadamard_entries,
    hadamard_order,
    histogram_task,
    mean_task,
    mean_variance,
    mixed_statistics,
    quantile_task,
    unit_ball_rows,
)
from anonml.protocol import FeatureSpec
from anonml.mechanisms import (
    OneBitMean,
    OptimizedUnaryEncoding,
    ReleaseKind,
    one_bit_mean_variance,
    one_bit_report_variance,
)

TRIALS = 100
# "Within 1.5 x the formula" both ways: the empirical mean squared error over
# TRIALS runs lies in [formula / 1.5, 1.5 formula] (relative sd ~ 0.14 here).
RATIO = 1.5


def _within_formula(errors: list[float], formula: float) -> None:
    empirical = float(np.mean(np.square(errors)))
    assert formula / RATIO <= empirical <= RATIO * formula, (empirical, formula)


# --- Harmony's 1-bit mechanism with dimension sampling ---------------------


def test_report_variance_is_harmony_lemma_3() -> None:
    c = (math.e + 1) / (math.e - 1)
    assert one_bit_report_variance(1.0, 5, 0.5) == pytest.approx(5 * c * c - 0.25)
    assert one_bit_mean_variance(1.0, 5, 10)[0] == pytest.approx(5 * c * c / 10)


def test_dimension_sampling_is_unbiased_within_its_variance() -> None:
    rng = np.random.default_rng(11)
    n, d = 40_000, 6
    values = rng.uniform(-1, 1, size=(n, d)) * np.linspace(0.2, 1, d)
    mechanism = OneBitMean(1.0, d)
    estimate = mechanism.estimate(mechanism.privatize(values, rng))
    sd = np.sqrt(one_bit_mean_variance(1.0, d, n, values))
    # 4.5 standard deviations per coordinate: a false alarm below 1e-4 for all six.
    assert np.all(np.abs(estimate - values.mean(axis=0)) <= 4.5 * sd)
    assert np.allclose(mechanism.variance(n, values), one_bit_mean_variance(1.0, d, n, values))


def test_dimension_sampling_error_matches_its_formula() -> None:
    rng = np.random.default_rng(12)
    n, d = 1_000, 4
    values = rng.uniform(-1, 1, size=(n, d))
    mechanism = OneBitMean(2.0, d)
    errors = [mechanism.estimate(mechanism.privatize(values, rng)) - values.mean(axis=0) for _ in range(TRIALS)]
    formula = one_bit_mean_variance(2.0, d, n, values)
    for j in range(d):
        _within_formula([e[j] for e in errors], float(formula[j]))


# --- statistic tasks ---------------------------------------------------------


def test_count_error_within_formula_and_one_release_each() -> None:
    rng = np.random.default_rng(21)
    flags = rng.random(1_000) < 0.3
    answers = [count_task(flags, 1.0, rng) for _ in range(TRIALS)]
    _within_formula([a.estimate - flags.sum() for a in answers], count_variance(1.0, flags.size))
    assert answers[0].variance == count_variance(1.0, flags.size)
    ledgers = answers[0].ledgers
    assert len(ledgers) == flags.size and all(len(ledger.releases) == 1 and ledger.spent() == 1.0 for ledger in ledgers)
    assert ledgers[0].releases[0].kind == ReleaseKind.STATISTIC


def test_mean_error_within_formula() -> None:
    rng = np.random.default_rng(22)
    values = rng.uniform(20, 70, size=1_000)
    answers = [mean_task(values, 17, 90, 1.0, rng) for _ in range(TRIALS)]
    exact = mean_variance(1.0, values.size, 17, 90, values)
    _within_formula([a.estimate - values.mean() for a in answers], exact)
    # The stated figure is the worst case over the secret values.
    assert answers[0].variance >= exact


def test_histogram_error_within_formula() -> None:
    rng = np.random.default_rng(23)
    codes = rng.integers(0, 8, size=1_000)
    truth = np.bincount(codes, minlength=8)
    errors, formula = [], 0.0
    for _ in range(TRIALS):
        counts, answer = histogram_task(codes, 8, 1.0, rng)
        errors.append(float(np.sqrt(np.sum((counts - truth) ** 2))))
        formula = answer.variance
    _within_formula(errors, formula)


def test_the_formula_check_fails_on_a_mechanism_at_the_wrong_scale() -> None:
    """The 1.5x check can fail: counts perturbed at ε = 0.7 but stated with
    the ε = 1 formula (noise variance 2.1 times larger than stated)."""
    rng = np.random.default_rng(21)
    flags = rng.random(1_000) < 0.3
    answers = [count_task(flags, 0.7, rng) for _ in range(TRIALS)]
    with pytest.raises(AssertionError):
        _within_formula([a.estimate - flags.sum() for a in answers], count_variance(1.0, flags.size))
    _within_formula([a.estimate - flags.sum() for a in answers], count_variance(0.7, flags.size))


def test_quantile_cdf_error_within_formula() -> None:
    rng = np.random.default_rng(24)
    values = rng.normal(40, 10, size=1_000)
    cuts = np.linspace(10, 70, 13)
    bins = np.searchsorted(cuts, values, side="left")
    truth_counts = np.bincount(bins, minlength=cuts.size + 1)
    median_bin = int(np.searchsorted(np.cumsum(truth_counts) / values.size, 0.5))
    true_cdf = np.cumsum(truth_counts)[median_bin] / values.size
    errors, answers = [], []
    for _ in range(TRIALS):
        cdf, answer = quantile_task(values, cuts, 0.5, 1.0, rng)
        errors.append(float(cdf[median_bin] - true_cdf))
        answers.append(answer.estimate)
    formula = float(cdf_variances(OptimizedUnaryEncoding(1.0, cuts.size + 1), truth_counts)[median_bin])
    _within_formula(errors, formula)
    assert abs(np.median(answers) - np.median(values)) <= 2 * (cuts[1] - cuts[0])


def _mixed_table(n: int, rng: np.random.Generator) -> tuple[FeatureSpec, Table]:
    spec = FeatureSpec.from_toml(
        '[[features]]\nname = "age"\ntype = "numeric"\nlow = 17\nhigh = 90\n'
        '[[features]]\nname = "colour"\ntype = "categorical"\ncategories = ["red", "green", "blue"]\n'
        '[[features]]\nname = "hours"\ntype = "numeric"\nlow = 0\nhigh = 100\n'
        '[label]\nname = "y"\npositive = ["yes"]\nnegative = ["no"]\n'
    )
    columns = {
        "age": rng.uniform(20, 70, size=n),
        "colour": rng.choice(np.array(["red", "green", "blue"]), size=n, p=[0.6, 0.3, 0.1]),
        "hours": rng.normal(40, 10, size=n),
    }
    return spec, Table(columns, np.where(rng.random(n) < 0.5, "yes", "no"))


def test_harmony_mixed_means_and_frequencies_within_formula() -> None:
    rng = np.random.default_rng(25)
    spec, table = _mixed_table(2_000, rng)
    hours = np.clip(table.column("hours"), 0, 100)
    truth = {"age": table.column("age").mean(), "hours": hours.mean()}
    colour_truth = np.array([np.mean(table.column("colour") == c) for c in ("red", "green", "blue")])
    reports = [mixed_statistics(spec, table, 2.0, rng) for _ in range(TRIALS)]
    first = reports[0]
    for name in ("age", "hours"):
        answer = first.answers[name]
        assert answer.kind == "mean" and answer.worst_case_variance >= answer.variance[0]
        _within_formula([r.answers[name].estimate[0] - truth[name] for r in reports], float(answer.variance[0]))
    colour = first.answers["colour"]
    assert colour.kind == "frequency" and colour.estimate.shape == (3,)
    for bin_index in range(3):
        _within_formula([r.answers["colour"].estimate[bin_index] - colour_truth[bin_index] for r in reports], float(colour.variance[bin_index]))
    # One release per peer about the whole tuple, at ε: not one per attribute.
    assert len(first.ledgers) == 2_000
    assert all(len(ledger.releases) == 1 and ledger.spent() == 2.0 for ledger in first.ledgers)
    # Lemma 4's scaling: the variance grows with d (three attributes here).
    c = (math.exp(2.0) + 1) / math.expm1(2.0)
    assert colour.worst_case_variance == pytest.approx(3 * c * c / 2_000)


def test_hadamard_rows_are_orthogonal() -> None:
    order = hadamard_order(5)
    assert order == 8 and hadamard_order(1) == 1 and hadamard_order(8) == 8
    s, v = np.meshgrid(np.arange(order), np.arange(order), indexing="ij")
    H = hadamard_entries(s, v)
    assert np.array_equal(H.T @ H, order * np.eye(order, dtype=np.int64))


# --- Harmony's LDP gradient descent -----------------------------------------


def _separable(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    X = np.column_stack([np.ones(n), rng.uniform(-1, 1, size=(n, 3))])
    y = np.where(X[:, 1] + 0.5 * X[:, 2] + 0.1 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


@pytest.mark.parametrize("loss", list(Loss))
def test_sgd_every_peer_releases_one_gradient_at_epsilon(loss: Loss) -> None:
    rng = np.random.default_rng(31)
    X, y = _separable(20_000, rng)
    model = LDPGradientDescent(loss=loss, epsilon=2.0, steps=20, random_state=1).fit(X, y, features=("a", "b", "c"))
    assert model.steps_ == 20 and model.group_size_ == 1_000
    assert len(model.ledgers_) == X.shape[0]
    for ledger in model.ledgers_:
        (release,) = ledger.releases
        assert release.kind == ReleaseKind.GRADIENT and release.epsilon == 2.0 and ledger.spent() == 2.0
    # It learns: the separating direction dominates the noise.
    scores = model.decision_function(X)
    assert np.mean((scores > 0) == (y > 0)) > 0.8


def test_sgd_refuses_inputs_outside_the_cube() -> None:
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        LDPGradientDescent(epsilon=1.0).fit(np.full((10, 2), 2.0), np.ones(10))
    with pytest.raises(ValueError, match="steps"):
        LDPGradientDescent(epsilon=1.0, steps=11).fit(np.zeros((10, 2)), np.ones(10))


# --- DP averaging of local models --------------------------------------------


def test_local_models_of_neighbouring_slices_stay_within_the_bound() -> None:
    rng = np.random.default_rng(42)
    X = unit_ball_rows(rng.uniform(-1, 1, size=(100, 5)), math.sqrt(5))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=100) > 0, 1.0, -1.0)
    mechanism = OutputPerturbation(epsilon=1.0, n_rows=100, regularization=0.05, dimension=5)
    base = fit_regularized_logistic(X, y, 0.05, mechanism.gradient_tolerance)
    for row in range(10):
        X2, y2 = X.copy(), y.copy()
        X2[row], y2[row] = -X[row], -y[row]  # the worst kind of replacement
        other = fit_regularized_logistic(X2, y2, 0.05, mechanism.gradient_tolerance)
        assert np.linalg.norm(other - base) <= mechanism.l2_sensitivity


def test_averaging_each_peer_releases_one_model_at_epsilon() -> None:
    rng = np.random.default_rng(43)
    X, y = _separable(5_050, rng)
    rows = unit_ball_rows(X, 2.0)
    model = ModelAveraging(epsilon=1.0, rows_per_peer=100, random_state=3).fit(rows, y, features=("a", "b", "c"))
    assert len(model.ledgers_) == 50 and min(model.peer_rows_) >= 100 and sum(model.peer_rows_) == 5_050
    for ledger in model.ledgers_:
        (release,) = ledger.releases
        assert release.kind == ReleaseKind.MODEL and ledger.spent() == 1.0
    assert np.mean((model.decision_function(rows) > 0) == (y > 0)) > 0.8


# --- the experiment ----------------------------------------------------------


def test_experiment_compares_learners_at_record_level_epsilon(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    result = CliRunner().invoke(experiment, [
        "breast-cancer", "--learner", "ldp-sgd-lr,ldp-sgd-svm,model-averaging,logreg", "--epsilon", "4",
        "--trials", "2", "--linear-tuning", "fixed", "--sgd-steps", "8", "--no-baselines", "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    lines = {line["learner"]: line for line in report["learners"]}
    assert set(lines) == {"ldp-sgd-lr", "ldp-sgd-svm", "model-averaging", "logreg"}
    for name in ("ldp-sgd-lr", "ldp-sgd-svm", "model-averaging"):
        assert lines[name]["epsilon_total"] == 4.0 and lines[name]["releases_per_peer"] == 1
        assert lines[name]["auc"]["n"] == 2
    assert lines["ldp-sgd-lr"]["steps"] == 8 and "tuned" not in lines["ldp-sgd-lr"]
    assert lines["logreg"]["epsilon_total_requested"] is None and lines["logreg"]["auc"]["mean"] > 0.95
    assert "Learners compared" in result.output


# --- the linear encoding's log scale -------------------------------------------


def test_wide_range_features_are_log_scaled_from_the_bounds_alone() -> None:
    from anonml.learning import LinearEncoding, adult_spec, wide_range_features

    spec = adult_spec()
    assert wide_range_features(spec) == {"capital-gain", "capital-loss"}
    encoding = LinearEncoding(spec, wide_range_features(spec))
    gains = np.array([0.0, 1.0, 100.0, 99_999.0, 200_000.0])
    columns = {f.name: np.repeat(np.asarray(f.categories[:1] if f.kind != "numeric" else [f.low]), gains.size) for f in spec.features}
    columns["capital-gain"] = gains
    X = encoding.transform(Table(columns, np.repeat(np.asarray(["<=50K"]), gains.size)))
    j = 1 + [f.name for f in spec.features].index("capital-gain")
    assert X[0, j] == -1 and X[3, j] == 1 and X[4, j] == 1 and np.all(np.diff(X[:, j]) >= 0)
    # A linear map would leave 100 at -0.998; the log scale spreads it out.
    assert X[2, j] > -0.2
    with pytest.raises(ValueError, match="not numeric"):
        LinearEncoding(spec, frozenset({"workclass"}))


def test_ldp_sgd_logistic_regression_on_adult_at_epsilon_4_with_settings_chosen_on_validation(adult_dir: Path) -> None:
    """Adult at ε_T 4 (every peer one gradient, record-level ε 4), its steps
    and γ0 chosen on rows held out of the training split, never the test
    split: issue 28's 0.86 is met over 20 trials in the README's run (0.864
    ± 0.009), and these ten seeds average 0.860, so the test holds a floor
    of 0.85 (the mean validation AUC of 3 seeds alone preferred 128 steps
    at γ0 3, which averages 0.847 on these seeds)."""
    from anonml.learning import EncodedSplit, LearnerName, LinearSettings, linear_encoding, linear_trial, load_adult
    from anonml.learning import adult_spec as spec_of_adult
    from anonml.learning._compare import tuned_settings

    train, test = load_adult(adult_dir)
    split = EncodedSplit.of(linear_encoding(LinearSettings(), spec_of_adult()), train, test)
    chosen, _ = tuned_settings([LearnerName.SGD_LR], split, [4.0], 0, LinearSettings())
    outcomes = [linear_trial(LearnerName.SGD_LR, split, 4.0, seed, chosen[(LearnerName.SGD_LR, 4.0)]) for seed in range(10)]
    assert all(o["epsilon_total"] == 4.0 and o["releases_per_peer"] == 1 for o in outcomes)
    assert np.mean([o["auc"] for o in outcomes]) >= 0.85


def test_experiment_compares_learners_across_tables(tmp_path: Path) -> None:
    out, plot = tmp_path / "all.json", tmp_path / "all.png"
    result = CliRunner().invoke(experiment, [
        "breast-cancer", "affairs", "--learner", "ensemble,ldp-sgd-lr,model-averaging,logreg", "--plan", "one", "--combiner", "naive-bayes",
        "--epsilon", "2,4", "--trials", "2", "--no-baselines", "--json", str(out), "--plot", str(plot),
    ])
    assert result.exit_code == 0, result.output
    tables = json.loads(out.read_text())["tables"]
    assert [t["dataset"] for t in tables] == ["breast-cancer", "affairs"]
    for table in tables:
        assert {line["learner"] for line in table["learners"]} == {"ldp-sgd-lr", "model-averaging", "logreg"}
        assert {line["epsilon_total_requested"] for line in table["results"]} == {2.0, 4.0}
    assert "Every learner on 2 tables" in result.output
    assert plot.stat().st_size > 10_000


def test_newton_reaches_the_tolerance_on_large_slices(adult_dir: Path) -> None:
    """3,000-row Adult slices: the bound's tolerance 1e-6/n lies near the
    objective's rounding error, where backtracking alone stalled (seed 29
    of 40 raised NotConverged before the full-step rule)."""
    from anonml.learning import EncodedSplit, LinearSettings, linear_encoding, load_adult
    from anonml.learning import adult_spec as spec_of_adult

    train, test = load_adult(adult_dir)
    encoding = linear_encoding(LinearSettings(), spec_of_adult())
    split = EncodedSplit.of(encoding, train, test)
    rows = unit_ball_rows(split.X, encoding.max_norm)
    model = ModelAveraging(epsilon=1.0, rows_per_peer=3_000, random_state=29).fit(rows, split.y)
    assert len(model.ledgers_) == 10 and model.perturbation_.gradient_tolerance == pytest.approx(1e-6 / 3_000)


def test_experiment_reports_statistic_errors_beside_their_formulas(tmp_path: Path) -> None:
    out = tmp_path / "stats.json"
    result = CliRunner().invoke(experiment, [
        "affairs", "--learner", "logreg", "--statistics", "--epsilon", "1", "--trials", "30", "--no-baselines", "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["statistics"]
    tasks = {row["task"] for row in rows}
    assert tasks == {"count", "mean", "median (CDF at its bin)", "histogram (L2)", "Harmony mixed: mean", "Harmony mixed: frequencies (L2)"}
    for row in rows:
        assert row["trials"] == 30 and row["stated_mse"] >= row["formula_mse"] * (1 - 1e-9)
        # 30 trials: the measured MSE's relative sd is about 0.26; 2.5x is ~6 sd.
        assert 1 / 2.5 <= row["ratio"] <= 2.5, row
    assert "Statistic tasks on affairs" in result.output


def test_the_rank_formula_auc_is_sklearns_with_ties_and_refuses_one_class() -> None:
    """The experiments' AUC (anonml.learning._metrics): the rank formula, with ties counted one half."""
    from sklearn.metrics import roc_auc_score

    from anonml.learning._metrics import roc_auc

    rng = np.random.default_rng(5)
    for n in (2, 3, 50, 2_000):
        labels = np.resize([-1.0, 1.0], n)
        rng.shuffle(labels)
        for scores in (rng.normal(size=n), np.round(rng.normal(size=n), 1), np.zeros(n)):
            assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert roc_auc([0, 1, 1], [0.1, 0.9, 0.9]) == 1.0 and roc_auc([0, 1], [1.0, 0.0]) == 0.0
    for labels, scores in (([1, 1], [0.1, 0.2]), ([0, 1, 2], [0.1, 0.2, 0.3]), ([0, 1], [0.1]), ([0, 1], [0.1, np.nan])):
        with pytest.raises(ValueError):
            roc_auc(labels, scores)
