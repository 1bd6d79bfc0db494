"""``anonml experiment``: the thesis's chapter-8 experiments, in process, on
any table a feature spec describes.

``anonml experiment adult --data-dir DIR --json out.json`` runs, for every
trial and record-level ε_T, the whole private pipeline (private quantiles,
binning, plan, perturbation of every peer's releases, estimation, ensemble)
for each requested plan and prints AUC on the test split (mean, std, min,
max) beside baselines measured in the same run: logistic regression and
gradient boosting on the raw features, logistic regression on the binned
features, and the ensemble on exact histograms (thesis Figure 8-2's dashed
lines). Built-in tables: ``adult`` (``--data-dir``), ``breast-cancer`` and
``affairs`` (offline, split here); ``csv`` takes ``--spec FILE.toml --train
FILE.csv [--test FILE.csv]``. ``--kp``/``--ks`` sweeps reproduce Figures 8-3
to 8-5.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from anonml.learning._binning import bin_table, exact_cut_points
from anonml.learning._compare import comparison_table, linear_encoding, run_comparison, summary
from anonml.learning._data import DataError, Table, read_csv_table, split_table
from anonml.learning._metrics import roc_auc
from anonml.learning._planner import THESIS_SPLIT, PlanChoice, candidate_choices, choose_plan
from anonml.learning._statistics_report import statistic_task_errors
from anonml.learning._tables import load_builtin
from anonml.learning._vocabulary import CSV, PLANNER, LearnerName, LinearSettings
from anonml.learning._trial import run_trial
from anonml.protocol import DEFAULT_MEDIAN_STEPS, Combiner, FeatureSpec, MedianPeers, PlanKind

def _flatten(values: Sequence[tuple[Any, ...]]) -> list[Any]:
    return list(dict.fromkeys(v for group in values for v in group))


@dataclass(frozen=True)
class PlanRequest:
    """One line of the results: the planner's choice, or a fixed plan."""

    label: str
    choice: PlanChoice | None  # None: the planner chooses at each ε_T
    median_steps: int = DEFAULT_MEDIAN_STEPS
    planner_trials: int = 2

    def resolve(self, spec: FeatureSpec, n: int, epsilon_total: float, cache: dict[tuple[str, float], PlanChoice]) -> PlanChoice:
        if self.choice is not None:
            return self.choice
        key = (self.label, epsilon_total)
        if key not in cache:
            cache[key] = choose_plan(spec, n, epsilon_total, candidates=candidate_choices(spec, n, median_steps=self.median_steps), trials=self.planner_trials)
        return cache[key]


def plan_requests(
    spec: FeatureSpec, plans: Sequence[str], kp: Sequence[int], ks: Sequence[int], kh: Sequence[int], *,
    quantiles: int | None, median_peers: str | None, median_steps: int, pool: float, oracle: str, planner_trials: int = 2,
) -> list[PlanRequest]:
    """Expand ``--plan`` and the ``--kp/--ks/--kh`` sweeps into result lines."""
    k_f = len(spec.names)
    requests: list[PlanRequest] = []
    for kind in dict.fromkeys(plans):
        if kind == PLANNER:
            requests.append(PlanRequest("planner", None, median_steps, planner_trials))
            continue
        thesis = kind == PlanKind.SPLIT
        mode = median_peers or (MedianPeers.ALL if thesis else MedianPeers.RESERVED)
        for k_s in ks or [THESIS_SPLIT["k_s"] if thesis else 1]:
            for k_p in kp or [THESIS_SPLIT["k_p"] if thesis else math.ceil(k_f / k_s)]:
                for k_h in (kh or [THESIS_SPLIT["k_h"]]) if thesis else [1]:
                    q = quantiles if quantiles is not None else (3 if mode == MedianPeers.RESERVED else 1)
                    choice = PlanChoice(
                        kind=kind, k_p=k_p, k_h=k_h, k_s=k_s, quantiles=q, median_peers=mode,
                        comparison_pool=pool if mode == MedianPeers.RESERVED else 0.0, median_steps=median_steps,
                        combiner=Combiner.WEIGHTED, oracle=oracle,
                    )
                    requests.append(PlanRequest(choice.label(), choice))
    return requests


