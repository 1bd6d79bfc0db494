"""The SGD task kind's pieces (issue 28): the iteration schedule, the signed model document, the peer's
gradient report and the aggregator's update, and a whole round of them in memory."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from anonml.learning import SgdRule, averaged_model, sgd_encoding, sgd_iteration
from anonml.learning._linear import clipped_gradients, harmony_step
from anonml.learning._tables import load_builtin
from anonml.mechanisms import PrivacyLedger, ReleaseKind
from anonml.protocol import (
    MAX_SGD_DIMENSION,
    DocumentKind,
    FeatureSpec,
    InvalidSgdModel,
    PhaseTimes,
    RoundSchedule,
    SgdModel,
    SignedDocument,
    SurveyKind,
    TaskKind,
)
from anonml.aggregator._report import summarise
from anonml.aggregator._store import RoundStore
from anonml.peer import Dataset, Event, PeerLedger, PeerStore, RoundPipeline, describe_release
from anonml.simulate import RoundSetup, RoundTrace, SimulationConfig, simulate_round
from anonml.simulate._world import _seeded, peer_row
from test_manifest import SIGNING_KEY, T0, fixed_manifest

ROUND_ID = b"\x07" * 32
SPEC = FeatureSpec.from_dict({
    "features": [
        {"name": "age", "type": "numeric", "low": 17, "high": 90},
        {"name": "colour", "type": "categorical", "categories": ["red", "green", "blue"]},
    ],
    "label": {"name": "income", "positive": [">50K"], "negative": ["<=50K"]},
})


DEMO_RELAYS = [{"node_id": bytes([i + 1]).hex() * 32, "host": "127.0.0.1", "port": 9000 + i, "public_key": bytes([0x40 + i]).hex() * 32,
                "key_epoch": 1, "mirror_port": None, "beacon_key": None} for i in range(5)]
"""Five relays' ``relay info`` entries, for the demo's round specs."""


def schedule(iterations: int) -> RoundSchedule:
    median = tuple(PhaseTimes(T0 + 120 + 30 * i, 10, T0 + 135 + 30 * i, T0 + 137 + 30 * i, 10, T0 + 150 + 30 * i)
                   for i in range(iterations))
    data_start = T0 + 150 + 30 * iterations
    return RoundSchedule(t_register_end=T0 + 60, t_issue_end=T0 + 120, median=median,
                         data=PhaseTimes(data_start, 20, data_start + 30, data_start + 32, 20, data_start + 60))


def published(model: SgdModel) -> SgdModel:
    """``model`` as a peer reads it: signed, encoded, parsed, verified."""
    wire = model.sign(SIGNING_KEY, ROUND_ID).to_json()
    document = SignedDocument.from_json(wire, max_bytes=len(wire))
    document.verify(bytes(SIGNING_KEY.verify_key), kind=DocumentKind.SGD_MODEL, round_id=ROUND_ID)
    return SgdModel.from_document(document)


def test_every_partition_takes_exactly_one_iteration_and_every_iteration_has_peers() -> None:
    manifest = fixed_manifest(k_p=6, schedule=schedule(3), task_kind="sgd")
    assert manifest.task_kind is TaskKind.SGD
    iterations = [sgd_iteration(manifest, p) for p in range(manifest.k_p)]
    assert iterations == [0, 1, 2, 0, 1, 2]
    for i in range(3):
        assert [p for p in range(manifest.k_p) if iterations[p] == i] == list(manifest.median_partitions(i))
    with pytest.raises(ValueError, match="comparison pool"):
        sgd_iteration(fixed_manifest(k_p=6, schedule=schedule(3), comparison_pool=100), 0)


def test_the_model_document_round_trips_signed() -> None:
    model = SgdModel(3, (0.5, -1.25, 0.0))
    assert published(model) == model


def _body(**changes: Any) -> SignedDocument:
    body: dict[str, Any] = {"iteration": 1, "coefficients": [0.5, 1.0]}
    body.update(changes)
    return SignedDocument.create(SIGNING_KEY, DocumentKind.SGD_MODEL, ROUND_ID, body)


@pytest.mark.parametrize(("changes", "field"), [
    ({"iteration": True}, "body.iteration"),
    ({"iteration": -1}, "body.iteration"),
    ({"coefficients": [0.5, "x"]}, "body.coefficients[1]"),
    ({"coefficients": []}, "coefficients"),
    ({"coefficients": [0.0] * (MAX_SGD_DIMENSION + 1)}, "body.coefficients"),
    ({"extra": 1}, "body.extra"),
])
def test_a_malformed_model_is_refused_naming_its_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSgdModel) as info:
        SgdModel.from_document(_body(**changes))
    assert info.value.field == field


def test_a_model_document_is_not_a_thresholds_document() -> None:
    document = SgdModel(0, (1.0,)).sign(SIGNING_KEY, ROUND_ID)
    with pytest.raises(Exception, match="expected a 'thresholds' document"):
        document.verify(bytes(SIGNING_KEY.verify_key), kind=DocumentKind.THRESHOLDS, round_id=ROUND_ID)


def test_the_gradient_report_is_one_coordinate_and_one_bit_in_the_fixed_packet() -> None:
    rule = SgdRule(sgd_encoding(SPEC), 2.0)
    assert rule.encoding.dimension == 1 + 1 + 2
    record = {"age": 40.0, "colour": "green"}
    rng = np.random.default_rng(1)
    reports = [rule.gradient_report(rule.initial_model(), record, 1, rng) for _ in range(4000)]
    assert {len(r) for r in reports} == {1}  # 2j + u < 2d = 8: one byte, far inside MAX_REPORT_BYTES
    # Unbiased: the mean of many releases of one record is its clipped gradient at the model.
    x = rule.encoding.record(record)[None, :]
    truth = clipped_gradients("logistic", np.zeros(4), x, np.asarray([1.0]))[0]
    estimate = rule.mechanism.estimate(rule.mechanism.decode_reports(reports))
    standard_error = math.sqrt(float(rule.mechanism.variance(len(reports)).max()))
    assert np.all(np.abs(estimate - truth) < 4 * standard_error)
    with pytest.raises(ValueError, match="0 or 1"):
        rule.gradient_report(rule.initial_model(), record, -1, rng)
    with pytest.raises(ValueError, match="lacks the features"):
        rule.gradient_report(rule.initial_model(), {"age": 3.0}, 1, rng)
    with pytest.raises(ValueError, match="coefficients"):
        rule.gradient_report(SgdModel(0, (0.0,) * 5), record, 1, rng)


def test_the_update_is_harmonys_step_on_the_reports_and_an_empty_iteration_keeps_the_model() -> None:
    rule = SgdRule(sgd_encoding(SPEC), 2.0, learning_rate=0.5, regularization=0.1)
    model = SgdModel(2, (0.1, -0.2, 0.3, 0.0))
    rng = np.random.default_rng(2)
    reports = [rule.gradient_report(model, {"age": 20.0 + i, "colour": "red"}, i % 2, rng) for i in range(50)]
    stepped = rule.step(model, reports)
    noisy_mean = rule.mechanism.estimate(rule.mechanism.decode_reports(reports))
    assert stepped.iteration == 3
    np.testing.assert_allclose(stepped.coefficients, harmony_step(np.asarray(model.coefficients), noisy_mean, 3, 0.5, 0.1))
    assert rule.step(model, []) == SgdModel(3, model.coefficients)
    assert rule.replay([reports[:10], [], reports[10:]])[-1].iteration == 3


def test_a_whole_round_in_memory_learns_and_every_peer_spends_its_promise_once() -> None:
    """Peers dealt into iterations; each reports against the signed model of its iteration; ledgers at ε_T."""
    spec, train, test = load_builtin("breast-cancer", data_dir=None, test_fraction=0.3, rng=np.random.default_rng(5))
    epsilon, iterations = 4.0, 4
    rule = SgdRule(sgd_encoding(spec), epsilon)
    rng = np.random.default_rng(0)
    labels = spec.label.encode(train.labels)
    groups = np.array_split(rng.permutation(train.n_rows), iterations)
    ledgers = [PrivacyLedger(epsilon) for _ in range(train.n_rows)]
    models = [rule.initial_model()]
    for group in groups:
        seen = published(models[-1])
        reports = []
        for peer in group.tolist():
            ledgers[peer].record(rule.release())
            reports.append(rule.gradient_report(seen, {n: train.columns[n][peer] for n in train.columns}, int(labels[peer]), rng))
        models.append(rule.step(models[-1], reports))
    assert [m.iteration for m in models] == list(range(iterations + 1))
    assert all(ledger.spent() == epsilon for ledger in ledgers)
    auc = roc_auc_score(spec.label.encode(test.labels), rule.encoding.transform(test) @ averaged_model(models))
    assert auc > 0.6, auc  # 398 peers at ε 4 and d = 31: seed 0 measures 0.74 (5 seeds: 0.60-0.88)



def _as_sgd_task(document: dict[str, Any]) -> None:
    """The simulator's round as an SGD task: 4 partitions over 2 gradient steps (the median sub-rounds)."""
    document["task"]["kind"] = "sgd"
    document["learning"] = {"k_p": 4, "k_h": 1, "k_s": 1, "plan": "split", "learner": "logreg"}
    document["privacy"] = {"eps_total": 4.0, "oracle": "grr"}
    document["schedule"]["median_rounds"] = 2
    document["participation"]["min_participation"] = 12


