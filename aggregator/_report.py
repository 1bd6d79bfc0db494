"""Learning after the delivery window, and the round report (DESIGN.md §3 step 8, §9, §11).

:func:`learn` estimates one histogram per (partition, subset) with the
manifest's frequency oracle and post-processing, fits the partition ensemble,
writes the model, and returns the report: counts, rejections by reason,
privacy spent (local ε_T per peer and the shuffle-amplified central figure),
utility on an operator-supplied labelled test file, and timings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from anonml.aggregator._anonymity import FullView, linking_report
from anonml.base.storage import replace_file
from anonml.aggregator._dashboard import dashboard_data, render_page
from anonml.aggregator._round import RoundState
from anonml.mechanisms import PostprocessMethod, per_attribute_epsilon, releases_from, shuffle_central_privacy
from anonml.protocol import StatisticQuery, SurveyId, TaskKind, default_queries, release_roles

if TYPE_CHECKING:
    from anonml.learning import Table

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
# The published model: plain JSON (learning.model_to_json), never a pickle.
MODEL_FILE = "model.json"
# A model-averaging round's published average (plain JSON as well).
AVERAGED_MODEL_FILE = "averaged-model.json"


def warm_learning() -> None:
    """Import what :func:`learn` fits and scores with (scikit-learn and the SciPy it loads): 1.8 s of 2.0 in a
    default demo's learning, all of it between ``t_r`` and the report (issue 26). The service calls it while
    the round still runs (``aggregator._service.serve_aggregator``)."""
    import sklearn.metrics  # noqa: F401

    from anonml.learning import PartitionEnsemble  # noqa: F401 (its module imports scikit-learn's estimators)


def learn(state: RoundState, directory: Path, *, test_file: Path | None = None) -> dict[str, Any]:
    """Fit the ensemble on the round's reports; write the model and the report files; return the report.

    The driver runs it in a worker thread after setting ``state.learning_started_at``,
    so it never reads the clock itself (trio's MockClock is only readable on the loop).
    """
    now = state.learning_started_at if state.learning_started_at is not None else state.now()
    from anonml.learning import (
        PartitionEnsemble,
        estimate_histogram,
        model_to_json,
        published_model,
        round_statistics,
        survey_cells,
        table_matrix,
    )

    started = time.perf_counter()
    manifest, spec = state.manifest, state.spec
    statistics = manifest.task_kind == TaskKind.STATISTICS
    averaging = manifest.task_kind == TaskKind.MODEL_AVERAGING
    histograms, cells = [], []
    per_survey: dict[str, int] = {}
    for partition, subsets in enumerate(state.subsets):
        for index, subset in enumerate(subsets):
            survey = SurveyId.data(state.round_id, partition, index)
            blobs = state.store.reports(survey)
            per_survey[f"partition {partition} subset {index}"] = len(blobs)
            if not blobs or averaging:  # a model's blocks are averaged below, not estimated as histograms
                continue
            oracle = state.data_oracle(partition, index)
            if statistics:  # one feature per survey (aggregator._spec): its unbiased cells, not post-processed
                cells.append(survey_cells(spec, subset[0], oracle, blobs, labelled=manifest.labelled_reports))
            else:
                histograms.append(estimate_histogram(spec, subset, oracle, blobs, partition=partition, method=PostprocessMethod.NORM_SUB))
    medians = state.medians()
    cut_points = {name: list(values) for name, values in (medians.cut_points.items() if medians else ())}
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
        "cut_points": cut_points,
        # The planner's choice and its simulated AUC when the spec said plan = "auto"; None for a plan written out.
        "planned": json.loads(planned) if (planned := state.store.get_meta("planned")) else None,
        "privacy": _privacy(state),
        "anonymity": linking_report(FullView(
            state.store.arrivals(), state.store.partitions(), lambda survey: float(manifest.schedule.phase_of(survey).send_end),
            state.requests, state.round_id, lambda survey: float(manifest.schedule.phase_of(survey).t_2),
        ), directory) | {"min_anonymity_set": manifest.min_anonymity_set},
        "task_kind": str(manifest.task_kind),
        "model": None,
        "utility": None,
    }
    if statistics:
        queries = [StatisticQuery.parse(text) for text in manifest.statistic_queries]
        report["queries"] = [query.text for query in queries or default_queries(spec.names, spec.numeric_names)]
        report["labelled_reports"] = manifest.labelled_reports
        report["statistics"] = round_statistics(spec, cells, cut_points, queries)
    if state.sgd is not None:
        report["sgd"] = _sgd_result(state, test_file)
        report["privacy"] = _sgd_privacy(state)
        # Its surveys are its steps' (the data surveys hold nothing).
        report["accepted_by_survey"] = {f"gradient step {i}": n for i, n in enumerate(report["sgd"]["reports_per_step"])}
    if histograms:
        ensemble = PartitionEnsemble(base=manifest.learner, combiner=manifest.vote, random_state=0).fit_histograms(histograms, n_bins=spec.n_bins)
        model = published_model(spec, cut_points, ensemble)
        replace_file(directory / MODEL_FILE, model_to_json(model))
        report["model"] = MODEL_FILE
        if test_file is not None:
            report["utility"] = _utility(state, lambda table: model.decision_function(table_matrix(spec, table)), test_file)
    if averaging:
        _average_models(state, directory, report, test_file)
    schedule = manifest.schedule
    report["timings"] = {
        "learn_seconds": round(time.perf_counter() - started, 3),
        "learning_started_at": now,
        "lag_after_delivery_seconds": now - schedule.end,
    }
    write_report(report, directory, dashboard_data(state, None, report, now=now))
    state.store.put_result("report", json.dumps(report, sort_keys=True).encode())
    return report


def _average_models(state: RoundState, directory: Path, report: dict[str, Any], test_file: Path | None) -> None:
    """A model-averaging round's result: each block survey's reports (every partition's) averaged on their own
    (``learning.average_blocks``), written as ``averaged-model.json``; its AUC on ``test_file`` if given."""
    from anonml.learning import average_blocks

    model = state.round_model
    blocks = [[blob for partition in range(state.manifest.k_p) for blob in state.store.reports(SurveyId.data(state.round_id, partition, block))]
              for block in range(model.blocks.blocks)]
    if not all(blocks):
        report["reason"] = "a block of the model has no report: there is no model to average"
        return
    averaged = average_blocks(model.blocks, blocks, model.mechanism.grid)
    published = {"format": "anonml-averaged-logistic-1", "coef": averaged.coef.tolist(), "reports_per_block": list(averaged.reports),
                 "blocks": model.blocks.blocks, "per_block": model.blocks.per_block, "weights": model.weights.tolist(),
                 "norm_bound": model.norm_bound, "log_scaled": sorted(model.encoding.log_scaled),
                 "noise_norm_scale": model.mechanism.noise_norm_scale, "regularization": model.mechanism.regularization,
                 "regularization_rule": model.regularization_rule, "categorical_weight": model.categorical_weight}
    replace_file(directory / AVERAGED_MODEL_FILE, json.dumps(published, indent=2, sort_keys=True))
    report["model"] = AVERAGED_MODEL_FILE
    report["averaged_model"] = {key: published[key] for key in ("coef", "blocks", "per_block", "reports_per_block", "noise_norm_scale",
                                                                "regularization", "regularization_rule", "categorical_weight")}
    if test_file is not None:
        report["utility"] = _utility(state, lambda table: model.scores(averaged.coef, table), test_file)


def _privacy(state: RoundState) -> dict[str, Any]:
    """The privacy figures: the record-level ε_T each peer was promised (the
    sum of every release, what the ledgers enforce), eq. 7.4's per-attribute
    figure only as a labelled secondary number, and the central (shuffle)
    figure per data survey only where its bound holds, in words."""
    manifest = state.manifest
    roles = release_roles(
        state.spec, k_h=manifest.k_h, k_s=manifest.k_s, eps_median=manifest.eps_median,
        eps_data=manifest.eps_data, median_rounds=manifest.median_rounds, comparison_pool=bool(manifest.comparison_pool),
    )
    shuffled = state.shuffled_reports()
    central: dict[str, Any] | None = None
    # A model's block is a piece of ONE release at ε_T, not a release at eps_data = ε_T / k_h: each block
    # report alone is ε_T-LDP (post-processing), so its survey's bound is computed at ε_T (a peer's k_h
    # block surveys then compose, as an ensemble peer's k_h reports do).
    per_report = manifest.eps_total if manifest.task_kind == TaskKind.MODEL_AVERAGING else manifest.eps_data
    if shuffled:
        # Feldman-McMillan-Talwar, for the data survey with the fewest accepted reports.
        figure = shuffle_central_privacy(per_report, min(shuffled))
        central = {"n": figure.n, "delta": figure.delta, "statement": figure.describe()}
        if figure.epsilon is not None:
            central["epsilon"] = figure.epsilon
    return {
        "eps_total_local": manifest.eps_total,
        "eps_total_meaning": "record-level: the sum of the epsilon of every release a peer makes",
        # The costliest kind of peer's (with a comparison pool there are two kinds).
        "eps_per_attribute_secondary": max(per_attribute_epsilon(releases_from(*releases)) for releases in roles.values()),
        "eps_median": manifest.eps_median,
        "eps_data": manifest.eps_data,
        "eps_per_data_report": per_report,
        "central_per_survey": central,
    }


def _utility(state: RoundState, scores_of: Callable[[Table], np.ndarray], test_file: Path) -> dict[str, Any]:
    """AUC of the published model (``scores_of`` a table) on a labelled held-out file: CSV with a header, or UCI Adult's format."""
    from sklearn.metrics import roc_auc_score

    from anonml.learning import read_adult_file, read_csv_table

    table = read_csv_table(test_file, state.spec) if test_file.suffix == ".csv" else read_adult_file(test_file)
    labels = state.spec.label.encode(table.labels)
    scores = scores_of(table)
    return {
        "test_file": str(test_file), "rows": int(labels.shape[0]), "auc": float(roc_auc_score(labels, scores)),
        "roc": roc_points(labels, scores),
    }


def _sgd_result(state: RoundState, test_file: Path | None) -> dict[str, Any]:
    """An SGD round's model: every published step's, the mean of the second half of them, and its AUC."""
    from anonml.learning import averaged_model

    assert state.sgd is not None
    steps = state.manifest.median_rounds
    models = [state.publish_sgd_model(i) for i in range(steps + 1)]
    published = [model for model in models if model is not None]
    coefficients = averaged_model(published)
    result: dict[str, Any] = {
        "loss": str(state.sgd.loss), "model": state.sgd.loss.model, "mechanism": "Harmony's 1-bit gradient, one coordinate sampled (OneBitMean)",
        "steps": steps, "dimension": state.sgd.encoding.dimension, "learning_rate": state.sgd.learning_rate,
        "regularization": state.sgd.regularization,
        "reports_per_step": [len(state.iteration_reports(i)) for i in range(steps)],
        "coefficients": [float(c) for c in coefficients],
        "utility": None,
    }
    if test_file is not None:
        encoding = state.sgd.encoding
        result["utility"] = _utility(state, lambda table: encoding.transform(table) @ coefficients, test_file)
    return result


def _sgd_privacy(state: RoundState) -> dict[str, Any]:
    """An SGD round's privacy: each data peer's one gradient release, at the whole ε_T."""
    return {
        "eps_total_local": state.manifest.eps_total,
        "eps_total_meaning": "record-level: each peer releases one perturbed gradient of its record (every feature "
                             "and the label) at the whole epsilon, in its partition's one step",
        "eps_gradient": state.manifest.eps_total,
        "central_per_survey": None,
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
    # report.json last, each file whole: the demo (and an operator's script)
    # takes report.json's presence to mean the round's files are all written.
    replace_file(directory / REPORT_HTML, render_page(page, standalone=True))
    replace_file(directory / REPORT_JSON, json.dumps(report, indent=2, sort_keys=True))


def summarise(report: dict[str, Any]) -> list[str]:
    """Terminal lines for ``anonml aggregator report``."""
    from anonml.learning import describe_answer

    counts = report.get("counts", {})
    privacy = report.get("privacy", {})
    lines = [
        f"round {report.get('name')} ({report.get('round_id', '')[:16]}…): {report.get('status', 'done')}",
        f"registered {counts.get('registered', 0)}, credentials {counts.get('credentials', 0)}, accepted packets {counts.get('accepted', 0)}",
        "rejected: " + (", ".join(f"{k} {v}" for k, v in sorted(report.get("rejected", {}).items())) or "none"),
        f"privacy: local record-level eps_T {privacy.get('eps_total_local')} per peer (every release counted); "
        f"per-attribute figure (eq. 7.4, secondary) {privacy.get('eps_per_attribute_secondary')}",
        f"central (shuffle): {(privacy.get('central_per_survey') or {}).get('statement', 'n/a')}",
    ]
    anonymity = report.get("anonymity") or {}
    if anonymity.get("messages"):
        smallest, minimum = anonymity["anonymity_set_min"], anonymity.get("min_anonymity_set", 0)
        promise = f", {'BELOW ' if smallest < minimum else ''}the round's minimum {minimum}" if minimum else ""
        lines.append(
            f"anonymity: timing guesses for {anonymity['messages']} messages in {anonymity.get('links')}; chance "
            f"{100 * anonymity['chance']:.3g}% (smallest anonymity set {smallest}{promise}); whoever knows "
            "the senders scores them"
        )
    if report.get("cut_points"):
        cuts = "; ".join(f"{name} {', '.join(f'{v:.4g}' for v in values)}" for name, values in report["cut_points"].items())
        lines.append(f"cut points (private median search): {cuts}")
    if planned := report.get("planned"):
        lines.append(
            f"plan chosen by the planner (plan = \"auto\"): {planned['kind']}, k_p {planned['k_p']}, k_h {planned['k_h']}, "
            f"k_s {planned['k_s']}, {planned['quantiles']} cut point(s) per numeric feature, vote {planned['combiner']}; "
            f"simulated AUC {planned['simulated_auc']:.3f} on synthetic peers"
        )
    for answer in report.get("statistics") or ():
        lines.append(f"statistic: {describe_answer(answer)}")
    if report.get("sgd"):
        sgd = report["sgd"]
        lines.append(f"LDP SGD {sgd.get('model', 'logistic regression')} ({sgd['loss']} loss): {sgd['steps']} steps, "
                     f"γ0 {sgd['learning_rate']:g}, reports per step {sgd['reports_per_step']}")
        if sgd.get("utility"):
            lines.append(f"utility: AUC {sgd['utility']['auc']:.4f} on {sgd['utility']['rows']} held-out rows")
    if averaged := report.get("averaged_model"):
        lines.append(f"averaged model: {averaged['blocks']} block(s) of at most {averaged['per_block']} coordinates, reports per block "
                     f"{', '.join(map(str, averaged['reports_per_block']))}; each peer's noise norm scale {averaged['noise_norm_scale']:.3g}")
        if "regularization_rule" in averaged:
            lines.append(f"local models: λ = {averaged['regularization']:.4g} (rule {averaged['regularization_rule']:g} / (rows per peer · ε)), "
                         f"categorical weight {averaged['categorical_weight']:g}")
    if report.get("utility"):
        lines.append(f"utility: AUC {report['utility']['auc']:.4f} on {report['utility']['rows']} held-out rows")
    if report.get("reason"):
        lines.append(f"reason: {report['reason']}")
    if report.get("shortfall"):
        short = ", ".join(f"{survey}: {count}" for survey, count in report["shortfall"].items())
        lines.append(f"short surveys (fewer accepted reports than the round's min_reports_per_survey): {short}")
    return lines