def raw_baselines(spec: FeatureSpec, train: Table, test: Table, random_state: int, quantiles: int) -> dict[str, float]:
    """Non-private baselines on the same split: logistic regression and
    gradient boosting on the raw features, logistic regression on the binned
    features (exact cuts, ``quantiles`` per numeric feature)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    def matrix(table: Table) -> np.ndarray:
        return np.column_stack([table.column(name).astype(object) for name in spec.names])

    numeric = [i for i, name in enumerate(spec.names) if name in spec.numeric_names]
    categorical = [i for i, name in enumerate(spec.names) if name not in spec.numeric_names]
    y_train, y_test = spec.label.encode(train.labels), spec.label.encode(test.labels)
    X_train, X_test = matrix(train), matrix(test)
    linear = make_pipeline(
        ColumnTransformer([("num", StandardScaler(), numeric), ("cat", OneHotEncoder(handle_unknown="ignore"), categorical)]),
        LogisticRegression(max_iter=5000),
    ).fit(X_train, y_train)
    boosting = make_pipeline(
        ColumnTransformer([
            ("num", "passthrough", numeric),
            ("cat", OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=np.nan), categorical),
        ]),
        HistGradientBoostingClassifier(categorical_features=list(range(len(numeric), len(spec.names))), random_state=random_state),
    ).fit(X_train, y_train)
    binned_spec = spec.with_quantiles(quantiles)
    cuts = exact_cut_points(binned_spec, train)
    B_train, _ = bin_table(binned_spec, train, cuts)
    B_test, _ = bin_table(binned_spec, test, cuts)
    one_hot = OneHotEncoder(drop="if_binary", handle_unknown="ignore").fit(B_train)
    binned = LogisticRegression(max_iter=5000).fit(one_hot.transform(B_train), y_train)
    return {
        "logreg raw": roc_auc(y_test, linear.decision_function(X_test)),
        "gradient boosting raw": roc_auc(y_test, boosting.predict_proba(X_test)[:, 1]),
        f"logreg binned (q={quantiles})": roc_auc(y_test, binned.decision_function(one_hot.transform(B_test))),
    }


def restrict_spec(spec: FeatureSpec, names: str | None) -> FeatureSpec:
    """The spec limited to comma-separated feature ``names`` (all if None)."""
    if not names:
        return spec
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    return FeatureSpec(tuple(spec.feature(n) for n in chosen), spec.label)


def load_tables(dataset: str, *, data_dir: Path | None, spec_path: Path | None, train_path: Path | None, test_path: Path | None, test_fraction: float, rng: np.random.Generator) -> tuple[FeatureSpec, Table, Table]:
    """``(spec, train, test)`` for a built-in table or a CSV with its spec file."""
    if dataset != CSV:
        return load_builtin(dataset, data_dir=data_dir, test_fraction=test_fraction, rng=rng)
    if spec_path is None or train_path is None:
        raise DataError("csv needs --spec (a feature-spec TOML file) and --train (a CSV with a header)")
    try:
        spec = FeatureSpec.from_toml(spec_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DataError(f"cannot read the feature spec {str(spec_path)!r}: {exc.strerror}") from None
    train = read_csv_table(train_path, spec)
    if test_path is not None:
        return spec, train, read_csv_table(test_path, spec)
    train, test = split_table(train, test_fraction, rng)
    return spec, train, test


def run_experiment(
    *,
    spec: FeatureSpec,
    train: Table,
    test: Table,
    dataset: str,
    epsilons: Sequence[float],
    trials: int,
    requests: Sequence[PlanRequest],
    combiners: Sequence[str],
    base: str,
    scoring: str,
    postprocess: str,
    seed: int,
    baselines: bool,
    progress: Any = None,
) -> dict[str, Any]:
    """Run everything and return the JSON-ready results (see module docstring)."""
    rng = np.random.default_rng(seed)
    lines: dict[tuple[str, str, float], dict[str, Any]] = {}
    noise_free: dict[tuple[str, str], list[float]] = {}
    chosen: dict[tuple[str, float], PlanChoice] = {}
    for _ in range(trials):
        plan_seed = rng.bytes(16)
        for request in requests:
            for eps in epsilons:
                choice = request.resolve(spec, train.n_rows, eps, chosen)
                trial_spec = choice.spec_for(spec)
                plan = choice.build(trial_spec, eps, plan_seed)
                result = run_trial(trial_spec, train, test, plan, rng, combiners=combiners, base=base, scoring=scoring, method=postprocess, epsilon_budget=eps)
                for combiner, auc in result.aucs.items():
                    line = lines.setdefault((request.label, combiner, eps), {
                        "plan": request.label, "combiner": combiner, "epsilon_total_requested": eps, "aucs": [], "seconds": [],
                        "epsilon_total": 0.0, "per_attribute_epsilon": 0.0, "epsilon_total_plan": plan.epsilon_total,
                        "release_epsilon": plan.release_epsilon, "median_epsilon": plan.median_epsilon, "choice": choice.to_dict(),
                        "kind": plan.kind, "k_p": plan.k_p, "k_h": plan.k_h, "k_s": plan.k_s, "quantiles": choice.quantiles,
                        "median_peers": plan.median_peers, "median_steps": plan.median_steps, "oracles": {},
                    })
                    # The costliest peer's record-level sum, worst trial, from the ledgers.
                    line["epsilon_total"] = max(line["epsilon_total"], result.epsilon_total)
                    line["per_attribute_epsilon"] = max(line["per_attribute_epsilon"], result.per_attribute)
                    line["aucs"].append(auc)
                    line["seconds"].append(result.seconds)
                    for name, count in result.oracles.items():
                        line["oracles"][name] = line["oracles"].get(name, 0) + count
                if progress is not None:
                    progress()
            # The noise-free ensemble of this plan (its structure at the largest ε_T).
            choice = request.resolve(spec, train.n_rows, max(epsilons), chosen)
            trial_spec = choice.spec_for(spec)
            plan = choice.build(trial_spec, max(epsilons), plan_seed)
            exact = run_trial(trial_spec, train, test, plan, rng, combiners=combiners, base=base, scoring=scoring, noise_free=True)
            for combiner, auc in exact.aucs.items():
                noise_free.setdefault((request.label, combiner), []).append(auc)
    results = []
    for line in lines.values():
        line["auc"] = summary(line.pop("aucs"))
        line["seconds_per_trial"] = float(np.mean(line.pop("seconds")))
        results.append(line)
    quantiles = max((line["quantiles"] for line in results), default=1)
    return {
        "dataset": dataset,
        "n_train": train.n_rows,
        "n_test": test.n_rows,
        "trials": trials,
        "seed": seed,
        "feature_spec": spec.to_dict(),
        "ensemble": {"base": base, "scoring": scoring, "combiners": list(combiners)},
        "postprocess": postprocess,
        "planner_choices": [{"epsilon_total": eps, **choice.to_dict()} for (_, eps), choice in chosen.items()],
        "results": results,
        "noise_free_ensemble": [{"plan": plan, "combiner": combiner, "auc": summary(v)} for (plan, combiner), v in noise_free.items()],
        "baselines": raw_baselines(spec, train, test, seed, quantiles) if baselines else {},
    }


def print_results(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable

    # Wide enough for the table even when stdout is not a terminal.
    console = Console(width=max(Console().width, 170))
    table = RichTable(title=f"AUC on the {report['dataset']} test split ({report['n_test']} rows), {report['trials']} trial(s), n_train={report['n_train']}")
    for column in ("plan", "combiner", "kp·kh·ks", "q", "ε_T record-level", "eq. 7.4 (secondary)", "ε_h", "ε_e", "oracle", "AUC mean", "std", "min", "max", "s/trial"):
        table.add_column(column, justify="left" if column in ("plan", "combiner", "oracle") else "right", no_wrap=True)
    for line in sorted(report["results"], key=lambda r: (r["plan"], r["combiner"], r["epsilon_total_requested"])):
        auc = line["auc"]
        cells = [
            line["plan"], line["combiner"], f"{line['k_p']}·{line['k_h']}·{line['k_s']}", str(line["quantiles"]),
            f"{line['epsilon_total']:.3g}", f"{line['per_attribute_epsilon']:.3g}", f"{line['release_epsilon']:.3g}", f"{line['median_epsilon']:.3g}",
            ",".join(sorted(line["oracles"])), f"{auc['mean']:.4f}", f"{auc['std']:.4f}", f"{auc['min']:.4f}", f"{auc['max']:.4f}",
            f"{line['seconds_per_trial']:.2f}",
        ]
        table.add_row(*cells)
    if report["results"]:
        console.print(table)
    for entry in report["planner_choices"]:
        console.print(f"planner at ε_T={entry['epsilon_total']:g}: {entry['kind']} kp={entry['k_p']} ks={entry['k_s']} q={entry['quantiles']} "
                      f"{entry['median_peers']} pool={entry['comparison_pool']:g}, {entry['combiner']} (simulated AUC {entry['simulated_auc'] or 0:.4f})")
    base = RichTable(title="Baselines (same run and split, no privacy)")
    base.add_column("model")
    base.add_column("AUC", justify="right")
    for name, auc in report["baselines"].items():
        base.add_row(name, f"{auc:.4f}")
    for entry in report["noise_free_ensemble"]:
        base.add_row(f"ensemble, exact histograms: {entry['plan']}, {entry['combiner']}", f"{entry['auc']['mean']:.4f} ± {entry['auc']['std']:.4f}")
    console.print(base)
    if report.get("learners"):
        print_comparison(report, console)


def print_comparison(report: dict[str, Any], console: Any) -> None:
    """Every learner on one table: AUC against the record-level ε each
    peer spent (the non-private reference has none)."""
    from rich.table import Table as RichTable

    table = RichTable(title=f"Learners compared on the {report['dataset']} test split, same split and ε_T, {report['trials']} trial(s)")
    for column in ("learner", "ε_T requested", "ε_T record-level spent", "AUC mean", "std", "min", "max", "trials"):
        table.add_column(column, justify="left" if column == "learner" else "right", no_wrap=True)
    for learner, requested, auc, spent in comparison_table(report):
        cells = [learner, "-" if requested is None else f"{requested:g}", "none (non-private)" if requested is None else f"{spent:.3g}",
                 f"{auc['mean']:.4f}", f"{auc['std']:.4f}", f"{auc['min']:.4f}", f"{auc['max']:.4f}", str(auc["n"])]
        table.add_row(*cells)
    console.print(table)
    tuned = sorted((line["learner"], line["epsilon_total_requested"], line["tuned"], line["validation_rows"]) for line in report.get("learners", []) if "tuned" in line)
    for learner, requested, choice, rows in tuned:
        console.print(f"{learner} at ε_T {requested:g}: {choice}, chosen on {rows} training rows held out")


def plot_results(report: dict[str, Any], path: Path, x_axis: str = "eps") -> None:
    """AUC against ε_T (Figure 8-2: one line per plan and combiner, baselines
    and exact-histogram ensembles dashed), or against ``k_p`` / ``k_s``
    (Figures 8-3b to 8-5b: one line per ε_T and combiner)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    x_key = {"eps": "epsilon_total_requested", "kp": "k_p", "ks": "k_s"}[x_axis]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for line in report["results"]:
        if x_axis == "eps":
            key: tuple[Any, ...] = (line["plan"], line["combiner"])
        else:
            fixed = f"ks={line['k_s']}" if x_axis == "kp" else f"kp={line['k_p']}"
            key = (f"{line['kind']} {fixed if line['kind'] == 'split' else ''}".strip(), line["combiner"], f"ε_T={line['epsilon_total_requested']:g}")
        groups.setdefault(key, []).append(line)
    noise_free = {(e["plan"], e["combiner"]): e["auc"]["mean"] for e in report["noise_free_ensemble"]}
    for key, lines in sorted(groups.items()):
        lines.sort(key=lambda r: r[x_key])
        x = [r[x_key] for r in lines]
        drawn = axes.errorbar(x, [r["auc"]["mean"] for r in lines], yerr=[r["auc"]["std"] for r in lines], marker="o", capsize=3, label=", ".join(key))
        if x_axis == "eps" and key in noise_free:
            axes.axhline(noise_free[key], linestyle="--", color=drawn[0].get_color(), linewidth=1)
    for (name, auc), style in zip(report["baselines"].items(), (":", "-.", (0, (5, 5)))):
        axes.axhline(auc, linestyle=style, color="grey", linewidth=1, label=name)
    axes.set_xlabel({"eps": "record-level ε_T (every release counted, quantile search included)", "kp": "partitions k_p", "ks": "features per subset k_s"}[x_axis])
    axes.set_ylabel(f"ROC AUC on the {report.get('dataset', '')} test split")
    axes.set_title(f"{report.get('dataset', '')}, mean ± std of {report['trials']} trials" + (" (dashed: exact histograms)" if x_axis == "eps" else ""))
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def run_table(
    dataset: str, *, data_dir: Path | None, spec_path: Path | None, train_path: Path | None, test_path: Path | None, test_fraction: float,
    epsilons: tuple[tuple[float, ...], ...], trials: int, learners: tuple[tuple[str, ...], ...], settings: LinearSettings,
    plans: tuple[tuple[str, ...], ...], kp: tuple[tuple[int, ...], ...], ks: tuple[tuple[int, ...], ...], kh: tuple[tuple[int, ...], ...],
    quantiles: int | None, median_peers: str | None, pool: float, planner_trials: int, median_steps: int, combiners: tuple[tuple[str, ...], ...],
    base: str, scoring: str, oracle: str, postprocess: str, features: str | None, max_train_rows: int | None, seed: int, baselines: bool,
    statistics: bool,
) -> dict[str, Any]:
    """One table's report: the release plans' and every chosen learner's AUC against ε_T, with baselines (``anonml experiment``)."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    spec, train, test = load_tables(dataset, data_dir=data_dir, spec_path=spec_path, train_path=train_path, test_path=test_path, test_fraction=test_fraction, rng=rng)
    spec = restrict_spec(spec, features)
    if max_train_rows is not None and max_train_rows < train.n_rows:
        train = train.rows(np.sort(rng.choice(train.n_rows, size=max_train_rows, replace=False)))
    chosen_learners = _flatten(learners)
    requests = [] if LearnerName.ENSEMBLE not in chosen_learners else plan_requests(
        spec, _flatten(plans), _flatten(kp), _flatten(ks), _flatten(kh), quantiles=quantiles, median_peers=median_peers,
        median_steps=median_steps, pool=pool, oracle=oracle, planner_trials=planner_trials,
    )
    eps_values = sorted(_flatten(epsilons))
    linear = [name for name in chosen_learners if name != LearnerName.ENSEMBLE]
    steps = trials * len(requests) * len(eps_values) + trials * sum(len(eps_values) for name in linear if name != LearnerName.LOGREG) + (LearnerName.LOGREG in linear)
    done = [0]

    def progress() -> None:
        done[0] += 1
        if done[0] % max(1, steps // 10) == 0 or done[0] == steps:
            click.echo(f"  {dataset}: {done[0]}/{steps} trial runs, {time.perf_counter() - started:.1f} s", err=True)

    report = run_experiment(
        spec=spec, train=train, test=test, dataset=dataset, epsilons=eps_values, trials=trials, requests=requests,
        combiners=_flatten(combiners), base=base, scoring=scoring, postprocess=postprocess, seed=seed, baselines=baselines,
        progress=progress,
    )
    if linear:
        report["linear_settings"] = {"tuning": str(settings.tuning), "sgd_steps": settings.sgd_steps or "harmony", "sgd_learning_rate": settings.sgd_learning_rate,
                                     "averaging_rule": settings.averaging_rule, "averaging_categorical_weight": settings.averaging_categorical_weight, "rows_per_peer": settings.rows_per_peer,
                                     "log_scaled": sorted(linear_encoding(settings, spec).log_scaled)}
        report["learners"] = run_comparison(spec=spec, train=train, test=test, learners=linear, epsilons=eps_values, trials=trials, seed=seed,
                                            settings=settings, progress=progress)
    if statistics:
        report["statistics"] = statistic_task_errors(spec, train, eps_values, trials, seed)
    report["wall_seconds"] = time.perf_counter() - started
    return report