@pytest.fixture(scope="module")
def sgd_round(tmp_path_factory: pytest.TempPathFactory) -> RoundTrace:
    return simulate_round(SimulationConfig(peers=16, seed=11), setup=RoundSetup(adjust_spec=_as_sgd_task),
                          keep=tmp_path_factory.mktemp("sgd-round"))


def test_a_simulated_sgd_round_accepts_every_gradient_and_charges_each_peer_its_promise(sgd_round: RoundTrace) -> None:
    trace = sgd_round
    manifest = trace.manifest.manifest
    assert trace.outcome == "done" and manifest.task_kind == TaskKind.SGD and manifest.median_rounds == 2
    results = [p.result for p in trace.peers]
    assert all(r is not None for r in results), [p.error or p.refused for p in trace.peers]
    # One packet per peer, in its partition's step (a median survey), every one acknowledged.
    assert [r.packets for r in results if r is not None] == [1] * len(trace.peers)
    assert len(trace.arrivals) == len(trace.peers) and all(s.kind == SurveyKind.MEDIAN for s, _, _ in trace.arrivals)
    assert sum(r.acknowledged for r in results if r is not None) == len(trace.peers)
    # The ledger holds the one gradient at the whole promise: exactly ε_T.
    assert {r.epsilon_spent for r in results if r is not None} == {manifest.eps_total} == {4.0}
    sgd = trace.report["sgd"]
    assert sum(sgd["reports_per_step"]) == len(trace.peers) and all(n > 0 for n in sgd["reports_per_step"])
    assert sgd["steps"] == 2 and len(sgd["coefficients"]) == 1 + 1 + 2
    assert trace.report["privacy"]["eps_gradient"] == 4.0 and trace.report["model"] is None
    assert trace.report["accepted_by_survey"] == {"gradient step 0": sgd["reports_per_step"][0], "gradient step 1": sgd["reports_per_step"][1]}
    # The spec named no loss: the round signed the default, logistic, and trained that model.
    assert manifest.sgd_loss == "logistic" and (sgd["loss"], sgd["model"]) == ("logistic", "logistic regression")
    assert any(line.startswith("LDP SGD logistic regression (logistic loss): 2 steps") for line in summarise(trace.report))


