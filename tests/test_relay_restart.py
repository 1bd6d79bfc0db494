"""A relay process killed with SIGKILL inside its release window and restarted
still delivers every packet it had acknowledged, inside the window. The relay
runs as a real subprocess (``anonml relay run``) set up with its own CLI."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pytest
import trio

from anonml.crypto import (
    NodeAddress,
    PathHop,
    ReleaseWindow,
    SphinxGeometry,
    build_packet,
    generate_keypair,
    node_id_of,
)
from anonml.base.process import anonml_command
from anonml.demo import free_port
from anonml.transport import AckStatus, LinkClient
from anonml.relay import DirectoryEntry, render_directory_file
from anonml.testing import FinalHopSink, drawn_in_time, packet_seconds, window_seconds

REPO_ROOT = Path(__file__).resolve().parent.parent
GEOMETRY = SphinxGeometry.create(max_hops=3, packet_size=2048)


def relay_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(anonml_command("relay", *args), cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True, timeout=60)


async def start_relay(data_dir: Path, port: int, log: Path) -> trio.Process:
    with log.open("a") as handle:
        process = await trio.lowlevel.open_process(
            anonml_command("relay", "run", "--data-dir", str(data_dir)), cwd=REPO_ROOT, stderr=handle
        )
    with trio.fail_after(30):
        while True:  # listening means recovered: the listener opens after recovery
            try:
                probe = await trio.open_tcp_stream("127.0.0.1", port)
                await probe.aclose()
                return process
            except OSError:
                assert process.poll() is None, log.read_text()
                await trio.sleep(0.05)


# System suite: a relay process restarted inside an 18 s wall-clock window (a start took 5-8 s at load 12).
@pytest.mark.system
async def test_a_relay_killed_mid_window_and_restarted_delivers_what_it_held(tmp_path: Path) -> None:
    n = 60
    port = free_port()
    data_dir = tmp_path / "relay"
    relay_cli("init", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}", "--max-hops", "3",
              "--directory-file", "directory.json")
    descriptor = json.loads(relay_cli("info", "--data-dir", str(data_dir), "--json").stdout)
    log = tmp_path / "relay.log"
    sink_private, sink_public = generate_keypair()
    sink = FinalHopSink(GEOMETRY, sink_private)
    process: trio.Process | None = None
    try:
        async with trio.open_nursery() as nursery:
            sink_address = await nursery.start(sink.serve)
            # The relay's only next hop is the sink (its directory file, read at start).
            (data_dir / "directory.json").write_text(
                render_directory_file([DirectoryEntry(node_id_of(sink_public), *sink_address)]))
            process = await start_relay(data_dir, port, log)
            def path_in(window: ReleaseWindow) -> list[PathHop]:
                return [
                    PathHop(bytes.fromhex(descriptor["node_id"]), NodeAddress("127.0.0.1", port),
                            bytes.fromhex(descriptor["public_key"]), window),
                    PathHop(node_id_of(sink_public), NodeAddress(*sink_address), sink_public, ReleaseWindow(0, 2**40)),
                ]

            # Opens once the packets are built and sent (at the cost measured now); long enough for
            # a restart on a loaded machine (a relay process took 5-8 s to start at load 12); killed
            # at t + 3, about 10 of the 60 are out (none with probability 2e-5).
            cost = packet_seconds(GEOMETRY, path_in(ReleaseWindow(0, 1)))

            def draw(slack: float) -> tuple[tuple[ReleaseWindow, list[bytes]], float]:
                t = math.ceil(time.time()) + window_seconds(n, cost, slack=slack)
                window = ReleaseWindow(t, t + 18)
                return (window, [build_packet(GEOMETRY, path_in(window), i.to_bytes(4, "big")) for i in range(n)]), t

            window, packets = drawn_in_time(draw)
            t = window.start
            client = LinkClient("127.0.0.1", port, packet_size=GEOMETRY.packet_size,
                                geometry_hash=GEOMETRY.canonical_hash())
            assert await client.send_batch(packets, give_up_at=trio.current_time() + 10) == [AckStatus.ACCEPTED] * n
            await client.aclose()

            await trio.sleep(t + 3 - time.time())  # mid-window: some released, most held
            released_before_kill = len(sink.arrivals)
            process.send_signal(signal.SIGKILL)
            await process.wait()
            assert 0 < released_before_kill < n
            process = await start_relay(data_dir, port, log)

            with trio.fail_after(window.end + 5 - time.time()):
                await sink.wait_for(n)
            nursery.cancel_scope.cancel()
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            with trio.move_on_after(10):
                await process.wait()
            if process.poll() is None:
                process.kill()
    messages = [int.from_bytes(a.message[:4], "big") for a in sink.arrivals]
    assert sorted(messages) == list(range(n)), log.read_text()
    assert all(window.start <= a.arrived_at <= window.end + 0.5 for a in sink.arrivals)
    assert process is not None and process.returncode == 0, log.read_text()  # SIGTERM is a clean shutdown
    assert "event=recovered" in log.read_text()
