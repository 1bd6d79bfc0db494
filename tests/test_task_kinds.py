"""Task kinds (issue 28): ``[task] kind`` in the round spec, signed in the manifest, and a statistics round."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anonml.aggregator._report import summarise
from anonml.aggregator._spec import RoundSpecError, parse_round_spec
from anonml.learning import round_statistic_errors
from anonml.mechanisms import OptimizedUnaryEncoding
from anonml.peer import Dataset, Event, PeerStore, RoundPipeline, describe_release
from anonml.protocol import FeatureSpec, InvalidManifest, RoundManifest, SignedManifest, TaskKind, check_queries
from anonml.simulate import RoundSetup, RoundTrace, SimulationConfig, simulate_round
from anonml.simulate._world import _seeded, peer_row
from test_aggregator import spec_document, with_median
from test_aggregator_cli import write_spec
from test_manifest import PINNED_ROUND_ID, SIGNING_KEY, fixed_manifest
from test_rounds_cli import agg, round_new  # noqa: F401 - agg is a fixture


def statistics_document() -> dict[str, object]:
    """The test round with a numeric feature, as a statistics task: one feature per peer, a unary encoding."""
    document = with_median(spec_document())
    document["task"]["kind"] = "statistics"
    document["learning"] = {"k_p": 3, "k_h": 1, "k_s": 1, "plan": "one", "learner": "logreg", "comparison_pool": 0.2}
    document["privacy"] = {"eps_total": 2.0, "oracle": "oue"}
    return document


def test_the_ensemble_is_the_default_kind_and_encodes_as_before_the_field() -> None:
    assert fixed_manifest().task_kind == TaskKind.ENSEMBLE
    assert fixed_manifest(task_kind="ensemble").round_id.hex() == PINNED_ROUND_ID
    assert b'"kind"' not in fixed_manifest().canonical_bytes()


def test_the_statistics_kind_is_signed_and_round_trips() -> None:
    statistics = fixed_manifest(task_kind="statistics")
    assert statistics.task_kind is TaskKind.STATISTICS and statistics.round_id.hex() != PINNED_ROUND_ID
    signed = SignedManifest.sign(statistics, SIGNING_KEY)
    parsed = SignedManifest.from_json(signed.to_json(), expected_identity=bytes(SIGNING_KEY.verify_key)).manifest
    assert parsed.task_kind == TaskKind.STATISTICS and parsed == statistics


@pytest.mark.parametrize("kind", ["magic", "ensemble", 3])
def test_an_unknown_or_spelled_out_default_kind_is_refused_naming_the_field(kind: object) -> None:
    if kind != "ensemble":  # the constructor takes the default: its encoding leaves the field out
        with pytest.raises(InvalidManifest):
            fixed_manifest(task_kind=kind)
    document = fixed_manifest().to_dict()
    document["task"]["kind"] = kind
    with pytest.raises(InvalidManifest) as info:
        RoundManifest.from_dict(document)
    assert info.value.field == "task.kind"


def test_a_spec_states_its_kind_and_leaving_it_out_is_the_ensemble() -> None:
    assert parse_round_spec(spec_document()).task.kind == TaskKind.ENSEMBLE
    assert parse_round_spec(statistics_document()).task.kind == TaskKind.STATISTICS


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"plan": "split", "k_p": 2, "comparison_pool": 0.0}, "learning", 'plan = "one" and k_s = 1'),
    ({"k_s": 2}, "learning", 'plan = "one" and k_s = 1'),
])
def test_a_statistics_task_releases_one_feature_per_peer(change: dict[str, object], field: str, words: str) -> None:
    document = statistics_document()
    document["learning"].update(change)  # type: ignore[attr-defined]
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(document)
    assert info.value.field == field and words in str(info.value)


def test_a_statistics_task_needs_a_unary_encoding() -> None:
    document = statistics_document()
    document["privacy"] = {"eps_total": 2.0, "oracle": "grr"}
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(document)
    assert info.value.field == "privacy.oracle" and "unary encoding" in str(info.value)


def test_round_new_refuses_an_unknown_kind_in_one_line(agg: Path, tmp_path: Path) -> None:  # noqa: F811
    spec = write_spec(tmp_path / "round.toml")
    spec.write_text(spec.read_text().replace("[task]\n", '[task]\nkind = "regression"\n', 1))
    code, output = round_new(agg, spec)
    assert code == 1 and "Traceback" not in output
    (line,) = output.strip().splitlines()
    assert "task.kind" in line and "'regression'" in line and "ensemble, statistics" in line


def _as_statistics_task(document: dict[str, Any]) -> None:
    """The simulator's round as a statistics task: a pool answers the median search, every other peer one report."""
    document["task"]["kind"] = "statistics"
    document["task"]["quantiles"] = 3
    document["learning"] = {"k_p": 2, "k_h": 1, "k_s": 1, "plan": "one", "learner": "logreg", "comparison_pool": 0.34}
    document["privacy"] = {"eps_total": 4.0, "oracle": "oue"}
    document["participation"]["min_participation"] = 12


