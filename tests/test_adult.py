"""The UCI Adult loader and the ``anonml experiment adult`` command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from anonml.cli import main
from anonml.learning import DataError, adult_spec, load_adult

GOOD_ROW = "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K\n"
TEST_ROW = "25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Black, Male, 0, 0, 40, ?, >50K.\n"


def write_dir(tmp_path: Path, data: str, test: str) -> Path:
    (tmp_path / "adult.data").write_text(data)
    (tmp_path / "adult.test").write_text(test)
    return tmp_path


def test_loads_the_real_files(adult_dir: Path) -> None:
    train, test = load_adult(adult_dir)
    assert (train.n_rows, test.n_rows) == (32561, 16281)
    assert set(train.labels) == set(test.labels) == {"<=50K", ">50K"}  # test file's trailing '.' stripped
    assert train.columns["age"].dtype == np.float64 and train.columns["workclass"][0] == "State-gov"
    assert "?" in set(train.columns["occupation"])
    spec = adult_spec()
    for table in (train, test):  # every raw value has a declared bin
        cuts = {name: [0.0] for name in spec.numeric_names}
        binned = spec.bin_columns(table.columns, cuts)
        assert binned.shape == (table.n_rows, 12)


def test_header_blank_lines_missing_values_and_label_period(tmp_path: Path) -> None:
    train, test = load_adult(write_dir(tmp_path, GOOD_ROW + "\n", "|1x3 Cross validator\n" + TEST_ROW + "\n"))
    assert train.n_rows == test.n_rows == 1
    assert test.labels[0] == ">50K" and test.columns["native-country"][0] == "?"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (GOOD_ROW + "39, State-gov, 77516\n", "adult.data:2: expected 15 fields, got 3"),
        (GOOD_ROW + GOOD_ROW.replace("39,", "old,"), "adult.data:2: 'age' is not a number: 'old'"),
        (GOOD_ROW + GOOD_ROW.replace("<=50K", "rich"), "adult.data:2: unknown label 'rich'"),
        ("\n" * 3 + GOOD_ROW.replace("State-gov", ""), "adult.data:4: empty field 'workclass'"),
        (GOOD_ROW.replace("2174", "nan"), "adult.data:1: 'capital-gain' is not finite"),
        ("", "adult.data: no data rows"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path: Path, data: str, message: str) -> None:
    with pytest.raises(DataError) as caught:
        load_adult(write_dir(tmp_path, data, TEST_ROW))
    assert message in str(caught.value)


def test_missing_directory_and_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_adult(tmp_path / "nowhere")
    (tmp_path / "adult.data").write_text(GOOD_ROW)
    with pytest.raises(DataError, match=r"lacks \['adult.test'\]"):
        load_adult(tmp_path)


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["experiment", "adult", *args])
    return result.exit_code, result.output


def test_cli_errors_are_clean(tmp_path: Path, adult_dir: Path) -> None:
    cases = [
        (["--data-dir", str(tmp_path / "missing")], "does not exist"),
        (["--data-dir", str(adult_dir), "--features", "age,height", "--trials", "1"], "unknown feature 'height'"),
        (["--data-dir", str(adult_dir), "--plan", "split", "--kh", "5", "--ks", "3", "--trials", "1"], "5 disjoint subsets of 3 features need 15"),
        (["--data-dir", str(adult_dir), "--epsilon", "0", "--trials", "1"], "--epsilon"),
        (["--data-dir", str(adult_dir), "--median-steps", "0", "--trials", "1"], "--median-steps"),
    ]
    bad = write_dir(tmp_path, GOOD_ROW + GOOD_ROW.replace("13,", "x,"), TEST_ROW)
    cases.append((["--data-dir", str(bad)], "adult.data:2: 'education-num' is not a number"))
    for args, message in cases:
        code, output = run_cli(*args)
        assert code != 0, output
        assert message in output, output
        assert "Traceback" not in output


@pytest.mark.slow
def test_smoke_on_a_subsample(tmp_path: Path, adult_dir: Path) -> None:
    """A couple of trials on 3,000 training peers: the full pipeline, table, JSON and plot."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("adult.data", "adult.test"):
        shutil.copy(adult_dir / name, data / name)  # a user directory works like the shared one
    report_path, plot_path = tmp_path / "r.json", tmp_path / "r.png"
    code, output = run_cli(
        "--data-dir", str(data), "--epsilon", "1,4", "--trials", "2", "--plan", "split,planner", "--planner-trials", "1",
        "--max-train-rows", "3000", "--json", str(report_path), "--plot", str(plot_path),
    )
    assert code == 0, output
    assert "logreg raw" in output and "exact histograms" in output
    report = json.loads(report_path.read_text())
    assert report["n_train"] == 3000 and report["n_test"] == 16281
    assert {(r["plan"].split()[0], r["combiner"], r["epsilon_total_requested"]) for r in report["results"]} == {
        (p, c, e) for p in ("split", "planner") for c in ("weighted", "soft", "naive-bayes") for e in (1.0, 4.0)
    }
    assert {entry["epsilon_total"] for entry in report["planner_choices"]} == {1.0, 4.0}
    for line in report["results"]:
        # Record-level: every peer's ledger sums to at most the requested ε_T, and the costliest to it.
        assert line["epsilon_total"] == pytest.approx(line["epsilon_total_requested"])
        assert line["auc"]["n"] == 2 and 0.5 < line["auc"]["mean"] <= 1.0
    assert 0.85 < report["baselines"]["logreg raw"] < 0.95
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_plots_put_the_swept_parameter_on_the_x_axis(tmp_path: Path) -> None:
    from anonml.learning._experiment import plot_results

    lines = [
        {"plan": f"split kp={k_p} kh=2 ks=3", "kind": "split", "combiner": "soft", "k_p": k_p, "k_s": 3, "epsilon_total": 1.0,
         "epsilon_total_requested": 1.0, "auc": {"mean": 0.8 + k_p / 100, "std": 0.01}}
        for k_p in (2, 5, 8)
    ]
    report = {"results": lines, "noise_free_ensemble": [], "baselines": {"logreg raw": 0.9}, "trials": 1}
    for axis in ("eps", "kp", "ks"):
        plot_results(report, tmp_path / f"{axis}.png", axis)
        assert (tmp_path / f"{axis}.png").read_bytes()[:4] == b"\x89PNG"


