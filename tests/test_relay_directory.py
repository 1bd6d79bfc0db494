"""A relay forwards only to the next hops of its directory (issue 5 security
fix), over real TCP on loopback: a static directory file, and the signed
manifest an aggregator serves at ``GET /v1/manifest``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from nacl.signing import SigningKey
from test_manifest import SIGNING_KEY, fixed_manifest
from test_relay_cascade import (
    GEOMETRY,
    SINK_PRIVATE,
    SINK_PUBLIC,
    client_for,
    hop,
    relay_config,
    sink_entry,
    sink_hop,
)
from test_relay_cli import invoke

from anonml.crypto import (
    NodeAddress,
    PathHop,
    ReleaseWindow,
    build_packet,
    generate_keypair,
    node_id_of,
)
from anonml.protocol import AggregatorHop, PhaseTimes, RelayEntry, RoundSchedule, SignedManifest
from anonml.transport import AckStatus
from anonml.relay import (
    DirectoryEntry,
    DirectoryError,
    NextHopDirectory,
    PinnedAggregator,
    RelayConfig,
    RelayConfigError,
    RelayStarted,
    create_identity,
    entries_from_manifest,
    fetch_manifest,
    load_config,
    parse_directory_file,
    render_directory_file,
    serve_relay,
)
from anonml.relay._config import REQUIRE_DIRECTORY_DEFAULT
from anonml.testing import FinalHopSink

AGGREGATOR_IDENTITY = bytes(SIGNING_KEY.verify_key)
# A key other than the pinned one: whoever answers an aggregator's URL can
# sign a well-formed manifest with it.
ROGUE_KEY = SigningKey(bytes(range(100, 132)))


async def fetch_manifest_hops(url: str, *, identity: bytes, timeout: float) -> tuple[DirectoryEntry, ...]:
    return entries_from_manifest(await fetch_manifest(url, identity=identity, timeout=timeout))


def schedule_around_now() -> RoundSchedule:
    """A round whose data phase is on now and for the next hour (relays accept windows inside its phases)."""
    now = int(time.time())
    return RoundSchedule(now - 300, now - 200, (), PhaseTimes(now - 100, 10, now + 1800, now + 1810, 10, now + 3600))


async def open_recorder(nursery: trio.Nursery, connections: list[object]) -> tuple[str, int]:
    """A TCP listener that records every connection it gets (it must get none)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, lambda stream: _record(stream, connections), listeners)
    return "127.0.0.1", int(listeners[0].socket.getsockname()[1])


async def _record(stream: trio.SocketStream, connections: list[object]) -> None:
    connections.append(stream)
    await stream.aclose()


def open_window() -> ReleaseWindow:
    """A first hop's window opening a few seconds after the packet is built (a first relay refuses a packet
    whose window has opened: its release would follow its intake), drawn then: a window fixed at the test's
    start can open or close on a loaded machine before a later packet is sent, and the relay would then
    refuse it as late instead of checking its next hop."""
    now = int(time.time())
    return ReleaseWindow(now + 3, now + 6)  # released within 6 s of acceptance


async def test_packets_to_unknown_or_readdressed_next_hops_are_dropped_counted_and_never_sent(
    tmp_path: Path,
) -> None:
    sink = FinalHopSink(GEOMETRY, SINK_PRIVATE)
    contacted: list[object] = []
    async with trio.open_nursery() as nursery:
        sink_address = await nursery.start(sink.serve)
        rogue_address = await open_recorder(nursery, contacted)
        config = relay_config(tmp_path / "r", [sink_entry(sink_address)])
        started: RelayStarted = await nursery.start(serve_relay, config)
        window = open_window()
        _, rogue_public = generate_keypair()
        unknown = PathHop(node_id_of(rogue_public), NodeAddress(*rogue_address), rogue_public, window)
        # The sink's node id, its address rewritten by the sender.
        readdressed = PathHop(node_id_of(SINK_PUBLIC), NodeAddress(*rogue_address), SINK_PUBLIC,
                              window)
        honest = PathHop(node_id_of(SINK_PUBLIC), NodeAddress(*sink_address), SINK_PUBLIC, window)
        packets = [build_packet(GEOMETRY, [hop(started, window), last], message)
                   for last, message in ((unknown, b"unknown"), (readdressed, b"readdressed"), (honest, b"honest"))]
        client = client_for(started)
        statuses = await client.send_batch(packets, give_up_at=trio.current_time() + 5)
        await client.aclose()
        # Refused BUSY: the sender may retry once the directory knows them (it never will).
        assert statuses == [AckStatus.BUSY, AckStatus.BUSY, AckStatus.ACCEPTED]
        with trio.fail_after(9):
            await sink.wait_for(1)
        await trio.sleep(0.3)  # time for a (wrong) forward to the rogue address to show up
        nursery.cancel_scope.cancel()
    assert [a.message for a in sink.arrivals] == [b"honest"]
    assert contacted == []
    dropped = started.counters.dropped
    assert dropped["unknown-next-hop"] == 1 and dropped["next-hop-address-mismatch"] == 1
    assert started.counters.forwarded == 1 and sum(dropped.values()) == 2