@pytest.fixture(scope="module")
def statistics_round(tmp_path_factory: pytest.TempPathFactory) -> RoundTrace:
    return simulate_round(SimulationConfig(peers=16, seed=11), setup=RoundSetup(adjust_spec=_as_statistics_task),
                          keep=tmp_path_factory.mktemp("statistics-round"))


def _row_of(trace: RoundTrace, index: int) -> dict[str, Any]:
    """Peer ``index``'s data row, drawn as the simulator drew it."""
    return peer_row(index, np.random.default_rng(_seeded(trace.config.seed, "data", index)))


def test_a_statistics_round_charges_each_peer_its_promise_and_accepts_every_report(statistics_round: RoundTrace) -> None:
    trace = statistics_round
    manifest = trace.manifest.manifest
    assert trace.outcome == "done" and manifest.task_kind == TaskKind.STATISTICS
    results = [p.result for p in trace.peers]
    assert all(r is not None for r in results), [p.error or p.refused for p in trace.peers]
    # Each peer made ONE release at the whole promise (a comparison bit or a report): its ledger is the promise, exactly.
    assert {r.epsilon_spent for r in results if r is not None} == {manifest.eps_total} == {4.0}
    packets = sum(r.packets for r in results if r is not None)
    assert packets == len(trace.arrivals) > 0
    assert sum(r.acknowledged for r in results if r is not None) == packets
    assert trace.report["model"] is None and trace.report["task_kind"] == "statistics"
    # The consent preview says what the round computes, and its cost is the promise.
    spec = FeatureSpec.from_dict(dict(manifest.features))
    assert trace.peer_store is not None
    store = PeerStore(trace.peer_store)
    outcome = trace.peers[0]
    vector = RoundPipeline.for_spec(spec).vector_of(Dataset((Event(_row_of(trace, outcome.index), None, 1),)))
    text, cost, _, _ = describe_release(trace.manifest, spec, vector, store, outcome.key)
    assert cost == manifest.eps_total and "task: statistics: every feature's histogram" in text, text


def test_a_statistics_round_reports_each_answer_beside_its_formula(statistics_round: RoundTrace) -> None:
    trace = statistics_round
    manifest = trace.manifest.manifest
    answers = {(a["kind"], a["subject"]): a for a in trace.report["statistics"]}
    assert set(answers) == {("count", "y positive"), ("histogram", "age"), ("histogram", "colour"), ("mean", "age"), ("quantile", "age")}
    assert trace.report["queries"] == [a["query"] for a in trace.report["statistics"]] == [
        "count:label", "histogram:age", "mean:age", "quantile:age:0.5", "histogram:colour"]
    data_peers = [p for p in trace.peers if p.result is not None and p.result.partition is not None and p.result.partition < manifest.k_p]
    rows = [_row_of(trace, p.index) for p in data_peers]
    count = answers[("count", "y positive")]
    assert count["reports"] == len(data_peers) == sum(a["reports"] for k, a in answers.items() if k[0] == "histogram")
    truth = sum(row["y"] == "1" for row in rows)
    assert abs(count["estimate"] - truth) < 4 * count["std_error"], (count, truth)
    # A histogram's total error needs no true counts: the oracle's exact total, per survey.
    for feature in ("age", "colour"):
        histogram = answers[("histogram", feature)]
        cells = FeatureSpec.from_dict(dict(manifest.features)).domain_size((feature,))
        assert histogram["variance"] == pytest.approx(OptimizedUnaryEncoding(4.0, cells).variance(histogram["reports"]))
    median, cut_points = answers[("quantile", "age")], trace.report["cut_points"]["age"]
    assert median["estimate"] in cut_points and len(median["cdf"]) == len(cut_points) + 1
    mean = answers[("mean", "age")]
    assert 0 <= mean["estimate"] <= 100 and mean["std_error"] > 0
    lines = summarise(trace.report)
    assert any(line.startswith("statistic: mean:age (age,") and "std error" in line and "mid_b" in line for line in lines)
    # report.html, the dashboard's page with the final figures, carries the answers its statistics table shows.
    assert trace.peer_store is not None
    (page,) = (trace.peer_store.parent / "aggregator" / "rounds").glob("*/report.html")
    html = page.read_text()
    tag = '<script id="report-data" type="application/json">'
    embedded = json.loads(html[html.index(tag) + len(tag):html.index("</script>", html.index(tag))])
    assert embedded["report"]["statistics"] == trace.report["statistics"] and 'id="statistics-table"' in html


