"""A packet sink with ingest workers (issue 27): the manifest lists the final hop's further addresses, and a
last relay spreads its deliveries over all of them and moves a batch that one fails to take to the others.

Under trio's MockClock with the relay's real window logic and SQLite store (each address's link an
in-memory recorder that can be switched off: a worker killed for good), then once over real TCP: a relay
that learns the round from its signed manifest, two recording sinks, and one of them stopped."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing
import test_relay_cascade as cascade
from test_manifest import SIGNING_KEY, fixed_manifest
from test_relay_directory import AGGREGATOR_IDENTITY, open_window, schedule_around_now, serve_manifests
from test_relay_windows import NEXT_HOP, NEXT_PUBLIC, T0, Harness, RecordingSender

from anonml.crypto import NodeAddress, ReleaseWindow, build_packet, node_id_of
from anonml.protocol import AggregatorHop, RelayEntry, SignedManifest
from anonml.relay import DirectoryEntry, NextHopDirectory, PinnedAggregator, RelayConfig, WallClock, create_identity, serve_relay
from anonml.relay._server import PacketSender
from anonml.testing import FinalHopSink
from anonml.transport import AckStatus

WORKER = NodeAddress("127.0.0.2", NEXT_HOP.port)
SINK = ((NEXT_HOP.host, NEXT_HOP.port), (WORKER.host, WORKER.port))


class SwitchableSender(RecordingSender):
    """One sink address's link: records what it takes while its address is up; while down, it answers
    nothing until the relay gives up (as a killed worker's address would) and notes how long it was given."""

    def __init__(self, address: tuple[str, int], down: set[tuple[str, int]], given: list[float],
                 clock: WallClock, log: list[tuple[float, int]], seen: set[bytes]) -> None:
        super().__init__(clock, log, seen)
        self.address, self.down, self.given = address, down, given

    async def send_batch(self, packets: Sequence[bytes], *, give_up_at: float) -> list[AckStatus | None]:
        if self.address in self.down:
            self.given.append(give_up_at - trio.current_time())
            await trio.sleep_until(give_up_at)
            return [None] * len(packets)
        return await super().send_batch(packets, give_up_at=give_up_at)


class SinkHarness(Harness):
    def __init__(self, tmp_path: Path, clock: WallClock, directory: NextHopDirectory) -> None:
        self.down: set[tuple[str, int]] = set()
        self.given: list[float] = []
        self.taken: dict[tuple[str, int], list[tuple[float, int]]] = {address: [] for address in SINK}
        super().__init__(tmp_path, clock, directory=directory)

    def _open(self, neighbour: tuple[str, int]) -> PacketSender:
        return SwitchableSender(neighbour, self.down, self.given, self.clock, self.taken[neighbour], self.seen)


def sink_directory(sink: Sequence[tuple[str, int]]) -> NextHopDirectory:
    """The directory a round's manifest makes whose final hop takes packets at ``sink``."""
    directory = NextHopDirectory()
    entries = [DirectoryEntry(node_id_of(NEXT_PUBLIC), host, port) for host, port in sink]
    directory.replace_source("round", entries, [(T0, T0 + 500)], relays=[], sink=sink)
    return directory


async def test_deliveries_are_spread_over_the_sinks_addresses_and_one_that_stops_loses_nothing(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    clock = WallClock.starting_at(T0)
    harness = SinkHarness(tmp_path, clock, sink_directory(SINK))
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        # Every packet names the sink's own address (as peers build them); both addresses take a share.
        statuses = await harness.relay.on_packets([harness.packet(i, ReleaseWindow(T0 + 10, T0 + 20)) for i in range(100)])
        assert statuses == [AckStatus.ACCEPTED] * 100
        await trio.sleep_until(clock.to_trio(T0 + 21))
        shares = {address: len(taken) for address, taken in harness.taken.items()}
        assert sum(shares.values()) == 100 and min(shares.values()) >= 40, shares
        # The address every packet names is lost for good: what the relay sends there comes back unacknowledged
        # after a few seconds, goes to the worker's address, and every packet is taken there.
        harness.down.add(SINK[0])
        statuses = await harness.relay.on_packets([harness.packet(i, ReleaseWindow(T0 + 30, T0 + 40)) for i in range(100, 200)])
        assert statuses == [AckStatus.ACCEPTED] * 100
        await trio.sleep_until(clock.to_trio(T0 + 60))
        nursery.cancel_scope.cancel()
    taken = sorted(index for log in harness.taken.values() for _, index in log)
    assert taken == list(range(200))
    counters = harness.relay.counters
    assert counters.forwarded == 200 and counters.held == 0 and not counters.dropped
    assert harness.given and max(harness.given) <= 5.0  # a dead address holds a batch seconds, not to the phase's end
    # While the failed address rests, the other takes the batches at once: most arrive inside their window.
    late = [at for at, index in harness.taken[SINK[1]] if index >= 100 and at > T0 + 40]
    assert len(late) < 50, late


async def test_a_sink_with_one_address_is_only_ever_sent_to_there(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    """Without workers nothing changes: a packet goes where it names, and an address that fails is retried."""
    clock = WallClock.starting_at(T0)
    harness = SinkHarness(tmp_path, clock, sink_directory(SINK[:1]))
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        await harness.relay.on_packets([harness.packet(i, ReleaseWindow(T0 + 10, T0 + 20)) for i in range(20)])
        await trio.sleep_until(clock.to_trio(T0 + 21))
        nursery.cancel_scope.cancel()
    assert [index for _, index in sorted(harness.taken[SINK[0]], key=lambda item: item[1])] == list(range(20))
    assert harness.taken[SINK[1]] == []


def test_a_relay_spreads_over_one_rounds_sink_addresses_only() -> None:
    """The addresses come from one round's manifest: the same key listed elsewhere (a static file, another
    round's sink, which would refuse this round's packets) never joins them, and they go with their round."""
    directory = sink_directory(SINK)
    sink_id = node_id_of(NEXT_PUBLIC)
    directory.replace_source("file", [DirectoryEntry(sink_id, "127.0.0.9", 7000)])
    other = (("127.0.0.1", 7001), ("127.0.0.3", 7001))
    directory.replace_source("other round", [DirectoryEntry(sink_id, *address) for address in other], [(T0, T0 + 500)],
                             relays=[], sink=other)
    assert directory.sink_endpoints(*SINK[0]) == directory.sink_endpoints(*SINK[1]) == SINK
    assert directory.sink_endpoints(*other[1]) == other
    assert directory.sink_endpoints("127.0.0.9", 7000) == (("127.0.0.9", 7000),)
    directory.remove_source("round")
    assert directory.sink_endpoints(*SINK[0]) == (SINK[0],)


async def _serve_until_stopped(sink: FinalHopSink, scope: trio.CancelScope, *,
                               task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
    with scope:
        await sink.serve(task_status=task_status)


async def _taken(sinks: Sequence[FinalHopSink], count: int) -> None:
    with trio.fail_after(30):
        while sum(len(sink.arrivals) for sink in sinks) < count:
            await trio.sleep(0.05)


@pytest.mark.usefixtures("quiet_machine")
async def test_over_tcp_a_relay_delivers_to_the_workers_its_manifest_lists_and_past_one_that_stopped(tmp_path: Path) -> None:
    sinks = [FinalHopSink(cascade.GEOMETRY, cascade.SINK_PRIVATE) for _ in range(2)]
    first_scope = trio.CancelScope()
    documents: dict[str, bytes] = {}
    async with trio.open_nursery() as nursery:
        first = await nursery.start(_serve_until_stopped, sinks[0], first_scope)
        second = await nursery.start(sinks[1].serve)
        base = f"http://127.0.0.1:{await nursery.start(serve_manifests, documents)}"
        create_identity(tmp_path / "r")
        config = RelayConfig(data_dir=tmp_path / "r", listen=("127.0.0.1", 0), max_hops=cascade.GEOMETRY.max_hops,
                             packet_size=cascade.GEOMETRY.packet_size, synchronous="NORMAL",
                             directory_aggregators=(PinnedAggregator(base, AGGREGATOR_IDENTITY),),
                             directory_min_refresh_seconds=0.2, directory_fetch_timeout=2.0)
        started = await nursery.start(serve_relay, config)
        manifest = fixed_manifest(
            relays=(RelayEntry(started.node_id, *started.link, started.keys[0].public_key, 1),), path_length=1,
            aggregator_hop=AggregatorHop(node_id_of(cascade.SINK_PUBLIC), *first, cascade.SINK_PUBLIC, workers=(second,)),
            identity_key=AGGREGATOR_IDENTITY, schedule=schedule_around_now())
        documents["/v1/manifest"] = SignedManifest.sign(manifest, SIGNING_KEY).to_json()
        with trio.fail_after(10):
            while not started.directory.sources():
                await trio.sleep(0.05)
        client = cascade.client_for(started)

        async def send(messages: range) -> None:
            window = open_window()
            packets = [build_packet(cascade.GEOMETRY, [cascade.hop(started, window), cascade.sink_hop(first)], b"%d" % i)
                       for i in messages]
            assert await client.send_batch(packets, give_up_at=trio.current_time() + 10) == [AckStatus.ACCEPTED] * len(packets)

        await send(range(40))  # every packet names the first address, as peers build them
        await _taken(sinks, 40)
        assert min(len(sink.arrivals) for sink in sinks) >= 10, [len(sink.arrivals) for sink in sinks]
        first_scope.cancel()  # the aggregator's own sink address is gone for good
        await send(range(40, 80))
        await _taken(sinks, 80)
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert sorted(int(a.message) for sink in sinks for a in sink.arrivals) == list(range(80))
    assert not started.counters.dropped
