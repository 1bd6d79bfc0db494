"""Learning after the delivery window, and the round report (DESIGN.md §3 step 8, §9, §11).

:func:`learn` estimates one histogram per (partition, subset) with the
manifest's frequency oracle and post-processing, fits the partition ensemble,
writes the model, and returns the report: counts, rejections by reason,
privacy spent (local ε_T per peer and the shuffle-amplified central figure),
utility on an operator-supplied labelled test file, and timings.
"""

from __future__ import annotations

import csv
import json
import pickle
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from anonml.aggregator._anonymity import FullView, linking_report
from anonml.aggregator._dashboard import dashboard_data, render_page
from anonml.aggregator._round import RoundState
from anonml.mechanisms import postprocess, shuffle_amplified_epsilon
from anonml.protocol import FeatureSpec, SurveyId

if TYPE_CHECKING:
    from anonml.learning._data import Table

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
MODEL_FILE = "model.pickle"


def learn(state: RoundState, directory: Path, *, test_file: Path | None = None) -> dict[str, Any]:
    """Fit the ensemble on the round's reports; write the model and the report files; return the report.

    The driver runs it in a worker thread after setting ``state.learning_started_at``,
    so it never reads the clock itself (trio's MockClock is only readable on the loop).
    """
    now = state.learning_started_at if state.learning_started_at is not None else state.now()
    from anonml.learning._ensemble import PartitionEnsemble, SubsetHistogram

    started = time.perf_counter()
    manifest, spec = state.manifest, state.spec
    histograms = []
    per_survey: dict[str, int] = {}
    for partition, subsets in enumerate(state.subsets):
        for index, subset in enumerate(subsets):
            survey = SurveyId.data(state.round_id, partition, index)
            blobs = state.store.reports(survey)
            per_survey[f"partition {partition} subset {index}"] = len(blobs)
            if not blobs:
                continue
            oracle = state.data_oracle(partition, index)
            reports = oracle.decode_reports(blobs)
            counts = postprocess(oracle.estimate(reports), len(blobs), "norm-sub")
            histograms.append(SubsetHistogram.from_spec(spec, subset, counts, partition))
    medians = state.medians()
    cut_points = {name: [value] for name, value in (medians.medians.items() if medians else ())}
    report: dict[str, Any] = {
        "round_id": state.round_id.hex(),
        "name": manifest.name,
        # "degraded" when a survey got fewer reports than the spec's minimum (RoundState.shortfall).
        "status": str(state.ending()),
        "shortfall": state.shortfall(manifest.schedule.phases),
        "partition_sizes": state.partition_sizes(),
        "schedule": manifest.schedule.to_dict(),
        "counts": state.store.counts(),
        "rejected": state.store.rejections(),
        "accepted_by_survey": per_survey,
        "medians": {name: values[0] for name, values in cut_points.items()},
        "privacy": _privacy(state),
        "anonymity": linking_report(FullView(
            state.store.arrivals(), state.store.partitions(), lambda survey: float(manifest.schedule.phase_of(survey).send_end),
            state.requests, state.round_id,
        ), directory),
        "model": None,
        "utility": None,
    }
    if histograms:
        model = PartitionEnsemble(base=manifest.learner, random_state=0).fit_histograms(histograms, n_bins=spec.n_bins)
        (directory / MODEL_FILE).write_bytes(pickle.dumps({"model": model, "cut_points": cut_points, "spec": spec.to_dict()}))
        report["model"] = MODEL_FILE
        if test_file is not None:
            report["utility"] = _utility(state, model, cut_points, test_file)
    schedule = manifest.schedule
    report["timings"] = {
        "learn_seconds": round(time.perf_counter() - started, 3),
        "learning_started_at": now,
        "lag_after_delivery_seconds": now - schedule.end,
    }
    write_report(report, directory, dashboard_data(state, None, report, now=now))
    state.store.put_result("report", json.dumps(report, sort_keys=True).encode())
    return report


def _privacy(state: RoundState) -> dict[str, Any]:
    manifest = state.manifest
    sizes = [size for size in state.partition_sizes() if size > 0]
    central: dict[str, Any] | None = None
    if sizes:
        n = min(sizes)
        delta = 1.0 / (n * n) if n > 1 else 1.0
        try:
            # Feldman–McMillan–Talwar: each data survey's reports are shuffled among its partition.
            central = {"epsilon": shuffle_amplified_epsilon(manifest.eps_data, n, delta), "delta": delta, "n": n}
        except ValueError as exc:
            central = {"unavailable": str(exc)}
    return {
        "eps_total_local": manifest.eps_total,
        "eps_median": manifest.eps_median,
        "eps_data": manifest.eps_data,
        "central_per_survey": central,
    }


MAX_TEST_ROWS = 10_000_000


