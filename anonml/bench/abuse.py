"""``anonml bench abuse``: honest traffic's delivery and latency under each abuse of a relay, the sink or the API.

One relay and one aggregator run live, each in its own process (the real
``serve_relay`` and ``serve_aggregator``, real SQLite, loopback TCP), the
relay's directory and known round fetched from the aggregator's signed
manifest; this process makes the round and its peers' credentials, then
sends honest traffic through three probes at a steady rate:

- ``peer``: a peer sends packets to the relay (latency: until the relay's
  durable ack); the relay forwards them to the aggregator;
- ``relay``: a last-hop relay (authenticated with the relay's key, which the
  manifest lists) delivers final-hop packets to the aggregator's sink
  (latency: until the sink's durable ack, the final Sphinx layer checked);
- ``http``: ``GET /v1/manifest`` on the API (latency: the whole response).

Each abuse runs in a fourth process (``python -m anonml.bench.abuse attack
SPEC``), from other loopback addresses (127.0.0.2 and up, so per-source
limits apply as they would to a remote attacker), bounded in count and time;
it builds whatever it sends before it starts, so its own CPU competes with
the services only as a remote attacker's network load would. For each it prints every probe's delivery (packets the
aggregator accepted after the round's verification, or HTTP 200s) and p99
latency beside the unloaded p99 measured in the same run (right
before it, so that both see the same machine load), and the target: 100%
delivered and p99 within 3x the unloaded p99. The relay's clock
is pinned (``relay.PinnedClock``) inside the round's data phase with
zero-length hop windows, so latency is processing, not a release draw.

Abuses: ``relay-hold-fill`` (packets for windows ten days ahead: a full hold
queue used to refuse honest packets BUSY), ``relay-late-tags`` (late
packets: their replay tags used to fill the cache), ``relay-idle-links``
(300 connections that send the hello and stay silent), ``sink-stranger``
(a stranger floods the sink: refused in the handshake), ``sink-garbage`` (a
compromised relay floods the sink with random frames: refused before
anything is stored), ``http-slow-bodies`` (300 clients sending a request body
a byte at a time), ``http-polling`` (8 clients polling the public
snapshots, roster, receipt log, heads and status, as fast as they are
answered: they used to be rebuilt per request on the event loop).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import trio

from anonml.aggregator import (
    AggregatorConfig,
    AggregatorHome,
    RoundState,
    create_round,
    open_round,
    parse_round_spec,
    serve_aggregator,
)
from anonml.crypto import (
    NodeAddress,
    PathHop,
    ReleaseWindow,
    SphinxGeometry,
    build_packet,
    generate_keypair,
)
from anonml.protocol import PATH_HEADS, PATH_RECEIPTS, PATH_ROSTER, PATH_STATUS, SurveyId
from anonml.transport import AckStatus, LinkClient, LinkIdentity, encode_hello
from anonml.relay import (
    PinnedAggregator,
    load_identity,
    load_identity_key,
    parse_metrics,
)
from anonml.bench._processes import child_processes
from anonml.base.process import freeze_startup_heap
from anonml.testing import SettableClock, enrol, loopback_relay, relay_keyring

TARGET_P99_RATIO = 3.0  # issue 13
# Seconds between a probe's requests: 200 per scenario. With 100, a p99 was the second-largest
# latency, and two of the rare 40-70 ms stalls of a durable commit (as common unloaded as under
# abuse) decided a ratio alone; with 200 it takes three.
_PROBE_INTERVAL = 0.04
_SCENARIO_SECONDS = 8.0
_ATTACK_LEAD = 1.0  # the abuse starts this long before the probes
_PEERS = 720  # 8 surveys each, half per probe: 2880 packets per probe, 200 per scenario (14 scenarios)
_SUBSETS = 8  # k_h: each peer answers this many data surveys, so it has this many packets
_HOST = "127.0.0.1"
_ROUTE_TIMEOUT = 120.0  # seconds for the relay to fetch its directory and the first packet to be accepted


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind((_HOST, 0))
        return int(probe.getsockname()[1])


def _round_document(relay_node: bytes, relay_port: int, relay_public: bytes, epoch: int, http_port: int,
                    sink_port: int, geometry: SphinxGeometry) -> dict[str, Any]:
    return {
        "name": "bench-abuse",
        "task": {
            "features": [{"name": f"f{i}", "type": "categorical", "categories": ["a", "b"]} for i in range(_SUBSETS)],
            "label": {"name": "y", "positive": ["1"], "negative": ["0"]},
        },
        "learning": {"k_p": 2, "k_h": _SUBSETS, "k_s": 1, "plan": "split", "learner": "logreg"},
        "privacy": {"eps_total": 8.0, "oracle": "grr"},
        "schedule": {"register": 100, "issue": 100, "median_send": 1, "median_delivery": 3, "data_send": 50,
                     "data_delivery": 7200},
        "network": {
            "relays": [{"node_id": relay_node.hex(), "host": _HOST, "port": relay_port,
                        "public_key": relay_public.hex(), "key_epoch": epoch}],
            "path_length": 1, "http_host": _HOST, "http_port": http_port, "sink_host": _HOST,
            "sink_port": sink_port, "max_hops": geometry.max_hops, "packet_size": geometry.packet_size,
        },
        "participation": {"min_participation": 2, "registration": "open", "purpose": "test", "max_per_client": _PEERS,
                          "min_anonymity_set": 1},
    }


@dataclass
class _System:
    """The live services (as processes) and what the probes and attackers need."""

    processes: list[subprocess.Popen[str]]
    geometry: SphinxGeometry
    manifest: Any  # protocol.RoundManifest
    relay_link: tuple[str, int]
    relay_node: bytes
    relay_public: bytes
    relay_identity: LinkIdentity
    relay_metrics: int
    http_url: str
    sink: tuple[str, int]
    instant: int  # the relay's pinned clock: every hop window is [instant, instant]
    via_relay: list[bytes]  # honest packets for the peer probe (relay, then the aggregator)
    direct: list[bytes]  # honest final-hop packets for the relay probe


def _honest_packets(state: RoundState, clock: SettableClock, via: list[PathHop]) -> tuple[list[bytes], list[bytes]]:
    """Registered and credentialed peers' packets; two per (peer, survey) would be a double
    submission, so half the surveys go through the relay and half straight to the sink."""
    peers = enrol(state, clock, [(i + 1).to_bytes(2, "big") * 16 for i in range(_PEERS)])
    rng = np.random.default_rng(13)
    via_relay, direct = [], []
    for subset in range(_SUBSETS):
        for peer in peers:
            oracle = state.data_oracle(peer.partition, subset)
            report = oracle.encode_report(oracle.privatize(np.array([int(rng.integers(2))]), rng)[0])
            survey = SurveyId.data(state.round_id, peer.partition, subset)
            if subset % 2 == 0:
                via_relay.append(peer.packet(survey, report, via=via))
            else:
                direct.append(peer.packet(survey, report))
    return via_relay, direct


def _child(processes: list[subprocess.Popen[str]], *args: str) -> dict[str, Any]:
    """Start ``python -m MODULE ARGS``; its first stdout line (JSON) once it serves. It exits when its stdin closes."""
    process = subprocess.Popen([sys.executable, "-m", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    processes.append(process)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"{args[0]} exited before serving ({process.wait()})")
    ready: dict[str, Any] = json.loads(line)
    return ready


def _start_system(work: Path, processes: list[subprocess.Popen[str]]) -> _System:
    home = AggregatorHome(work / "aggregator")
    home.initialise(os.urandom(32), generate_keypair()[0])
    identity = bytes(home.signing_key().verify_key)
    http_port, sink_port = _free_port(), _free_port()
    instant = int(time.time())
    relay_dir = work / "relay"
    geometry = SphinxGeometry.create(max_hops=2, packet_size=2048)
    config = loopback_relay(relay_dir, geometry, metrics=(_HOST, 0), log_level="WARNING",
                            directory_aggregators=(PinnedAggregator(f"http://{_HOST}:{http_port}", identity),),
                            directory_min_refresh_seconds=0.5)
    keyring = relay_keyring(config)
    keyring.rotate(instant)
    # The relay process (the relay benchmark's node, its clock pinned at the instant) fetches the manifest
    # until the aggregator serves it.
    relay = _child(processes, "anonml.bench.relay", "node", str(relay_dir), str(instant))
    relay_link = (_HOST, int(relay["link"]))
    relay_node, _ = load_identity(relay_dir)
    relay_key = keyring.published(instant)[0]
    # The data phase runs from before the relay's pinned instant to two hours after it, in wall time.
    start = instant - 300
    document = _round_document(relay_node, relay_link[1], relay_key.public_key, relay_key.epoch, http_port,
                               sink_port, geometry)
    state, _ = create_round(home, parse_round_spec(document), now=start)
    clock = SettableClock(start + 1)
    state.clock = clock
    data = state.manifest.schedule.data
    assert data.send_end <= instant < data.t_r
    window = ReleaseWindow(instant, instant)
    via = [PathHop(relay_node, NodeAddress(*relay_link), relay_key.public_key, window)]
    via_relay, direct = _honest_packets(state, clock, via)
    manifest = state.manifest
    state.store.close()
    aggregator = _child(processes, "anonml.bench.abuse", "aggregator", str(home.root), state.round_id.hex())
    return _System(processes=processes, geometry=geometry, manifest=manifest, relay_link=relay_link, relay_node=relay_node,
                   relay_public=relay_key.public_key, relay_identity=LinkIdentity(load_identity_key(relay_dir)),
                   relay_metrics=int(relay["metrics"]), http_url=str(aggregator["http"]), sink=(_HOST, sink_port),
                   instant=instant, via_relay=via_relay, direct=direct)


async def _serve_aggregator(root: str, round_id: str) -> None:
    """``python -m anonml.bench.abuse aggregator ROOT ROUND``: the round's service on wall time."""
    state = open_round(AggregatorHome(Path(root)), round_id)
    freeze_startup_heap()  # as `anonml aggregator run` does
    manifest = state.manifest
    host, port = manifest.aggregator_url.removeprefix("http://").rsplit(":", 1)
    config = AggregatorConfig(state, http_host=host, http_port=int(port), sink_host=manifest.aggregator_hop.host,
                              sink_port=manifest.aggregator_hop.port)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(serve_aggregator, config)
        print(json.dumps({"http": addresses.http_url}), flush=True)
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        while await stdin.receive_some(1024):
            pass
        nursery.cancel_scope.cancel()


