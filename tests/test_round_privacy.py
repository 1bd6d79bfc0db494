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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from anonml.aggregator._report import learn, summarise
from anonml.aggregator._round import RoundState
from anonml.aggregator._service import AggregatorConfig, serve_aggregator
from anonml.aggregator._setup import create_round
from anonml.aggregator._spec import parse_round_spec
from anonml.aggregator._store import AggregatorHome
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
from anonml.protocol import SurveyId, SurveyKind, SurveyMessage, decode_median_report, decode_pool_answer
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
    for message in sealed_messages(store, peer, signed):
        if message.survey.kind == SurveyKind.DATA:
            epsilons.append(manifest.eps_data)
        elif manifest.comparison_pool:
            # A pool peer's one bit, naming its feature and one of that feature's two cut points.
            decode_pool_answer(message.report, [2, 2])
            epsilons.append(manifest.eps_median)
        else:
            # One byte per comparison bit, naming which of the feature's two cut points it answers
            # (decoding raises otherwise).
            decode_median_report(message.report, [2, 2])
            epsilons += [manifest.eps_median] * len(message.report)
    return math.fsum(epsilons)


def sealed_messages(store: PeerStore, peer: bytes, signed: SignedManifest) -> list[SurveyMessage]:
    """Every message ``peer`` sealed in the round, each of which it sent."""
    messages = []
    for key, packet in store.packets(signed.round_id):
        if key == peer:
            assert packet.sends >= 1, "a sealed message was never sent"
            messages.append(SurveyMessage.from_bytes(packet.message))
    return messages


@dataclass
class PrivacyRound:
    """A finished loopback round of :func:`run_round`: its manifest, its peers and what each did, its report."""

    home: AggregatorHome
    descriptors: list[dict[str, Any]]
    signed: SignedManifest
    peers: list[Peer]
    results: dict[bytes, JoinResult]
    report: dict[str, Any]
    store_path: Path


async def run_round(tmp_path: Path, relay_processes: list[trio.Process], peers: int, adjust: Callable[[dict[str, Any]], None]) -> PrivacyRound:
    """Run :func:`spec_document`'s round, changed by ``adjust``, with ``peers`` honest peers to its end."""
    http_port = free_port()
    home, _, descriptors = await aggregator_with_relays(tmp_path, http_port, relay_processes)
    document = spec_document(descriptors, http_port, "privacy")
    adjust(document)
    spec = parse_round_spec(document)
    state, _ = create_round(home, spec, now=int(time.time()))
    reports: dict[str, Any] = {}

    def on_learn(s: RoundState) -> dict[str, Any]:
        reports["report"] = learn(s, home.round_dir(s.round_id))
        return {}

    store_path = tmp_path / "peers.sqlite"
    store = PeerStore(store_path)
    joined: list[Peer] = []
    results: dict[bytes, JoinResult] = {}
    outcome: list[str] = []
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            config = AggregatorConfig(state, http_port=http_port, sink_port=spec.network.sink_port, on_learn=on_learn, linger=5.0)
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
                joined.append(peer)
                results[peer.identity.public_key] = await join_round(peer, session, signed, pipeline)

            async with trio.open_nursery() as joining:
                for i in range(peers):
                    joining.start_soon(honest, i)
        with trio.fail_after(60):
            while not outcome:
                await trio.sleep(0.2)
        await client.aclose()
    store.close()
    assert outcome == ["done"]
    return PrivacyRound(home, descriptors, signed, joined, results, reports["report"], store_path)


async def test_every_peer_releases_exactly_its_ledger_within_the_record_level_promise(tmp_path: Path, relay_processes: list[trio.Process]) -> None:
    finished = await run_round(tmp_path, relay_processes, PEERS, lambda document: None)
    signed, peers, home, descriptors = finished.signed, finished.peers, finished.home, finished.descriptors
    reports = {"report": finished.report}
    store_path, by_key = finished.store_path, finished.results
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
    reopened = PeerStore(store_path)  # the ledger is what the disk holds
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


