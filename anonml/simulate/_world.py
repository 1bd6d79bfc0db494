"""One whole round in one process, on a virtual clock, over an in-memory network.

Every role runs its real code: the aggregator's service (``serve_aggregator``:
its HTTP API, round driver, packet sink and token verifier), each relay
(``serve_relay``: link, mixing, mirror, Sphinx), and every peer
(``join_round``). Only the transport is replaced, behind the seam that TCP
uses too (``transport.MemoryNetwork``), and time is trio's ``MockClock``:
a round whose windows last minutes runs in seconds, and nothing in it
depends on how busy the machine is. HTTP requests are handed to the server's
ASGI app in process, not carried as HTTP/1.1 bytes (``transport._inprocess``
says what that no longer exercises, and where that is tested).

Determinism: one seed gives one event trace. Every random choice that moves
control flow is drawn from a generator derived from the seed (peers' send
times, paths, nonces and answers; relays' release times; the round seed;
mirror order; retry jitter; trio's scheduler), and blocking work runs on the
event loop (``base.threads.blocking_work_inline``), so virtual time never
jumps while a thread runs. Key material and packet padding still come from
the operating system: they change bytes, never what happens when.
"""

from __future__ import annotations

import functools
import hashlib
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import trio
import trio.testing
from nacl.signing import SigningKey

from anonml.aggregator import (
    AggregatorConfig,
    AggregatorHome,
    RoundState,
    create_round,
    learn,
    parse_round_spec,
    serve_aggregator,
)
from anonml.base.threads import blocking_work_inline
from anonml.crypto import generate_keypair
from anonml.peer import (
    AggregatorClient,
    AggregatorError,
    Dataset,
    Event,
    JoinRefused,
    JoinResult,
    Peer,
    PeerIdentity,
    PeerStore,
    RoundPipeline,
    RoundSession,
    join_round,
    mirror_clients,
    open_transport,
    peer_generator,
)
from anonml.protocol import FeatureSpec, RelayEntry, SignedManifest, SurveyId
from anonml.relay import KeyRing, PinnedAggregator, RelayConfig, WallClock, create_identity, relay_descriptor, serve_relay
from anonml.simulate._adversary import Adversary, AdversaryView, RoundContext, asgi_interposer
from anonml.transport import MemoryNetwork

# Virtual wall time at the start of every simulated round (UTC seconds, 2027).
T0 = 1_800_000_000
AGGREGATOR_IP = "10.0.0.1"
SINK_PORT = 7000
HTTP_PORT = 8000
LINK_PORT = 9000
MIRROR_PORT = 9001
# The aggregator keeps serving after the round ends, as `aggregator run --linger` does, while the
# peers read their final logs; the simulation stops as soon as every peer has finished.
LINGER_SECONDS = 3_600.0


def relay_ip(index: int) -> str:
    return f"10.0.1.{index + 1}"


def peer_ip(index: int) -> str:
    return f"10.1.{index // 250}.{index % 250 + 1}"


@dataclass(frozen=True)
class SimulationConfig:
    """What a simulated round looks like. The defaults are the issue's setting: 4 relays, 3-relay paths."""

    peers: int = 40
    relays: int = 4
    path_length: int = 3
    partitions: int = 2
    seed: int = 0
    epsilon_total: float = 4.0
    clock_skew: float = 0.0
    """How far off the peers' clocks are, in seconds: the target's (the peer the seed names) runs this much
    slow, so it sends that much late, and every other peer's is off by a uniform draw in ``±clock_skew``."""

    def __post_init__(self) -> None:
        if not 0 <= self.clock_skew < 3_600:
            raise ValueError(f"clock_skew={self.clock_skew!r} must be in [0, 3600) seconds")
        if self.peers < 2 * self.partitions:
            raise ValueError(f"peers={self.peers!r}: at least two peers per partition")
        if not 1 <= self.path_length <= self.relays:
            raise ValueError(f"path_length={self.path_length!r} must be between 1 and relays={self.relays!r}")


SpecAdjustment = Callable[[dict[str, Any]], None]
"""Changes a simulated round's spec document in place (its features, plan, privacy, participation)."""
PeerData = Callable[[int, np.random.Generator], dict[str, Any]]
"""Peer ``i``'s data row (feature values and label), drawn from the generator it is given."""


