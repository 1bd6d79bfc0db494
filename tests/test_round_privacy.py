"""Record-level privacy in a whole loopback round (issue 11): real relays as
``anonml relay`` processes, the aggregator on real sockets, peers running
``join_round``.

For every peer, the epsilon of every release it made (each comparison bit of
its median answer, each subset report, read back from the messages it sealed)
sums to its ledger entry, and that sum never exceeds the record-level epsilon
the manifest promises. The ledger is durable (a reopened store refuses any
further release), the consent text of a peer resuming after it spent counts
each release once, a later round's consent states what earlier rounds spent,
and the report states the promise as record-level, eq. 7.4 only as a labelled
per-attribute figure.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from anonml.aggregator._report import learn, summarise
from anonml.aggregator._round import RoundState
from anonml.aggregator._service import AggregatorConfig, serve_aggregator
from anonml.aggregator._setup import create_round
from anonml.aggregator._spec import parse_round_spec
from anonml.demo import free_port
from anonml.mechanisms import BudgetExceeded
from anonml.peer import describe_release
from anonml.peer._client import AggregatorClient
from anonml.peer._features import RoundPipeline
from anonml.peer._framework import Dataset, Event, FeatureVector
from anonml.peer._identity import PeerIdentity
from anonml.peer._join import JoinResult, Peer, RoundSession, join_round, peer_generator
from anonml.peer._ledger import PeerLedger
from anonml.peer._store import DEFAULT_LIFETIME_EPSILON, PeerStore
from anonml.peer._transport import open_transport
from anonml.protocol import SurveyId, SurveyKind, SurveyMessage, decode_median_report
from anonml.protocol._features import FeatureSpec
from anonml.protocol._manifest import SignedManifest
from test_e2e_round import aggregator_with_relays, served_manifest
from test_e2e_round import spec_document as e2e_spec_document

pytestmark = pytest.mark.slow

PEERS = 6
EPS_TOTAL = 2.0


def spec_document(relays: list[dict[str, Any]], http_port: int, name: str) -> dict[str, Any]:
    """The e2e round with two numeric features, so a median answer is two comparison bits; both
    partitions are queried, and each data subset holds two features. Each numeric feature gets
    two cut points (three bins), found by the median search: a bit answers about one of them."""
    document = e2e_spec_document(relays, http_port)
    document["name"] = name
    document["task"]["features"].insert(1, {"name": "hours", "type": "numeric", "low": 0, "high": 100})
    document["task"]["quantiles"] = 2
    document["learning"]["k_s"] = 2
    document["privacy"] = {"eps_total": EPS_TOTAL, "oracle": "grr"}
    document["schedule"].update({"register": 8, "issue": 8})
    return document


def vector(pipeline: RoundPipeline, i: int) -> FeatureVector:
    row = {"age": float(20 + 7 * i), "hours": float(10 + 9 * i), "colour": ("red", "green", "blue")[i % 3], "y": str(i % 2)}
    return pipeline.vector_of(Dataset((Event(row, None, i + 2),)))


def released_epsilon(store: PeerStore, peer: bytes, signed: SignedManifest) -> float:
    """The record-level epsilon of every message ``peer`` sealed in the round, from the messages themselves:
    ``eps_median`` per comparison bit of a median answer, ``eps_data`` per subset report."""
    manifest = signed.manifest
    epsilons = []
    for key, packet in store.packets(signed.round_id):
        if key != peer:
            continue
        message = SurveyMessage.from_bytes(packet.message)
        assert packet.sends >= 1, "a sealed message was never sent"
        if message.survey.kind == SurveyKind.MEDIAN:
            # One byte per comparison bit, naming which of the feature's two cut points it answers
            # (decoding raises otherwise).
            decode_median_report(message.report, [2, 2])
            epsilons += [manifest.eps_median] * len(message.report)
        else:
            epsilons.append(manifest.eps_data)
    return math.fsum(epsilons)


async def test_every_peer_releases_exactly_its_ledger_within_the_record_level_promise(tmp_path: Path, relay_processes: list[trio.Process]) -> None:
    http_port = free_port()
    home, _, descriptors = await aggregator_with_relays(tmp_path, http_port, relay_processes)
    spec = parse_round_spec(spec_document(descriptors, http_port, "privacy"))
    state, _ = create_round(home, spec, now=int(time.time()))
    reports: dict[str, Any] = {}

    def on_learn(s: RoundState) -> dict[str, Any]:
        reports["report"] = learn(s, home.round_dir(s.round_id))
        return {}

    store_path = tmp_path / "peers.sqlite"
    store = PeerStore(store_path)
    peers: list[Peer] = []
    results: list[JoinResult] = []
    outcome: list[str] = []
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            config = AggregatorConfig(state, http_port=http_port, sink_port=spec.sink_port, on_learn=on_learn, linger=5.0)
            outcome.append(await serve_aggregator(config))

        nursery.start_soon(serve)
        client = AggregatorClient(state.manifest.aggregator_url, retry_for=10)
        signed = await served_manifest(client)
        pipeline = RoundPipeline.for_spec(FeatureSpec.from_dict(dict(signed.manifest.features)))
        geometry = signed.manifest.sphinx_geometry()
        async with open_transport(packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash()) as transport:
            session = RoundSession(client, transport)

            async def honest(i: int) -> None:
                peer = Peer(PeerIdentity.generate(), store, vector(pipeline, i), peer_generator())
                peers.append(peer)
                results.append(await join_round(peer, session, signed, pipeline))

            async with trio.open_nursery() as joining:
                for i in range(PEERS):
                    joining.start_soon(honest, i)
        with trio.fail_after(60):
            while not outcome:
                await trio.sleep(0.2)
        await client.aclose()
    assert outcome == ["done"]
    manifest = signed.manifest
    # The promise is record level: two comparison bits and one report, summed.
    assert manifest.eps_total == pytest.approx(EPS_TOTAL)
    assert 2 * manifest.eps_median + manifest.k_h * manifest.eps_data == pytest.approx(manifest.eps_total)

    spec_ = FeatureSpec.from_dict(dict(manifest.features))
    # Several cut points per numeric feature, end to end: the search published two for each,
    # ascending, the peers binned with them (their data reports decoded in three bins), and the
    # report and its model carry them.
    assert [spec_.feature(name).n_bins for name in spec_.numeric_names] == [3, 3]
    cut_points = reports["report"]["cut_points"]
    assert set(cut_points) == set(spec_.numeric_names)
    assert all(len(values) == 2 and values == sorted(values) for values in cut_points.values()), cut_points
    assert any(line.startswith("cut points (private median search): ") and "age " in line and "hours " in line for line in summarise(reports["report"]))
    assert sum(reports["report"]["accepted_by_survey"].values()) == PEERS
    store.close()
    reopened = PeerStore(store_path)  # the ledger is what the disk holds
    by_key = {result_peer.identity.public_key: result for result_peer, result in zip(peers, results, strict=True)}
    for peer in peers:
        key = peer.identity.public_key
        released = released_epsilon(reopened, key, signed)
        ledger = PeerLedger(reopened, key, signed.round_id, manifest.eps_total)
        assert released == pytest.approx(ledger.spent())
        assert released == pytest.approx(by_key[key].epsilon_spent)
        assert released <= manifest.eps_total * (1 + 1e-12)
        # Both partitions were queried, so every peer spent the whole promise ...
        assert released == pytest.approx(manifest.eps_total)
        # ... and its ledger, rebuilt from disk, refuses anything more in this round.
        with pytest.raises(BudgetExceeded):
            ledger.spend_subset(SurveyId.data(signed.round_id, 0, 7), ("colour",), 1e-3)
        # A resumed join after spending counts each release once (before: spent + planned, 2·ε_T, refused).
        text, cost, _, _ = describe_release(signed, spec_, peer.vector, reopened, key)
        assert cost == pytest.approx(manifest.eps_total), text
        assert "record level" in text and "per-attribute figure, thesis eq. 7.4" in text.lower()

    # A later round: its consent states what the earlier round spent, and its own cost alone.
    later, _ = create_round(home, parse_round_spec(spec_document(descriptors, free_port(), "privacy-2")), now=int(time.time()))
    key = peers[0].identity.public_key
    text, cost, lifetime_total, lifetime = describe_release(later.signed, spec_, peers[0].vector, reopened, key)
    assert cost == pytest.approx(later.manifest.eps_total)
    assert f"records {manifest.eps_total:.4g} in 1 earlier round(s)" in text, text
    # Epsilons add up across rounds, and the lifetime budget caps the sum (DESIGN.md §8).
    assert lifetime_total == pytest.approx(manifest.eps_total + later.manifest.eps_total)
    assert lifetime == DEFAULT_LIFETIME_EPSILON and "within it" in text
    reopened.set_lifetime_epsilon(lifetime_total - 0.01)
    assert "OVER it: the round is refused" in describe_release(later.signed, spec_, peers[0].vector, reopened, key).text
    later_ledger = PeerLedger(reopened, key, later.signed.round_id, later.manifest.eps_total)
    with pytest.raises(BudgetExceeded, match="lifetime budget"):
        later_ledger.spend_subset(SurveyId.data(later.signed.round_id, 0, 0), ("colour",), later.manifest.eps_total)
    assert reopened.spends(key, later.signed.round_id) == []
    reopened.close()

    privacy = reports["report"]["privacy"]
    assert privacy["eps_total_local"] == pytest.approx(manifest.eps_total)
    assert privacy["eps_total_meaning"].startswith("record-level")
    # eq. 7.4 would call this round max(age: 0.5 + 1, label: 1) = 1.5, labelled as per-attribute only
    assert privacy["eps_per_attribute_secondary"] == pytest.approx(manifest.eps_median + manifest.eps_data)
    assert any("record-level" in line and "eq. 7.4" in line for line in summarise(reports["report"]))
