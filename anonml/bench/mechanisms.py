"""``anonml bench mechanisms``: histogram error of every oracle against its
formula, what ``auto`` picks, and time and peak memory up to m = 1e6.

Error: for m in {4, 8, 16, 32, 64} and epsilon in {0.5, 1, 2, 4}, n reports of
a fixed Zipf-like population, ``reps`` repetitions; the empirical mean of
``sum_i (n̂_i - n_i)^2`` beside the exact ``variance(n)``. Scale: for m in
{16, 1024, 65536, 1e6}, ``--scale-n`` peers (default 1e5) each privatise,
encode and the aggregator estimates blockwise from the encoded reports
(``estimate_blobs``), for every oracle whose report fits ``auto``'s byte
budget and whose estimation work is within its bound (others are listed as
excluded, with the reason); seconds and peak traced memory (tracemalloc,
which counts numpy's buffers) beside a same-run baseline: a non-private
``np.bincount`` over the same values array.
"""

from __future__ import annotations

import math
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from anonml.mechanisms import DEFAULT_MAX_ESTIMATE_WORK, DEFAULT_MAX_REPORT_BYTES, ORACLE_NAMES, OracleName, make_oracle

DOMAIN_SIZES = (4, 8, 16, 32, 64)
EPSILONS = (0.5, 1.0, 2.0, 4.0)
SCALE_DOMAINS = (16, 1024, 65_536, 1_000_000)
SCALE_EPSILON = 1.0


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


def _measure(action: Callable[[], object]) -> tuple[float, int]:
    """Seconds and peak traced bytes of ``action``."""
    tracemalloc.start()
    try:
        started = time.perf_counter()
        action()
        return time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def scale(n: int, seed: int) -> list[dict[str, Any]]:
    """One row per (m, oracle): seconds and peak memory of privatise, encode
    and blockwise estimation of ``n`` reports, or why the oracle is excluded;
    each m starts with its baseline row and what ``auto`` picks."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for m in SCALE_DOMAINS:
        values = rng.integers(0, m, size=n)
        base_seconds, base_peak = _measure(lambda: np.bincount(values, minlength=m))
        rows.append({"m": m, "oracle": "baseline: np.bincount", "seconds": base_seconds, "peak_bytes": base_peak})
        auto = make_oracle(OracleName.AUTO, SCALE_EPSILON, m, n=n).name
        for name in ORACLE_NAMES:
            if name == OracleName.AUTO:
                continue
            row: dict[str, Any] = {"m": m, "oracle": name, "auto_picks": auto == name}
            try:
                oracle = make_oracle(name, SCALE_EPSILON, m)
            except ValueError as exc:
                rows.append({**row, "excluded": str(exc)})
                continue
            row["report_bytes"] = oracle.report_bytes
            if oracle.report_bytes > DEFAULT_MAX_REPORT_BYTES:
                rows.append({**row, "excluded": f"report of {oracle.report_bytes} bytes > {DEFAULT_MAX_REPORT_BYTES}"})
                continue
            if oracle.estimate_work(n) > DEFAULT_MAX_ESTIMATE_WORK:
                rows.append({**row, "excluded": f"estimation work {oracle.estimate_work(n):.2g} > {DEFAULT_MAX_ESTIMATE_WORK:.2g}"})
                continue

            def run() -> None:
                blobs = oracle.encode_reports(oracle.privatize(values, rng))
                oracle.estimate_blobs(blobs)

            seconds, peak = _measure(run)
            rows.append({
                **row, "seconds": seconds, "peak_bytes": peak, "time_ratio": seconds / base_seconds,
                "memory_ratio": peak / base_peak,
            })
    return rows


def auto_vs_pq(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def render(console: Console, n: int, reps: int, rows: list[dict[str, Any]], speed: list[dict[str, Any]], n_scale: int) -> None:
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

    scale_table = Table(title=f"Scale: privatise, encode and estimate blockwise, n={n_scale:,} reports, eps={SCALE_EPSILON:g} (peak: tracemalloc)")
    for column in ("m", "oracle", "auto", "bytes/report", "seconds", "x baseline", "peak MiB", "x baseline mem", "excluded because"):
        scale_table.add_column(column, justify="left" if column in ("oracle", "excluded because") else "right")
    for row in speed:
        if "excluded" in row:
            excluded_cells = [f"{row['m']:,}", row["oracle"], "", str(row.get("report_bytes", "")), "", "", "", "", row["excluded"]]
            scale_table.add_row(*excluded_cells)
            continue
        baseline = "oracle" in row and row["oracle"].startswith("baseline")
        scale_cells = [
            f"{row['m']:,}", row["oracle"], "" if baseline else ("yes" if row["auto_picks"] else ""),
            "" if baseline else str(row["report_bytes"]), f"{row['seconds']:.3f}", "1" if baseline else f"{row['time_ratio']:.0f}",
            f"{row['peak_bytes'] / 2**20:.1f}", "1" if baseline else f"{row['memory_ratio']:.1f}", "",
        ]
        scale_table.add_row(*scale_cells)
    console.print(scale_table)