def test_a_simulated_sgd_rounds_models_are_the_replayed_steps_and_the_consent_states_the_gradient(
    sgd_round: RoundTrace, tmp_path: Path,
) -> None:
    trace = sgd_round
    manifest = trace.manifest.manifest
    assert trace.peer_store is not None
    (directory,) = (trace.peer_store.parent / "aggregator" / "rounds").glob("*/")
    store = RoundStore(directory / "round.sqlite")
    documents = [store.get_result(f"thresholds/{i}") for i in range(3)]
    models = [SgdModel.from_document(SignedDocument.from_json(d, max_bytes=len(d))) for d in documents if d is not None]
    assert [m.iteration for m in models] == [0, 1, 2]
    rule = SgdRule.of(manifest)
    reports = [[r for p in manifest.median_partitions(i) for r in store.reports(manifest.median_survey(p))] for i in range(2)]
    assert rule.replay(reports) == models and models[1] != models[0]
    np.testing.assert_allclose(trace.report["sgd"]["coefficients"], averaged_model(models))
    spec = FeatureSpec.from_dict(dict(manifest.features))
    peer_store = PeerStore(trace.peer_store)
    outcome = trace.peers[0]
    row = peer_row(outcome.index, np.random.default_rng(_seeded(trace.config.seed, "data", outcome.index)))
    vector = RoundPipeline.for_spec(spec).vector_of(Dataset((Event(row, None, 1),)))
    # Every peer's ledger holds ONE gradient release (not a subset report) at exactly the promise.
    for taken in trace.peers:
        releases = [r for spend in peer_store.spends(taken.key, trace.manifest.round_id) for r in spend.releases()]
        assert [(r.kind, r.epsilon) for r in releases] == [(ReleaseKind.GRADIENT, manifest.eps_total)]
        assert PeerLedger(peer_store, taken.key, trace.manifest.round_id, manifest.eps_total).spent() == manifest.eps_total
    # A peer that took part sees its one release in its ledger; a new peer is told what it would send.
    spent = describe_release(trace.manifest, spec, vector, peer_store, outcome.key)
    assert spent.cost == manifest.eps_total and "1 release(s), epsilon 4" in spent.text, spent.text
    text, cost, _, _ = describe_release(trace.manifest, spec, vector, PeerStore(tmp_path / "new.sqlite"), b"\x01" * 32)
    assert cost == manifest.eps_total == 4.0, text
    assert "logistic regression" in text and "1 gradient report" in text and "epsilon 4" in text, text
    assert "data packet" not in text and "median answer" not in text, text


