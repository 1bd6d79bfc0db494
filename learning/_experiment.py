"""``anonml experiment``: the thesis's chapter-8 experiments, in process.

``anonml experiment adult --data-dir DIR --epsilon 0.5 1 2 4 --trials 20``
runs, for every trial and ε_T, the whole private pipeline (private medians,
binning, plan, perturbation of every peer's subsets, estimation, ensemble)
for each requested plan and prints AUC on ``adult.test`` (mean, std, min,
max) beside baselines measured in the same run: logistic regression and
gradient boosting on the raw features, logistic regression on the binned
features, and the ensemble on exact histograms (thesis Figure 8-2's dashed
lines). ``--kp``/``--ks`` sweeps reproduce Figures 8-3 to 8-5.
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

from anonml.learning._adult import adult_spec
from anonml.learning._data import ADULT_COLUMNS, ADULT_NUMERIC, DataError, Table, load_adult
from anonml.learning._planner import choose_plan
from anonml.learning._trial import run_trial
from anonml.protocol import DEFAULT_MEDIAN_STEPS, EPSILON_TOTAL_RANGE, MAX_MEDIAN_STEPS, FeatureSpec, FeatureSpecError, PlanError, ReleasePlan

# The thesis's Figure 8-2a plan: two subsets of three features on each of
# five partitions, with ε_e = ε_h (§8.2.1).
THESIS_SPLIT = {"k_p": 5, "k_h": 2, "k_s": 3}


class _ListOptionsCommand(click.Command):
    """Lets ``--epsilon 0.5 1 2`` stand for ``--epsilon 0.5 --epsilon 1 --epsilon 2``
    for the options in ``LIST_OPTIONS`` (all take positive values, so a
    following argument that starts with ``-`` is the next option)."""

    LIST_OPTIONS = ("--epsilon", "--kp", "--ks", "--kh", "--vote", "--plan")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        expanded: list[str] = []
        current: str | None = None
        awaiting_first = False
        for arg in args:
            if arg.startswith("-"):
                current = arg if arg in self.LIST_OPTIONS else None
                awaiting_first = current is not None
                expanded.append(arg)
            elif current is not None and not awaiting_first:
                expanded.extend([current, arg])
            else:
                awaiting_first = False
                expanded.append(arg)
        return super().parse_args(ctx, expanded)


@dataclass(frozen=True)
class PlanRequest:
    """One line of the results: a plan kind with fixed or planner-chosen sizes."""

    label: str
    kind: str | None  # None: the planner chooses the kind
    k_p: int | None = None
    k_h: int | None = None
    k_s: int | None = None
    median_peers: str | None = None
    median_steps: int = DEFAULT_MEDIAN_STEPS

    def build(self, spec: FeatureSpec, n: int, epsilon_total: float, seed: bytes, oracle: str) -> ReleasePlan:
        if self.kind is not None and self.k_p is not None and self.k_s is not None and self.median_peers is not None:
            kind, features, k_p, k_h, k_s, median_peers = (
                self.kind, spec.names, self.k_p, self.k_h or 1, self.k_s, self.median_peers or "all"
            )
        else:
            choice = choose_plan(
                spec, n, epsilon_total, seed,
                kinds=(self.kind,) if self.kind else ("split", "one"),
                k_s_values=(self.k_s,) if self.k_s else None,
                k_p_values=(self.k_p,) if self.k_p else None,
                median_peers=(self.median_peers,) if self.median_peers else ("all", "disjoint"),
                median_steps=self.median_steps,
            ).plan
            if oracle == "auto":
                return choice
            kind, features, k_p, k_h, k_s, median_peers = (
                choice.kind, choice.features, choice.k_p, choice.k_h, choice.k_s, choice.median_peers
            )
        return ReleasePlan.build(
            kind=kind, features=features, numeric_features=spec.numeric_names, k_p=k_p, k_h=k_h, k_s=k_s,
            epsilon_total=epsilon_total, seed=seed, oracle=oracle, median_peers=median_peers,
            median_steps=self.median_steps,
        )


def plan_requests(
    plans: Sequence[str], kp: Sequence[int], ks: Sequence[int], kh: Sequence[int], median_peers: str | None,
    median_steps: int = DEFAULT_MEDIAN_STEPS,
) -> list[PlanRequest]:
    """Expand ``--plan`` and the ``--kp/--ks/--kh`` sweeps into result lines."""
    kinds: list[str] = []
    for plan in plans:
        kinds.extend(["split", "one", "best"] if plan == "all" else [plan])
    requests: list[PlanRequest] = []
    for kind in dict.fromkeys(kinds):
        if kind == "split":
            for k_p in kp or [THESIS_SPLIT["k_p"]]:
                for k_s in ks or [THESIS_SPLIT["k_s"]]:
                    for k_h in kh or [THESIS_SPLIT["k_h"]]:
                        requests.append(PlanRequest(f"split kp={k_p} kh={k_h} ks={k_s}", "split", k_p, k_h, k_s, median_peers or "all", median_steps))
        elif kind == "one":
            k_s_sweep: list[int | None] = list(ks) or [None]
            k_p_sweep: list[int | None] = list(kp) or [None]
            for fixed_k_s in k_s_sweep:
                for fixed_k_p in k_p_sweep:
                    label = "one" + (f" kp={fixed_k_p}" if fixed_k_p else "") + (f" ks={fixed_k_s}" if fixed_k_s else "")
                    requests.append(PlanRequest(label, "one", fixed_k_p, 1, fixed_k_s, median_peers, median_steps))
        else:
            requests.append(PlanRequest("best (planner)", None, median_peers=median_peers, median_steps=median_steps))
    return requests


def raw_baselines(spec: FeatureSpec, train: Table, test: Table, random_state: int) -> dict[str, float]:
    """Non-private baselines on the same split: logistic regression and
    gradient boosting on all raw columns, logistic regression on the binned
    features (exact medians)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    from anonml.learning._binning import bin_table, exact_cut_points

    def matrix(table: Table) -> np.ndarray:
        return np.column_stack([table.columns[c].astype(object) for c in ADULT_COLUMNS])

    numeric = [i for i, c in enumerate(ADULT_COLUMNS) if c in ADULT_NUMERIC]
    categorical = [i for i, c in enumerate(ADULT_COLUMNS) if c not in ADULT_NUMERIC]
    y_train, y_test = spec.label.encode(train.labels), spec.label.encode(test.labels)
    X_train, X_test = matrix(train), matrix(test)
    linear = make_pipeline(
        ColumnTransformer([("num", StandardScaler(), numeric), ("cat", OneHotEncoder(handle_unknown="ignore"), categorical)]),
        LogisticRegression(max_iter=2000),
    ).fit(X_train, y_train)
    boosting = make_pipeline(
        ColumnTransformer([
            ("num", "passthrough", numeric),
            ("cat", OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=np.nan), categorical),
        ]),
        HistGradientBoostingClassifier(categorical_features=list(range(len(numeric), len(ADULT_COLUMNS))), random_state=random_state),
    ).fit(X_train, y_train)
    cuts = exact_cut_points(spec, train)
    B_train, _ = bin_table(spec, train, cuts)
    B_test, _ = bin_table(spec, test, cuts)
    one_hot = OneHotEncoder(drop="if_binary", handle_unknown="ignore").fit(B_train)
    binned = LogisticRegression(max_iter=2000).fit(one_hot.transform(B_train), y_train)
    return {
        "logreg raw": float(roc_auc_score(y_test, linear.decision_function(X_test))),
        "gradient boosting raw": float(roc_auc_score(y_test, boosting.predict_proba(X_test)[:, 1])),
        "logreg binned": float(roc_auc_score(y_test, binned.decision_function(one_hot.transform(B_test)))),
    }


