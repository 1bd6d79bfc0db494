"""``anonml demo`` as a user runs it: separate relay, aggregator and peer
worker processes on loopback, one complete round, a summary at the end."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from anonml.cli import anonml_command

pytestmark = pytest.mark.slow


def test_the_default_demo_completes_a_round_with_a_small_group(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    result = subprocess.run(
        anonml_command("demo", "--peers", "60", "--work-dir", str(tmp_path / "work"), "--json", str(summary_path)),
        capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["phase"] == "done"
    assert summary["registered"] == summary["joined"] == 60
    # split plan, k_h = 2: two data packets per peer, plus a median answer
    # from each peer of the partitions the median sub-rounds query
    assert summary["packets"] >= 120
    assert summary["accepted"] == summary["packets"] == summary["receipts"]
    assert summary["missing"] == summary["unconfirmed"] == 0 and summary["rejected"] == {}
    assert summary["epsilon_local_max"] <= 2.0 + 1e-9
    assert 0.0 <= summary["auc"] <= 1.0 and summary["baseline_auc"] > 0.9
    assert Path(summary["report_path"]).is_file()
    assert "round summary" in result.stdout
    # Piped, progress arrives as timestamped lines while each phase runs, not as a table at its end.
    assert re.search(r"\[\d\d:\d\d:\d\d\] round phase registration;", result.stdout)
    assert re.search(r"\[\d\d:\d\d:\d\d\] round phase data;", result.stdout)
    assert "Traceback" not in result.stdout + result.stderr
    # The report carries the AUC the demo printed (it was null before the demo passed its held-out rows).
    assert summary["report"]["utility"]["auc"] == pytest.approx(summary["auc"])