async def serve_manifests(documents: dict[str, bytes], *, task_status: trio.TaskStatus[int]) -> None:
    """A minimal HTTP/1.1 server: ``GET path`` -> ``documents[path]`` or 404."""

    async def handle(stream: trio.SocketStream) -> None:
        request = b""
        with trio.move_on_after(5):
            while b"\r\n\r\n" not in request and len(request) < 8192:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                request += chunk
        path = request.split(b" ")[1].decode() if request.count(b" ") >= 2 else ""
        body = documents.get(path)
        status = b"200 OK" if body is not None else b"404 Not Found"
        body = body if body is not None else b"{}"
        try:
            await stream.send_all(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
                                  + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        except trio.BrokenResourceError:
            pass  # the client stopped reading (an oversized body)
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(int(listeners[0].socket.getsockname()[1]))
    await trio.serve_listeners(handle, listeners)


def signed_manifest_json(relay_node: bytes, relay_link: tuple[str, int], relay_public: bytes,
                         sink_address: tuple[str, int], signing_key: SigningKey = SIGNING_KEY) -> bytes:
    """A valid signed manifest naming one relay and the sink at ``sink_address``,
    signed by ``signing_key`` (which it also names as its identity key)."""
    manifest = fixed_manifest(
        relays=(RelayEntry(relay_node, relay_link[0], relay_link[1], relay_public, 1),),
        aggregator_hop=AggregatorHop(node_id_of(SINK_PUBLIC), sink_address[0], sink_address[1],
                                     SINK_PUBLIC),
        path_length=1,
        identity_key=bytes(signing_key.verify_key),
        schedule=schedule_around_now(),
    )
    return SignedManifest.sign(manifest, signing_key).to_json()


async def test_the_directory_comes_from_verified_manifests_of_an_aggregator_that_starts_later(
    tmp_path: Path,
) -> None:
    sink = FinalHopSink(GEOMETRY, SINK_PRIVATE)
    documents: dict[str, bytes] = {}
    async with trio.open_nursery() as nursery:
        sink_address = await nursery.start(sink.serve)
        http_port = await nursery.start(serve_manifests, documents)
        base = f"http://127.0.0.1:{http_port}"
        data_dir = tmp_path / "r"
        create_identity(data_dir)
        config = RelayConfig(data_dir=data_dir, listen=("127.0.0.1", 0), max_hops=GEOMETRY.max_hops,
                             packet_size=GEOMETRY.packet_size, synchronous="NORMAL",
                             directory_aggregators=tuple(
                                 PinnedAggregator(base + path, AGGREGATOR_IDENTITY)
                                 for path in ("/good", "/forged", "/rogue")),
                             directory_min_refresh_seconds=0.2, directory_fetch_timeout=2.0)
        # The aggregator is not serving its manifest yet: the relay still starts.
        started: RelayStarted = await nursery.start(serve_relay, config)
        good = signed_manifest_json(started.node_id, started.link, started.keys[0].public_key, sink_address)
        rogue_address = ("127.0.0.1", 9)
        forged = SignedManifest.from_json(signed_manifest_json(
            started.node_id, started.link, started.keys[0].public_key, rogue_address))
        # A manifest naming the rogue address as the final hop, its signature broken.
        forged_json = SignedManifest(forged.manifest, bytes(64)).to_json()
        # The same, correctly signed by a key other than the pinned one.
        rogue_json = signed_manifest_json(started.node_id, started.link, started.keys[0].public_key, rogue_address,
                                          signing_key=ROGUE_KEY)
        client = client_for(started)
        first = build_packet(GEOMETRY, [hop(started, open_window()), sink_hop(sink_address)], b"before")
        assert await client.send_batch([first], give_up_at=trio.current_time() + 5) == [AckStatus.BUSY]
        documents["/good/v1/manifest"] = good
        documents["/forged/v1/manifest"] = forged_json
        documents["/rogue/v1/manifest"] = rogue_json
        # No packet asks for it: the failed start-up fetch is simply retried.
        assert started.directory is not None
        with trio.fail_after(10):
            while not started.directory.sources():
                await trio.sleep(0.05)
        # The relay and the final hop; nothing from the broken or the rogue-signed manifest.
        round_id = SignedManifest.from_json(good).round_id.hex()[:16]
        assert started.directory.sources() == {f"round {round_id} from {base}/good": 2}
        packet = build_packet(GEOMETRY, [hop(started, open_window()), sink_hop(sink_address)], b"after")
        assert await client.send_batch([packet], give_up_at=trio.current_time() + 5) == [AckStatus.ACCEPTED]
        with trio.fail_after(10):
            await sink.wait_for(1)
        window = open_window()
        rogue = PathHop(node_id_of(SINK_PUBLIC), NodeAddress(*rogue_address), SINK_PUBLIC, window)
        readdressed = build_packet(GEOMETRY, [hop(started, window), rogue], b"rogue")
        assert await client.send_batch([readdressed], give_up_at=trio.current_time() + 5) == [AckStatus.BUSY]
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert [a.message for a in sink.arrivals] == [b"after"]
    dropped = started.counters.dropped
    assert dropped["unknown-next-hop"] == 1 and dropped["next-hop-address-mismatch"] == 1


async def test_a_missing_or_malformed_directory_file_stops_the_relay_at_start(tmp_path: Path) -> None:
    create_identity(tmp_path)
    config = RelayConfig(data_dir=tmp_path, listen=("127.0.0.1", 0), directory_file="missing.json")
    with pytest.raises(RelayConfigError, match="missing.json"):
        await serve_relay(config)
    (tmp_path / "bad.json").write_text('{"hops": [{"node_id": "zz", "host": "127.0.0.1", "port": 1}]}')
    with pytest.raises(RelayConfigError, match="node_id"):
        await serve_relay(RelayConfig(data_dir=tmp_path, listen=("127.0.0.1", 0), directory_file="bad.json"))


async def test_no_directory_source_refuses_to_start_when_required(tmp_path: Path) -> None:
    create_identity(tmp_path)
    config = RelayConfig(data_dir=tmp_path, listen=("127.0.0.1", 0), require_directory=True)
    with pytest.raises(RelayConfigError, match="no next-hop directory"):
        await serve_relay(config)


@pytest.mark.parametrize("data", [
    b"", b"[]", b"{}", b'{"hops": {}}', b'{"hops": [], "x": 1}', b'{"hops": [1]}',
    b'{"hops": [{"node_id": "00", "host": "example.org", "port": 1}]}',
    b'{"hops": [{"node_id": "00", "host": "127.0.0.1", "port": 0}]}',
    b'{"hops": [{"node_id": "00", "host": "127.0.0.1", "port": true}]}',
    b'{"hops": [{"node_id": "", "host": "127.0.0.1", "port": 1}]}',
    b'{"hops": [{"node_id": 5, "host": "127.0.0.1", "port": 1}]}',
    b'{"hops": [{"node_id": "00", "host": "127.0.0.1", "port": 1, "extra": 1}]}',
    b"[" * 100_000, b"\xff\xfe", b'{"hops": [' + b'{"node_id": "00", "host": "::1", "port": 1},' * 5000 + b"]}",
])
def test_directory_files_parse_strictly_with_one_typed_error(data: bytes) -> None:
    with pytest.raises(DirectoryError):
        parse_directory_file(data)


def test_directory_file_round_trip_and_address_normalisation(tmp_path: Path) -> None:
    entries = (DirectoryEntry(b"\x01" * 16, "::ffff:127.0.0.1", 7000), DirectoryEntry(b"\x02" * 16, "::1", 7001))
    assert parse_directory_file(render_directory_file(entries).encode()) == entries
    directory = NextHopDirectory()
    directory.replace_source("file", entries)
    assert directory.check(b"\x01" * 16, NodeAddress("127.0.0.1", 7000)) is None
    assert directory.check(b"\x01" * 16, NodeAddress("127.0.0.1", 7001)) == "next-hop-address-mismatch"
    assert directory.check(b"\x03" * 16, NodeAddress("::1", 7001)) == "unknown-next-hop"
    directory.replace_source("file", entries[1:])  # a source's re-read replaces its own entries
    assert directory.check(b"\x01" * 16, NodeAddress("127.0.0.1", 7000)) == "unknown-next-hop"


def test_the_directory_counts_listed_relays_across_sources_for_the_neighbour_share() -> None:
    """A static file's hops all count as relays (it does not say which is a final hop); a manifest's
    source names its relays; a relay listed by two sources counts once, and this relay never."""
    directory = NextHopDirectory()
    hops = [DirectoryEntry(bytes([i]) * 16, "127.0.0.1", 7000 + i) for i in range(1, 5)]
    directory.replace_source("file", hops[:2])
    assert directory.relays_besides(None) == 2 and directory.relays_besides(bytes([1]) * 16) == 1
    directory.replace_source("round", hops[1:], [(0, 10)], relays=[hop.node_id for hop in hops[1:3]])
    assert directory.relays_besides(bytes([1]) * 16) == 2  # hops 2 and 3; hop 4 is the round's final hop
    directory.remove_source("file")
    assert directory.relays_besides(bytes([1]) * 16) == 2 and directory.relays_besides(bytes([2]) * 16) == 1


def test_init_stores_the_directory_sources_and_info_shows_them(tmp_path: Path) -> None:
    data_dir = tmp_path / "r"
    key = AGGREGATOR_IDENTITY.hex()
    code, output = invoke("init", "--data-dir", str(data_dir), "--listen", "127.0.0.1:9000",
                          "--aggregator", f"{key}@http://127.0.0.1:8080", "--aggregator", f"{key}@http://[::1]:8081/a",
                          "--directory-file", "directory.json")
    assert code == 0, output
    config = load_config(data_dir)
    assert config.directory_aggregators == (PinnedAggregator("http://127.0.0.1:8080", AGGREGATOR_IDENTITY),
                                            PinnedAggregator("http://[::1]:8081/a", AGGREGATOR_IDENTITY))
    assert config.directory_path == data_dir / "directory.json"
    code, output = invoke("info", "--data-dir", str(data_dir))
    assert code == 0 and f"forwards only to next hops from: aggregator http://127.0.0.1:8080 (identity {key})" in output
    for value, named in ((f"{key}@ftp://x", "ftp://x"), ("http://127.0.0.1:8080", "IDENTITY@URL"),
                         (f"{key[:-2]}@http://127.0.0.1:8080", "identity"), (f"{key}zz@http://127.0.0.1:8080", "identity")):
        code, output = invoke("init", "--data-dir", str(tmp_path / "bad"), "--listen", "127.0.0.1:9000",
                              "--aggregator", value)
        assert code != 0 and "--aggregator" in output and named in output, (value, output)
        assert not (tmp_path / "bad").exists()
    code, output = invoke("init", "--data-dir", str(tmp_path / "none"), "--listen", "127.0.0.1:9001")
    assert code == 0
    without_directory = "refuses to start" if REQUIRE_DIRECTORY_DEFAULT else "forwards to ANY address"
    assert without_directory in invoke("info", "--data-dir", str(tmp_path / "none"))[1]
    # `run --aggregator` adds to the configured sources, validated the same way.
    code, output = invoke("run", "--data-dir", str(tmp_path / "none"), "--aggregator", f"{key}@ftp://y")
    assert code != 0 and "ftp://y" in output
    code, output = invoke("run", "--data-dir", str(tmp_path / "none"), "--aggregator", "ftp://y")
    assert code != 0 and "IDENTITY@URL" in output


async def test_fetching_a_manifest_is_bounded_in_time_and_size() -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    documents = {"/big/v1/manifest": b"{" + b" " * (2 * 1024 * 1024) + b"}", "/junk/v1/manifest": b"\xff not json"}
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, silent, listeners)
        silent_url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        http_port = await nursery.start(serve_manifests, documents)
        started = trio.current_time()
        with pytest.raises(DirectoryError, match="within"):
            await fetch_manifest_hops(silent_url, identity=AGGREGATOR_IDENTITY, timeout=0.5)
        assert trio.current_time() - started < 2
        with pytest.raises(DirectoryError, match="over"):
            await fetch_manifest_hops(f"http://127.0.0.1:{http_port}/big", identity=AGGREGATOR_IDENTITY, timeout=5)
        with pytest.raises(DirectoryError, match="does not verify"):
            await fetch_manifest_hops(f"http://127.0.0.1:{http_port}/junk", identity=AGGREGATOR_IDENTITY, timeout=5)
        with pytest.raises(DirectoryError, match="cannot fetch"):
            await fetch_manifest_hops("http://127.0.0.1:1", identity=AGGREGATOR_IDENTITY, timeout=5)
        nursery.cancel_scope.cancel()


