"""``anonml bench relay``: packets per second through a 3-relay cascade.

Setup (DESIGN.md §11 "relay cost"). Three relays run as separate processes
(``python -m anonml.bench.relay node``), each the real ``serve_relay`` with its
SQLite store in a temporary directory and a static next-hop directory file
naming only the next relay (the last: the sink), on loopback; this process sends
pre-built packets to the first relay over one link connection and runs the
final hop (a sink that removes the last Sphinx layer, :mod:`relay._sink`).
Separate processes let the relays use both cores, as separate machines would.

Zero-length windows. Every hop's window is ``[T, T]`` and each relay's clock
is pinned at ``T`` (:class:`relay.PinnedClock`): every window is open for the
whole run, so nothing waits and nothing is late; what is measured is pure
processing: the link (hello, frames, acks), Sphinx processing, the SQLite
WAL commit before each ack, the scheduler and forwarding.

Beside the end-to-end rate it prints, from the same run: one X25519
multiplication (the baseline, DESIGN.md §11), the isolated one-hop
``process_packet`` cost (the ``anonml bench crypto`` figure), the floor (the
Sphinx unwrapping alone: three hops and the final layer, isolated, so the rate
two idle cores would reach if relays did nothing else) with the cascade's CPU
per packet as a multiple of it, and each relay's own split of its time between
Sphinx processing, SQLite, and the rest (link I/O, scheduling, Python
overhead), read from its metrics endpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from anonml.crypto import (
    DEFAULT_PACKET_SIZE,
    ForwardPacket,
    NodeAddress,
    PathHop,
    ReleaseWindow,
    SphinxGeometry,
    build_packet,
    generate_keypair,
    node_id_of,
    process_packet,
)
from anonml.bench._processes import child_processes
from anonml.base.process import freeze_startup_heap
from anonml.transport import AckStatus, LinkClient
from anonml.relay import (
    INTAKE_SLICE,
    STORE_FILE,
    DirectoryEntry,
    PinnedClock,
    RelayStarted,
    RelayStore,
    WallClock,
    load_config,
    load_identity,
    parse_metrics,
    serve_relay,
)
from anonml.testing import FinalHopSink, loopback_relay, relay_keyring

TARGET_PACKETS_PER_SECOND = 5000.0  # issue 26 (issue 5 asked for 2,000)
RELAYS = 3
SEND_BATCH = 128
_SEND_PIPELINE = 4
_METRICS = ("packets_received", "packets_forwarded", "intake_cpu_seconds", "store_seconds", "process_cpu_seconds")


# -- one relay process ---------------------------------------------------


async def _run_node(data_dir: Path, pinned: int, wall: bool = False) -> None:
    config = load_config(data_dir)
    # Pinned: every zero-length window is open (throughput); wall: real windows (``anonml bench anonymity``).
    clock = WallClock.anchored() if wall else PinnedClock(pinned)
    async with trio.open_nursery() as nursery:
        started: RelayStarted = await nursery.start(
            lambda task_status: serve_relay(config, clock=clock, task_status=task_status)
        )
        assert started.metrics is not None
        print(json.dumps({"link": started.link[1], "metrics": started.metrics[1]}), flush=True)
        # Exit when the parent closes our stdin (or dies): no orphan relays.
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        while await stdin.receive_some(1024):
            pass
        nursery.cancel_scope.cancel()


# -- the parent ------------------------------------------------------------



def _prepare_relay(data_dir: Path, pinned: int, synchronous: str, geometry: SphinxGeometry,
                   next_hop: DirectoryEntry) -> tuple[bytes, bytes]:
    """Initialise a relay data dir whose directory holds only ``next_hop``;
    returns (node_id, epoch public key at ``pinned``)."""
    config = loopback_relay(data_dir, geometry, next_hops=[next_hop], metrics=("127.0.0.1", 0),
                            synchronous=synchronous, log_level="WARNING")
    keyring = relay_keyring(config)
    keyring.rotate(pinned)
    node_id, _ = load_identity(data_dir)
    return node_id, keyring.published(pinned)[0].public_key


async def _scrape(port: int) -> dict[str, float]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    response = b""
    while chunk := await stream.receive_some(65536):
        response += chunk
    await stream.aclose()
    return parse_metrics(response.partition(b"\r\n\r\n")[2].decode())


def _start_relay(work: Path, index: int, pinned: int, synchronous: str, geometry: SphinxGeometry,
                 next_hop: DirectoryEntry, processes: list[subprocess.Popen[str]], *, wall: bool = False) -> tuple[bytes, bytes, int, int]:
    """Start relay ``index`` as a process; returns (node_id, public key, link port, metrics port).

    ``wall``: the relay runs on the wall clock (keys for the epoch of ``pinned``, which is then now)."""
    data_dir = work / f"relay-{index}"
    node_id, public = _prepare_relay(data_dir, pinned, synchronous, geometry, next_hop)
    process = subprocess.Popen(
        [sys.executable, "-m", "anonml.bench.relay", "node", str(data_dir), str(pinned), *(["wall"] if wall else [])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    processes.append(process)
    assert process.stdout is not None
    ready = json.loads(process.stdout.readline())
    return node_id, public, int(ready["link"]), int(ready["metrics"])


async def _drive(
    geometry: SphinxGeometry, work: Path, synchronous: str, processes: list[subprocess.Popen[str]], pinned: int,
    packets_count: int,
) -> dict[str, Any]:
    sink_private, sink_public = generate_keypair()
    sink = FinalHopSink(geometry, sink_private)
    async with trio.open_nursery() as nursery:
        sink_address = await nursery.start(sink.serve)
        # Last relay first: each one's directory names the next hop's port.
        hops: list[tuple[bytes, bytes, int]] = []
        metrics_ports: list[int] = []
        next_hop = DirectoryEntry(node_id_of(sink_public), *sink_address)
        for index in reversed(range(RELAYS)):
            node_id, public, link_port, metrics_port = await trio.to_thread.run_sync(
                _start_relay, work, index, pinned, synchronous, geometry, next_hop, processes)
            hops.insert(0, (node_id, public, link_port))
            metrics_ports.insert(0, metrics_port)
            next_hop = DirectoryEntry(node_id, "127.0.0.1", link_port)
        window = ReleaseWindow(pinned, pinned)
        path = [PathHop(node_id, NodeAddress("127.0.0.1", port), public, window) for node_id, public, port in hops]
        path.append(PathHop(node_id_of(sink_public), NodeAddress(*sink_address), sink_public, window))
        build_started = time.perf_counter()
        packets = [build_packet(geometry, path, i.to_bytes(4, "big")) for i in range(packets_count)]
        build_us = (time.perf_counter() - build_started) / packets_count * 1e6
        client = LinkClient("127.0.0.1", hops[0][2], packet_size=geometry.packet_size,
                            geometry_hash=geometry.canonical_hash())
        before = [await _scrape(port) for port in metrics_ports]
        started, cpu_started = time.perf_counter(), time.process_time()
        offsets = iter(range(0, packets_count, SEND_BATCH))

        async def send_batches() -> None:
            for offset in offsets:  # shared iterator: each batch is sent once
                batch = packets[offset : offset + SEND_BATCH]
                statuses = await client.send_batch(batch, give_up_at=trio.current_time() + 30)
                if statuses != [AckStatus.ACCEPTED] * len(batch):
                    raise RuntimeError(f"first relay did not accept the batch at {offset}: {statuses[:5]!r}...")

        async with trio.open_nursery() as senders:  # pipelined on the one link connection
            for _ in range(_SEND_PIPELINE):
                senders.start_soon(send_batches)
        with trio.fail_after(120):
            await sink.wait_for(packets_count)
        elapsed, driver_cpu = time.perf_counter() - started, time.process_time() - cpu_started
        await client.aclose()
        after = [await _scrape(port) for port in metrics_ports]
        relays = [{k: a[k] - b.get(k, 0.0) for k in _METRICS} for a, b in zip(after, before)]
        nursery.cancel_scope.cancel()
    return {
        "elapsed_s": elapsed,
        "driver_cpu_s": driver_cpu,
        "delivered": len(sink.arrivals),
        "build_us": build_us,
        "sink_process_us": sink.process_seconds / max(1, len(sink.arrivals)) * 1e6,
        "relays": relays,
    }


def _crypto_figures(geometry: SphinxGeometry, repeat: int) -> dict[str, float]:
    """The ``anonml bench crypto`` figures for this geometry, measured now."""
    from anonml.bench.crypto import measure_sphinx

    return {str(k): float(v) for k, v in measure_sphinx(repeat, geometry).items()}


def measure_intake_split(geometry: SphinxGeometry, packets: int = 512, batch: int = 64,
                         synchronous: str = "FULL") -> dict[str, float]:
    """CPU µs per packet of each step of a relay's intake, measured apart.

    The same steps as ``Relay._intake`` in one process with no network and
    no other relay competing: Sphinx ``process_packet`` (without its replay
    tag lookup), the replay tag (lookup, then insert with the batch), the
    held-packet insert, and the batch commit (a WAL commit per ``batch`` packets, as link group commit does).
    Process CPU time (``time.process_time``) so other processes' load on the
    shared machine does not count; each reading costs about 0.65 µs (measured).
    """
    private, public = generate_keypair()
    final_private, final_public = generate_keypair()
    window = ReleaseWindow(0, 2**40)
    path = [PathHop(node_id_of(public), NodeAddress("127.0.0.1", 1), public, window),
            PathHop(node_id_of(final_public), NodeAddress("127.0.0.1", 2), final_public, window)]
    frames = [build_packet(geometry, path, b"intake") for _ in range(packets)]
    seconds = dict.fromkeys(("sphinx_us", "replay_tag_us", "held_insert_us", "commit_us"), 0.0)
    clock = time.process_time
    with tempfile.TemporaryDirectory(prefix="anonml-bench-intake-") as work:
        store = RelayStore(Path(work) / STORE_FILE, synchronous=synchronous)

        lookups = [0.0]  # inside process_packet: subtracted from its time below

        def is_replay(tag: bytes) -> bool:
            started = clock()
            seen = store.tag_seen(tag)
            lookups[0] += clock() - started
            return seen

        held: list[tuple[float, float, str, int, bytes]] = []
        tags: list[tuple[bytes, float]] = []
        try:
            for offset in range(0, packets, batch):
                for first in range(offset, offset + batch, INTAKE_SLICE):
                    # A slice's lookups share one read transaction, as in Relay.receive.
                    with store.reading():
                        for frame in frames[first : min(first + INTAKE_SLICE, offset + batch)]:
                            started = clock()
                            result = process_packet(geometry, private, frame, is_replay=is_replay)
                            seconds["sphinx_us"] += clock() - started
                            assert isinstance(result, ForwardPacket)
                            held.append((0.0, 1.0, "127.0.0.1", 2, result.packet))
                            tags.append((result.replay_tag, 1.0))
                with store.transaction():
                    started = clock()
                    store.insert_held(held)
                    seconds["held_insert_us"] += clock() - started
                    started = clock()
                    store.record_tags(tags)
                    seconds["replay_tag_us"] += clock() - started
                    held.clear()
                    tags.clear()
                    committing = clock()
                seconds["commit_us"] += clock() - committing
        finally:
            store.close()
    seconds["sphinx_us"] -= lookups[0]  # the tag lookup ran inside process_packet
    seconds["replay_tag_us"] += lookups[0]
    return {name: value / packets * 1e6 for name, value in seconds.items()}


def _rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def run_benchmark(packets_count: int, synchronous: str, repeat: int) -> dict[str, Any]:
    """Run the cascade benchmark and its same-run baselines; returns the figures."""
    geometry = SphinxGeometry.create(max_hops=RELAYS + 1, packet_size=DEFAULT_PACKET_SIZE)
    crypto = _crypto_figures(geometry, repeat)
    intake_split = measure_intake_split(geometry, synchronous=synchronous)
    pinned = int(time.time())
    with tempfile.TemporaryDirectory(prefix="anonml-bench-relay-") as work, child_processes(grace=10) as processes:
        run = trio.run(_drive, geometry, Path(work), synchronous, processes, pinned, packets_count)
    x25519_us = crypto.get("x25519_mult_us")
    hop_us = crypto.get("sphinx_process_hop_us")
    rate = run["delivered"] / run["elapsed_s"]
    per_relay = []
    for index, figures in enumerate(run["relays"]):
        received = max(1.0, figures["packets_received"])
        cpu_us = figures["process_cpu_seconds"] / received * 1e6
        intake_us = figures["intake_cpu_seconds"] / received * 1e6
        busy = {"cpu_us": cpu_us, "intake_cpu_us": intake_us, "forward_link_cpu_us": cpu_us - intake_us,
                "sqlite_wall_us": figures["store_seconds"] / received * 1e6}
        per_relay.append({
            "relay": index,
            "received": int(figures["packets_received"]),
            "forwarded": int(figures["packets_forwarded"]),
            **{k: round(v, 1) for k, v in busy.items()},
        })
    wall_per_packet_us = run["elapsed_s"] / max(1, run["delivered"]) * 1e6
    final_us = crypto.get("sphinx_process_final_us")
    # The floor: only the Sphinx unwrapping every packet needs (each relay's hop, then the final layer).
    floor_us = RELAYS * hop_us + final_us if hop_us and final_us else None
    # CPU of every process of the cascade per delivered packet: what the
    # machine would sustain with all its cores free for this (the machine is
    # shared, so the wall-clock rate above also pays for others' load).
    cpu_per_packet_us = (sum(r["cpu_us"] for r in per_relay)
                         + run["driver_cpu_s"] / max(1, run["delivered"]) * 1e6)
    return {
        "setup": f"{RELAYS} relays as separate processes + final-hop sink in the driver, loopback TCP, "
                 f"zero-length windows (clocks pinned), {geometry.packet_size}-byte packets, "
                 f"SQLite WAL synchronous={synchronous}, {os.cpu_count()} CPUs",
        "packets": packets_count,
        "delivered": run["delivered"],
        "elapsed_s": round(run["elapsed_s"], 3),
        "packets_per_second": round(rate, 1),
        "target_packets_per_second": TARGET_PACKETS_PER_SECOND,
        "meets_target": rate >= TARGET_PACKETS_PER_SECOND,
        "wall_us_per_packet": round(wall_per_packet_us, 1),
        "baseline_x25519_us": _rounded(x25519_us, 2),
        "isolated_process_hop_us": _rounded(hop_us),
        "isolated_process_hop_x_x25519": _rounded(hop_us / x25519_us, 2) if hop_us and x25519_us else None,
        "isolated_process_final_us": _rounded(final_us),
        "driver_cpu_us_per_packet": round(run["driver_cpu_s"] / max(1, run["delivered"]) * 1e6, 1),
        "cpu_us_per_packet_all_processes": round(cpu_per_packet_us, 1),
        "cpu_bound_capacity_packets_per_second": round((os.cpu_count() or 1) / cpu_per_packet_us * 1e6, 1),
        "floor_sphinx_cpu_us_per_packet": _rounded(floor_us),
        "floor_packets_per_second": round((os.cpu_count() or 1) / floor_us * 1e6, 1) if floor_us else None,
        "cpu_x_floor": round(cpu_per_packet_us / floor_us, 2) if floor_us else None,
        "sink_process_us": round(run["sink_process_us"], 1),
        "intake_split_cpu_us": {name: round(value, 1) for name, value in intake_split.items()},
        "build_packet_us": round(run["build_us"], 1),
        "per_relay": per_relay,
    }


def _node_main(argv: list[str]) -> None:
    """``python -m anonml.bench.relay node DATA_DIR PINNED``: one benchmark relay."""
    if len(argv) not in (3, 4) or argv[0] != "node" or argv[3:] not in ([], ["wall"]):
        raise SystemExit("usage: python -m anonml.bench.relay node DATA_DIR PINNED_UNIX_SECONDS [wall]")
    freeze_startup_heap()  # as `anonml relay run` does
    trio.run(_run_node, Path(argv[1]), int(argv[2]), argv[3:] == ["wall"])


if __name__ == "__main__":
    _node_main(sys.argv[1:])