def test_the_statistics_demo_plans_a_round_round_new_accepts() -> None:
    from anonml.demo._data import breast_cancer_data
    from anonml.demo._schedule import plan_round, round_spec
    from test_demo_parts import costs

    data = breast_cancer_data(0)
    params = plan_round(data, len(data.train_rows), 2.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.STATISTICS)
    relays = [{"node_id": bytes([i + 1]).hex() * 32, "host": "127.0.0.1", "port": 9000 + i, "public_key": bytes([0x40 + i]).hex() * 32,
               "key_epoch": 1, "mirror_port": None, "beacon_key": None} for i in range(5)]
    spec = parse_round_spec(round_spec(data, params, relays, 8080, 8081))
    assert spec.task.kind == TaskKind.STATISTICS and spec.privacy.oracle == "oue"
    assert (spec.learning.plan, spec.learning.k_s, spec.learning.k_p) == ("one", 1, len(data.spec.features))


def test_a_statistics_rounds_errors_hold_their_formulas_over_100_trials() -> None:
    """Offline, with the round's own estimator: each answer's empirical squared error over 100 seeded trials
    is within 1.5x of the mean of the variance its formula stated (the mean's target is its bins' midpoints)."""
    spec = FeatureSpec.from_dict({
        "features": [{"name": "age", "type": "numeric", "low": 0, "high": 100, "quantiles": 3}],
        "label": {"name": "y", "positive": ["1"], "negative": ["0"]},
    })
    cuts = [20.0, 45.0, 70.0]
    rng = np.random.default_rng(2028)
    n = 400
    ages = rng.beta(2, 3, n) * 100
    labels = (rng.random(n) < ages / 100).astype(np.int64)
    bins = np.searchsorted(cuts, ages, side="left")  # bin #{c : v > c}, as the peers bin
    rows = round_statistic_errors(spec, bins[:, None], labels, {"age": cuts}, (), epsilon=1.0, trials=100, rng=rng)
    assert [row["task"] for row in rows] == ["count:label", "histogram:age", "mean:age", "quantile:age:0.5"]
    for row in rows:
        assert 1 / 1.5 < row["ratio"] < 1.5, row


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_a_count_of_a_categorical_value_holds_its_formula_over_100_trials(epsilon: float) -> None:
    """``count:F=V`` counts ``V``'s bin among the peers who reported ``F`` (half of them: two features, one each),
    beside the label count over every peer; each within 1.5x of its formula over 100 seeded trials."""
    spec = FeatureSpec.from_dict({
        "features": [{"name": "age", "type": "numeric", "low": 0, "high": 100, "quantiles": 1},
                     {"name": "colour", "type": "categorical", "categories": ["red", "green", "blue"]}],
        "label": {"name": "y", "positive": ["1"], "negative": ["0"]},
    })
    queries = check_queries(["count:colour=green", "count:label", "histogram:age"], spec)
    rng = np.random.default_rng(2029)
    n = 600
    colours = rng.choice(3, size=n, p=[0.6, 0.3, 0.1])
    ages = rng.uniform(0, 100, n)
    bins = np.column_stack([(ages > 50).astype(np.int64), colours])
    labels = (rng.random(n) < 0.3 + 0.4 * (colours == 1)).astype(np.int64)
    rows = round_statistic_errors(spec, bins, labels, {"age": [50.0]}, queries, epsilon=epsilon, trials=100, rng=rng)
    assert [row["task"] for row in rows] == ["count:colour=green", "count:label", "histogram:age"]
    assert rows[0]["column"] == "colour = green" and "Var[n̂_b] / n^2" in rows[0]["formula"]
    for row in rows:
        assert 1 / 1.5 < row["ratio"] < 1.5, row