POOL_PEERS = 12


def with_comparison_pool(document: dict[str, Any]) -> None:
    """The one-release plan with a reserved comparison pool of a third of the peers (4 of 12, two per
    sub-round): a pool peer answers one comparison bit at the full ε_T, a data peer sends one report
    of two features at the full ε_T."""
    document["learning"].update({"plan": "one", "k_p": 2, "k_h": 1, "k_s": 2, "comparison_pool": 0.34})


async def test_with_a_comparison_pool_every_peer_makes_one_release_at_the_full_promise(tmp_path: Path, relay_processes: list[trio.Process]) -> None:
    """Issue 11, What to build 2: in a round, by default each peer answers exactly one question at the full
    ε_T. The pool's peers each seal one comparison bit (about a feature and a cut point they drew), the
    others one data report and no comparison; each sum equals the ledger and the promise; the search
    still finds both features' cut points from the pool's answers alone."""
    finished = await run_round(tmp_path, relay_processes, POOL_PEERS, with_comparison_pool)
    signed, report = finished.signed, finished.report
    manifest = signed.manifest
    assert manifest.comparison_pool == 340 and manifest.partitions == manifest.k_p + manifest.median_rounds == 4
    # One release at the full promise either way: the pool's bit and a data report both cost ε_T.
    assert manifest.eps_median == pytest.approx(EPS_TOTAL) and manifest.eps_data == pytest.approx(EPS_TOTAL)
    assert manifest.eps_total == pytest.approx(EPS_TOTAL)

    reopened = PeerStore(finished.store_path)
    pool = 0
    for peer in finished.peers:
        key = peer.identity.public_key
        result = finished.results[key]
        assert result.partition is not None
        messages = sealed_messages(reopened, key, signed)
        (message,) = messages  # exactly one release, and the final receipt log holds it
        assert (result.acknowledged, result.missing) == (1, 0), result
        if manifest.is_pool_partition(result.partition):
            pool += 1
            assert message.survey == manifest.median_survey(result.partition)
            assert result.partition - manifest.k_p == message.survey.sub_round
        else:
            assert message.survey == SurveyId.data(signed.round_id, result.partition, 0)
        released = released_epsilon(reopened, key, signed)
        assert released == pytest.approx(PeerLedger(reopened, key, signed.round_id, manifest.eps_total).spent())
        assert released == pytest.approx(result.epsilon_spent) == pytest.approx(manifest.eps_total)
    assert pool == manifest.comparison_pool_size(POOL_PEERS) == 4
    accepted = report["accepted_by_survey"]
    assert sum(accepted.values()) == POOL_PEERS - pool  # the data reports, every one
    spec_ = FeatureSpec.from_dict(dict(manifest.features))
    cut_points = report["cut_points"]
    assert set(cut_points) == set(spec_.numeric_names)
    assert all(len(values) == 2 and values == sorted(values) for values in cut_points.values()), cut_points
    # The eq. 7.4 figure is the costlier kind's: a pool peer's one feature or a data peer's label, ε_T each.
    assert report["privacy"]["eps_per_attribute_secondary"] == pytest.approx(EPS_TOTAL)

    # Before the seed, a new peer is told it will be one kind or the other, and what each costs.
    newcomer = PeerIdentity.generate().public_key
    first = finished.peers[0]
    text, cost, _, _ = describe_release(signed, spec_, first.vector, reopened, newcomer)
    assert cost == pytest.approx(EPS_TOTAL), text
    assert "if in the comparison pool:" in text and "otherwise:" in text and "about ONE numeric feature" in text, text
    # After, each sees only its own kind's release, counted once.
    for peer in finished.peers:
        key = peer.identity.public_key
        text, cost, _, _ = describe_release(signed, spec_, peer.vector, reopened, key)
        assert cost == pytest.approx(EPS_TOTAL) and "if in the comparison pool:" not in text, text
    reopened.close()
