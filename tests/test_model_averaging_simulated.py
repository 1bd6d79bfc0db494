"""A whole model-averaging round (``[task] kind = "model-averaging"``, issue 28) on the in-process simulator:
peers of 100 rows each, a model of 151 coordinates cut into two blocks (a packet carries 149), every packet accepted,
every peer's ledger equal to its promise (one model release at ε_T for two packets), the average scored."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from anonml.learning import RoundModel, Table
from anonml.peer import Dataset, Event, RoundPipeline
from anonml.peer._disclosure import describe_release
from anonml.peer._store import PeerStore
from anonml.protocol import FeatureSpec, TaskKind
from anonml.simulate import RoundSetup, RoundTrace, SimulationConfig, simulate_round

COLOURS = tuple(f"c{i}" for i in range(150))
ROWS = 100


def _as_model_averaging(document: dict[str, Any]) -> None:
    """Two features whose encoding has 151 coordinates; a 2048-byte packet carries 149, so the model takes two blocks."""
    document["task"]["kind"] = "model-averaging"
    document["task"]["rows_per_peer"] = ROWS
    document["task"]["features"][1]["categories"] = list(COLOURS)
    document["learning"] = {"k_p": 2, "k_h": 2, "k_s": 1, "plan": "split", "learner": "logreg"}
    document["schedule"].pop("median_rounds")
    for key in ("median_send", "median_delivery"):
        document["schedule"].pop(key)


def _row(index: int, rng: np.random.Generator) -> dict[str, Any]:
    age = float(rng.uniform(0, 100))
    colour = COLOURS[int(rng.integers(len(COLOURS)))]
    positive = age > 50 or colour in COLOURS[:40]
    return {"age": age, "colour": colour, "y": "1" if rng.random() < (0.85 if positive else 0.15) else "0"}


@pytest.fixture(scope="module")
def averaging_round(tmp_path_factory: pytest.TempPathFactory) -> RoundTrace:
    setup = RoundSetup(adjust_spec=_as_model_averaging, peer_data=_row, rows_per_peer=ROWS)
    return simulate_round(SimulationConfig(peers=16, seed=5), setup=setup, keep=tmp_path_factory.mktemp("averaging-round"))


def test_a_model_averaging_round_accepts_every_block_and_charges_each_peer_its_promise_once(averaging_round: RoundTrace) -> None:
    trace = averaging_round
    manifest = trace.manifest.manifest
    assert trace.outcome == "done" and manifest.task_kind == TaskKind.MODEL_AVERAGING and manifest.rows_per_peer == ROWS
    model = RoundModel.of_manifest(manifest)
    assert (model.blocks.dimension, model.blocks.blocks) == (151, 2)
    results = [p.result for p in trace.peers]
    assert all(r is not None for r in results), [p.error or p.refused for p in trace.peers]
    # Every peer sends one packet per block, and its ledger holds the model once: exactly the promise.
    assert {r.packets for r in results if r is not None} == {model.blocks.blocks}
    assert {r.epsilon_spent for r in results if r is not None} == {manifest.eps_total}
    packets = sum(r.packets for r in results if r is not None)
    assert packets == len(trace.arrivals) == sum(r.acknowledged for r in results if r is not None) == 32
    assert trace.peer_store is not None
    store = PeerStore(trace.peer_store)
    for outcome in trace.peers:
        (spend,) = store.spends(outcome.key)
        assert spend.epsilon == manifest.eps_total and [r.kind for r in spend.releases()] == ["model"]
    assert trace.report["averaged_model"]["reports_per_block"] == [len(trace.peers)] * 2
    # Each block report is a piece of the one ε_T release: the shuffle bound is stated at ε_T, not ε_T / k_h.
    privacy = trace.report["privacy"]
    assert manifest.eps_data == manifest.eps_total / 2 and privacy["eps_per_data_report"] == manifest.eps_total
    assert privacy["central_per_survey"]["n"] == len(trace.peers) // 2  # two partitions: a survey holds half the peers
    # The consent preview says what the round computes, and after the round (the model in the ledger,
    # nothing left to send) its cost is still the promise: the model counted once, not once per block.
    spec = FeatureSpec.from_dict(dict(manifest.features))
    outcome = trace.peers[0]
    vector = RoundPipeline.for_spec(spec).vector_of(Dataset((Event(_row(0, np.random.default_rng(0)), None, 1),)))
    text, cost, _, _ = describe_release(trace.manifest, spec, vector, store, outcome.key)
    assert cost == manifest.eps_total and "averaging the peers' models" in text, text
    # The spec left the settings out, so the round signed the ones chosen on validation, and every party used them.
    assert (manifest.regularization_rule, manifest.categorical_weight) == (1.5, 0.35)
    assert (trace.report["averaged_model"]["regularization_rule"], trace.report["averaged_model"]["categorical_weight"]) == (1.5, 0.35)
    assert "categorical columns scaled by 0.35" in text and f"λ = {1.5 / (ROWS * manifest.eps_total):.4g}" in text, text


def test_the_averaged_model_ranks_held_out_rows(averaging_round: RoundTrace) -> None:
    trace = averaging_round
    published = trace.report["averaged_model"]
    model = RoundModel.of_manifest(trace.manifest.manifest)
    rng = np.random.default_rng(99)
    rows = [_row(0, rng) for _ in range(2000)]
    table = Table({"age": np.array([r["age"] for r in rows]), "colour": np.array([r["colour"] for r in rows])},
                  np.array([r["y"] for r in rows]))
    auc = roc_auc_score([r["y"] == "1" for r in rows], model.scores(np.array(published["coef"]), table))
    assert auc > 0.65, auc  # measured 0.701: 16 peers, 151 coordinates, mostly noise but ranked
