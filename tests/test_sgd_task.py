"""The SGD task kind's pieces (issue 28): the iteration schedule, the signed model document, the peer's
gradient report and the aggregator's update, and a whole round of them in memory."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from anonml.learning import SgdRule, averaged_model, sgd_encoding, sgd_iteration
from anonml.learning._linear import clipped_gradients, harmony_step
from anonml.learning._tables import load_builtin
from anonml.mechanisms import PrivacyLedger
from anonml.protocol import (
    MAX_SGD_DIMENSION,
    DocumentKind,
    FeatureSpec,
    InvalidSgdModel,
    PhaseTimes,
    RoundSchedule,
    SgdModel,
    SignedDocument,
    TaskKind,
)
from test_manifest import SIGNING_KEY, T0, fixed_manifest

ROUND_ID = b"\x07" * 32
SPEC = FeatureSpec.from_dict({
    "features": [
        {"name": "age", "type": "numeric", "low": 17, "high": 90},
        {"name": "colour", "type": "categorical", "categories": ["red", "green", "blue"]},
    ],
    "label": {"name": "income", "positive": [">50K"], "negative": ["<=50K"]},
})


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

