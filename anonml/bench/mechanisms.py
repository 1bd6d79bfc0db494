"""``anonml bench mechanisms``: histogram error of every oracle against its
formula, what ``auto`` picks, and privatise+estimate throughput.

Error: for m in {4, 8, 16, 32, 64} and epsilon in {0.5, 1, 2, 4}, n reports of
a fixed Zipf-like population, ``reps`` repetitions; the empirical mean of
``sum_i (n̂_i - n_i)^2`` beside the exact ``variance(n)``. Throughput:
privatise and estimate one million reports at m = 16, beside a same-run
baseline (a non-private ``np.bincount`` over the same values array).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from anonml.mechanisms._oracles import ORACLE_NAMES, make_oracle

DOMAIN_SIZES = (4, 8, 16, 32, 64)
EPSILONS = (0.5, 1.0, 2.0, 4.0)
THROUGHPUT_REPORTS = 1_000_000
THROUGHPUT_M = 16
THROUGHPUT_EPSILON = 1.0


def _population(m: int, n: int) -> np.ndarray:
    """n values over {0..m-1} with Zipf(1) frequencies, deterministic."""
    weights = 1.0 / np.arange(1, m + 1)
    counts = np.floor(weights / weights.sum() * n).astype(np.int64)
    counts[0] += n - counts.sum()
    return np.repeat(np.arange(m), counts)


def error_table(n: int, reps: int, seed: int) -> list[dict[str, Any]]:
    """One row per (m, epsilon, oracle) with empirical and exact total squared error."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for m in DOMAIN_SIZES:
        values = _population(m, n)
        truth = np.bincount(values, minlength=m).astype(np.float64)
        for epsilon in EPSILONS:
            for name in ORACLE_NAMES:
                oracle = make_oracle(name, epsilon, m, n=n)
                errors = [float(((oracle.estimate(oracle.privatize(values, rng)) - truth) ** 2).sum()) for _ in range(reps)]
                rows.append(
                    {
                        "m": m,
                        "epsilon": epsilon,
                        "oracle": name,
                        "picked": oracle.name,
                        "theoretical": oracle.variance(n),
                        "empirical": float(np.mean(errors)),
                    }
                )
    return rows