async def test_only_a_manifest_signed_by_the_pinned_identity_adds_next_hops() -> None:
    """Whoever answers the URL can serve a well-formed manifest signed by a key
    of their own; it must add nothing (the relay would be an open forwarder
    again), while the pinned aggregator's manifest is accepted."""
    relay_node, relay_public = b"\x01" * 32, b"\x02" * 32
    honest_sink, rogue_sink = ("127.0.0.1", 7100), ("127.0.0.1", 9)
    documents = {
        "/honest/v1/manifest": signed_manifest_json(relay_node, ("127.0.0.1", 7000), relay_public, honest_sink),
        "/rogue/v1/manifest": signed_manifest_json(relay_node, ("127.0.0.1", 7000), relay_public, rogue_sink,
                                                   signing_key=ROGUE_KEY),
    }
    async with trio.open_nursery() as nursery:
        base = f"http://127.0.0.1:{await nursery.start(serve_manifests, documents)}"
        honest = await fetch_manifest_hops(base + "/honest", identity=AGGREGATOR_IDENTITY, timeout=5)
        assert DirectoryEntry(node_id_of(SINK_PUBLIC), *honest_sink) in honest
        with pytest.raises(DirectoryError, match=ROGUE_KEY.verify_key.encode().hex()):
            await fetch_manifest_hops(base + "/rogue", identity=AGGREGATOR_IDENTITY, timeout=5)
        # The rogue manifest is itself well formed: only the pin refuses it.
        assert DirectoryEntry(node_id_of(SINK_PUBLIC), *rogue_sink) in await fetch_manifest_hops(
            base + "/rogue", identity=bytes(ROGUE_KEY.verify_key), timeout=5)
        nursery.cancel_scope.cancel()


