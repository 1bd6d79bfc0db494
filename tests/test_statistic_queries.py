"""Requester-chosen statistic queries (issue 28): ``[task] queries`` validated naming its field, signed in the
manifest only when present, peers releasing exactly the features they read and no label unless one counts it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anonml.aggregator._spec import RoundSpecError, parse_round_spec
from anonml.learning import describe_answer
from anonml.mechanisms import OptimizedUnaryEncoding
from anonml.peer import Dataset, Event, FeatureError, MalformedData, PeerStore, RoundPipeline, describe_release
from anonml.protocol import FeatureSpec, InvalidManifest, PartitionPlan, RoundManifest, SignedManifest, TaskKind
from anonml.simulate import RoundSetup, RoundTrace, SimulationConfig, simulate_round
from test_manifest import SIGNING_KEY, fixed_manifest
from anonml.simulate._world import peer_row
from test_task_kinds import _as_statistics_task, _row_of, statistics_document

LABEL_FREE = ["histogram:age", "mean:age", "quantile:age:0.25"]


def _with_queries(queries: object) -> dict[str, Any]:
    document = statistics_document()
    document["task"]["queries"] = queries
    return document


def test_a_spec_names_its_queries_and_keeps_only_the_features_they_read() -> None:
    spec = parse_round_spec(_with_queries(["count:label", "histogram:colour", "quantile:size:0.50"]))
    assert [query.text for query in spec.task.queries] == ["count:label", "histogram:colour", "quantile:size:0.5"]
    assert spec.task.features.names == ("colour", "size") and spec.task.labelled
    assert not parse_round_spec(_with_queries(["mean:size"])).task.labelled
    # Counting a categorical feature's value reads that feature, not the label.
    document = _with_queries(["count:colour=green", "count:shape=round"])
    del document["learning"]["comparison_pool"]  # no numeric feature read: no median search
    counted = parse_round_spec(document)
    assert [query.text for query in counted.task.queries] == ["count:colour=green", "count:shape=round"]
    assert counted.task.features.names == ("colour", "shape") and not counted.task.labelled


@pytest.mark.parametrize(("queries", "words"), [
    (["mean:colour"], "[0] 'mean:colour': a mean needs a numeric feature"),
    (["histogram:size", "median:size"], "[1] 'median:size': the kind must be one of count, histogram, mean, quantile"),
    (["quantile:size:1.5"], "strictly between 0 and 1"),
    (["quantile:size"], "'quantile:FEATURE:LEVEL'"),
    (["quantile:size:half"], "'half' is not a number"),
    (["histogram:weight"], "'weight' is not a feature of the task"),
    (["count:y"], "a count query is 'count:label' (the positive labels) or 'count:FEATURE=VALUE'"),
    (["count:colour=purple"], "[0] 'count:colour=purple': 'purple' is not a value of 'colour' (red, green, blue)"),
    (["count:weight=red"], "'weight' is not a feature of the task"),
    (["count:size=3"], "a count of a value needs a categorical feature; 'size' is numeric (ask 'histogram:size')"),
    (["count:colour="], "a count of a value is 'count:FEATURE=VALUE'"),
    (["count:=red"], "a count of a value is 'count:FEATURE=VALUE'"),
    (["count:colour=red", "count:colour=red"], "[1] 'count:colour=red': asked twice"),
    (["mean:size", "mean:size"], "[1] 'mean:size': asked twice"),
    ([], "a list of 1 to 64 queries"),
    ("mean:size", "a list of 1 to 64 queries"),
    ([3], "[0] expected a string"),
])
def test_a_malformed_query_is_refused_naming_the_field(queries: object, words: str) -> None:
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(_with_queries(queries))
    assert info.value.field == "task.queries" and words in str(info.value), str(info.value)


def test_queries_belong_to_a_statistics_task() -> None:
    document = _with_queries(["mean:size"])
    del document["task"]["kind"]
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(document)
    assert info.value.field == "task.queries" and 'kind = "statistics"' in str(info.value)


AGE_ONLY = {
    "features": [{"name": "age", "type": "numeric", "low": 17, "high": 90, "quantiles": 1}],
    "label": {"name": "income", "positive": [">50K"], "negative": ["<=50K"]},
}


def test_the_manifest_signs_queries_only_when_present() -> None:
    plain = fixed_manifest(task_kind="statistics")
    assert b'"queries"' not in plain.canonical_bytes() and plain.labelled_reports
    asked = fixed_manifest(task_kind="statistics", features=AGE_ONLY, statistic_queries=("mean:age", "quantile:age:0.5"))
    assert b'"queries":["mean:age","quantile:age:0.5"]' in asked.canonical_bytes() and not asked.labelled_reports
    signed = SignedManifest.sign(asked, SIGNING_KEY)
    parsed = SignedManifest.from_json(signed.to_json(), expected_identity=bytes(SIGNING_KEY.verify_key)).manifest
    assert parsed == asked and parsed.statistic_queries == ("mean:age", "quantile:age:0.5")
    assert parsed.round_id != fixed_manifest(task_kind="statistics", features=AGE_ONLY).round_id
    assert fixed_manifest(task_kind="statistics", features=AGE_ONLY, statistic_queries=("count:label", "mean:age")).labelled_reports


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"task_kind": "statistics", "statistic_queries": ("mean:age", "quantile:age:0.50")}, "task.queries", "canonical spelling"),
    ({"statistic_queries": ("mean:age",)}, "task.queries", "only a 'statistics' task"),
    ({"task_kind": "statistics", "statistic_queries": ("mean:sex",)}, "task.queries", "'sex' is not a feature"),
    ({"task_kind": "statistics", "statistic_queries": ("count:label",)}, "task.features", "'age' read by no query"),
])
def test_a_manifest_whose_queries_do_not_match_its_features_is_refused(change: dict[str, object], field: str, words: str) -> None:
    document = fixed_manifest(task_kind="statistics", features=AGE_ONLY, statistic_queries=("mean:age",)).to_dict()
    document["task"]["queries"] = list(change["statistic_queries"])  # type: ignore[call-overload]
    if change.get("task_kind") is None:
        del document["task"]["kind"]
    with pytest.raises(InvalidManifest) as info:
        RoundManifest.from_dict(document)
    assert info.value.field == field and words in str(info.value), str(info.value)


def test_a_label_free_report_has_no_label_bit() -> None:
    spec = FeatureSpec.from_dict(AGE_ONLY)
    assert spec.domain_size(("age",)) == 4 and spec.domain_size(("age",), labelled=False) == 2
    assert spec.encode(("age",), [[0], [1]], None).tolist() == [0, 1]
    assert spec.encode(("age",), [[0], [1]], [1, 1]).tolist() == [1, 3]
    pipeline = RoundPipeline.for_spec(spec)
    assert pipeline.encode_subset(("age",), {"age": 1}, None) == 1 and pipeline.encode_subset(("age",), {"age": 1}, 0) == 2


@pytest.mark.parametrize(("manifest", "needs"), [
    (fixed_manifest(task_kind="statistics", features=AGE_ONLY, statistic_queries=("count:label", "mean:age")),
     "the label the round's 'count:label' query counts"),
    (fixed_manifest(features=AGE_ONLY), "the label the round's model predicts"),
])
def test_a_peer_reads_a_file_without_the_label_column_only_when_no_release_carries_the_label(manifest: RoundManifest, needs: str) -> None:
    unlabelled = b"age\n41\n"
    free = RoundPipeline.for_manifest(fixed_manifest(task_kind="statistics", features=AGE_ONLY, statistic_queries=("mean:age",)))
    vector = free.vector_of(free.importer.import_bytes(unlabelled))
    assert vector.features == {"age": 41.0} and vector.label is None
    with pytest.raises(FeatureError, match="reads no label"):
        vector.known_label()
    # A round that reads the label says what reads it when the column is missing.
    with pytest.raises(MalformedData) as info:
        RoundPipeline.for_manifest(manifest).importer.import_bytes(unlabelled)
    assert str(info.value) == f"line 1: the header lacks the required columns ['income'] ('income' is {needs})"


def _label_free(document: dict[str, Any]) -> None:
    _as_statistics_task(document)
    document["task"]["queries"] = LABEL_FREE


@pytest.fixture(scope="module")
def label_free_round(tmp_path_factory: pytest.TempPathFactory) -> RoundTrace:
    return simulate_round(SimulationConfig(peers=16, seed=11), setup=RoundSetup(adjust_spec=_label_free),
                          keep=tmp_path_factory.mktemp("label-free-round"))


def test_a_round_answers_the_chosen_queries_from_label_free_reports(label_free_round: RoundTrace, tmp_path: Path) -> None:
    trace = label_free_round
    manifest = trace.manifest.manifest
    assert trace.outcome == "done" and manifest.statistic_queries == tuple(LABEL_FREE) and not manifest.labelled_reports
    spec = FeatureSpec.from_dict(dict(manifest.features))
    assert spec.names == ("age",)  # colour is read by no query: no peer releases it
    results = [p.result for p in trace.peers]
    assert all(r is not None for r in results), [p.error or p.refused for p in trace.peers]
    assert {r.epsilon_spent for r in results if r is not None} == {manifest.eps_total} == {4.0}
    assert sum(r.acknowledged for r in results if r is not None) == len(trace.arrivals) > 0
    # The data surveys' oracle encodes the age bins alone: half the labelled domain.
    plan = PartitionPlan.derive(manifest, spec, [bytes(32)], bytes(32), bytes(32))
    assert plan.oracle(0, 0).m == spec.features[0].n_bins == 4 // 2 * 2
    report = trace.report
    assert report["queries"] == LABEL_FREE and report["labelled_reports"] is False
    answers = report["statistics"]
    assert [a["query"] for a in answers] == LABEL_FREE
    histogram, mean, quantile = answers
    data_peers = [p for p in trace.peers if p.result is not None and p.result.partition is not None and p.result.partition < manifest.k_p]
    assert histogram["reports"] == len(data_peers)
    assert histogram["variance"] == pytest.approx(OptimizedUnaryEncoding(4.0, spec.features[0].n_bins).variance(len(data_peers)))
    cut_points = report["cut_points"]["age"]
    assert quantile["level"] == 0.25 and quantile["estimate"] == cut_points[quantile["cut_index"]]
    assert quantile["cdf"][quantile["cut_index"]] >= 0.25 or quantile["cut_index"] == len(cut_points) - 1
    ages = np.array([_row_of(trace, p.index)["age"] for p in data_peers], dtype=float)
    assert abs(mean["estimate"] - ages.mean()) < 4 * mean["std_error"] + 25  # the midpoints' bias: bins up to 50 wide
    # The consent preview (of a peer yet to spend) names the queries and says the label stays.
    outcome = trace.peers[0]
    vector = RoundPipeline.for_spec(spec).vector_of(Dataset((Event(_row_of(trace, outcome.index), None, 1),)))
    text, cost, _, _ = describe_release(trace.manifest, spec, vector, PeerStore(tmp_path / "peer.db"), outcome.key)
    assert cost == manifest.eps_total and "histogram:age, mean:age, quantile:age:0.25" in text, text
    assert "your label is never sent" in text and "NOT your label" in text and "colour" not in text, text


def _blue_count(document: dict[str, Any]) -> None:
    """A statistics round asking only how many peers' colour is blue: no numeric feature, so no median search."""
    document["task"].update(kind="statistics", queries=["count:colour=blue"])
    document["learning"] = {"k_p": 2, "k_h": 1, "k_s": 1, "plan": "one", "learner": "logreg"}
    document["privacy"] = {"eps_total": 4.0, "oracle": "oue"}
    for key in ("median_rounds", "median_send", "median_delivery"):
        document["schedule"].pop(key)