def throughput(seed: int) -> dict[str, Any]:
    """Reports per second of privatise+estimate at m = 16, and the baseline."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, THROUGHPUT_M, size=THROUGHPUT_REPORTS)
    start = time.perf_counter()
    np.bincount(values, minlength=THROUGHPUT_M)
    baseline = time.perf_counter() - start
    result: dict[str, Any] = {
        "reports": THROUGHPUT_REPORTS,
        "m": THROUGHPUT_M,
        "epsilon": THROUGHPUT_EPSILON,
        "baseline_seconds": baseline,
        "oracles": {},
    }
    for name in ORACLE_NAMES[:-1]:
        oracle = make_oracle(name, THROUGHPUT_EPSILON, THROUGHPUT_M)
        start = time.perf_counter()
        reports = oracle.privatize(values, rng)
        privatized = time.perf_counter()
        oracle.estimate(reports)
        done = time.perf_counter()
        result["oracles"][name] = {
            "privatize_seconds": privatized - start,
            "estimate_seconds": done - privatized,
            "total_seconds": done - start,
            "reports_per_second": THROUGHPUT_REPORTS / (done - start),
            "ratio_to_baseline": (done - start) / baseline,
            "report_bytes": oracle.report_bytes,
        }
    return result


def _auto_vs_pq(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_key = {(row["m"], row["epsilon"], row["oracle"]): row for row in rows}
    summary = []
    for m in DOMAIN_SIZES:
        for epsilon in EPSILONS:
            auto = by_key[(m, epsilon, "auto")]
            pq = by_key[(m, epsilon, "pq")]
            summary.append(
                {
                    "m": m,
                    "epsilon": epsilon,
                    "auto_picks": auto["picked"],
                    "pq_over_auto": pq["theoretical"] / auto["theoretical"],
                }
            )
    return summary


def _render(console: Console, n: int, reps: int, rows: list[dict[str, Any]], speed: dict[str, Any]) -> None:
    by_key = {(row["m"], row["epsilon"], row["oracle"]): row for row in rows}
    exact = Table(title=f"Exact total squared error sum_i E[(n̂_i - n_i)^2] / n (n={n})")
    ratios = Table(title=f"Empirical / exact total squared error ({reps} reps, n={n}; red: outside 4 sd)")
    for table in (exact, ratios):
        table.add_column("m", justify="right")
        table.add_column("eps", justify="right")
        for name in ORACLE_NAMES:
            table.add_column(name, justify="right")
    exact.add_column("auto picks")
    exact.add_column("pq / auto", justify="right")
    for m in DOMAIN_SIZES:
        # The mean of `reps` totals of m squared errors has relative sd about
        # sqrt(2 / (reps m)) when the errors are near-independent normals.
        band = 4 * math.sqrt(2 / (reps * m))
        for epsilon in EPSILONS:
            cells = [by_key[(m, epsilon, name)] for name in ORACLE_NAMES]
            auto, pq = by_key[(m, epsilon, "auto")], by_key[(m, epsilon, "pq")]
            exact.add_row(
                str(m), f"{epsilon:g}", *(f"{row['theoretical'] / n:.4g}" for row in cells),
                auto["picked"], f"{pq['theoretical'] / auto['theoretical']:.2f}",
            )
            ratio_cells = []
            for row in cells:
                ratio = row["empirical"] / row["theoretical"]
                ratio_cells.append(f"{ratio:.2f}" if abs(ratio - 1) <= band else f"[red]{ratio:.2f}[/red]")
            ratios.add_row(str(m), f"{epsilon:g}", *ratio_cells)
    console.print(exact)
    console.print(ratios)
    speed_table = Table(
        title=f"Throughput: privatise + estimate {speed['reports']:,} reports, m={speed['m']}, eps={speed['epsilon']:g}"
    )
    for column in ("oracle", "privatise s", "estimate s", "total s", "reports/s", "x baseline", "bytes/report"):
        speed_table.add_column(column, justify="right")
    speed_table.add_row(
        "baseline: np.bincount", "", "", f"{speed['baseline_seconds']:.4f}",
        f"{speed['reports'] / speed['baseline_seconds']:,.0f}", "1", "",
    )
    for name, figures in speed["oracles"].items():
        speed_table.add_row(
            name,
            f"{figures['privatize_seconds']:.3f}",
            f"{figures['estimate_seconds']:.3f}",
            f"{figures['total_seconds']:.3f}",
            f"{figures['reports_per_second']:,.0f}",
            f"{figures['ratio_to_baseline']:.0f}",
            str(figures["report_bytes"]),
        )
    console.print(speed_table)


@click.command("mechanisms")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON instead of tables.")
@click.option("--n", "n", default=10_000, show_default=True, help="Reports per histogram in the error table.")
@click.option("--reps", default=20, show_default=True, help="Repetitions per (m, epsilon, oracle).")
@click.option("--seed", default=20240601, show_default=True, help="Seed of the numpy generator.")
def bench_mechanisms(as_json: bool, n: int, reps: int, seed: int) -> None:
    """Histogram error of every frequency oracle (empirical vs exact), what
    `auto` picks, and privatise+estimate throughput at one million reports."""
    if n < 1 or reps < 1:
        raise click.BadParameter(f"n and reps must be >= 1, got {n!r}, {reps!r}")
    rows = error_table(n, reps, seed)
    speed = throughput(seed + 1)
    if as_json:
        click.echo(
            json.dumps(
                {"n": n, "reps": reps, "seed": seed, "errors": rows, "auto_vs_pq": _auto_vs_pq(rows), "throughput": speed},
                indent=2,
            )
        )
        return
    console = Console()
    if not console.is_terminal:
        # Piped output would otherwise be wrapped at 80 columns.
        console = Console(width=120)
    _render(console, n, reps, rows, speed)