def test_median_steps_reach_every_plan() -> None:
    """``--median-steps`` sets Algorithm 1's steps for fixed and planner-chosen plans alike (the demo's round uses 4)."""
    from anonml.learning._experiment import plan_requests

    spec = adult_spec()
    for request in plan_requests(spec, ["one", "planner"], [12], [1], [], quantiles=None, median_peers="all", median_steps=4, pool=0.1, oracle="auto"):
        if request.choice is not None:
            assert request.choice.median_steps == 4 and request.choice.median_peers == "all" and request.choice.quantiles == 1
        else:
            assert request.median_steps == 4
    (default,) = plan_requests(spec, ["one"], [], [], [], quantiles=None, median_peers=None, median_steps=10, pool=0.1, oracle="auto")
    assert default.choice is not None and (default.choice.median_peers, default.choice.quantiles, default.choice.k_p) == ("reserved", 3, 12)


@pytest.mark.parametrize("dataset", ["adult", "breast-cancer"])
def test_the_demo_names_an_experiment_at_its_own_parameters(tmp_path: Path, adult_dir: Path, dataset: str) -> None:
    """The command the demo prints runs, on the demo's data, with its plan, vote, ε, cut points, median steps
    and the peers that answer the search."""
    from anonml.demo._calibrate import PhaseCosts
    from anonml.demo._data import breast_cancer_data, write_experiment_files
    from anonml.demo._schedule import plan_round
    from anonml.demo._summary import experiment_command

    costs = PhaseCosts(register=1e-3, issue=1e-3, roster_entry=0.1e-3, token=1e-3, relay_hop=1e-3, verify=1e-3, http=1e-3, process_start=1.0, serving_start=2.0)
    if dataset == "adult":
        from types import SimpleNamespace

        params = plan_round(SimpleNamespace(name="adult"), 2000, 2.0, 2, 0, costs)  # type: ignore[arg-type]
        command = experiment_command(params, ["adult", "--data-dir", str(adult_dir)], 32561).split()
        assert command[:3] == ["anonml", "experiment", "adult"] and command[-2:] == ["--max-train-rows", "2000"]
    else:
        data = breast_cancer_data(0)
        params = plan_round(data, len(data.train_rows), 2.0, 2, 0, costs)
        command = experiment_command(params, write_experiment_files(data, data.train_rows, tmp_path), len(data.train_rows)).split()
        assert command[:3] == ["anonml", "experiment", "csv"] and "--max-train-rows" not in command
    report_path = tmp_path / "r.json"
    result = CliRunner().invoke(main, [*command[1:], "--trials", "1", "--no-baselines", "--json", str(report_path)])
    assert result.exit_code == 0, result.output
    (line,) = json.loads(report_path.read_text())["results"]
    assert (line["k_p"], line["k_s"], line["combiner"]) == (params.k_p, params.k_s, params.vote)
    # The same peers answer the search: the Adult round's 10% comparison pool, every breast-cancer peer.
    pool = {"adult": ("reserved", 0.1), "breast-cancer": ("all", 0.0)}[dataset]
    assert (line["median_peers"], line["choice"]["comparison_pool"], line["median_steps"]) == (*pool, params.median_rounds)
    assert line["quantiles"] == params.quantiles
    assert line["epsilon_total"] == pytest.approx(params.epsilon)
    if dataset == "breast-cancer":
        assert json.loads(report_path.read_text())["n_train"] == len(data.train_rows)


