"""``anonml bench mechanisms`` runs and reports consistent figures."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from anonml.bench.mechanisms import DOMAIN_SIZES, EPSILONS, SCALE_DOMAINS
from anonml.cli import main
from anonml.mechanisms import ORACLE_NAMES


def test_bench_json_covers_the_grid_and_auto_is_the_minimum() -> None:
    result = CliRunner().invoke(main, ["bench", "mechanisms", "--json", "--n", "300", "--reps", "2", "--scale-n", "5000"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    rows = figures["errors"]
    assert len(rows) == len(DOMAIN_SIZES) * len(EPSILONS) * len(ORACLE_NAMES)
    by_key = {(row["m"], row["epsilon"], row["oracle"]): row for row in rows}
    for m in DOMAIN_SIZES:
        for epsilon in EPSILONS:
            others = [by_key[(m, epsilon, name)]["theoretical"] for name in ORACLE_NAMES if name != "auto"]
            # Equal up to rounding: SS with k = 1 is GRR, and ties go to GRR.
            assert by_key[(m, epsilon, "auto")]["theoretical"] == pytest.approx(min(others), rel=1e-12)
            assert all(by_key[(m, epsilon, name)]["empirical"] > 0 for name in ORACLE_NAMES)
    assert all(entry["pq_over_auto"] >= 1 for entry in figures["auto_vs_pq"])
    # Every domain size up to 1e6 is measured, with peak memory, or the
    # oracle is excluded with its reason; auto's pick is always measured.
    scale = figures["scale"]
    assert max(SCALE_DOMAINS) == 1_000_000
    for m in SCALE_DOMAINS:
        rows = {row["oracle"]: row for row in scale if row["m"] == m}
        assert set(rows) == {"baseline: np.bincount", *(set(ORACLE_NAMES) - {"auto"})}
        for name, row in rows.items():
            assert ("excluded" in row) != ("peak_bytes" in row), row
        (picked,) = [row for row in rows.values() if row.get("auto_picks")]
        assert picked["peak_bytes"] > 0 and picked["report_bytes"] <= 1024


def test_bench_table_renders() -> None:
    result = CliRunner().invoke(main, ["bench", "mechanisms", "--n", "200", "--reps", "1", "--scale-n", "5000"])
    assert result.exit_code == 0, result.output
    assert "auto picks" in result.output and "peak MiB" in result.output and "1,000,000" in result.output