@dataclass(frozen=True)
class RoundSetup:
    """How a simulated round's spec and peers' data are made (the default: :func:`spec_document`, :func:`peer_row`)."""

    adjust_spec: SpecAdjustment | None = None
    peer_data: PeerData | None = None
    rows_per_peer: int = 1
    """Rows each peer holds (a model-averaging round's peers hold many), each drawn by ``peer_data``."""


@dataclass
class PeerOutcome:
    """One simulated peer: who it is on the network, and what ``join_round`` did or why it refused."""

    index: int
    address: str
    key: bytes
    clock_offset: float = 0.0
    """Its clock minus true time (``SimulationConfig.clock_skew``; negative: slow)."""
    result: JoinResult | None = None
    refused: JoinRefused | None = None
    error: str | None = None


@dataclass
class RoundTrace:
    """Everything a simulated round leaves behind: the truth, the adversary's view, and the outcome."""

    config: SimulationConfig
    manifest: SignedManifest
    outcome: str
    peers: list[PeerOutcome]
    view: AdversaryView
    arrivals: list[tuple[SurveyId, bytes, float]]
    """Every accepted report: its survey, its receipt digest, when it reached the aggregator (the adversary sees all)."""
    senders: dict[bytes, int] = field(default_factory=dict)
    """Ground truth: receipt digest -> index of the peer that sealed it."""
    report: dict[str, Any] = field(default_factory=dict)
    peer_store: Path | None = None
    """The peers' shared store (identities, ledgers, sealed messages) when the caller asked to keep the files."""


def spec_document(config: SimulationConfig, relays: list[dict[str, Any]]) -> dict[str, Any]:
    """A small round: one numeric and one categorical feature, a median search, one subset per peer."""
    return {
        "name": f"simulated-{config.seed}",
        "task": {
            "features": [
                {"name": "age", "type": "numeric", "low": 0, "high": 100},
                {"name": "colour", "type": "categorical", "categories": ["red", "green", "blue"]},
            ],
            "label": {"name": "y", "positive": ["1"], "negative": ["0"]},
        },
        "learning": {"k_p": config.partitions, "k_h": 1, "k_s": 1, "plan": "split", "learner": "logreg"},
        "privacy": {"eps_total": config.epsilon_total, "oracle": "grr"},
        # Virtual seconds cost no waiting, but every second of a round wakes the relays' mirrors and
        # housekeeping: windows as short as their sends and deliveries need on the virtual clock.
        "schedule": {"register": 20, "issue": 20, "median_rounds": config.partitions, "median_send": 10,
                     "median_delivery": 20, "data_send": 10, "data_delivery": 20},
        "network": {
            "relays": [{k: r[k] for k in RelayEntry.FIELDS} for r in relays], "path_length": config.path_length,
            "http_host": AGGREGATOR_IP, "http_port": HTTP_PORT, "sink_host": AGGREGATOR_IP, "sink_port": SINK_PORT,
        },
        "participation": {"min_participation": 2 * config.partitions, "min_anonymity_set": 2, "registration": "open", "purpose": "test",
                          "max_per_client": 1},
    }


def peer_row(index: int, rng: np.random.Generator) -> dict[str, Any]:
    """One peer's data: the label depends on both features, so the round has something to learn."""
    age = float(rng.uniform(0, 100))
    colour = ("red", "green", "blue")[int(rng.integers(3))]
    positive = (age > 50) != (colour == "blue")
    return {"age": age, "colour": colour, "y": "1" if rng.random() < (0.8 if positive else 0.2) else "0"}


def _clock_offset(config: SimulationConfig, index: int) -> float:
    """Peer ``index``'s clock error: ``-clock_skew`` for the target, a seeded uniform draw for the others."""
    if config.clock_skew == 0:
        return 0.0
    if index == config.seed % config.peers:
        return -config.clock_skew
    return random.Random(_seeded(config.seed, "clock", index)).uniform(-config.clock_skew, config.clock_skew)


def _seeded(seed: int, *purpose: object) -> int:
    """A 64-bit seed for one purpose, derived from the run's seed (streams never overlap)."""
    text = ":".join(str(part) for part in (seed, *purpose)).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