def _summary(values: Sequence[float]) -> dict[str, float]:
    array = np.asarray(values)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if array.size > 1 else 0.0, "min": float(array.min()), "max": float(array.max()), "n": int(array.size)}


def restrict_spec(spec: FeatureSpec, names: str | None) -> FeatureSpec:
    """The spec limited to comma-separated feature ``names`` (all if None)."""
    if not names:
        return spec
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    return FeatureSpec(tuple(spec.feature(n) for n in chosen), spec.label)


def run_experiment(
    *,
    data_dir: Path,
    epsilons: Sequence[float],
    trials: int,
    requests: Sequence[PlanRequest],
    votes: Sequence[str],
    base: str,
    scoring: str,
    oracle: str,
    postprocess: str,
    quantiles: int,
    features: str | None,
    max_train_rows: int | None,
    seed: int,
    baselines: bool,
    progress: Any = None,
) -> dict[str, Any]:
    """Run everything and return the JSON-ready results (see module docstring)."""
    spec = restrict_spec(adult_spec(quantiles), features)
    train, test = load_adult(data_dir)
    rng = np.random.default_rng(seed)
    if max_train_rows is not None and max_train_rows < train.n_rows:
        train = train.rows(np.sort(rng.choice(train.n_rows, size=max_train_rows, replace=False)))
    ensembles = [{"vote": v, "base": base, "scoring": scoring} for v in votes]
    lines: dict[tuple[str, str, float], dict[str, Any]] = {}
    noise_free: dict[tuple[str, str], list[float]] = {}
    for trial in range(trials):
        plan_seed = rng.bytes(16)
        for request in requests:
            for eps in epsilons:
                plan = request.build(spec, train.n_rows, eps, plan_seed, oracle)
                result = run_trial(spec, train, test, plan, rng, ensembles=ensembles, method=postprocess, epsilon_budget=eps)
                for vote, auc in zip(votes, result.aucs):
                    line = lines.setdefault((request.label, vote, eps), {
                        "plan": request.label, "vote": vote, "epsilon_total_requested": eps, "aucs": [], "seconds": [],
                        "epsilon_total": result.epsilon_total, "epsilon_total_plan": plan.epsilon_total, "release_epsilon": plan.release_epsilon,
                        "median_epsilon": plan.median_epsilon, "kind": plan.kind, "k_p": plan.k_p, "k_h": plan.k_h,
                        "k_s": plan.k_s, "median_peers": plan.median_peers, "median_steps": plan.median_steps, "oracles": {},
                    })
                    # The worst trial's eq. 7.4 total recorded in the peers' ledgers.
                    line["epsilon_total"] = max(line["epsilon_total"], result.epsilon_total)
                    line["aucs"].append(auc)
                    line["seconds"].append(result.seconds)
                    for name, count in result.oracles.items():
                        line["oracles"][name] = line["oracles"].get(name, 0) + count
                if progress is not None:
                    progress()
            # The noise-free ensemble of this plan (eps-independent structure;
            # built with the largest eps so the planner's choice is the one
            # used where noise matters least).
            plan = request.build(spec, train.n_rows, max(epsilons), plan_seed, oracle)
            exact = run_trial(spec, train, test, plan, rng, ensembles=ensembles, noise_free=True)
            for vote, auc in zip(votes, exact.aucs):
                noise_free.setdefault((request.label, vote), []).append(auc)
    results = []
    for line in lines.values():
        line["auc"] = _summary(line.pop("aucs"))
        line["seconds_per_trial"] = float(np.mean(line.pop("seconds")))
        results.append(line)
    return {
        "dataset": "adult",
        "n_train": train.n_rows,
        "n_test": test.n_rows,
        "trials": trials,
        "seed": seed,
        "feature_spec": spec.to_dict(),
        "ensemble": {"base": base, "scoring": scoring, "votes": list(votes)},
        "postprocess": postprocess,
        "results": results,
        "noise_free_ensemble": [{"plan": plan, "vote": vote, "auc": _summary(v)} for (plan, vote), v in noise_free.items()],
        "baselines": raw_baselines(spec, train, test, seed) if baselines else {},
    }