# -- the probes ---------------------------------------------------------------


@dataclass
class _Probe:
    latencies: list[float]
    sent: int = 0
    ok: int = 0


async def _packet_probe(client: LinkClient, packets: Sequence[bytes], probe: _Probe, until: float) -> None:
    for packet in packets:
        if trio.current_time() >= until:
            return
        started = trio.current_time()
        [status] = await client.send_batch([packet], give_up_at=started + 30)
        probe.sent += 1
        if status is AckStatus.ACCEPTED:
            probe.ok += 1
            probe.latencies.append(trio.current_time() - started)
        await trio.sleep_until(started + _PROBE_INTERVAL)


async def _http_probe(url: str, probe: _Probe, until: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while trio.current_time() < until:
            started = trio.current_time()
            try:
                response = await client.get("/v1/manifest")
                ok = response.status_code == 200
            except httpx.HTTPError:
                ok = False
            probe.sent += 1
            if ok:
                probe.ok += 1
                probe.latencies.append(trio.current_time() - started)
            await trio.sleep_until(started + _PROBE_INTERVAL)


def _p99(latencies: Sequence[float]) -> float | None:
    return float(np.percentile(latencies, 99)) * 1000 if latencies else None


async def _status(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        status: dict[str, Any] = (await client.get("/v1/status")).json()["body"]  # a signed document
    return status


def _peer_client(system: _System) -> LinkClient:
    """A peer's link to the relay (no identity: a peer is not a neighbour)."""
    return LinkClient(*system.relay_link, packet_size=system.geometry.packet_size,
                      geometry_hash=system.geometry.canonical_hash())


async def _wait_for_relay_route(system: _System, offsets: dict[str, int]) -> None:
    """Resend one honest packet through the relay until the aggregator has accepted it.

    Until the relay has fetched the aggregator's manifest, the aggregator is no next hop of its
    directory and it answers BUSY (``unknown-next-hop``); a baseline started before then lost its
    first packets (4 of 198 in one run), and a late arrival of this one would count in a scenario.
    """
    packet = system.via_relay[offsets["peer"]]
    offsets["peer"] += 1
    client = _peer_client(system)
    with trio.fail_after(_ROUTE_TIMEOUT):
        try:
            while (await client.send_batch([packet], give_up_at=trio.current_time() + 5))[0] is not AckStatus.ACCEPTED:
                await trio.sleep(0.25)
        finally:
            await client.aclose()
        while int((await _status(system.http_url))["counts"]["accepted"]) < 1:
            await trio.sleep(0.25)


async def _scenario(system: _System, abuse: str | None, work: Path, offsets: dict[str, int]) -> dict[str, Any]:
    """Run the probes for _SCENARIO_SECONDS (beside the abuse, if any); then wait for verification."""
    attacker = await trio.to_thread.run_sync(_start_attacker, system, abuse, work) if abuse is not None else None
    if attacker is not None:
        await trio.sleep(_ATTACK_LEAD)
    accepted_before = int((await _status(system.http_url))["counts"]["accepted"])
    count = int(_SCENARIO_SECONDS / _PROBE_INTERVAL)
    peer_packets = system.via_relay[offsets["peer"] : offsets["peer"] + count]
    direct_packets = system.direct[offsets["relay"] : offsets["relay"] + count]
    geometry = system.geometry
    peer_client = _peer_client(system)
    relay_client = LinkClient(*system.sink, packet_size=geometry.packet_size,
                              geometry_hash=geometry.canonical_hash(), identity=system.relay_identity,
                              expect_node_id=system.manifest.aggregator_hop.node_id)
    probes = {"peer": _Probe([]), "relay": _Probe([]), "http": _Probe([])}
    services = [psutil.Process(process.pid) for process in system.processes]
    for service in services:
        service.cpu_percent()
    until = trio.current_time() + _SCENARIO_SECONDS
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_packet_probe, peer_client, peer_packets, probes["peer"], until)
        nursery.start_soon(_packet_probe, relay_client, direct_packets, probes["relay"], until)
        nursery.start_soon(_http_probe, system.http_url, probes["http"], until)
    service_cpu = [round(service.cpu_percent(), 1) for service in services]
    await peer_client.aclose()
    await relay_client.aclose()
    offsets["peer"] += probes["peer"].sent
    offsets["relay"] += probes["relay"].sent
    attack_summary = await trio.to_thread.run_sync(_stop_attacker, attacker) if attacker is not None else None
    # Every honest packet the relay and the sink acknowledged must end up accepted.
    expected = probes["peer"].ok + probes["relay"].ok
    accepted = 0
    with trio.move_on_after(120):
        while (accepted := int((await _status(system.http_url))["counts"]["accepted"]) - accepted_before) < expected:
            await trio.sleep(0.5)
    packets_sent = probes["peer"].sent + probes["relay"].sent
    return {
        "abuse": abuse or "none",
        "attack": attack_summary,
        "packets_sent": packets_sent,
        "packets_accepted": accepted,
        "delivered": accepted / packets_sent if packets_sent else None,
        "http_ok": probes["http"].ok / probes["http"].sent if probes["http"].sent else None,
        "p99_ms": {name: _p99(probe.latencies) for name, probe in probes.items()},
        "cpu_percent_relay_aggregator": service_cpu,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


# -- the attacker process -------------------------------------------------------


def _start_attacker(system: _System, abuse: str, work: Path) -> subprocess.Popen[str]:
    """Start the abuse's process; return once it has built what it sends and is about to start."""
    geometry = system.geometry
    hop = system.manifest.aggregator_hop
    spec = {
        "abuse": abuse, "seconds": _SCENARIO_SECONDS + _ATTACK_LEAD,
        "relay": list(system.relay_link), "relay_node": system.relay_node.hex(),
        "relay_key": system.relay_public.hex(), "instant": system.instant,
        "sink": list(system.sink), "sink_node": hop.node_id.hex(),
        "sink_key": hop.public_key.hex(), "http": system.http_url,
        "max_hops": geometry.max_hops, "packet_size": geometry.packet_size,
        # A compromised relay's key (the sink-garbage abuse authenticates with it).
        "relay_identity": system.relay_identity.private_key.hex(),
    }
    path = work / f"attack-{abuse}.json"
    path.write_text(json.dumps(spec))
    process = subprocess.Popen([sys.executable, "-m", "anonml.bench.abuse", "attack", str(path)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    process.stdout.readline()  # "ready"
    return process


def _stop_attacker(process: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    try:
        summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        summary = {"error": f"attacker exited {process.returncode}"}
    return summary


async def _attack(spec: dict[str, Any]) -> dict[str, Any]:
    abuse = spec["abuse"]
    geometry = SphinxGeometry.create(max_hops=spec["max_hops"], packet_size=spec["packet_size"])
    relay = (spec["relay"][0], int(spec["relay"][1]))
    sink = (spec["sink"][0], int(spec["sink"][1]))
    counts = {"connections": 0, "frames": 0, "refused": 0}

    def relay_packets(window: ReleaseWindow, count: int) -> list[bytes]:
        relay_hop = PathHop(bytes.fromhex(spec["relay_node"]), NodeAddress(*relay), bytes.fromhex(spec["relay_key"]),
                            window)
        final = PathHop(bytes.fromhex(spec["sink_node"]), NodeAddress(*sink), bytes.fromhex(spec["sink_key"]), window)
        return [build_packet(geometry, [relay_hop, final], os.urandom(16)) for _ in range(count)]

    async def send_frames(target: tuple[str, int], frames: list[bytes], source: str, identity: LinkIdentity | None
                          ) -> None:
        client = LinkClient(*target, packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash(),
                            identity=identity, local_address=source, connect_timeout=2, ack_timeout=5)
        for offset in range(0, len(frames), 64):
            if trio.current_time() >= until:
                break
            statuses = await client.send_batch(frames[offset : offset + 64], give_up_at=trio.current_time())
            counts["frames"] += len(statuses)
            counts["refused"] += sum(s is not AckStatus.ACCEPTED for s in statuses)
        await client.aclose()

    # Build what is sent first (a remote attacker's CPU is not ours), then say so and start.
    instant = int(spec["instant"])
    prepared: list[bytes] = []
    if abuse == "relay-hold-fill":
        prepared = relay_packets(ReleaseWindow(instant + 10 * 86400, instant + 10 * 86400 + 60), 2000)
    elif abuse == "relay-late-tags":
        prepared = relay_packets(ReleaseWindow(instant - 120, instant - 60), 2000)
    elif abuse in ("sink-stranger", "sink-garbage"):
        prepared = [os.urandom(geometry.packet_size) for _ in range(640)]
    print(json.dumps({"ready": True}), flush=True)
    until = trio.current_time() + float(spec["seconds"])

    if abuse in ("relay-hold-fill", "relay-late-tags"):
        await send_frames(relay, prepared, "127.0.0.2", None)
    elif abuse == "relay-idle-links":
        hello = encode_hello(geometry.packet_size, geometry.canonical_hash())
        streams = []
        for index in range(300):
            try:
                stream = await trio.open_tcp_stream(*relay, local_address=f"127.0.0.{2 + index % 3}")
                await stream.send_all(hello)
                streams.append(stream)
                counts["connections"] += 1
            except (OSError, trio.BrokenResourceError):
                counts["refused"] += 1
        await trio.sleep_until(until)
        for stream in streams:
            await trio.aclose_forcefully(stream)
    elif abuse in ("sink-stranger", "sink-garbage"):
        identity = LinkIdentity(bytes.fromhex(spec["relay_identity"])) if abuse == "sink-garbage" else None
        while trio.current_time() < until:
            await send_frames(sink, prepared, "127.0.0.2", identity)
            counts["connections"] += 1
            if identity is None:
                await trio.sleep(0.01)  # each attempt ends at the handshake: do not spin
    elif abuse == "http-slow-bodies":
        host, port = spec["http"].removeprefix("http://").rsplit(":", 1)
        head = (b"POST /v1/register HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 4096\r\n\r\n")

        async def slow(index: int) -> None:
            try:
                stream = await trio.open_tcp_stream(host, int(port), local_address=f"127.0.0.{2 + index % 4}")
                counts["connections"] += 1
                await stream.send_all(head)
                while trio.current_time() < until:
                    await stream.send_all(b"{")
                    await trio.sleep(5)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                counts["refused"] += 1

        async with trio.open_nursery() as nursery:
            for index in range(300):
                nursery.start_soon(slow, index)
    elif abuse == "http-polling":
        paths = [PATH_ROSTER, PATH_RECEIPTS.format(kind="data", partition=0, check=0), PATH_HEADS, PATH_STATUS]

        async def poll(index: int) -> None:
            transport = httpx.AsyncHTTPTransport(local_address=f"127.0.0.{2 + index % 4}")
            async with httpx.AsyncClient(base_url=spec["http"], timeout=10, transport=transport) as client:
                while trio.current_time() < until:
                    try:
                        await client.get(paths[counts["frames"] % len(paths)])
                        counts["frames"] += 1  # requests answered
                    except httpx.HTTPError:
                        counts["refused"] += 1

        async with trio.open_nursery() as nursery:
            for index in range(8):
                nursery.start_soon(poll, index)
    else:
        raise SystemExit(f"unknown abuse {abuse!r}")
    return counts


def _attack_main(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    print(json.dumps(trio.run(_attack, spec)), flush=True)


# -- the command ----------------------------------------------------------------


async def _run(system: _System, work: Path, abuses: Sequence[str]) -> dict[str, Any]:
    offsets = {"peer": 0, "relay": 0}
    # Each abuse right after an unloaded run of its own: the machine's load drifts (other processes
    # share its cores), so each ratio compares runs seconds apart.
    await _wait_for_relay_route(system, offsets)
    unloaded = await _scenario(system, None, work, offsets)
    results: list[dict[str, Any]] = []
    for abuse in abuses:
        paired = unloaded if not results else await _scenario(system, None, work, offsets)
        result = await _scenario(system, abuse, work, offsets)
        result["unloaded_p99_ms"] = paired["p99_ms"]
        results.append(result)
    stream = await trio.open_tcp_stream(_HOST, system.relay_metrics)
    await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    response = b""
    while chunk := await stream.receive_some(65536):
        response += chunk
    await stream.aclose()
    relay_metrics = parse_metrics(response.partition(b"\r\n\r\n")[2].decode())
    status = await _status(system.http_url)
    for result in results:
        base = result["unloaded_p99_ms"]
        ratios = {name: (value / base[name] if value is not None and base[name] else None)
                  for name, value in result["p99_ms"].items()}
        result["p99_x_unloaded"] = {name: round(r, 2) if r is not None else None for name, r in ratios.items()}
        result["meets_target"] = bool(
            result["delivered"] == 1.0 and result["http_ok"] == 1.0
            and all(r is not None and r <= TARGET_P99_RATIO for r in ratios.values())
        )
    return {
        "setup": f"a relay and the aggregator in a process each, the abuses in another, the probes here; loopback; "
                 f"{os.cpu_count()} CPUs; each probe every {_PROBE_INTERVAL} s for {_SCENARIO_SECONDS} s",
        "unloaded": unloaded,
        "abuses": results,
        "relay_drops": {k.removeprefix("packets_dropped/"): v for k, v in relay_metrics.items()
                        if k.startswith("packets_dropped/")},
        "relay_connections_refused": {k.removeprefix("connections_refused/"): v for k, v in relay_metrics.items()
                                      if k.startswith("connections_refused/")},
        "relay_link_errors": {k.removeprefix("link_errors/"): v for k, v in relay_metrics.items()
                              if k.startswith("link_errors/")},
        "aggregator_counts": {k: v for k, v in status["counts"].items() if "/" in k},
        "aggregator_rejected": status["rejected"],
        "target": f"100% delivered and p99 <= {TARGET_P99_RATIO}x unloaded",
        "all_meet_target": all(result["meets_target"] for result in results),
    }


def run_benchmark(abuses: Sequence[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="anonml-bench-abuse-") as work, child_processes() as processes:
        system = _start_system(Path(work), processes)
        # The probes' own process: a collection walking its start-up heap (the round, 2,880 prepared
        # packets) stalled all three probes at once by 40-50 ms, in unloaded runs as often as under abuse.
        freeze_startup_heap()
        return trio.run(_run, system, Path(work), abuses)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "attack":
        _attack_main(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "aggregator":
        trio.run(_serve_aggregator, sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: python -m anonml.bench.abuse attack SPEC.json | aggregator ROOT ROUND_ID")