async def test_a_restarted_relay_forwards_at_once_with_the_directory_it_last_verified(tmp_path: Path) -> None:
    """Issue 13/14: a restarted relay refused every packet (``unknown-next-hop``)
    until its first fetch of the manifest succeeded; with the aggregator down
    that was for as long as it stayed down."""
    sink = FinalHopSink(GEOMETRY, SINK_PRIVATE)
    documents: dict[str, bytes] = {}
    data_dir = tmp_path / "r"
    create_identity(data_dir)
    async with trio.open_nursery() as nursery:
        sink_address = await nursery.start(sink.serve)
        async with trio.open_nursery() as aggregator:
            base = f"http://127.0.0.1:{await aggregator.start(serve_manifests, documents)}"
            config = RelayConfig(data_dir=data_dir, listen=("127.0.0.1", 0), max_hops=GEOMETRY.max_hops,
                                 packet_size=GEOMETRY.packet_size, synchronous="NORMAL",
                                 directory_aggregators=(PinnedAggregator(base, AGGREGATOR_IDENTITY),),
                                 directory_min_refresh_seconds=0.2, directory_fetch_timeout=2.0)
            async with trio.open_nursery() as first_run:
                started: RelayStarted = await first_run.start(serve_relay, config)
                config = config.with_listen(*started.link)  # the restart listens where the manifest says
                documents["/v1/manifest"] = signed_manifest_json(started.node_id, started.link,
                                                                 started.keys[0].public_key, sink_address)
                assert started.directory is not None
                with trio.fail_after(10):
                    while not started.directory.sources():
                        await trio.sleep(0.05)
                first_run.cancel_scope.cancel()  # the relay stops...
            aggregator.cancel_scope.cancel()  # ... and the aggregator is gone when it comes back
        restarted: RelayStarted = await nursery.start(serve_relay, config)
        client = client_for(restarted)
        packet = build_packet(GEOMETRY, [hop(restarted, open_window()), sink_hop(sink_address)], b"at once")
        assert await client.send_batch([packet], give_up_at=trio.current_time() + 5) == [AckStatus.ACCEPTED]
        with trio.fail_after(10):
            await sink.wait_for(1)
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert [a.message for a in sink.arrivals] == [b"at once"]
