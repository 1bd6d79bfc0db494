"""The learners' signed ``[task]`` settings (issue 28): an SGD round's loss (``loss``) and a model-averaging
round's λ rule and categorical weight (``regularization_rule``, ``categorical_weight``): in the spec, the
manifest, the peers' and the aggregator's computation, the consent preview, the report and the demo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anonml.crypto import SphinxGeometry
from anonml.learning import RoundModel, SgdRule
from anonml.learning._linear import clipped_gradients
from anonml.learning._vocabulary import AVERAGING_CATEGORICAL_WEIGHT, AVERAGING_RULE, ROUND_CATEGORICAL_WEIGHT, ROUND_REGULARIZATION_RULE
from anonml.protocol import SGD_LOSSES, InvalidManifest, RoundManifest, SgdLoss, SgdModel, TaskKind
from test_manifest import fixed_manifest
from test_sgd_task import schedule

RECORD = {"age": 60.0}
"""A record of ``fixed_manifest``'s one feature, far from the middle of its range."""


def sgd_manifest(**changes: Any) -> RoundManifest:
    return fixed_manifest(k_p=2, schedule=schedule(2), task_kind="sgd", geometry=SphinxGeometry.create().to_dict(), **changes)


def averaging_manifest(**changes: Any) -> RoundManifest:
    return fixed_manifest(k_p=2, k_h=1, k_s=1, task_kind="model-averaging", rows_per_peer=100, geometry=SphinxGeometry.create().to_dict(),
                          **changes)


def reports_of(rule: SgdRule, model: SgdModel, label: int, count: int) -> list[bytes]:
    return [rule.gradient_report(model, RECORD, label, np.random.default_rng(seed)) for seed in range(count)]


@pytest.mark.parametrize("loss", SGD_LOSSES)
def test_a_peer_of_an_sgd_round_releases_the_gradient_of_the_loss_the_manifest_signs(loss: SgdLoss) -> None:
    """The peer's report is the 1-bit release of THIS loss's clipped gradient (the learners' own
    ``clipped_gradients``): the same draws give the same reports, and another loss's gradient gives others."""
    manifest = sgd_manifest(sgd_loss=loss)
    assert manifest.to_dict()["task"]["loss"] == str(loss) and RoundManifest.from_dict(manifest.to_dict()) == manifest
    rule = SgdRule.of(manifest)
    assert rule.loss == loss
    # A model where the three losses' gradients differ (margin 0.54 on a positive label: logistic -0.37 x,
    # hinge -x, squared -0.91 x), checked rather than assumed.
    model = SgdModel(1, (0.5, 0.25))
    x = rule.encoding.record(RECORD)[None, :]
    beta = np.asarray(model.coefficients)
    gradients = {other: clipped_gradients(other, beta, x, np.asarray([1.0])) for other in SgdLoss}
    assert all(not np.allclose(gradients[a], gradients[b]) for a in SgdLoss for b in SgdLoss if a != b), gradients
    mechanism = rule.mechanism

    def released(other: SgdLoss, seed: int) -> bytes:
        return mechanism.encode_report(mechanism.privatize(gradients[other], np.random.default_rng(seed))[0])

    sent = reports_of(rule, model, 1, 200)
    assert sent == [released(loss, seed) for seed in range(200)]
    for other in SgdLoss:
        if other != loss:
            assert sent != [released(other, seed) for seed in range(200)], other


def test_an_sgd_manifest_without_a_loss_is_logistic_and_keeps_its_bytes() -> None:
    plain, logistic = sgd_manifest(), sgd_manifest(sgd_loss=SgdLoss.LOGISTIC)
    assert "loss" not in plain.to_dict()["task"] and SgdRule.of(plain).loss == SgdLoss.LOGISTIC
    assert logistic.round_id != plain.round_id and SgdRule.of(logistic).loss == SgdLoss.LOGISTIC


@pytest.mark.parametrize(("kind", "value"), [("sgd", "cubic"), ("sgd", 1), ("model-averaging", "hinge")])
def test_a_manifest_refuses_an_unknown_loss_or_a_loss_on_another_kind(kind: str, value: object) -> None:
    document = sgd_manifest(sgd_loss=SgdLoss.HINGE).to_dict()
    document["task"]["loss"] = value
    if kind == "model-averaging":
        document = averaging_manifest().to_dict()
        document["task"]["loss"] = value
    with pytest.raises(InvalidManifest, match="loss"):
        RoundManifest.from_dict(document)