def test_the_sgd_demo_plans_a_round_round_new_accepts_with_one_step_per_partition() -> None:
    from anonml.aggregator._spec import parse_round_spec
    from anonml.demo._data import breast_cancer_data
    from anonml.demo._schedule import SGD_STEPS, plan_round, round_spec
    from anonml.demo._summary import sgd_experiment_command
    from test_demo_parts import costs

    data = breast_cancer_data(0)
    params = plan_round(data, 200, 4.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.SGD)
    ensemble = plan_round(data, 200, 4.0, 2, 0, costs(1.0), n_cores=2)
    # Nothing is sent in the data phase: its windows are the shortest the planner makes.
    assert params.data_send_window < ensemble.data_send_window
    relays = DEMO_RELAYS
    spec = parse_round_spec(round_spec(data, params, relays, 8080, 8081))
    assert spec.task.kind == TaskKind.SGD and spec.schedule.median_rounds == SGD_STEPS == spec.learning.k_p
    assert spec.learning.comparison_pool == 0
    # --sgd-steps: the round takes that many steps, a partition each, and the spec still covers every feature.
    eight = parse_round_spec(round_spec(data, plan_round(data, 200, 4.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.SGD, sgd_steps=8),
                                        relays, 8080, 8081))
    assert eight.schedule.median_rounds == 8 == eight.learning.k_p and eight.learning.k_s * 8 >= len(data.spec.features)
    with pytest.raises(ValueError, match="at least one gradient step"):
        plan_round(data, 200, 4.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.SGD, sgd_steps=0)
    # --sgd-learning-rate: written in the spec (hence signed), and the in-process command the demo prints takes it.
    fast = plan_round(data, 200, 4.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.SGD, sgd_learning_rate=3.0)
    assert parse_round_spec(round_spec(data, fast, relays, 8080, 8081)).task.learning_rate == 3.0 and spec.task.learning_rate is None
    assert "--sgd-learning-rate 3 " in sgd_experiment_command(fast, ["csv"], 200) + " "


def test_an_sgd_spec_needs_a_partition_per_step_and_no_pool() -> None:
    from anonml.aggregator._spec import RoundSpecError, parse_round_spec
    from test_aggregator import spec_document

    document = spec_document()
    document["task"]["kind"] = "sgd"
    document["schedule"]["median_rounds"] = 2
    assert parse_round_spec(document).schedule.median_rounds == 2  # categorical features only: the steps still run
    document["schedule"]["median_rounds"] = 3
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(document)
    assert info.value.field == "learning.k_p" and "3 steps" in str(info.value)


