"""The pieces of a model-averaging round (``[task] kind = "model-averaging"``, issue 28):
the payload limit, the model's fixed blocks of coordinates, a peer's block reports,
the aggregator's block-wise average, and the peer's ledger charging the model once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from anonml.aggregator._spec import RoundSpecError, parse_round_spec
from anonml.crypto import IssuerSecretKey, SphinxGeometry
from anonml.learning import (
    MIN_ROWS_PER_PEER,
    InvalidModelReport,
    ModelBlocks,
    OutputPerturbation,
    TooFewRows,
    average_blocks,
    load_builtin,
    model_reports,
    unit_ball_rows,
)
from anonml.learning._linear import LinearEncoding, wide_range_features
from anonml.learning._vocabulary import AVERAGING_RULE
from anonml.mechanisms import BudgetExceeded, ReleaseKind
from anonml.peer._ledger import PeerLedger
from anonml.peer._framework import FeatureVector
from anonml.peer._store import PeerStore
from anonml.protocol import RoundManifest, SealedReport, SurveyId, TaskKind, report_capacity
from test_aggregator import spec_document
from test_manifest import fixed_manifest

PEER = b"\x01" * 32
ROUND = b"\x02" * 32


def test_the_payload_limit_is_the_message_less_its_header_and_token() -> None:
    geometry = SphinxGeometry.create()
    # 2048-byte packets, 5 hops: a 1551-byte message, 354 of them version, survey id, lengths and a 296-byte token.
    assert report_capacity(geometry.message_size) == 1197
    assert ModelBlocks.fitting(100, report_capacity(geometry.message_size)).blocks == 1
    small = SphinxGeometry.create(max_hops=3, packet_size=1024)
    assert ModelBlocks.fitting(100, report_capacity(small.message_size)).blocks > 1


def test_a_model_is_cut_into_fixed_blocks_dealt_evenly() -> None:
    blocks = ModelBlocks.fitting(13, 40)  # five 8-byte coordinates at most: three blocks of 5, 5 and 3
    assert (blocks.blocks, blocks.per_block) == (3, 5)
    assert [list(blocks.coordinates(b)) for b in range(3)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12]]
    steps = np.array([-(2**62), 7, 0, -1, 3, 2**62, 11, 12, 13, 14, 15, 16, -17], dtype=np.int64)
    reports = blocks.split(steps)
    assert [len(r) for r in reports] == [40, 40, 24]
    assert np.array_equal(np.concatenate([blocks.decode(b, r) for b, r in enumerate(reports)]), steps)
    with pytest.raises(InvalidModelReport):
        blocks.decode(2, reports[0])  # block 2 holds three coordinates, not five
    with pytest.raises(ValueError):
        ModelBlocks.fitting(13, 7)  # not one coordinate fits
    with pytest.raises(ValueError):
        blocks.split(steps.astype(np.float64))  # grid steps only


def _adult_slices(peers: int, rows: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray, LinearEncoding]:
    data = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "adult"
    if not data.is_dir():
        pytest.skip("the Adult data is not at ../shared/data/adult")
    spec, train, test = load_builtin("adult", data_dir=data, test_fraction=0.3, rng=np.random.default_rng(0))
    encoding = LinearEncoding(spec, wide_range_features(spec))
    X, y = encoding.transform(train), encoding.signed_labels(train)
    order = np.random.default_rng(1).permutation(len(y))[: peers * rows].reshape(peers, rows)
    return [(X[rows_of], y[rows_of]) for rows_of in order], encoding.transform(test), encoding.signed_labels(test), encoding


def test_block_reports_averaged_per_survey_are_the_peers_average_model() -> None:
    peers, rows, epsilon = 40, 150, 1.0
    slices, X_test, y_test, encoding = _adult_slices(peers, rows)
    mechanism = OutputPerturbation(epsilon, rows, AVERAGING_RULE / (rows * epsilon), encoding.dimension)
    blocks = ModelBlocks.fitting(encoding.dimension, 48)  # six coordinates a packet: a model of 13 in three blocks
    assert blocks.blocks == 3
    rng = np.random.default_rng(2)
    sent = [model_reports(X, y, mechanism, encoding.max_norm, blocks, rng) for X, y in slices]
    assert {len(reports) for reports in sent} == {blocks.blocks}  # every peer sends one packet per block
    # The aggregator sees each survey's reports in an order of its own, unlinked across blocks.
    by_survey = [[reports[b] for reports in sent] for b in range(blocks.blocks)]
    for b, survey in enumerate(by_survey):
        np.random.default_rng(b).shuffle(survey)
    averaged = average_blocks(blocks, by_survey, mechanism.grid)
    whole = np.mean([np.concatenate([blocks.decode(b, r) for b, r in enumerate(reports)]) for reports in sent], axis=0)
    assert averaged.reports == (peers,) * blocks.blocks
    assert np.allclose(averaged.coef, whole * mechanism.grid, rtol=1e-12, atol=0)
    auc = roc_auc_score(y_test, unit_ball_rows(X_test, encoding.max_norm) @ averaged.coef)
    assert auc > 0.8, auc
    with pytest.raises(ValueError, match="block survey"):
        average_blocks(blocks, [by_survey[0], [], by_survey[2]], mechanism.grid)


def test_a_peer_with_too_few_rows_sends_nothing() -> None:
    [(X, y)], _, _, encoding = _adult_slices(1, 120)
    mechanism = OutputPerturbation(1.0, 150, 0.01, encoding.dimension)
    with pytest.raises(TooFewRows):
        model_reports(X, y, mechanism, encoding.max_norm, ModelBlocks.fitting(encoding.dimension, 1197), np.random.default_rng(0))


def test_the_ledger_charges_the_model_once_whatever_its_blocks(tmp_path: Path) -> None:
    store = PeerStore(tmp_path / "peer.sqlite")
    ledger = PeerLedger(store, PEER, ROUND, epsilon_total=1.5)
    surveys = [SurveyId.data(ROUND, 0, b) for b in range(4)]
    sealed = [SealedReport(survey, f"message {b}".encode(), bytes([b]) * 32) for b, survey in enumerate(surveys)]
    ledger.spend_model(sealed, ("age", "sex"), 1.5)
    # One release at ε_T for four packets: the ledger equals the promise exactly.
    assert ledger.spent() == 1.5
    assert [(r.kind, r.epsilon) for r in ledger.releases()] == [(ReleaseKind.MODEL, 1.5)]
    assert all(store.packet(PEER, survey.to_bytes()) is not None for survey in surveys)
    with pytest.raises(BudgetExceeded):
        ledger.spend_model([SealedReport(SurveyId.data(ROUND, 1, 0), b"again", b"\x09" * 32)], ("age",), 0.1)
    store.close()
    reopened = PeerLedger(PeerStore(tmp_path / "peer.sqlite"), PEER, ROUND, epsilon_total=1.5)
    assert reopened.spent() == 1.5 and len(reopened.releases()) == 1


def test_model_averaging_is_a_task_kind() -> None:
    assert TaskKind("model-averaging") is TaskKind.MODEL_AVERAGING


def _averaging_document(**learning: object) -> dict[str, Any]:
    document = spec_document()
    document["task"]["kind"] = "model-averaging"
    document["learning"] = {"k_p": 2, "k_h": 1, "k_s": 1, "plan": "split", "learner": "logreg", **learning}
    return document


def test_a_model_averaging_spec_signs_its_rows_and_has_no_median_search() -> None:
    spec = parse_round_spec(_averaging_document())
    assert spec.task.rows_per_peer == MIN_ROWS_PER_PEER and spec.schedule.median_rounds == 0
    document = _averaging_document()
    document["task"]["rows_per_peer"] = 250
    assert parse_round_spec(document).task.rows_per_peer == 250
    manifest = fixed_manifest(task_kind="model-averaging", rows_per_peer=250)
    assert RoundManifest.from_dict(manifest.to_dict()).rows_per_peer == 250
    assert manifest.to_dict()["task"]["rows_per_peer"] == 250
    assert "rows_per_peer" not in fixed_manifest().to_dict()["task"]


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"learning": {"k_h": 2}}, "learning", "k_h = 1"),
    ({"learning": {"plan": "one"}}, "learning", 'set plan = "split"'),
    ({"task": {"rows_per_peer": 99}}, "task.rows_per_peer", "100"),
])
def test_a_model_averaging_spec_refuses_a_survey_per_block_it_does_not_need_or_too_few_rows(
        change: dict[str, dict[str, object]], field: str, words: str) -> None:
    document = _averaging_document(**change.get("learning", {}))
    document["task"].update(change.get("task", {}))
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(document)
    assert info.value.field == field and words in str(info.value), str(info.value)


def test_another_kind_may_not_set_rows_per_peer() -> None:
    document = spec_document()
    document["task"]["rows_per_peer"] = 100
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(document)
    assert "rows_per_peer" in str(info.value)


def test_the_model_averaging_demo_plans_a_round_round_new_accepts_and_deals_peers_whole(tmp_path: Path) -> None:
    from test_demo_parts import costs

    from anonml.demo._data import breast_cancer_data, write_peer_files
    from anonml.demo._schedule import plan_round, round_spec

    data = breast_cancer_data(0)
    params = plan_round(data, 4, 1.0, 2, 0, costs(1.0), n_cores=2, task=TaskKind.MODEL_AVERAGING, rows_per_peer=100)
    relays = [{"node_id": bytes([i + 1]).hex() * 32, "host": "127.0.0.1", "port": 9000 + i, "public_key": bytes([0x40 + i]).hex() * 32,
               "key_epoch": 1, "mirror_port": None, "beacon_key": None} for i in range(5)]
    spec = parse_round_spec(round_spec(data, params, relays, 8080, 8081))
    assert spec.task.kind == TaskKind.MODEL_AVERAGING and spec.task.rows_per_peer == 100 and spec.schedule.median_rounds == 0
    # Peer g holds rows g*100 .. g*100+99, whole, in one worker's file; the workers take the peers in turn.
    rows = [[str(i), *row[1:]] for i, row in enumerate(data.train_rows[:350])]
    files = write_peer_files(data, rows, tmp_path, 2, rows_per_peer=100)
    held = [[line.split(",", 1)[0] for line in path.read_text().splitlines()[1:]] for path in files]
    assert held == [[str(i) for i in [*range(0, 100), *range(200, 300)]], [str(i) for i in range(100, 200)]]


def test_a_peer_holding_fewer_rows_than_the_round_signs_refuses_before_it_registers(tmp_path: Path) -> None:
    import trio
    from test_manifest import SIGNING_KEY

    from anonml.peer import AggregatorClient, JoinRefused, Peer, PeerIdentity, RoundPipeline, RoundSession, join_round
    from anonml.peer._events import RefusalReason
    from anonml.protocol import FeatureSpec, SignedManifest

    issuer = IssuerSecretKey.generate().public_key()
    manifest = fixed_manifest(task_kind="model-averaging", rows_per_peer=150, geometry=SphinxGeometry.create().to_dict(),
                              token_public_key=issuer.to_bytes(), token_kid=issuer.kid)
    signed = SignedManifest.sign(manifest, SIGNING_KEY)
    pipeline = RoundPipeline.for_spec(FeatureSpec.from_dict(dict(signed.manifest.features)))
    store = PeerStore(tmp_path / "peer.sqlite")
    rows = tuple(FeatureVector({name: 0.0 for name in pipeline.spec.names}, 1) for _ in range(149))
    peer = Peer(PeerIdentity.generate(), store, rows[-1], np.random.default_rng(0), rows=rows)
    # Nothing listens there: the refusal comes before the peer's first request.
    client = AggregatorClient("http://127.0.0.1:9")

    async def join() -> None:
        session = RoundSession(client, transport=None)  # type: ignore[arg-type]  # no packet is sent
        try:
            await join_round(peer, session, signed, pipeline)
        finally:
            await client.aclose()

    with pytest.raises(JoinRefused) as info:
        trio.run(join)
    assert info.value.reason == RefusalReason.TOO_FEW_ROWS and "150" in str(info.value) and "149" in str(info.value)
    assert store.registration(peer.identity.public_key, signed.round_id) is None and store.spends(peer.identity.public_key) == []