def _unlabelled_row(index: int, rng: np.random.Generator) -> dict[str, Any]:
    """The simulator's row without its label column (drawn as before, so the features match :func:`_row_of`)."""
    row = peer_row(index, rng)
    del row["y"]
    return row


def test_a_round_counts_a_categorical_value_from_peers_without_a_label_column() -> None:
    trace = simulate_round(SimulationConfig(peers=12, seed=4), setup=RoundSetup(adjust_spec=_blue_count, peer_data=_unlabelled_row))
    manifest = trace.manifest.manifest
    assert trace.outcome == "done" and not manifest.labelled_reports
    results = [p.result for p in trace.peers]
    assert all(r is not None for r in results), [p.error or p.refused for p in trace.peers]
    assert sum(r.acknowledged for r in results if r is not None) == len(trace.arrivals) == len(trace.peers)
    (answer,) = trace.report["statistics"]
    assert (answer["query"], answer["subject"], answer["bin"], answer["reports"]) == ("count:colour=blue", "colour = blue", 2, 12)
    # Every cell of a unary encoding is perturbed alone: the bin's variance is its one cell's, whose formula
    # grows with the (estimated) count from none of the 12 peers to all of them.
    oracle = OptimizedUnaryEncoding(4.0, 3)
    none, every = (float(oracle.value_variances(np.array(counts))[2]) for counts in ([12, 0, 0], [0, 0, 12]))
    assert none <= answer["variance"] <= every and none < every
    assert answer["share"] == pytest.approx(answer["estimate"] / 12)
    assert answer["share_std_error"] == pytest.approx(np.sqrt(answer["variance"]) / 12)
    assert f"(a share of {answer['share']:.4g} ± {answer['share_std_error']:.2g})" in describe_answer(answer)
    blue = sum(_row_of(trace, p.index)["colour"] == "blue" for p in trace.peers)
    assert abs(answer["estimate"] - blue) < 4 * answer["std_error"]