def spec_with(kind: str, **task: Any) -> dict[str, Any]:
    from test_aggregator import spec_document

    spec = spec_document()
    spec["task"].update(kind=kind, **task)
    if kind == "sgd":
        spec["schedule"]["median_rounds"] = 2
    if kind == "model-averaging":
        spec["learning"].update(plan="split", k_s=1, k_h=1)
        spec["schedule"]["median_rounds"] = 0
    return spec


def test_the_round_spec_signs_the_loss_and_refuses_an_unknown_one_in_one_line() -> None:
    from anonml.aggregator._spec import RoundSpecError, parse_round_spec

    assert parse_round_spec(spec_with("sgd")).task.loss == SgdLoss.LOGISTIC
    assert parse_round_spec(spec_with("sgd", loss="squared")).task.loss == SgdLoss.SQUARED
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(spec_with("sgd", loss="cubic"))
    assert info.value.field == "task.loss" and "'cubic' is not one of" in str(info.value) and "\n" not in str(info.value), str(info.value)
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(spec_with("ensemble", loss="hinge"))
    assert info.value.field == "task.loss" and "only a 'sgd' task sets loss; this is a 'ensemble' task" in str(info.value), str(info.value)


def test_the_consent_preview_and_the_report_name_the_loss_and_its_model(tmp_path: Path) -> None:
    from anonml.aggregator._report import summarise
    from anonml.peer import PeerStore, describe_release
    from anonml.peer._framework import FeatureVector
    from anonml.protocol import FeatureSpec, SignedManifest
    from test_manifest import SIGNING_KEY

    manifest = sgd_manifest(sgd_loss=SgdLoss.HINGE)
    signed = SignedManifest.sign(manifest, SIGNING_KEY)
    spec = FeatureSpec.from_dict(dict(manifest.features))
    vector = FeatureVector({"age": 60.0}, 1)
    text = describe_release(signed, spec, vector, PeerStore(tmp_path / "peer.sqlite"), b"\x01" * 32).text
    assert "a linear SVM predicting 'income'" in text and "the hinge loss" in text and "logistic" not in text, text
    lines = summarise({"status": "done", "sgd": {"model": "linear SVM", "loss": "hinge", "steps": 2, "learning_rate": 1.0,
                                                 "reports_per_step": [3, 4]}})
    assert "LDP SGD linear SVM (hinge loss): 2 steps, γ0 1, reports per step [3, 4]" in lines, lines


def test_the_demo_signs_its_sgd_loss_and_prints_that_learners_experiment() -> None:
    from anonml.aggregator._spec import parse_round_spec
    from anonml.demo._data import breast_cancer_data
    from anonml.demo._schedule import plan_round, round_spec
    from anonml.demo._summary import sgd_experiment_command
    from test_demo_parts import costs
    from test_sgd_task import DEMO_RELAYS

    data = breast_cancer_data(0)
    for loss, learner in (("hinge", "ldp-sgd-svm"), ("squared", "ldp-sgd-linreg"), (None, "ldp-sgd-lr")):
        params = plan_round(data, 200, 4.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.SGD, sgd_loss=loss)
        assert parse_round_spec(round_spec(data, params, DEMO_RELAYS, 8080, 8081)).task.loss == (loss or "logistic")
        assert f"--learner {learner} " in sgd_experiment_command(params, ["csv"], 200), loss


@pytest.mark.parametrize(("arguments", "said"), [
    (["--sgd-loss", "hinge"], "--sgd-steps, --sgd-learning-rate and --sgd-loss are for --task sgd"),
    (["--task", "sgd", "--sgd-loss", "cubic"], "'cubic' is not one of"),
    (["--task", "sgd", "--categorical-weight", "0.5"], "--regularization-rule and --categorical-weight are for --task model-averaging"),
    (["--task", "model-averaging", "--categorical-weight", "2"], "--categorical-weight"),
])
def test_the_demo_refuses_a_task_setting_it_cannot_use_in_one_line(arguments: list[str], said: str) -> None:
    from click.testing import CliRunner

    from anonml.cli import main

    result = CliRunner().invoke(main, ["demo", *arguments])
    assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output, result.output