def test_an_sgd_rounds_aggregator_takes_gradients_in_the_steps_and_refuses_data_surveys_and_bad_reports(tmp_path: Path) -> None:
    from anonml.aggregator._round import SurveyRefused
    from anonml.protocol import InvalidMessage, SurveyId, acceptance_window
    from anonml.testing import SettableClock
    from test_aggregator import T0 as AGGREGATOR_T0
    from test_aggregator import make_round, spec_document

    document = spec_document()
    document["task"]["kind"] = "sgd"
    document["schedule"]["median_rounds"] = 2
    clock = SettableClock(AGGREGATOR_T0)
    state, _ = make_round(tmp_path, clock, document)
    manifest = state.manifest
    assert state.sgd is not None and manifest.eps_total == manifest.eps_median == manifest.eps_data == 2.0
    survey = manifest.median_survey(1)
    state.check_report(survey, state.sgd.mechanism.encode_report(np.asarray([3, 1])))
    with pytest.raises(InvalidMessage, match="gradient report"):
        state.check_report(survey, bytes([2 * state.sgd.encoding.dimension]))  # a coordinate past d
    assert state.check_survey(survey, acceptance_window(manifest.schedule, survey)[0]) == 1
    data_survey = SurveyId.data(state.round_id, 0, 0)
    with pytest.raises(SurveyRefused, match="unknown-survey"):
        state.check_survey(data_survey, acceptance_window(manifest.schedule, data_survey)[0])
    # Step 0's model is published before anything is sent, and stays the same when asked again.
    first = state.publish_thresholds(0)
    assert first == state.sgd.initial_model() == state.publish_thresholds(0) == state.sgd_model(0)
    assert state.phase_surveys(manifest.schedule.data) == {}


def test_the_demo_refuses_sgd_steps_without_the_sgd_task_in_one_line() -> None:
    from click.testing import CliRunner

    from anonml.cli import main

    result = CliRunner().invoke(main, ["demo", "--sgd-steps", "8"])
    assert result.exit_code == 2 and "--sgd-steps, --sgd-learning-rate and --sgd-loss are for --task sgd" in result.output and "Traceback" not in result.output, result.output


def test_an_sgd_rounds_learning_rate_is_signed_in_the_manifest_and_steps_the_rule() -> None:
    from anonml.aggregator._spec import RoundSpecError, parse_round_spec
    from anonml.learning import SGD_LEARNING_RATE
    from anonml.protocol import InvalidManifest, RoundManifest
    from test_aggregator import spec_document

    plain = fixed_manifest(k_p=2, schedule=schedule(2), task_kind="sgd")
    fast = fixed_manifest(k_p=2, schedule=schedule(2), task_kind="sgd", sgd_learning_rate=3.0)
    # Unset: no field, so an earlier SGD manifest keeps its bytes and round id; set: signed, and another round.
    assert "learning_rate" not in plain.to_dict()["task"] and fast.to_dict()["task"]["learning_rate"] == "3.0"
    assert RoundManifest.from_dict(fast.to_dict()) == fast and fast.round_id != plain.round_id
    assert SgdRule.of(plain).learning_rate == SGD_LEARNING_RATE and SgdRule.of(fast).learning_rate == 3.0
    # The aggregator's step and every replay use the signed rate: γ0 = 3 moves the model three times as far.
    rule, faster = SgdRule.of(plain), SgdRule.of(fast)
    reports = [faster.mechanism.encode_report(faster.mechanism.privatize(np.full((1, rule.encoding.dimension), 0.5),
                                                                           np.random.default_rng(i))[0]) for i in range(40)]
    np.testing.assert_allclose(faster.step(faster.initial_model(), reports).coefficients,
                               3.0 * np.asarray(rule.step(rule.initial_model(), reports).coefficients))
    for kind, rate in (("ensemble", "1.0"), ("sgd", "0.0"), ("sgd", "1000.0")):
        document = fast.to_dict()
        document["task"]["learning_rate"] = rate
        if kind == "ensemble":
            del document["task"]["kind"]
        with pytest.raises(InvalidManifest, match="learning_rate"):
            RoundManifest.from_dict(document)
    # The round spec's [task] learning_rate reaches the manifest; another kind may not set it.
    spec = spec_document()
    spec["task"].update(kind="sgd", learning_rate=3)
    spec["schedule"]["median_rounds"] = 2
    assert parse_round_spec(spec).task.learning_rate == 3.0
    spec["task"]["learning_rate"] = 0
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(spec)
    assert info.value.field == "task.learning_rate"
    ensemble = spec_document()
    ensemble["task"]["learning_rate"] = 3
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(ensemble)
    assert info.value.field == "task.learning_rate"