EXPERIMENT_QUERIES = ["count:label", "histogram:mean radius", "mean:mean radius", "quantile:worst area:0.75"]


def test_the_experiment_prints_each_querys_error_beside_its_formula(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from anonml.learning._command import experiment

    out = tmp_path / "statistics.json"
    arguments = ["breast-cancer", "--task", "statistics", "--epsilon", "1,4", "--trials", "100", "--json", str(out)]
    result = CliRunner().invoke(experiment, [*arguments, *(item for query in EXPERIMENT_QUERIES for item in ("--query", query))])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["statistics"]
    assert [(row["task"], row["epsilon"]) for row in rows] == [(query, eps) for eps in (1.0, 4.0) for query in EXPERIMENT_QUERIES]
    for row in rows:
        assert row["trials"] == 100 and 1 / 1.5 < row["ratio"] < 1.5, row
    assert "Var[n̂_b]" in result.output and "quantile:worst area:0.75" in result.output


def test_the_adult_experiment_counts_a_categorical_value_within_its_formula(tmp_path: Path, adult_dir: Path) -> None:
    from click.testing import CliRunner

    from anonml.learning._command import experiment

    out = tmp_path / "statistics.json"
    arguments = ["adult", "--data-dir", str(adult_dir), "--task", "statistics", "--query", "count:sex=Female",
                 "--query", "count:workclass=private-or-none", "--epsilon", "1,4", "--trials", "100", "--json", str(out)]
    result = CliRunner().invoke(experiment, arguments)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["statistics"]
    assert [(row["task"], row["column"], row["epsilon"]) for row in rows] == [
        (query, column, eps) for eps in (1.0, 4.0)
        for query, column in (("count:sex=Female", "sex = Female"), ("count:workclass=private-or-none", "workclass = private-or-none"))]
    for row in rows:
        assert row["trials"] == 100 and 1 / 1.5 < row["ratio"] < 1.5, row


def test_a_count_of_a_bucketed_category_names_its_bucket() -> None:
    from anonml.learning import adult_spec
    from anonml.protocol import QueryError, check_queries

    with pytest.raises(QueryError) as info:
        check_queries(["count:sex=Female", "count:workclass=Private"], adult_spec())
    assert str(info.value) == ("[1] 'count:workclass=Private': 'Private' is in bucket 'private-or-none' of 'workclass', and a "
                               "report carries only the bucket: count 'count:workclass=private-or-none'")


@pytest.mark.parametrize(("arguments", "words"), [
    (["--task", "statistics", "--query", "mean:diagnosis"], "--query [0] 'mean:diagnosis': 'diagnosis' is not a feature"),
    (["--query", "mean:mean radius"], "--query asks a statistics task: add --task statistics"),
])
def test_the_experiment_refuses_a_bad_query_in_one_line(arguments: list[str], words: str) -> None:
    from click.testing import CliRunner

    from anonml.learning._command import experiment

    result = CliRunner().invoke(experiment, ["breast-cancer", "--trials", "1", *arguments])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output, result.output


RELAYS = [{"node_id": bytes([i + 1]).hex() * 32, "host": "127.0.0.1", "port": 9000 + i, "public_key": bytes([0x40 + i]).hex() * 32,
           "key_epoch": 1, "mirror_port": None, "beacon_key": None} for i in range(5)]


def test_the_statistics_demo_asks_its_queries_and_searches_medians_only_for_numeric_ones() -> None:
    import dataclasses

    from anonml.demo._data import breast_cancer_data
    from anonml.demo._schedule import plan_round, round_spec
    from anonml.protocol import CategoricalFeature
    from test_demo_parts import costs

    data = breast_cancer_data(0)
    asked = ["histogram:mean_radius", "quantile:worst_area:0.5"]
    params = plan_round(data, len(data.train_rows), 2.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.STATISTICS, queries=asked)
    spec = parse_round_spec(round_spec(data, params, RELAYS, 8080, 8081))
    assert [query.text for query in spec.task.queries] == asked and not spec.task.labelled
    assert spec.task.features.names == ("mean_radius", "worst_area") and spec.schedule.median_rounds == params.median_rounds > 0
    # Queries over a categorical feature alone: no median search, so no comparison pool either.
    site = CategoricalFeature("site", ("left", "right"))
    with_site = dataclasses.replace(data, spec=FeatureSpec((*data.spec.features, site), data.spec.label))
    params = plan_round(with_site, len(data.train_rows), 2.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.STATISTICS,
                        queries=["count:label", "histogram:site"])
    spec = parse_round_spec(round_spec(with_site, params, RELAYS, 8080, 8081))
    assert spec.task.features.names == ("site",) and spec.task.labelled
    assert spec.schedule.median_rounds == 0 and spec.learning.comparison_pool == 0.0