def test_a_model_averaging_manifest_signs_its_rule_and_weight_and_the_model_follows_them() -> None:
    plain = averaging_manifest()
    tuned = averaging_manifest(regularization_rule=1.5, categorical_weight=0.35)
    task = tuned.to_dict()["task"]
    assert (task["regularization_rule"], task["categorical_weight"]) == ("1.5", "0.35")
    assert RoundManifest.from_dict(tuned.to_dict()) == tuned and tuned.round_id != plain.round_id
    # Unset (a manifest made before the fields): the settings rounds used then, and the bytes they had.
    assert "regularization_rule" not in plain.to_dict()["task"] and "categorical_weight" not in plain.to_dict()["task"]
    old = RoundModel.of_manifest(plain)
    assert (old.regularization_rule, old.categorical_weight) == (AVERAGING_RULE, AVERAGING_CATEGORICAL_WEIGHT)
    model = RoundModel.of_manifest(tuned)
    # λ = rule / (rows_per_peer ε_T); the noise is calibrated to it (sensitivity 2 / (n λ)), at the whole ε_T.
    assert model.mechanism.regularization == pytest.approx(1.5 / (100 * tuned.eps_total))
    assert model.mechanism.epsilon == tuned.eps_total == old.mechanism.epsilon
    assert model.mechanism.l2_sensitivity > old.mechanism.l2_sensitivity  # a weaker λ: more noise for the same ε


def test_a_model_averaging_rounds_weight_scales_the_categorical_columns_before_the_unit_ball() -> None:
    from anonml.learning._tables import adult_spec

    spec = adult_spec()
    heavy = RoundModel.of(spec, 1.0, 100, 1197, categorical_weight=1.0)
    light = RoundModel.of(spec, 1.0, 100, 1197, categorical_weight=0.35)
    categorical = light.encoding.categorical_columns
    assert categorical.any() and set(light.weights[categorical]) == {0.35} and set(light.weights[~categorical]) == {1.0}
    assert set(heavy.weights) == {1.0}
    # The public norm bound follows the weights, so every weighted row still lies in the unit ball.
    assert light.norm_bound == pytest.approx(float(np.sqrt((~categorical).sum() + 0.35**2 * categorical.sum())))
    for bad in ({"categorical_weight": 0.0}, {"categorical_weight": 1.5}, {"regularization_rule": 0.0}, {"regularization_rule": float("nan")}):
        with pytest.raises(ValueError):
            RoundModel.of(spec, 1.0, 100, 1197, **bad)


@pytest.mark.parametrize(("field", "value"), [("regularization_rule", "0.0"), ("regularization_rule", "1000.0"),
                                              ("categorical_weight", "0.0"), ("categorical_weight", "1.5")])
def test_a_manifest_refuses_a_rule_or_weight_out_of_range(field: str, value: str) -> None:
    document = averaging_manifest(regularization_rule=1.5, categorical_weight=0.35).to_dict()
    document["task"][field] = value
    with pytest.raises(InvalidManifest, match=field):
        RoundManifest.from_dict(document)
    other = sgd_manifest().to_dict()
    other["task"][field] = "0.5"
    with pytest.raises(InvalidManifest, match=field):
        RoundManifest.from_dict(other)


def test_the_spec_defaults_to_the_validated_settings_and_refuses_bad_ones() -> None:
    from anonml.aggregator._spec import RoundSpecError, parse_round_spec

    default = parse_round_spec(spec_with("model-averaging")).task
    assert (default.regularization_rule, default.categorical_weight) == (ROUND_REGULARIZATION_RULE, ROUND_CATEGORICAL_WEIGHT) == (1.5, 0.35)
    chosen = parse_round_spec(spec_with("model-averaging", regularization_rule=3, categorical_weight=1)).task
    assert (chosen.regularization_rule, chosen.categorical_weight) == (3.0, 1.0)
    for field, value, kind in (("categorical_weight", 1.5, "model-averaging"), ("regularization_rule", 0, "model-averaging"),
                               ("categorical_weight", 0.5, "sgd")):
        with pytest.raises(RoundSpecError) as info:
            parse_round_spec(spec_with(kind, **{field: value}))
        assert info.value.field == f"task.{field}", (field, value, kind)
    assert "only a 'model-averaging' task sets categorical_weight" in str(info.value), str(info.value)


def test_the_model_averaging_demo_signs_the_validated_defaults_or_its_options() -> None:
    from anonml.aggregator._spec import parse_round_spec
    from anonml.demo._data import breast_cancer_data
    from anonml.demo._schedule import plan_round, round_spec
    from test_demo_parts import costs
    from test_sgd_task import DEMO_RELAYS

    data = breast_cancer_data(0)
    default = plan_round(data, 3, 1.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.MODEL_AVERAGING, rows_per_peer=100)
    task = parse_round_spec(round_spec(data, default, DEMO_RELAYS, 8080, 8081)).task
    assert (task.regularization_rule, task.categorical_weight) == (1.5, 0.35)
    chosen = plan_round(data, 3, 1.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.MODEL_AVERAGING, rows_per_peer=100,
                        regularization_rule=2.0, categorical_weight=0.5)
    task = parse_round_spec(round_spec(data, chosen, DEMO_RELAYS, 8080, 8081)).task
    assert (task.regularization_rule, task.categorical_weight) == (2.0, 0.5)