@pytest.mark.parametrize("dataset", ["breast-cancer", "affairs"])
def test_the_offline_tables_run_beside_logistic_regression(tmp_path: Path, dataset: str) -> None:
    report_path = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["experiment", dataset, "--trials", "1", "--epsilon", "4", "--plan", "one", "--combiner", "naive-bayes", "--json", str(report_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    (line,) = report["results"]
    assert line["epsilon_total"] == pytest.approx(4.0) and 0.5 < line["auc"]["mean"] <= 1.0
    assert report["n_train"] + report["n_test"] == {"breast-cancer": 569, "affairs": 6366}[dataset]
    assert 0.6 < report["baselines"]["logreg raw"] <= 1.0


def test_any_csv_with_its_feature_spec(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 3000
    hours = rng.uniform(0, 80, n)
    team = rng.choice(["red", "blue", "green"], n)
    late = (rng.random(n) < np.where(hours > 45, 0.6, 0.15) * np.where(team == "red", 1.3, 0.8)).astype(int)
    rows = ["hours,team,ignored,late"] + [f"{h:.1f},{t},x,{'yes' if y else 'no'}" for h, t, y in zip(hours, team, late)]
    (tmp_path / "people.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "spec.toml").write_text(
        '[label]\nname = "late"\npositive = ["yes"]\n\n'
        '[[features]]\nname = "hours"\ntype = "numeric"\nlow = 0\nhigh = 100\n\n'
        '[[features]]\nname = "team"\ntype = "categorical"\ncategories = ["red", "blue", "green"]\n'
    )
    report_path = tmp_path / "r.json"
    args = ["experiment", "csv", "--spec", str(tmp_path / "spec.toml"), "--train", str(tmp_path / "people.csv"), "--trials", "1", "--epsilon", "2", "--plan", "one", "--json", str(report_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert report["n_train"] == 2100 and report["n_test"] == 900
    assert all(line["auc"]["mean"] > 0.6 for line in report["results"])
    (tmp_path / "bad.toml").write_text('[label]\nname = "late"\n')
    result = CliRunner().invoke(main, [*args[:2], "--spec", str(tmp_path / "bad.toml"), *args[4:]])
    assert result.exit_code != 0 and "feature spec" in result.output and "Traceback" not in result.output