def read_labelled_csv(path: Path, spec: FeatureSpec) -> Table:
    """A held-out table as CSV with a header naming every feature and the label.

    Raises DataError naming the line of the first malformed row.
    """
    from anonml.learning._data import DataError, Table, finite_number

    needed = [*spec.names, spec.label.name]
    numeric = set(spec.numeric_names)
    values: dict[str, list[Any]] = {name: [] for name in needed}
    try:
        with path.open("r", encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [name for name in needed if name not in (reader.fieldnames or [])]
            if missing:
                raise DataError(f"{path.name}:1: header lacks columns {missing!r}")
            for row in reader:
                line = reader.line_num
                if line > MAX_TEST_ROWS:
                    raise DataError(f"{path.name}:{line}: more than {MAX_TEST_ROWS} rows")
                for name in needed:
                    field = (row.get(name) or "").strip()
                    if not field:
                        raise DataError(f"{path.name}:{line}: empty field {name!r}")
                    values[name].append(finite_number(f"{path.name}:{line}", name, field) if name in numeric else field)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path.name}: not a readable CSV file ({exc})") from None
    if not values[spec.label.name]:
        raise DataError(f"{path.name}: no data rows")
    columns = {
        name: np.asarray(values[name], dtype=np.float64 if name in numeric else str) for name in spec.names
    }
    return Table(columns, np.asarray(values[spec.label.name], dtype=str))


def _utility(state: RoundState, model: Any, cut_points: dict[str, list[float]], test_file: Path) -> dict[str, Any]:
    """AUC of the published model on a labelled held-out file: CSV with a header, or UCI Adult's format."""
    from sklearn.metrics import roc_auc_score

    from anonml.learning._data import read_adult_file

    table = read_labelled_csv(test_file, state.spec) if test_file.suffix == ".csv" else read_adult_file(test_file)
    bins = state.spec.bin_columns(table.columns, cut_points)
    labels = state.spec.label.encode(table.labels)
    scores = model.decision_function(bins)
    return {
        "test_file": str(test_file), "rows": int(labels.shape[0]), "auc": float(roc_auc_score(labels, scores)),
        "roc": roc_points(labels, scores),
    }


ROC_POINTS = 200
"""At most this many ROC points in the report (the curve's shape, not every threshold)."""


def roc_points(labels: np.ndarray, scores: np.ndarray) -> dict[str, list[float]]:
    """The ROC curve (false and true positive rates), thinned to at most ROC_POINTS points, ends kept."""
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=True)
    keep = np.unique(np.linspace(0, len(fpr) - 1, min(len(fpr), ROC_POINTS)).round().astype(int))
    return {"fpr": [round(float(x), 5) for x in fpr[keep]], "tpr": [round(float(y), 5) for y in tpr[keep]]}


def write_report(report: dict[str, Any], directory: Path, page: dict[str, Any]) -> None:
    """``report.json`` and ``report.html``: the dashboard page with the final figures, readable without a server.

    ``page`` is :func:`dashboard_data` at the end of the round, ``report`` included.
    """
    (directory / REPORT_JSON).write_text(json.dumps(report, indent=2, sort_keys=True))
    (directory / REPORT_HTML).write_text(render_page(page, standalone=True))


def summarise(report: dict[str, Any]) -> list[str]:
    """Terminal lines for ``anonml aggregator report``."""
    counts = report.get("counts", {})
    privacy = report.get("privacy", {})
    lines = [
        f"round {report.get('name')} ({report.get('round_id', '')[:16]}…): {report.get('status', 'done')}",
        f"registered {counts.get('registered', 0)}, credentials {counts.get('credentials', 0)}, accepted packets {counts.get('accepted', 0)}",
        "rejected: " + (", ".join(f"{k} {v}" for k, v in sorted(report.get("rejected", {}).items())) or "none"),
        f"privacy: local eps_T {privacy.get('eps_total_local')} per peer; central (shuffled) {privacy.get('central_per_survey')}",
    ]
    anonymity = report.get("anonymity") or {}
    if anonymity.get("messages"):
        lines.append(
            f"anonymity: timing guesses for {anonymity['messages']} messages in {anonymity.get('links')}; chance "
            f"{100 * anonymity['chance']:.3g}% (smallest anonymity set {anonymity['anonymity_set_min']}); whoever knows "
            "the senders scores them"
        )
    if report.get("utility"):
        lines.append(f"utility: AUC {report['utility']['auc']:.4f} on {report['utility']['rows']} held-out rows")
    if report.get("reason"):
        lines.append(f"reason: {report['reason']}")
    if report.get("shortfall"):
        short = ", ".join(f"{survey}: {count}" for survey, count in report["shortfall"].items())
        lines.append(f"short surveys (fewer accepted reports than the round's min_reports_per_survey): {short}")
    return lines

