"""Every learner across several tables (``anonml experiment adult
breast-cancer affairs --learner ...``): one table of AUC by table, learner
and record-level ε_T, and one figure with a panel per table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from anonml.learning._compare import comparison_table

NON_PRIVATE = "logreg"


def learner_grid(report: dict[str, Any]) -> dict[str, dict[float | None, dict[str, float]]]:
    """``{learner: {ε_T requested (None: non-private): AUC summary}}`` of one table's report."""
    grid: dict[str, dict[float | None, dict[str, float]]] = {}
    for learner, requested, auc, _ in comparison_table(report):
        grid.setdefault(learner, {})[requested] = auc
    return grid


def short_name(learner: str) -> str:
    """A learner's name without the ensemble's plan parameters (they differ
    by table; the vote does not): ``ensemble, naive-bayes vote``."""
    return f"ensemble, {learner.rsplit(' ', 1)[1]} vote" if learner.startswith("ensemble ") else learner


def _epsilons(reports: Sequence[dict[str, Any]]) -> list[float]:
    return sorted({eps for report in reports for cells in learner_grid(report).values() for eps in cells if eps is not None})


def print_tables_comparison(reports: Sequence[dict[str, Any]]) -> None:
    """One row per table and learner, one column per ε_T: mean AUC ± std."""
    from rich.console import Console
    from rich.table import Table as RichTable

    epsilons = _epsilons(reports)
    table = RichTable(title=f"Every learner on {len(reports)} tables (AUC on each test split, mean ± std of {reports[0]['trials']} trials)")
    table.add_column("table", no_wrap=True)
    table.add_column("learner", no_wrap=True)
    for eps in epsilons:
        table.add_column(f"ε_T {eps:g}", justify="right", no_wrap=True)
    for report in reports:
        for learner, cells in learner_grid(report).items():
            if None in cells:
                table.add_row(report["dataset"], f"{short_name(learner)} (non-private)", *[f"{cells[None]['mean']:.3f}"] * len(epsilons))
                continue
            table.add_row(report["dataset"], short_name(learner), *(f"{cells[eps]['mean']:.3f} ± {cells[eps]['std']:.3f}" if eps in cells else "-" for eps in epsilons))
    # Wide enough for the ensemble's plan labels: the table is for reading, not a terminal's width.
    Console(width=max(160, Console().width)).print(table)


def plot_tables_comparison(reports: Sequence[dict[str, Any]], path: Path) -> None:
    """One panel per table: AUC against record-level ε_T (log scale), one
    line per learner with its std as error bars, the non-private reference
    dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(reports), figsize=(4.2 * len(reports), 4.6), squeeze=False)
    # One colour per learner on every panel.
    names = sorted({short_name(learner) for report in reports for learner in learner_grid(report)})
    colours = {name: f"C{index % 10}" for index, name in enumerate(names)}
    handles: dict[str, Any] = {}
    for panel, report in zip(axes[0], reports):
        for learner, cells in sorted(learner_grid(report).items()):
            name = short_name(learner)
            if None in cells:
                handles[f"{name} (non-private)"] = panel.axhline(cells[None]["mean"], linestyle="--", color="grey", linewidth=1)
                continue
            x = sorted(eps for eps in cells if eps is not None)
            handles[name] = panel.errorbar(x, [cells[eps]["mean"] for eps in x], yerr=[cells[eps]["std"] for eps in x], marker="o", capsize=3,
                                           color=colours[name])
        panel.set_xscale("log", base=2)
        panel.set_xlabel("record-level ε_T")
        panel.set_title(f"{report['dataset']} ({report['trials']} trials)")
    axes[0][0].set_ylabel("ROC AUC on the test split (mean ± std)")
    figure.legend(list(handles.values()), list(handles), loc="lower center", ncol=4, fontsize=8)
    figure.tight_layout(rect=(0, 0.14, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