def print_results(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable

    # Wide enough for the table even when stdout is not a terminal.
    console = Console(width=max(Console().width, 150))
    table = RichTable(title=f"AUC on adult.test, {report['trials']} trial(s), n_train={report['n_train']}")
    for column in ("plan", "vote", "kp·kh·ks", "median", "ε_T (eq. 7.4)", "ε_h", "ε_e", "oracle", "AUC mean", "std", "min", "max", "s/trial"):
        table.add_column(column, justify="left" if column in ("plan", "vote", "oracle", "median") else "right", no_wrap=True)
    for line in sorted(report["results"], key=lambda r: (r["plan"], r["vote"], r["epsilon_total"])):
        auc = line["auc"]
        table.add_row(
            line["plan"], line["vote"], f"{line['k_p']}·{line['k_h']}·{line['k_s']}", line["median_peers"],
            f"{line['epsilon_total']:.3g}", f"{line['release_epsilon']:.3g}", f"{line['median_epsilon']:.3g}",
            ",".join(sorted(line["oracles"])), f"{auc['mean']:.4f}", f"{auc['std']:.4f}", f"{auc['min']:.4f}", f"{auc['max']:.4f}",
            f"{line['seconds_per_trial']:.2f}",
        )
    console.print(table)
    base = RichTable(title="Baselines (same run, no privacy)")
    base.add_column("model")
    base.add_column("AUC", justify="right")
    for name, auc in report["baselines"].items():
        base.add_row(name, f"{auc:.4f}")
    for entry in report["noise_free_ensemble"]:
        base.add_row(f"ensemble, exact histograms: {entry['plan']}, {entry['vote']}", f"{entry['auc']['mean']:.4f} ± {entry['auc']['std']:.4f}")
    console.print(base)


def plot_results(report: dict[str, Any], path: Path, x_axis: str = "eps") -> None:
    """AUC against ε_T (Figure 8-2: one line per plan and vote, baselines and
    exact-histogram ensembles dashed), or against ``k_p`` / ``k_s`` (Figures
    8-3b to 8-5b: one line per ε_T and vote)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    x_key = {"eps": "epsilon_total", "kp": "k_p", "ks": "k_s"}[x_axis]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for line in report["results"]:
        if x_axis == "eps":
            key: tuple[Any, ...] = (line["plan"], line["vote"])
        else:
            fixed = f"ks={line['k_s']}" if x_axis == "kp" else f"kp={line['k_p']}"
            key = (f"{line['kind']} {fixed if line['kind'] == 'split' else ''}".strip(), line["vote"], f"ε_T={line['epsilon_total_requested']:g}")
        groups.setdefault(key, []).append(line)
    noise_free = {(e["plan"], e["vote"]): e["auc"]["mean"] for e in report["noise_free_ensemble"]}
    for key, lines in sorted(groups.items()):
        lines.sort(key=lambda r: r[x_key])
        x = [r[x_key] for r in lines]
        drawn = axes.errorbar(x, [r["auc"]["mean"] for r in lines], yerr=[r["auc"]["std"] for r in lines], marker="o", capsize=3, label=", ".join(key))
        if x_axis == "eps" and key in noise_free:
            axes.axhline(noise_free[key], linestyle="--", color=drawn[0].get_color(), linewidth=1)
    for (name, auc), style in zip(report["baselines"].items(), (":", "-.", (0, (5, 5)))):
        axes.axhline(auc, linestyle=style, color="grey", linewidth=1, label=name)
    axes.set_xlabel({"eps": "ε_T (eq. 7.4, median estimation included)", "kp": "partitions k_p", "ks": "features per subset k_s"}[x_axis])
    axes.set_ylabel("ROC AUC on adult.test")
    axes.set_title(f"UCI Adult, mean ± std of {report['trials']} trials" + (" (dashed: exact histograms)" if x_axis == "eps" else ""))
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


@click.group()
def experiment() -> None:
    """The thesis's chapter-8 experiments, in process (no network)."""


@experiment.command("adult", cls=_ListOptionsCommand)
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="Directory with adult.data and adult.test.")
@click.option("--epsilon", "epsilons", type=click.FloatRange(*EPSILON_TOTAL_RANGE), multiple=True, default=(0.5, 1.0, 2.0, 4.0), show_default=True, help="ε_T values (eq. 7.4, median cost included); several may follow one flag.")
@click.option("--trials", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--plan", "plans", type=click.Choice(["split", "one", "best", "all"]), multiple=True, default=("all",), show_default=True, help="split: the thesis's plan; one: one subset per peer; best: the planner's choice.")
@click.option("--kp", type=click.IntRange(min=1), multiple=True, help="Partitions (sweep: several values).")
@click.option("--ks", type=click.IntRange(min=1), multiple=True, help="Features per subset (sweep: several values).")
@click.option("--kh", type=click.IntRange(min=1), multiple=True, help="Subsets per partition for the split plan.")
@click.option("--median-peers", type=click.Choice(["all", "disjoint"]), default=None, help="Who answers the median search (default: split=all as the thesis, one/best=planner).")
@click.option("--median-steps", type=click.IntRange(1, MAX_MEDIAN_STEPS), default=DEFAULT_MEDIAN_STEPS, show_default=True, help="Steps of the median search (thesis Algorithm 1); each answering peer answers one.")
@click.option("--vote", "votes", type=click.Choice(["weighted", "soft"]), multiple=True, default=("weighted", "soft"), show_default=True)
@click.option("--base", type=click.Choice(["logreg", "tree"]), default="logreg", show_default=True)
@click.option("--scoring", type=click.Choice(["f1", "roc_auc", "accuracy"]), default="f1", show_default=True)
@click.option("--oracle", type=click.Choice(["auto", "grr", "sue", "pq", "oue", "olh", "ss"]), default="auto", show_default=True)
@click.option("--postprocess", type=click.Choice(["clip", "norm-sub", "project", "ibu"]), default="norm-sub", show_default=True)
@click.option("--quantiles", type=click.IntRange(min=1, max=8), default=1, show_default=True, help="Cut points per numeric feature (1 = median).")
@click.option("--features", default=None, help="Comma-separated subset of the Adult features to use.")
@click.option("--max-train-rows", type=click.IntRange(min=50), default=None, help="Subsample the training peers (for smoke tests).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--baselines/--no-baselines", default=True, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write all results as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Draw AUC vs ε_T (PNG).")
@click.option("--plot-x", type=click.Choice(["eps", "kp", "ks"]), default="eps", show_default=True, help="x axis of the plot: ε_T (Figure 8-2) or a swept k_p / k_s (Figures 8-3 to 8-5).")
def adult(
    data_dir: Path, epsilons: tuple[float, ...], trials: int, plans: tuple[str, ...], kp: tuple[int, ...], ks: tuple[int, ...],
    kh: tuple[int, ...], median_peers: str | None, median_steps: int, votes: tuple[str, ...], base: str, scoring: str,
    oracle: str, postprocess: str, quantiles: int, features: str | None, max_train_rows: int | None, seed: int,
    baselines: bool, json_path: Path | None, plot_path: Path | None, plot_x: str,
) -> None:
    """UCI Adult: AUC against ε_T for the release plans, with baselines."""
    requests = plan_requests(plans, kp, ks, kh, median_peers, median_steps)
    started = time.perf_counter()
    steps = trials * len(requests) * len(epsilons)
    done = [0]

    def progress() -> None:
        done[0] += 1
        if done[0] % max(1, steps // 10) == 0 or done[0] == steps:
            click.echo(f"  {done[0]}/{steps} trial runs, {time.perf_counter() - started:.1f} s", err=True)

    try:
        report = run_experiment(
            data_dir=data_dir, epsilons=sorted(set(epsilons)), trials=trials, requests=requests, votes=list(dict.fromkeys(votes)),
            base=base, scoring=scoring, oracle=oracle, postprocess=postprocess, quantiles=quantiles, features=features,
            max_train_rows=max_train_rows, seed=seed, baselines=baselines, progress=progress,
        )
    except DataError as exc:
        raise click.BadParameter(str(exc), param_hint="'--data-dir'") from None
    except FeatureSpecError as exc:
        raise click.BadParameter(str(exc), param_hint="'--features'") from None
    except PlanError as exc:
        raise click.UsageError(f"unsatisfiable plan parameters: {exc}") from None
    report["wall_seconds"] = time.perf_counter() - started
    print_results(report)
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        click.echo(f"wrote {json_path}")
    if plot_path is not None:
        plot_results(report, plot_path, plot_x)
        click.echo(f"wrote {plot_path}")
    if any(not math.isfinite(r["auc"]["mean"]) for r in report["results"]):
        raise click.ClickException("some trials produced a non-finite AUC")
