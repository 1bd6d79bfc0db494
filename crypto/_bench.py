"""``anonml bench crypto``: packet and token costs beside same-run baselines.

Absolute times drift on shared machines, so every time is also printed as a
ratio to one X25519 and one P-256 scalar multiplication measured in the same
run (DESIGN.md §11). Token figures come from ``crypto._token_bench`` (owned
by the token recipe) when that module exists.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import click
from petlib.ec import EcGroup
from rich.console import Console
from rich.table import Table

from crypto._geometry import SphinxGeometry
from crypto._primitives import x25519
from crypto._sphinx import (
    NodeAddress,
    PathHop,
    ReleaseWindow,
    build_packet,
    generate_keypair,
    never_replayed,
    node_id_of,
    process_packet,
)

# DESIGN.md §5 and §6 targets, checked and printed beside the figures.
TARGETS: dict[str, tuple[str, float]] = {
    "sphinx_process_hop_us": ("<=", 250.0),
    "sphinx_build_3hop_us": ("<=", 1000.0),
    "token_verify_us": ("<=", 600.0),
    "token_bytes": ("<=", 300.0),
}
_P256_CURVE = 415  # NID of NIST P-256 in OpenSSL (petlib's EcGroup id), DESIGN.md §6


def time_us(operation: Callable[[], object], repeat: int) -> float:
    """Microseconds per call of ``operation``: the fastest of ``repeat`` calls."""
    return time_us_interleaved({"operation": operation}, repeat)["operation"]


def time_us_interleaved(operations: Mapping[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Microseconds per call of each operation: the fastest of ``repeat`` calls.

    Each call is timed on its own and the minimum kept (timeit's rule: the
    minimum is the cost with the least interference from other processes; on
    a machine shared by several busy processes a batch of a millisecond-long
    operation is almost never undisturbed, a single call often is). The
    operations take turns call by call, so load hits all of them alike and
    the ratios between them stay meaningful.
    """
    best = dict.fromkeys(operations, float("inf"))
    clock = time.perf_counter
    for _ in range(repeat):
        for name, operation in operations.items():
            started = clock()
            operation()
            best[name] = min(best[name], clock() - started)
    return {name: seconds * 1e6 for name, seconds in best.items()}


def _baseline_operations() -> dict[str, Callable[[], object]]:
    """One X25519 and one P-256 variable-base scalar multiplication."""
    scalar, point = os.urandom(32), generate_keypair()[1]
    group = EcGroup(_P256_CURVE)
    order = group.order()
    p256_point = order.random() * group.generator()
    p256_scalar = order.random()
    return {
        "x25519_mult_us": lambda: x25519(scalar, point),
        "p256_mult_us": lambda: p256_scalar * p256_point,
    }


def _sphinx_operations(geometry: SphinxGeometry) -> dict[str, Callable[[], object]]:
    """Build a 4-hop (3 relays + aggregator) and a 3-hop packet; process one
    relay hop and one final hop."""
    keys = [generate_keypair() for _ in range(4)]
    path = [
        PathHop(node_id_of(public), NodeAddress("127.0.0.1", 9000 + index), public, ReleaseWindow(0, 60))
        for index, (_, public) in enumerate(keys)
    ]
    message = os.urandom(geometry.message_size)
    four_hop = build_packet(geometry, path, message)
    one_hop = build_packet(geometry, path[-1:], message)
    return {
        "sphinx_build_4hop_us": lambda: build_packet(geometry, path, message),
        "sphinx_build_3hop_us": lambda: build_packet(geometry, path[:3], message),
        "sphinx_process_hop_us": lambda: process_packet(geometry, keys[0][0], four_hop, is_replay=never_replayed),
        "sphinx_process_final_us": lambda: process_packet(geometry, keys[-1][0], one_hop, is_replay=never_replayed),
    }


def measure_sphinx(repeat: int, geometry: SphinxGeometry | None = None) -> dict[str, float]:
    """Sphinx costs (µs) and sizes (bytes), with both baselines timed in turn with them."""
    geometry = geometry or SphinxGeometry.create()
    figures = time_us_interleaved({**_baseline_operations(), **_sphinx_operations(geometry)}, repeat)
    figures["sphinx_packet_bytes"] = float(geometry.packet_size)
    figures["sphinx_message_bytes"] = float(geometry.message_size)
    return figures


def measure_tokens(repeat: int) -> dict[str, float] | None:
    """The token recipe's figures, or None while ``crypto._token_bench`` does not exist."""
    try:
        module = importlib.import_module("crypto._token_bench")
    except ModuleNotFoundError as exc:
        if exc.name != "crypto._token_bench":
            raise
        return None
    figures: dict[str, float] = {str(name): float(value) for name, value in module.measure_tokens(repeat).items()}
    return figures


def run_benchmark(repeat: int) -> dict[str, Any]:
    """All figures, each time with its ratio to both baselines, and target checks."""
    measured = measure_sphinx(repeat)
    baselines = {name: measured.pop(name) for name in ("x25519_mult_us", "p256_mult_us")}
    tokens = measure_tokens(repeat)
    if tokens is not None:
        measured.update(tokens)
        # The token figures were timed apart from the baselines: time the
        # baselines again and keep the least disturbed measurement of each.
        again = time_us_interleaved(_baseline_operations(), repeat)
        baselines = {name: min(value, again[name]) for name, value in baselines.items()}
    figures: dict[str, dict[str, Any]] = {}
    for name, value in measured.items():
        entry: dict[str, Any] = {"value": round(value, 2)}
        if name.endswith("_us"):
            entry["x_x25519"] = round(value / baselines["x25519_mult_us"], 2)
            entry["x_p256"] = round(value / baselines["p256_mult_us"], 2)
        if name in TARGETS:
            relation, bound = TARGETS[name]
            entry["target"] = f"{relation} {bound:g}"
            entry["meets_target"] = value <= bound
        figures[name] = entry
    return {
        "repeat": repeat,
        "baselines_us": {name: round(value, 2) for name, value in baselines.items()},
        "figures": figures,
        "tokens_measured": tokens is not None,
    }


@click.command("crypto")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--repeat", default=500, show_default=True, type=click.IntRange(min=1), help="Calls per figure.")
def bench_crypto(as_json: bool, repeat: int) -> None:
    """Sphinx and token costs, as µs and as ratios to X25519 and P-256 multiplications."""
    report = run_benchmark(repeat)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    console = Console()
    baselines = report["baselines_us"]
    console.print(
        f"baselines: X25519 mult {baselines['x25519_mult_us']:.1f} µs, P-256 mult {baselines['p256_mult_us']:.1f} µs"
    )
    table = Table(title="anonml bench crypto")
    for column in ("figure", "value", "× X25519", "× P-256", "target", "ok"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for name, entry in report["figures"].items():
        table.add_row(
            name,
            f"{entry['value']:g}",
            f"{entry['x_x25519']:g}" if "x_x25519" in entry else "",
            f"{entry['x_p256']:g}" if "x_p256" in entry else "",
            entry.get("target", ""),
            ("yes" if entry["meets_target"] else "NO") if "meets_target" in entry else "",
        )
    console.print(table)
    if not report["tokens_measured"]:
        console.print("token figures: crypto._token_bench is not available yet")
