"""Task kinds (issue 28): ``[task] kind`` in the round spec, signed in the manifest, and a statistics round."""

from __future__ import annotations

from pathlib import Path

import pytest

from anonml.aggregator._spec import RoundSpecError, parse_round_spec
from anonml.protocol import InvalidManifest, RoundManifest, SignedManifest, TaskKind
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
    assert statistics.round_id.hex() != PINNED_ROUND_ID
    signed = SignedManifest.sign(statistics, SIGNING_KEY)
    parsed = SignedManifest.from_json(signed.to_json(), expected_identity=bytes(SIGNING_KEY.verify_key)).manifest
    assert parsed.task_kind == TaskKind.STATISTICS and parsed == statistics


@pytest.mark.parametrize("kind", ["magic", "ensemble", 3])
def test_an_unknown_or_spelled_out_default_kind_is_refused_naming_the_field(kind: object) -> None:
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
