"""``anonml bench anonymity``: can timing link a report to its sender? (DESIGN.md §11 "anonymity")

Setup. Three real relays run as separate processes on the wall clock (the
real ``serve_relay``, each with its SQLite store and a directory naming only
the next hop) and this process runs the real aggregator's packet sink
(``aggregator.PacketSink``: durable inbox stamped with each arrival,
verification of every token in a worker process, the round's store) on
loopback TCP. N simulated peers (``anonml.testing.SimulatedPeer``: real
identities, blind credentials, tokens; the peer client per process would not
fit 10,000 peers on this machine) register, obtain credentials, and each seal
one data report into a Sphinx packet over the three relays with the round's
hop windows (relay ``k`` releases in slice ``k`` of the delivery window). Each
draws its send time uniformly in the send window with its own ChaCha20
generator (``peer.peer_generator``) and is handed to the first relay then.

What is measured, by whom.

* The aggregator's best guess from its full view (``aggregator.timing_guesses``,
  what its round report publishes): its arrivals, and a request log in which
  every peer made a signed HTTP request at the moment it sent — the leakiest
  peer there could be (under the protocol, peers request at scheduled times
  that do not depend on their send times). The bench, which knows who sent
  each receipt, scores the guess against chance (1 / partition size).
* Spearman's rho between send and arrival times, and two guesses a global
  observer of the first hops could make (exact sender by rank; "sent in the
  first half" from "arrived in the first half", chance 1/2).

The baseline, measured in the same run on the same peers and times: the
same guesses against a network without mixing (arrival = send + a fixed
delay), which links every packet.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
import trio

from anonml.aggregator import AggregatorHome, FullView, IssuerWorkers, PacketSink, RoundState, create_round, parse_round_spec, timing_guesses
from anonml.bench.aggregator import bench_spec
from anonml.bench.relay import _start_relay
from anonml.crypto import DEFAULT_MAX_HOPS, DEFAULT_PACKET_SIZE, SphinxGeometry, generate_keypair, node_id_of, public_key_of
from anonml.peer import peer_generator
from anonml.protocol import SurveyId, seal_report
from anonml.transport import AckStatus, LinkClient
from anonml.aggregator import score_links, timing_figures
from anonml.relay import DirectoryEntry
from anonml.testing import SettableClock, SimulatedPeer

RELAYS = 3
_REGISTER = _ISSUE = 10  # seconds of round time: setup runs on a settable clock, only the data phase is on the wall clock
_CALIBRATION_PEERS = 40


def _setup_peers(state: RoundState, clock: SettableClock, count: int, rng: np.random.Generator) -> list[tuple[SimulatedPeer, bytes, bytes]]:
    """Register ``count`` peers, issue their credentials, seal one data report each: (peer, message, receipt)."""
    schedule = state.manifest.schedule
    clock.now = schedule.t_register_end - _REGISTER + 1
    peers = [SimulatedPeer(state, rng.bytes(32)) for _ in range(count)]
    for peer in peers:
        peer.register()
    clock.now = schedule.t_register_end
    state.prepare()
    sealed = []
    for peer in peers:
        partition = peer.obtain_credential()
        assert peer.credential is not None
        survey = SurveyId.data(state.round_id, partition, 0)
        oracle = state.data_oracle(partition, 0)
        report = oracle.encode_report(oracle.privatize(np.array([int(rng.integers(0, 12))]), rng)[0])
        message = seal_report(peer.public, peer.credential, survey, report, state.geometry.message_size)
        sealed.append((peer, message.message, message.receipt))
    return sealed


def _make_round(home: AggregatorHome, relays: list[dict[str, Any]], sink_port: int, start: int,
                send_window: int, delivery_window: int) -> tuple[RoundState, SettableClock]:
    schedule = {"register": _REGISTER, "issue": _ISSUE, "data_send": send_window, "data_delivery": delivery_window}
    state, _ = create_round(home, parse_round_spec(bench_spec(relays, schedule, sink_port)), now=start)
    clock = SettableClock(start)
    state.clock = clock
    return state, clock


async def _start_cascade(work: Path, now: int, geometry: SphinxGeometry, next_hop: DirectoryEntry,
                         children: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """The relays as processes, last hop first (each forwards to the one started before it): their descriptors, in path order."""
    relays: list[dict[str, Any]] = []
    for index in reversed(range(RELAYS)):
        node_id, public, link_port, _ = await trio.to_thread.run_sync(
            lambda: _start_relay(work, index, now, "NORMAL", geometry, next_hop, children, wall=True))
        relays.insert(0, {"node_id": node_id.hex(), "host": "127.0.0.1", "port": link_port, "public_key": public.hex(), "key_epoch": 1})
        next_hop = DirectoryEntry(node_id, "127.0.0.1", link_port)
    return relays


async def _seconds_per_peer(state: RoundState, clock: SettableClock, rng: np.random.Generator) -> float:
    """The setup cost of one peer (registration, credential, sealing) measured on a calibration round, then closed."""
    started = time.perf_counter()
    await trio.to_thread.run_sync(_setup_peers, state, clock, _CALIBRATION_PEERS, rng)
    state.store.close()
    return (time.perf_counter() - started) / _CALIBRATION_PEERS


async def _run(peers: int, send_window: int, delivery_window: int, processes: int, seed: int, work: Path,
               children: list[subprocess.Popen[str]]) -> dict[str, Any]:
    load_before = os.getloadavg()
    began = time.monotonic()
    home = AggregatorHome(work / "aggregator")
    home.initialise(os.urandom(32), generate_keypair()[0])
    sink_public = public_key_of(home.read_key(home.final_hop_path))
    geometry = SphinxGeometry.create(max_hops=DEFAULT_MAX_HOPS, packet_size=DEFAULT_PACKET_SIZE)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    sink_port = int(listeners[0].socket.getsockname()[1])
    now = int(time.time())
    relays = await _start_cascade(work, now, geometry, DirectoryEntry(node_id_of(sink_public), "127.0.0.1", sink_port), children)
    rng = np.random.default_rng(seed)
    # Calibrate: the per-peer setup cost now, on this machine's load, decides when the send window opens.
    calibration, calibration_clock = _make_round(home, relays, sink_port, now, send_window, delivery_window)
    planned_setup = 1.5 * await _seconds_per_peer(calibration, calibration_clock, rng) * peers + 30
    t_s = int(time.time() + planned_setup)
    state, clock = _make_round(home, relays, sink_port, t_s - _REGISTER - _ISSUE, send_window, delivery_window)
    started = time.perf_counter()
    sealed = await trio.to_thread.run_sync(_setup_peers, state, clock, peers, rng)
    setup_seconds = time.perf_counter() - started
    path = list(state.manifest.relays)
    packets = [state.manifest.packet(path, SurveyId.data(state.round_id, peer.partition, 0), message) for peer, message, _ in sealed]
    data = state.manifest.schedule.data
    if time.time() > data.t_s:
        raise click.ClickException(f"setting up {peers} peers took {setup_seconds:.0f} s, past the planned {planned_setup:.0f} s: "
                                   "the machine is busier than at calibration; run again")
    state.clock = time.time  # from here on the aggregator judges arrivals on the wall clock, like the relays
    send_at = peer_generator(seed).uniform(data.t_s, data.send_end, peers)
    order = np.argsort(send_at)
    sent = np.zeros(peers)
    workers = IssuerWorkers(state.secrets.issuer_key, processes)
    sink = PacketSink(state, workers)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, sink.handle, listeners)
            nursery.start_soon(sink.verify_forever)
            client = LinkClient("127.0.0.1", int(path[0].port), packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash())
            position = 0
            while position < peers:
                # Everything due now goes in one batch; the next batch waits for its first packet's time.
                await trio.sleep(max(0.0, float(send_at[order[position]]) - time.time()))
                now_wall = time.time()
                due = []
                while position < peers and send_at[order[position]] <= now_wall:
                    due.append(int(order[position]))
                    position += 1
                statuses = await client.send_batch([packets[i] for i in due], give_up_at=trio.current_time() + 30)
                sent[due] = now_wall
                if statuses != [AckStatus.ACCEPTED] * len(due):
                    raise click.ClickException(f"the first relay refused packets: {statuses[:5]!r}")
                for i in due:
                    # The leakiest peer: a signed request at the moment it sends (see the module docstring).
                    state.requests.record(now_wall, f"peer-{i}", sealed[i][0].identity)
            await client.aclose()
            # Wait for the delivery window, then for the sink to have judged everything that arrived.
            await trio.sleep(max(0.0, data.t_c - time.time()) + 2)
            with trio.move_on_after(max(60.0, peers / 50)):
                while state.store.inbox_size() > 0 or state.store.counts()["accepted"] < peers:
                    await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    finally:
        workers.close()
    arrivals = state.store.arrivals()
    who = {receipt: index for index, (_, _, receipt) in enumerate(sealed)}
    delivered = [who[receipt] for _, receipt, _ in arrivals]
    arrived = np.array([a for _, _, a in arrivals])
    partitions = state.store.partitions()

    def aggregator_guess(times: list[tuple[SurveyId, bytes, float]]) -> dict[str, Any]:
        links, _ = timing_guesses(FullView(times, partitions, lambda survey: float(data.send_end), state.requests, state.round_id))
        truth = [sealed[who[bytes.fromhex(link["receipt"])]][0].identity.hex() for link in links]
        return score_links([link["guess"] for link in links], truth, [link["candidates"] for link in links]).to_dict()

    no_mixing = [(survey, receipt, float(sent[who[receipt]]) + delivery_window) for survey, receipt, _ in arrivals]
    figures = timing_figures(sent[delivered], arrived, np.random.default_rng(seed))
    result = {
        "peers": peers,
        "delivered_and_accepted": len(arrivals),
        "rejected": state.store.rejections(),
        "partitions": state.manifest.k_p,
        "send_window_s": send_window,
        "delivery_window_s": delivery_window,
        "relays": RELAYS,
        "aggregator_guess": aggregator_guess(arrivals),
        **figures,
        "baseline_no_mixing": {
            "aggregator_guess": aggregator_guess(no_mixing),
            **timing_figures(sent[delivered], sent[delivered] + delivery_window, np.random.default_rng(seed)),
        },
        "setup_seconds_per_peer": setup_seconds / peers,
        "wall_seconds": time.monotonic() - began,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    state.store.close()
    return result


def run_bench(peers: int, send_window: int, delivery_window: int, processes: int = 1, seed: int = 0) -> dict[str, Any]:
    children: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="anonml-bench-anonymity-") as work:
        try:
            return trio.run(_run, peers, send_window, delivery_window, processes, seed, Path(work), children)
        finally:
            for child in children:
                if child.stdin is not None:
                    child.stdin.close()
                child.wait(timeout=30)
