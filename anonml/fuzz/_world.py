"""A small live round the fuzz targets parse against: real keys, a real round store, real peers.

Valid inputs (the fuzzer's seeds) are made the way the services make them:
the aggregator's signed manifest and documents, peers' registration and
credential requests, Sphinx packets through a relay to the aggregator, tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from nacl.signing import SigningKey

from anonml.aggregator import AggregatorHome, RoundState, create_round, parse_round_spec
from anonml.crypto import (
    NodeAddress,
    PathHop,
    ReleaseWindow,
    SphinxGeometry,
    generate_keypair,
)
from anonml.protocol import SurveyId, acceptance_window
from anonml.testing import SettableClock, SimulatedPeer, enrol

SUBSETS = 2
PARTITIONS = 2


@dataclass
class World:
    """One prepared round (registration closed, credentials issued) and what the targets need of it."""

    state: RoundState
    clock: SettableClock
    peers: list[SimulatedPeer]
    applicant: SimulatedPeer
    """On the roster without a credential: its credential request reaches the issuer."""
    relay_private: bytes
    relay_public: bytes
    signing_key: SigningKey
    identity: bytes
    survey: SurveyId
    """A data survey of the first peer's partition, open at ``clock``."""
    report: bytes
    """A valid report for ``survey``."""
    registering: RoundState
    """A second round of the same aggregator, its registration open: a registration request reaches its store."""


def spec_document(relay_public: bytes, geometry: SphinxGeometry) -> dict[str, Any]:
    return {
        "name": "fuzz",
        "task": {
            "features": [
                {"name": "colour", "type": "categorical", "categories": ["red", "green", "blue"]},
                {"name": "age", "type": "numeric", "low": 0.0, "high": 100.0},
            ],
            "label": {"name": "y", "positive": ["1"], "negative": ["0"]},
        },
        "learning": {"k_p": PARTITIONS, "k_h": SUBSETS, "k_s": 1, "plan": "split", "learner": "logreg"},
        "privacy": {"eps_total": 4.0, "oracle": "grr"},
        "schedule": {"register": 100, "issue": 100, "median_rounds": 1, "median_send": 10, "median_delivery": 10,
                     "data_send": 100, "data_delivery": 100},
        "network": {
            "relays": [{"node_id": (b"\x01" * 16).hex(), "host": "127.0.0.1", "port": 9001,
                        "public_key": relay_public.hex(), "key_epoch": 1}],
            "path_length": 1, "http_host": "127.0.0.1", "http_port": 8080, "sink_host": "127.0.0.1",
            "sink_port": 8081, "max_hops": geometry.max_hops, "packet_size": geometry.packet_size,
        },
        "participation": {"min_participation": 2, "registration": "open", "purpose": "test", "max_per_client": 8, "min_anonymity_set": 1},
    }


def build_world(work: Path) -> World:
    """A round in ``work`` whose data phase is open, with four peers holding credentials and one applicant;
    and a round still registering."""
    relay_private, relay_public = generate_keypair()
    geometry = SphinxGeometry.create(max_hops=2, packet_size=1024)
    home = AggregatorHome(work / "aggregator")
    home.initialise(os.urandom(32), generate_keypair()[0])
    start = 1_800_000_000
    state, _ = create_round(home, parse_round_spec(spec_document(relay_public, geometry)), now=start)
    clock = SettableClock(start + 1)
    state.clock = clock
    applicant = SimulatedPeer(state, b"\x05" * 32)
    applicant.register()
    peers = enrol(state, clock, [bytes([i + 1]) * 32 for i in range(4)])
    clock.now = state.manifest.schedule.data.send_end + 1  # the data surveys accept packets
    peer = peers[0]
    survey = SurveyId.data(state.round_id, peer.partition, 0)
    oracle = state.data_oracle(peer.partition, 0)
    report = oracle.encode_report(oracle.privatize(np.array([1]), np.random.default_rng(1))[0])
    signing_key = home.signing_key()
    registering, _ = create_round(home, parse_round_spec(spec_document(relay_public, geometry)), now=start)
    registering.clock = SettableClock(start + 1)
    return World(state=state, clock=clock, peers=peers, applicant=applicant, relay_private=relay_private,
                 relay_public=relay_public, signing_key=signing_key, identity=bytes(signing_key.verify_key), survey=survey,
                 report=report, registering=registering)


def relay_hop(world: World) -> PathHop:
    """The relay as a packet's first hop, its window the survey's acceptance window."""
    window = ReleaseWindow(*acceptance_window(world.state.manifest.schedule, world.survey))
    return PathHop(b"\x01" * 16, NodeAddress("127.0.0.1", 9001), world.relay_public, window)