def _seed_trio_scheduler(seed: int) -> None:
    """Make trio's choice among runnable tasks a function of the seed.

    trio shuffles each batch of runnable tasks with a module-level generator
    (so tests cannot depend on an order). pytest-trio's Hypothesis support
    seeds it through these same two names; they are private, so a trio that
    lacks them leaves the order unseeded rather than failing.
    """
    run_module = getattr(getattr(trio, "_core", None), "_run", None)
    if run_module is not None and hasattr(run_module, "_r") and hasattr(run_module, "_ALLOW_DETERMINISTIC_SCHEDULING"):
        run_module._ALLOW_DETERMINISTIC_SCHEDULING = True
        run_module._r.seed(seed)


class _World:
    """The files and objects of one simulated round (see :func:`simulate_round`)."""

    def __init__(self, config: SimulationConfig, adversary: Adversary, root: Path, setup: RoundSetup) -> None:
        self.config = config
        self.setup = setup
        self.adversary = adversary
        self.root = root
        self.view = AdversaryView()
        # Requests to the HTTP servers go straight to their apps (transport._inprocess says what that skips).
        self.network = MemoryNetwork(in_process_http=True)
        identity = SigningKey(hashlib.sha256(f"{config.seed}:aggregator".encode()).digest())
        self.home = AggregatorHome(root / "aggregator")
        self.home.initialise(bytes(identity), generate_keypair(rng_bytes=random.Random(_seeded(config.seed, "final-hop")).randbytes)[0])
        pinned = PinnedAggregator(f"http://{AGGREGATOR_IP}:{HTTP_PORT}", bytes(identity.verify_key))
        self.relay_configs = [self._relay_config(i, pinned) for i in range(config.relays)]
        document = spec_document(config, [relay_descriptor(c, T0) for c in self.relay_configs])
        if setup.adjust_spec is not None:
            setup.adjust_spec(document)
        spec = parse_round_spec(document)
        # A relay serves one packet geometry (its config's, the default unless set), and refuses a link whose
        # hello names another: every relay takes the spec's, or a round of another packet size never delivers.
        self.relay_configs = [replace(c, packet_size=spec.network.packet_size, max_hops=spec.network.max_hops)
                              for c in self.relay_configs]
        round_seed = random.Random(_seeded(config.seed, "round"))
        self.state, _ = create_round(self.home, spec, now=T0, rng_bytes=round_seed.randbytes)
        self.state.clock = lambda: T0 + trio.current_time()
        self.round_dir = self.home.round_dir(self.state.round_id)
        self.report: dict[str, Any] = {}
        self.peers = [PeerOutcome(i, peer_ip(i), b"", _clock_offset(config, i)) for i in range(config.peers)]
        self.store = PeerStore(root / "peers.sqlite", durable=False)

    def _relay_config(self, index: int, aggregator: PinnedAggregator) -> RelayConfig:
        data_dir = self.root / f"relay-{index}"
        keys = random.Random(_seeded(self.config.seed, "relay-keys", index)).randbytes
        create_identity(data_dir, rng_bytes=keys)
        config = RelayConfig(data_dir=data_dir, listen=(relay_ip(index), LINK_PORT), mirror=(relay_ip(index), MIRROR_PORT),
                             synchronous="NORMAL", key_epoch_seconds=86_400, directory_aggregators=(aggregator,),
                             # No first-hop work from honest relays (relay._work): its level follows wall time,
                             # and these relays run on a virtual clock, all in this one process. Colluding ones
                             # ask it of their targets (simulate._work), each stamp charged its modelled time.
                             max_work_bits=0)
        # The epoch key the manifest names must exist before the descriptor is read.
        KeyRing(data_dir, epoch_seconds=config.key_epoch_seconds, grace_seconds=config.key_grace_seconds).rotate(T0, rng_bytes=keys)
        return config

    def on_learn(self, state: RoundState) -> dict[str, Any]:
        self.report.update(learn(state, self.round_dir))
        return {}

    async def run_peer(self, outcome: PeerOutcome, pipeline: RoundPipeline) -> None:
        """One peer with its own client, session and transport (so the adversary can tell peers apart)."""
        seed = self.config.seed
        rng = np.random.default_rng(_seeded(seed, "data", outcome.index))
        draw = self.setup.peer_data or peer_row
        rows = tuple(pipeline.vector_of(Dataset((Event(draw(outcome.index, rng), None, 1),))) for _ in range(self.setup.rows_per_peer))
        identity = PeerIdentity(SigningKey(hashlib.sha256(f"{seed}:identity:{outcome.index}".encode()).digest()))
        outcome.key = identity.public_key
        peer = Peer(identity, self.store, rows[-1], peer_generator(_seeded(seed, "peer", outcome.index)),
                    rows=rows if self.setup.rows_per_peer > 1 else ())
        network = self.network.node(outcome.address)
        client = AggregatorClient(self.state.manifest.aggregator_url, network=network,
                                  jitter=random.Random(_seeded(seed, "jitter", outcome.index)))
        try:
            signed = await client.manifest()
        except AggregatorError as failed:
            # The manifest withheld from it (random strategy 8): it never learnt of the round, so sent nothing.
            outcome.error = str(failed)
            await client.aclose()
            return
        geometry = signed.manifest.sphinx_geometry()
        async with open_transport(packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash(),
                                  network=self.network, local_address=outcome.address) as transport:
            offset, clock = outcome.clock_offset, self.state.clock
            session = RoundSession(
                client, transport, now=clock if offset == 0 else lambda: clock() + offset,
                mirror_client=mirror_clients(network),
                mirror_order=random.Random(_seeded(seed, "mirrors", outcome.index)),
            )
            try:
                outcome.result = await join_round(peer, session, signed, pipeline)
            except JoinRefused as refused:
                outcome.refused = refused
            except AggregatorError as failed:
                # It stopped (a credential withheld until issuance closed, say) before sending anything.
                outcome.error = str(failed)
            finally:
                await session.aclose()
                await client.aclose()

    async def run(self) -> str:
        """Serve the round to its end with every relay and peer; the aggregator's outcome."""
        manifest = self.state.manifest
        pipeline = RoundPipeline.for_manifest(manifest)
        config = AggregatorConfig(self.state, http_host=AGGREGATOR_IP, http_port=HTTP_PORT, sink_host=AGGREGATOR_IP,
                                  sink_port=SINK_PORT, on_learn=self.on_learn, network=self.network.node(AGGREGATOR_IP),
                                  linger=LINGER_SECONDS,
                                  app_middleware=lambda app: asgi_interposer(app, self.adversary, self.view, self.state.clock))
        async with trio.open_nursery() as nursery:
            self.adversary.attach(RoundContext(self.network, self.view, self.state.clock, manifest,
                                               [c.listen for c in self.relay_configs], nursery, self.home.signing_key(),
                                               self.state))
            await nursery.start(functools.partial(serve_aggregator, config))
            for index, relay_config in enumerate(self.relay_configs):
                rng = np.random.default_rng(_seeded(self.config.seed, "relay", index))
                await nursery.start(functools.partial(serve_relay, relay_config, clock=WallClock(T0), rng=rng,
                                                      network=self.network.node(relay_ip(index))))

            async with trio.open_nursery() as peers:
                for outcome in self.peers:
                    peers.start_soon(self.run_peer, outcome, pipeline)
            # Every peer has read its final log; the aggregator, still serving, has ended the round.
            while (ended := self.state.outcome()) is None:
                await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
        return str(ended)


