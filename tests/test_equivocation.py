"""Issue 12 attack 3: an aggregator that shows one peer a manifest or a roster of its own is caught by
comparing with a relay's mirror (``relay._mirror``, served here in process, pinned to the aggregator's
identity), and the peer keeps both signed documents as the proof and stops."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from anonml.demo import free_port
from anonml.aggregator._round import RoundState
from anonml.aggregator._service import AggregatorConfig, serve_aggregator
from anonml.aggregator._setup import create_round
from anonml.aggregator._spec import parse_round_spec
from anonml.aggregator._home import AggregatorHome
from anonml.crypto import IssuerSecretKey, generate_keypair
from anonml.peer import Equivocation
from anonml.peer._client import AggregatorClient
from anonml.peer._features import RoundPipeline
from anonml.peer._identity import PeerIdentity
from anonml.peer._join import Peer, PeerRound, RoundSession
from anonml.peer._store import PeerStore
from anonml.peer._transport import open_transport
from anonml.protocol import DocumentKind, FeatureSpec, RegisterRequest, RosterResponse, SignedDocument, SignedManifest
from anonml.relay import PinnedAggregator, serve_mirror
from test_peer_aggregator import spec_document, vector_for


@pytest.fixture
async def mirrored(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[tuple[RoundState, str]]:
    """A round served on loopback whose one listed relay runs a mirror pinned to the aggregator."""
    home = AggregatorHome(tmp_path / "agg")
    home.initialise(bytes(range(32)), generate_keypair()[0])
    http_port, mirror_port = free_port(), free_port()
    document = spec_document(register_seconds=4)
    document["network"]["http_port"] = http_port
    document["network"]["relays"][0]["mirror_port"] = mirror_port
    state, _ = create_round(home, parse_round_spec(document), now=int(time.time()))
    addresses = await nursery.start(serve_aggregator, AggregatorConfig(state, http_port=http_port))
    identity = bytes(home.signing_key().verify_key)
    await nursery.start(serve_mirror, ("127.0.0.1", mirror_port), (PinnedAggregator(addresses.http_url, identity),))
    yield state, addresses.http_url
    nursery.cancel_scope.cancel()


class TailoredRoster(AggregatorClient):
    """The aggregator's client as a malicious operator answers it for one peer: a roster of its own choosing
    (a Sybil added), under a head it signs with its identity key."""

    def __init__(self, url: str, state: RoundState) -> None:
        super().__init__(url, retry_for=10)
        self.state = state

    async def roster(self) -> RosterResponse | None:
        genuine = await super().roster()
        if genuine is None:
            return None
        sybil = RegisterRequest.create(PeerIdentity.generate().signing_key, self.state.round_id).entry
        return RosterResponse.create(self.state.secrets.signing_key, self.state.round_id, [*genuine.entries, sybil], self.state.secrets.seed)


async def run_until_partition(
    state: RoundState, url: str, tmp_path: Path, client: AggregatorClient, signed: SignedManifest, *, register: bool = True
) -> tuple[PeerRound, Any]:
    pipeline = RoundPipeline.for_spec(FeatureSpec.from_dict(dict(state.manifest.features)))
    store = PeerStore(tmp_path / "peer.sqlite", durable=False)
    honest = AggregatorClient(url, retry_for=10)
    async with open_transport(packet_size=2048, geometry_hash=bytes(32)) as transport:
        # Two more peers register through the genuine service (the round needs two).
        for age in (20.0, 30.0):
            other = PeerRound(Peer(PeerIdentity.generate(), store, vector_for(pipeline, age, "red", "1"), np.random.default_rng(0)),
                              RoundSession(honest, transport), state.signed, pipeline, lambda _: None)
            await other.register()
        run = PeerRound(Peer(PeerIdentity.generate(), store, vector_for(pipeline, 41.0, "green", "1"), np.random.default_rng(1)),
                        RoundSession(client, transport), signed, pipeline, lambda _: None)
        if register:
            await run.register()
        try:
            outcome: Any = await run.partition()
        except Equivocation as exc:
            outcome = exc
    await honest.aclose()
    return run, outcome


async def test_a_roster_shown_to_one_peer_alone_is_caught_and_kept(mirrored: Any, tmp_path: Path) -> None:
    state, url = mirrored
    client = TailoredRoster(url, state)
    run, outcome = await run_until_partition(state, url, tmp_path, client, state.signed)
    await client.aclose()
    assert isinstance(outcome, Equivocation), outcome
    [proof] = run.peer.store.equivocations(run.key)
    assert proof.kind == "roster-head" and proof.round_id == state.round_id
    served, mirror = (SignedDocument.from_json(d, max_bytes=1 << 20) for d in (proof.first, proof.second))
    for document in (served, mirror):  # both signed by the aggregator: a proof anyone can check
        document.verify(state.manifest.identity_key, kind=DocumentKind.ROSTER_HEAD, round_id=state.round_id)
    assert not served.same_as(mirror)


async def test_a_manifest_shown_to_one_peer_alone_is_caught_and_kept(mirrored: Any, tmp_path: Path) -> None:
    state, url = mirrored
    # The attack: one peer gets a manifest with its own issuer key, so its tokens are unique.
    own_key = IssuerSecretKey.generate().public_key()
    forged = dataclasses.replace(state.manifest, token_public_key=own_key.to_bytes(), token_kid=own_key.kid)
    signed = SignedManifest.sign(forged, state.secrets.signing_key)
    client = AggregatorClient(url, retry_for=10)
    # (the genuine service refuses a registration for the forged round; a malicious one would accept it)
    run, outcome = await run_until_partition(state, url, tmp_path, client, signed, register=False)
    await client.aclose()
    assert isinstance(outcome, Equivocation), outcome
    [proof] = run.peer.store.equivocations(run.key)
    assert proof.kind == "manifest"
    first, second = (SignedManifest.from_json(d, expected_identity=state.manifest.identity_key) for d in (proof.first, proof.second))
    assert {first.round_id, second.round_id} == {signed.round_id, state.round_id}
    assert first.manifest.name == second.manifest.name