def simulate_round(config: SimulationConfig, adversary: Adversary | None = None, *, setup: RoundSetup = RoundSetup(),
                   keep: Path | None = None) -> RoundTrace:
    """Run one whole round under ``adversary`` (None: an honest aggregator) and return its trace.

    ``setup`` changes the spec and the peers' data; with ``keep`` (an empty or
    missing folder) the round's files stay there, the peers' store among them.
    """
    adversary = adversary if adversary is not None else Adversary()
    root = keep if keep is not None else Path(tempfile.mkdtemp(prefix="anonml-sim-", dir=_scratch()))
    root.mkdir(parents=True, exist_ok=True)
    try:
        world = _World(config, adversary, root, setup)

        async def main() -> str:
            with blocking_work_inline():
                return await world.run()

        _seed_trio_scheduler(_seeded(config.seed, "scheduler"))
        outcome = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        senders = {packet.receipt: next(o.index for o in world.peers if o.key == key)
                   for key, packet in world.store.packets(world.state.round_id)}
        return RoundTrace(config=config, manifest=world.state.signed, outcome=outcome, peers=world.peers, view=world.view,
                          arrivals=world.state.store.arrivals(), senders=senders, report=world.report,
                          peer_store=root / "peers.sqlite" if keep is not None else None)
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _scratch() -> str | None:
    """Memory-backed scratch space when the machine has it: the stores' fsyncs then cost nothing."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None
