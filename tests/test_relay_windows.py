"""Relay window logic under trio's MockClock (no sockets): holding, staggered
release, late drops, replays, capacity, restart recovery, key rotation and
forwarding retries. The next hop is an in-memory recorder; SQLite is real."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing
from scipy import stats

from anonml.crypto import (
    FinalMessage,
    NodeAddress,
    PathHop,
    ReleaseWindow,
    SphinxGeometry,
    build_packet,
    generate_keypair,
    never_replayed,
    node_id_of,
    process_packet,
)
from anonml.transport import AckStatus, LinkIdentity
from anonml.relay import (
    DirectoryEntry,
    HeldPacket,
    LateIntake,
    NextHopDirectory,
    RelayConfig,
    RelayConfigError,
    RelayCounters,
    RelayStore,
    WallClock,
    load_identity_key,
    parse_metrics,
    render_prometheus,
)
from anonml.relay._clock import uniform_from
from anonml.relay._delivery import gather_batch
from anonml.relay._server import PacketSender, Relay
from anonml.relay._store import STORE_FILE
from anonml.testing import loopback_relay, relay_keyring

T0 = 1_800_000_000  # the wall time at which each test starts (any value works)
GEOMETRY = SphinxGeometry.create(max_hops=3, packet_size=1024)
NEXT_HOP = NodeAddress("127.0.0.1", 9999)
NEXT_PRIVATE, NEXT_PUBLIC = generate_keypair()


class RecordingSender:
    """The next hop: records (wall time, message index) of each new packet and,
    like a real next hop's replay cache, rejects a copy it has already taken;
    fails the first ``failures`` calls."""

    def __init__(self, clock: WallClock, log: list[tuple[float, int]], seen: set[bytes], failures: int = 0) -> None:
        self.clock = clock
        self.log = log
        self.seen = seen
        self.failures = failures
        self.calls = 0

    async def send_batch(self, packets: Sequence[bytes], *, give_up_at: float) -> list[AckStatus | None]:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            await trio.sleep_until(give_up_at if give_up_at < trio.current_time() + 1 else trio.current_time() + 1)
            return [None] * len(packets)
        statuses: list[AckStatus | None] = []
        for packet in packets:
            if packet in self.seen:
                statuses.append(AckStatus.REJECTED)
            else:
                self.seen.add(packet)
                self.log.append((self.clock.now(), message_index(packet)))
                statuses.append(AckStatus.ACCEPTED)
        return statuses

    async def aclose(self) -> None:
        pass


def message_index(forwarded: bytes) -> int:
    result = process_packet(GEOMETRY, NEXT_PRIVATE, forwarded, is_replay=never_replayed)
    assert isinstance(result, FinalMessage)
    return int.from_bytes(result.message[:4], "big")


class Harness:
    def __init__(self, tmp_path: Path, clock: WallClock, *, seed: int = 1, failures: int = 0,
                 seen: set[bytes] | None = None, directory: NextHopDirectory | None = None,
                 relay_class: Callable[..., Relay] = Relay, **overrides: int) -> None:
        self.data_dir = tmp_path / "relay"
        self.config = loopback_relay(self.data_dir, GEOMETRY, synchronous="NORMAL", **overrides)
        self.clock = clock
        self.sent: list[tuple[float, int]] = []
        self.senders: list[RecordingSender] = []
        self.failures = failures
        self.seen = seen if seen is not None else set()
        self.store = RelayStore(self.data_dir / STORE_FILE, synchronous="NORMAL")
        self.identity = LinkIdentity(load_identity_key(self.data_dir))
        self.relay = relay_class(
            self.config,
            geometry=GEOMETRY,
            keyring=relay_keyring(self.config),
            store=self.store,
            clock=clock,
            uniform=uniform_from(np.random.default_rng(seed)),
            counters=RelayCounters(),
            identity=self.identity,
            open_sender=self._open,
            directory=directory,
        )
        self.relay.rotate_keys()
        self.relay.recover()

    def start(self, nursery: trio.Nursery) -> None:
        """Run the relay's background tasks as serve_relay does."""
        self.relay.attach(nursery)
        nursery.start_soon(self.relay.run_scheduler)
        nursery.start_soon(self.relay.run_housekeeping)

    def _open(self, neighbour: tuple[str, int]) -> PacketSender:
        sender = RecordingSender(self.clock, self.sent, self.seen, self.failures)
        self.senders.append(sender)
        return sender

    def public_key(self, epoch_offset: int = 0) -> bytes:
        """The current (0) or next (1) epoch's public key."""
        now = self.clock.now()
        epoch = self.relay.keyring.epoch_of(now) + epoch_offset
        return next(k.public_key for k in self.relay.keyring.published(now) if k.epoch == epoch)

    def packet(self, index: int, window: ReleaseWindow, public_key: bytes | None = None,
               next_hop: NodeAddress = NEXT_HOP) -> bytes:
        key = public_key if public_key is not None else self.public_key()
        path = [
            PathHop(node_id_of(key), NodeAddress("127.0.0.1", 9000), key, window),
            PathHop(node_id_of(NEXT_PUBLIC), next_hop, NEXT_PUBLIC, ReleaseWindow(0, 2**40)),
        ]
        return build_packet(GEOMETRY, path, index.to_bytes(4, "big"))

    async def offer_ahead(self, count: int, source: str | None = None) -> list[AckStatus]:
        """The statuses of ``count`` distinct packets for the window 10 to 20 s after ``T0``, offered
        in one batch from ``source`` (None: an authenticated neighbour)."""
        window = ReleaseWindow(T0 + 10, T0 + 20)
        return await self.relay.on_packets([self.packet(i, window) for i in range(count)], source)


def rho_bound(n: int) -> float:
    """4 standard deviations of Spearman's rho under independence (var = 1/(n-1))."""
    return 4 / math.sqrt(n - 1)


async def test_packets_are_held_then_released_uniformly_inside_their_window(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    clock = WallClock.starting_at(T0)
    harness = Harness(tmp_path, clock)
    window = ReleaseWindow(T0 + 100, T0 + 400)
    n = 300
    packets = [harness.packet(i, window) for i in range(n)]
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        for offset in range(0, n, 50):  # arrives in batches, like link group commits
            assert await harness.relay.on_packets(packets[offset : offset + 50]) == [AckStatus.ACCEPTED] * 50
            await trio.sleep(0.1)
        await trio.sleep_until(clock.to_trio(T0 + 99.999))
        assert harness.sent == [] and harness.relay.counters.held == n
        await trio.sleep_until(clock.to_trio(window.end + 1))
        nursery.cancel_scope.cancel()
    times = np.array([t for t, _ in harness.sent])
    order = [i for _, i in harness.sent]
    assert sorted(order) == list(range(n))
    assert times.min() >= window.start and times.max() <= window.end
    # Release times are uniform on the window (KS test, fixed seed, alpha 1e-3)...
    assert stats.kstest((times - window.start) / (window.end - window.start), "uniform").pvalue > 1e-3
    # ... and release order is unrelated to arrival order.
    rho = stats.spearmanr(order, np.arange(n)).statistic
    assert abs(rho) < rho_bound(n)
    counters = harness.relay.counters
    assert (counters.received, counters.accepted, counters.forwarded, counters.held) == (n, n, n, 0)
    assert harness.store.schedule() == []


async def test_late_packets_are_dropped_and_counted_and_mid_window_ones_released_in_the_rest(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    clock = WallClock.starting_at(T0)
    harness = Harness(tmp_path, clock)
    late = [harness.packet(i, ReleaseWindow(T0 - 60, T0 - 1)) for i in range(3)]
    open_now = [harness.packet(100 + i, ReleaseWindow(T0 - 10, T0 + 10)) for i in range(20)]
    from_peer = [harness.packet(200 + i, ReleaseWindow(T0 - 10, T0 + 10)) for i in range(5)]
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        # A later hop's packets come from an authenticated neighbour (its node id).
        statuses = await harness.relay.on_packets(late + open_now, node_id_of(NEXT_PUBLIC))
        assert statuses == [AckStatus.REJECTED] * 3 + [AckStatus.ACCEPTED] * 20
        # A first hop (from a peer's address) whose window has opened would be released in what is left of it,
        # after its intake, which follows its send: refused, so that the peer counts it as not sent.
        assert await harness.relay.on_packets(from_peer, "192.0.2.7") == [AckStatus.REJECTED] * 5
        await trio.sleep_until(clock.to_trio(T0 + 11))
        nursery.cancel_scope.cancel()
    assert harness.relay.counters.dropped["late"] == 3 and harness.relay.counters.dropped["late-first-hop"] == 5
    assert sorted(i for _, i in harness.sent) == list(range(100, 120))
    assert all(T0 <= t <= T0 + 10 for t, _ in harness.sent)
    # Each accepted one is counted as taken in 10 s after its window opened.
    assert harness.relay.counters.late_intake == LateIntake(packets=20, seconds_open=200.0)
    scraped = parse_metrics(render_prometheus(harness.relay.counters).decode())
    assert [scraped[f"packets_held_after_window_opened{suffix}"] for suffix in ("", "_seconds")] == [20, 200]


async def test_replays_are_dropped_within_and_across_batches(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    harness = Harness(tmp_path, WallClock.starting_at(T0))
    window = ReleaseWindow(T0 + 10, T0 + 20)
    first, second = harness.packet(1, window), harness.packet(2, window)
    assert await harness.relay.on_packets([first, second, first]) == [
        AckStatus.ACCEPTED, AckStatus.ACCEPTED, AckStatus.REJECTED,
    ]
    assert await harness.relay.on_packets([second]) == [AckStatus.REJECTED]
    assert await harness.relay.on_packets([bytes(GEOMETRY.packet_size)]) == [AckStatus.REJECTED]
    dropped = harness.relay.counters.dropped
    assert dropped["replay"] == 2 and dropped["bad-group-element"] + dropped["bad-mac"] == 1
    assert harness.relay.counters.held == 2


async def test_beyond_max_held_packets_are_refused_busy(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    harness = Harness(tmp_path, WallClock.starting_at(T0), max_held_packets=3)
    statuses = await harness.offer_ahead(5)
    assert statuses == [AckStatus.ACCEPTED] * 3 + [AckStatus.BUSY] * 2
    assert harness.relay.counters.dropped["capacity"] == 2
    assert len(harness.store.schedule()) == 3


async def test_with_one_share_one_address_may_fill_the_queue(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    """The loopback demo's peers all send from one address: its relays give that address the whole queue
    (`relay init --source-shares 1 --prefix-shares 1`), and the queue's own cap still holds."""
    harness = Harness(tmp_path, WallClock.starting_at(T0), max_held_packets=20, source_shares=1, prefix_shares=1)
    statuses = await harness.offer_ahead(25, "127.0.0.1")
    assert statuses == [AckStatus.ACCEPTED] * 20 + [AckStatus.BUSY] * 5
    assert harness.relay.counters.dropped["capacity"] == 5 and "source-share" not in harness.relay.counters.dropped


def test_a_network_share_smaller_than_an_address_share_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RelayConfigError, match="prefix_shares"):
        RelayConfig(data_dir=tmp_path, listen=("127.0.0.1", 9000), source_shares=8, prefix_shares=16)


async def test_one_address_or_one_network_filling_the_hold_leaves_room_for_an_honest_peer(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Issue 25: in-window packets from one address were all held until the queue was full, then
    every honest packet was BUSY for the rest of the phase. Each address holds at most 1/64 and each
    /24 1/32 of the queue from the first packet; the refusals are counted and charged to its budget."""
    clock = WallClock.starting_at(T0)
    harness = Harness(tmp_path, clock, max_held_packets=640)  # 10 per address, 20 per /24
    relay = harness.relay
    window = ReleaseWindow(T0 + 10, T0 + 20)
    flood = [harness.packet(i, window) for i in range(640)]  # the whole queue, in window, from one address
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        statuses, charged = await relay.receive(flood, "10.0.0.1")
        assert statuses == [AckStatus.ACCEPTED] * 10 + [AckStatus.BUSY] * 630 and charged == 630
        # More addresses of the same /24 get its other 10, then nothing.
        for host in range(2, 6):
            statuses, _ = await relay.receive([harness.packet(1000 + 10 * host + i, window) for i in range(5)],
                                              f"10.0.0.{host}")
            assert statuses.count(AckStatus.ACCEPTED) == (5 if host <= 3 else 0)
        assert relay.counters.dropped["source-share"] == 630 and relay.counters.dropped["prefix-share"] == 10
        # An honest peer elsewhere is served as if nobody flooded.
        honest = [harness.packet(2000 + i, window) for i in range(3)]
        assert await relay.on_packets(honest, "192.0.2.7") == [AckStatus.ACCEPTED] * 3
        # A share is given back once its packets are released: the next window's packets are taken.
        await trio.sleep_until(clock.to_trio(window.end + 1))
        later = ReleaseWindow(T0 + 30, T0 + 40)
        assert await relay.on_packets([harness.packet(3000 + i, later) for i in range(10)], "10.0.0.1") == [
            AckStatus.ACCEPTED] * 10
        nursery.cancel_scope.cancel()
    assert sorted(i for _, i in harness.sent) == [*range(10), *range(1020, 1025), *range(1030, 1035), 2000, 2001, 2002]


async def test_a_colluding_relay_holds_only_its_share_and_other_relays_and_peers_are_still_served(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Issue 25: authenticated directory neighbours were exempt from the shares, so one colluding relay,
    listed in the round's directory and proving its key on the link, filled an honest relay's queue with
    in-window packets and its peers got BUSY. A neighbour is charged by its node id, from any address;
    with three relays listed, each of the two others may hold half the queue (RelayConfig
    .max_held_per_neighbour); the final hop counts as no relay."""
    from anonml.transport import LinkClient, MemoryNetwork

    clock = WallClock.starting_at(T0)
    colluder, upstream = LinkIdentity(generate_keypair()[0]), LinkIdentity(generate_keypair()[0])
    directory = NextHopDirectory()
    harness = Harness(tmp_path, clock, directory=directory, max_held_packets=640)  # 10 per address
    own = harness.identity.node_id
    listed = [(own, "10.9.0.1"), (colluder.node_id, "10.9.0.2"), (upstream.node_id, "10.9.0.3")]
    entries = [DirectoryEntry(node_id, host, 9000) for node_id, host in listed]
    entries.append(DirectoryEntry(node_id_of(NEXT_PUBLIC), NEXT_HOP.host, NEXT_HOP.port))
    directory.replace_source("round", entries, [(T0, T0 + 500)], relays=[node_id for node_id, _ in listed])
    network = MemoryNetwork()
    listeners = await network.listen("10.9.0.1", 9000)
    window = ReleaseWindow(T0 + 10, T0 + 20)

    async def send(frames: list[bytes], source: str, identity: LinkIdentity | None) -> list[AckStatus | None]:
        client = LinkClient("10.9.0.1", 9000, packet_size=GEOMETRY.packet_size, geometry_hash=GEOMETRY.canonical_hash(),
                            identity=identity, expect_node_id=own, network=network, local_address=source)
        statuses: list[AckStatus | None] = []
        for offset in range(0, len(frames), 64):
            statuses += await client.send_batch(frames[offset : offset + 64], give_up_at=trio.current_time() + 5)
        await client.aclose()
        return statuses

    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        nursery.start_soon(partial(trio.serve_listeners, harness.relay.handle_connection, listeners,
                                   handler_nursery=nursery))
        flood = [harness.packet(i, window) for i in range(640)]  # the whole queue
        assert await send(flood, "10.9.0.2", colluder) == [AckStatus.ACCEPTED] * 320 + [AckStatus.BUSY] * 320
        # Its key is charged, not its address: from elsewhere it gets nothing more.
        assert await send([harness.packet(700 + i, window) for i in range(5)], "10.7.0.9", colluder) == [
            AckStatus.BUSY] * 5
        assert harness.relay.counters.dropped["neighbour-share"] == 325
        # The honest upstream relay and a peer are served as if nobody flooded.
        assert await send([harness.packet(1000 + i, window) for i in range(100)], "10.9.0.3", upstream) == [
            AckStatus.ACCEPTED] * 100
        assert await send([harness.packet(2000 + i, window) for i in range(10)], "192.0.2.7", None) == [
            AckStatus.ACCEPTED] * 10
        # Released, the colluder's share is free again for the next window.
        await trio.sleep_until(clock.to_trio(window.end + 1))
        later = ReleaseWindow(T0 + 30, T0 + 40)
        assert await send([harness.packet(3000 + i, later) for i in range(5)], "10.9.0.2", colluder) == [
            AckStatus.ACCEPTED] * 5
        nursery.cancel_scope.cancel()
    # More relays listed: each neighbour's part of a window is smaller, and so is its share.
    assert harness.relay.shares.per_neighbour() == 320
    directory.replace_source("round", entries, [(T0, T0 + 500)], relays=[*(node_id for node_id, _ in listed),
                                                                         b"\x01" * 32, b"\x02" * 32])
    assert harness.relay.shares.per_neighbour() == 640 // 4


async def test_link_churn_from_eight_addresses_leaves_a_fresh_peer_connection_served(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Issue 25: 320 silent link connections from 8 addresses, reopened when closed, took all 224
    public slots (the per-source cap bound only once half were taken) and an honest peer sent 1
    packet in 8 s. Scaled over the in-memory network: 8 addresses (each in a /24 of its own) keep
    every one of 16 public slots busy with hellos and silence; a peer's fresh connections are served."""
    from anonml.transport import LinkClient, MemoryNetwork, encode_hello

    harness = Harness(tmp_path, WallClock.starting_at(T0), max_connections=20, max_connections_per_source=2,
                      neighbour_connections=4)
    network = MemoryNetwork()
    listeners = await network.listen("10.9.0.1", 9000)
    window = ReleaseWindow(T0 + 100, T0 + 200)
    hello = encode_hello(GEOMETRY.packet_size, GEOMETRY.canonical_hash())

    async def churn(source: str) -> None:
        while True:
            stream = await network.connect("10.9.0.1", 9000, local_address=source)
            try:
                await stream.send_all(hello)
                while await stream.receive_some():
                    pass
            except trio.BrokenResourceError:
                pass
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        nursery.start_soon(partial(trio.serve_listeners, harness.relay.handle_connection, listeners,
                                   handler_nursery=nursery))
        for index in range(8):
            for _ in range(3):
                nursery.start_soon(churn, f"10.4.{index}.1")
        await trio.sleep(1.0)
        statuses = []
        for index in range(10):
            client = LinkClient("10.9.0.1", 9000, packet_size=GEOMETRY.packet_size,
                                geometry_hash=GEOMETRY.canonical_hash(), network=network, local_address="192.0.2.7")
            statuses += await client.send_batch([harness.packet(index, window)], give_up_at=trio.current_time() + 1)
            await client.aclose()
            await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    assert statuses == [AckStatus.ACCEPTED] * 10
    counters = harness.relay.counters
    assert counters.connections_refused["evicted-idle"] >= 5 and counters.connections_accepted > 16


async def test_a_restart_inside_the_window_still_releases_everything_inside_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    clock = WallClock.starting_at(T0)
    window = ReleaseWindow(T0 + 100, T0 + 200)
    first = Harness(tmp_path, clock, seed=2)
    n = 200
    packets = [first.packet(i, window) for i in range(n)]
    async with trio.open_nursery() as nursery:
        first.start(nursery)
        assert await first.relay.on_packets(packets) == [AckStatus.ACCEPTED] * n
        await trio.sleep_until(clock.to_trio(T0 + 150))
        nursery.cancel_scope.cancel()  # the process dies: no shutdown work runs
    released_before = len(first.sent)
    assert 0.3 * n < released_before < 0.7 * n

    # Down for 20 s; the packets due in (150, 170] were not released.
    await trio.sleep_until(clock.to_trio(T0 + 170))
    # The next hop (and its replay cache) outlives the crash.
    second = Harness(tmp_path, clock, seed=3, seen=first.seen)
    # Forwarded rows not yet deleted at the crash are re-sent and rejected as copies.
    assert second.relay.counters.held >= n - released_before
    async with trio.open_nursery() as nursery:
        second.start(nursery)
        await trio.sleep_until(clock.to_trio(window.end + 1))
        nursery.cancel_scope.cancel()
    assert second.store.schedule() == []
    delivered = [i for _, i in first.sent] + [i for _, i in second.sent]
    assert sorted(delivered) == list(range(n))  # everything, exactly once
    after = np.array([t for t, _ in second.sent])
    assert after.min() >= T0 + 170 and after.max() <= window.end
    # After the restart the held packets are again uniform on what is left.
    assert stats.kstest((after - (T0 + 170)) / (window.end - (T0 + 170)), "uniform").pvalue > 1e-3


async def test_packets_whose_window_closed_while_down_are_dropped_and_counted(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    clock = WallClock.starting_at(T0)
    first = Harness(tmp_path, clock)
    await first.offer_ahead(5)
    await trio.sleep_until(clock.to_trio(T0 + 30))
    second = Harness(tmp_path, clock)
    assert second.relay.counters.dropped["expired-while-down"] == 5
    assert second.relay.counters.held == 0 and second.store.schedule() == []


async def test_packets_whose_window_closed_while_down_go_out_at_the_restart_shuffled_while_their_phase_lasts(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Issue 27: a relay down across a window dropped everything it held for it ("expired-while-down"), though
    the later hops' windows (the aggregator's until the phase's t_r) were still open."""
    clock = WallClock.starting_at(T0)
    hops = [(node_id_of(NEXT_PUBLIC), NEXT_HOP)]
    # Two phases of a known round: the first ends while the relay is down, the second lasts past its restart.
    directory = round_directory([(T0, T0 + 40), (T0 + 40, T0 + 200)], hops)
    first = Harness(tmp_path, clock, directory=directory)
    n = 200
    ended_phase = [first.packet(1000 + i, ReleaseWindow(T0 + 10, T0 + 20)) for i in range(5)]
    open_phase = [first.packet(i, ReleaseWindow(T0 + 50, T0 + 60)) for i in range(n)]
    assert await first.relay.on_packets(ended_phase + open_phase) == [AckStatus.ACCEPTED] * (n + 5)
    # The relay dies before either window opens and is back after both closed, inside the second phase.
    restart = T0 + 70
    await trio.sleep_until(clock.to_trio(restart))
    second = Harness(tmp_path, clock, seed=3, directory=directory)
    assert second.relay.counters.dropped["expired-while-down"] == 5
    async with trio.open_nursery() as nursery:
        second.start(nursery)
        await trio.sleep_until(clock.to_trio(restart + 5))
        nursery.cancel_scope.cancel()
    order = [i for _, i in second.sent]
    assert sorted(order) == list(range(n))
    assert all(restart <= t <= restart + 0.25 for t, _ in second.sent)
    # At once, but in an order unrelated to their arrival order (rows are numbered as they arrived).
    assert abs(stats.spearmanr(order, np.arange(n)).statistic) < rho_bound(n)
    assert second.relay.counters.held == 0 and second.relay.counters.forwarded == n


async def test_a_next_hop_down_past_the_window_gets_the_packet_while_the_phase_lasts_then_it_is_dropped(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Issue 27: forwarding gave up when the packet's own window ended ("next-hop-unreachable"), though the
    next hop's window, and the aggregator's, were still open."""
    clock = WallClock.starting_at(T0)
    phase_end = T0 + 60
    directory = round_directory([(T0, phase_end)], [(node_id_of(NEXT_PUBLIC), NEXT_HOP)])
    # Each failed attempt takes a second and the next comes half a second later: down for ~18 s.
    harness = Harness(tmp_path, clock, failures=12, directory=directory)
    window = ReleaseWindow(T0 + 1, T0 + 5)
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        await harness.relay.on_packets([harness.packet(7, window)])
        await trio.sleep_until(clock.to_trio(phase_end + 1))
        nursery.cancel_scope.cancel()
    assert [i for _, i in harness.sent] == [7]
    assert window.end < harness.sent[0][0] <= phase_end
    assert not harness.relay.counters.dropped

    start = int(clock.now())
    phase_end = start + 60
    directory = round_directory([(start, phase_end)], [(node_id_of(NEXT_PUBLIC), NEXT_HOP)])
    unreachable = Harness(tmp_path / "other", clock, failures=10**6, directory=directory)
    async with trio.open_nursery() as nursery:
        unreachable.start(nursery)
        assert await unreachable.relay.on_packets([unreachable.packet(8, ReleaseWindow(start + 1, start + 5))]) == [AckStatus.ACCEPTED]
        await trio.sleep_until(clock.to_trio(phase_end - 1))
        assert unreachable.relay.counters.held == 1 and not unreachable.relay.counters.dropped
        await trio.sleep_until(clock.to_trio(phase_end + 5))
        nursery.cancel_scope.cancel()
    assert unreachable.relay.counters.dropped["next-hop-unreachable"] == 1
    assert unreachable.relay.counters.held == 0 and unreachable.store.schedule() == []


async def test_key_rotation_accepts_the_previous_key_for_the_grace_period_then_erases_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    epoch_seconds, grace = 1000, 100
    start = (T0 // epoch_seconds + 1) * epoch_seconds - 50  # 50 s before a boundary
    clock = WallClock.starting_at(start)
    harness = Harness(tmp_path, clock, key_epoch_seconds=epoch_seconds, key_grace_seconds=grace)
    keyring = harness.relay.keyring
    old_epoch = keyring.epoch_of(start)
    old_key = harness.public_key()
    next_key = harness.public_key(+1)
    window = ReleaseWindow(start, start + 10_000)
    async with trio.open_nursery() as nursery:
        harness.relay.attach(nursery)
        nursery.start_soon(harness.relay.run_key_rotation)
        # Within the grace before the boundary the next key already works.
        assert await harness.relay.on_packets([harness.packet(1, window, next_key)]) == [AckStatus.ACCEPTED]
        assert await harness.relay.on_packets([harness.packet(2, window, old_key)]) == [AckStatus.ACCEPTED]
        await trio.sleep_until(clock.to_trio(start + 50 + grace - 1))  # after the boundary, inside the grace
        assert await harness.relay.on_packets([harness.packet(3, window, old_key)]) == [AckStatus.ACCEPTED]
        await trio.sleep_until(clock.to_trio(start + 50 + grace + 1))  # grace over: the old key is erased
        assert await harness.relay.on_packets([harness.packet(4, window, old_key)]) == [AckStatus.REJECTED]
        assert not (harness.data_dir / "keys" / f"epoch-{old_epoch}.key").exists()
        # The new epoch's key works and the one after it has been created.
        assert await harness.relay.on_packets([harness.packet(5, window, next_key)]) == [AckStatus.ACCEPTED]
        assert (harness.data_dir / "keys" / f"epoch-{old_epoch + 2}.key").exists()
        nursery.cancel_scope.cancel()
    assert harness.relay.counters.dropped["bad-mac"] == 1


async def test_forwarding_retries_inside_the_window_then_gives_up(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    clock = WallClock.starting_at(T0)
    harness = Harness(tmp_path, clock, failures=2)
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        await harness.relay.on_packets([harness.packet(7, ReleaseWindow(T0 + 1, T0 + 30))])
        await trio.sleep_until(clock.to_trio(T0 + 31))
        nursery.cancel_scope.cancel()
    assert [i for _, i in harness.sent] == [7]
    assert harness.relay.counters.forward_retries == 2 and harness.relay.counters.forwarded == 1

    unreachable = Harness(tmp_path / "other", clock, failures=10**6)
    async with trio.open_nursery() as nursery:
        unreachable.start(nursery)
        window = ReleaseWindow(int(clock.now()) + 1, int(clock.now()) + 5)
        await unreachable.relay.on_packets([unreachable.packet(8, window)])
        await trio.sleep_until(clock.to_trio(window.end + 5))
        nursery.cancel_scope.cancel()
    assert unreachable.relay.counters.dropped["next-hop-unreachable"] == 1
    assert unreachable.relay.counters.held == 0 and unreachable.store.schedule() == []


async def test_next_hops_in_use_are_bounded_and_freed_once_delivered(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    clock = WallClock.starting_at(T0)
    harness = Harness(tmp_path, clock, max_neighbours=2)
    window = ReleaseWindow(T0 + 1, T0 + 2)
    hops = [NodeAddress("127.0.0.1", 9100 + i) for i in range(3)]
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        statuses = await harness.relay.on_packets([harness.packet(i, window, next_hop=hops[i]) for i in range(3)])
        assert statuses == [AckStatus.ACCEPTED, AckStatus.ACCEPTED, AckStatus.REJECTED]
        assert harness.relay.counters.dropped["too-many-neighbours"] == 1
        await trio.sleep_until(clock.to_trio(window.end + 1))  # both delivered: their next hops are free
        later = ReleaseWindow(T0 + 5, T0 + 6)
        assert await harness.relay.on_packets([harness.packet(3, later, next_hop=hops[2])]) == [AckStatus.ACCEPTED]
        await trio.sleep_until(clock.to_trio(later.end + 1))
        nursery.cancel_scope.cancel()
    assert sorted(i for _, i in harness.sent) == [0, 1, 3]
    assert len(harness.senders) == 3  # an idle forwarder was retired for the new next hop


async def test_random_and_tampered_frames_are_rejected_and_counted_never_raised(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    harness = Harness(tmp_path, WallClock.starting_at(T0))
    rng = np.random.default_rng(9)
    window = ReleaseWindow(T0 + 10, T0 + 20)
    good = harness.packet(1, window)
    frames = [rng.bytes(GEOMETRY.packet_size) for _ in range(100)]
    payload_flips = 0
    for _ in range(100):  # one flipped bit anywhere in an authentic packet
        position = int(rng.integers(GEOMETRY.packet_size * 8))
        payload_flips += position >= GEOMETRY.header_size * 8
        tampered = bytearray(good)
        tampered[position // 8] ^= 1 << (position % 8)
        frames.append(bytes(tampered))
    statuses = await harness.relay.on_packets(frames)
    counters = harness.relay.counters
    assert all(s in (AckStatus.ACCEPTED, AckStatus.REJECTED) for s in statuses)
    # A flipped header bit fails the MAC. A flipped payload bit passes it (the
    # payload is not authenticated per hop, by Sphinx's design: LIONESS
    # garbles it for the final hop), so the first such copy is taken and every
    # other one carries the same replay tag.
    assert payload_flips > 1
    assert statuses.count(AckStatus.ACCEPTED) == 1
    assert counters.dropped["replay"] == payload_flips - 1
    assert counters.dropped["bad-mac"] + counters.dropped["bad-group-element"] == 200 - payload_flips
    assert counters.received == 200 and counters.held == 1


async def test_a_full_replay_cache_refuses_busy_instead_of_forgetting(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    harness = Harness(tmp_path, WallClock.starting_at(T0), max_replay_tags=2)
    statuses = await harness.offer_ahead(3)
    assert statuses == [AckStatus.ACCEPTED, AckStatus.ACCEPTED, AckStatus.BUSY]
    assert harness.relay.counters.dropped["replay-cache-full"] == 1


# -- issue 13: abuse that used to take an honest packet's place -----------------


async def test_far_future_packets_are_refused_and_leave_the_hold_queue_to_honest_ones(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Hold-fill: 20 packets for a window a year ahead filled a 20-slot queue, and the next honest packet got BUSY."""
    harness = Harness(tmp_path, WallClock.starting_at(T0), max_held_packets=20, max_hold_seconds=3600)
    far = ReleaseWindow(T0 + 365 * 86400, T0 + 365 * 86400 + 60)
    assert await harness.relay.on_packets([harness.packet(i, far) for i in range(20)]) == [AckStatus.REJECTED] * 20
    honest = harness.packet(99, ReleaseWindow(T0 + 10, T0 + 20))
    assert await harness.relay.on_packets([honest]) == [AckStatus.ACCEPTED]
    assert harness.relay.counters.dropped["window-too-far"] == 20
    assert harness.relay.replay_tags == 1 and harness.store.tag_count() == 1  # no tag kept for a refused packet


async def test_late_packets_leave_no_replay_tag_so_they_cannot_fill_the_cache(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Replay-cache fill: with the cap at 50, 50 late packets made the next honest packet BUSY."""
    harness = Harness(tmp_path, WallClock.starting_at(T0), max_replay_tags=50)
    late = [harness.packet(i, ReleaseWindow(T0 - 60, T0 - 1)) for i in range(50)]
    assert await harness.relay.on_packets(late) == [AckStatus.REJECTED] * 50
    assert await harness.relay.on_packets([harness.packet(99, ReleaseWindow(T0 + 10, T0 + 20))]) == [AckStatus.ACCEPTED]
    assert harness.relay.counters.dropped["late"] == 50 and harness.relay.counters.dropped["replay-cache-full"] == 0


async def test_replay_tags_are_kept_until_their_window_ends_then_forgotten(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    clock = WallClock.starting_at(T0)
    harness = Harness(tmp_path, clock)
    packet = harness.packet(1, ReleaseWindow(T0 + 10, T0 + 20))
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        assert await harness.relay.on_packets([packet]) == [AckStatus.ACCEPTED]
        await trio.sleep_until(clock.to_trio(T0 + 19))
        assert await harness.relay.on_packets([packet]) == [AckStatus.REJECTED]  # still a replay in its window
        await trio.sleep_until(clock.to_trio(T0 + 40))  # the window is over: the tag protects nothing
        nursery.cancel_scope.cancel()
    assert harness.store.tag_count() == 0 and harness.relay.replay_tags == 0
    # The copy is refused anyway, as late; nothing is held for it.
    assert await harness.relay.on_packets([packet]) == [AckStatus.REJECTED]
    assert harness.relay.counters.dropped["late"] == 1 and harness.store.tag_count() == 0


def round_directory(spans: list[tuple[int, int]], hops: list[tuple[bytes, NodeAddress]]) -> NextHopDirectory:
    """A directory as a verified manifest makes it: next hops and the round's phases."""
    directory = NextHopDirectory()
    directory.replace_source("round", [DirectoryEntry(n, a.host, a.port) for n, a in hops], spans)
    return directory


async def test_windows_outside_every_known_round_are_refused_busy_and_take_nothing(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    directory = round_directory([(T0, T0 + 500)], [(node_id_of(NEXT_PUBLIC), NEXT_HOP)])
    harness = Harness(tmp_path, WallClock.starting_at(T0), directory=directory)
    inside = harness.packet(1, ReleaseWindow(T0 + 100, T0 + 200))
    outside = harness.packet(2, ReleaseWindow(T0 + 1000, T0 + 1100))  # within max_hold, in no round
    assert await harness.relay.on_packets([inside, outside]) == [AckStatus.ACCEPTED, AckStatus.BUSY]
    assert harness.relay.counters.dropped["unknown-window"] == 1
    assert harness.relay.holdings.held == 1 and harness.store.tag_count() == 1


async def test_an_unknown_next_hop_is_answered_busy_so_the_sender_retries(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Issue 13: REJECTED made upstream relays drop packets for good while a restarted relay's directory was empty."""
    directory = round_directory([(T0, T0 + 500)], [])
    harness = Harness(tmp_path, WallClock.starting_at(T0), directory=directory)
    packet = harness.packet(1, ReleaseWindow(T0 + 100, T0 + 200))
    assert await harness.relay.on_packets([packet]) == [AckStatus.BUSY]
    assert harness.relay.counters.dropped["unknown-next-hop"] == 1 and harness.store.tag_count() == 0
    # Once the directory knows the next hop, the same packet (resent) is taken.
    directory.replace_source("round", [DirectoryEntry(node_id_of(NEXT_PUBLIC), NEXT_HOP.host, NEXT_HOP.port)],
                             [(T0, T0 + 500)])
    assert await harness.relay.on_packets([packet]) == [AckStatus.ACCEPTED]


async def test_batches_of_two_connections_take_turns_and_a_packet_on_both_is_taken_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A flood's batch yields between slices (issue 13 fairness), so two connections' batches are checked
    at once: a packet in both is still accepted once, before either commits."""
    harness = Harness(tmp_path, WallClock.starting_at(T0))
    window = ReleaseWindow(T0 + 10, T0 + 20)
    twin = harness.packet(99, window)
    flood = [twin] + [harness.packet(i, window) for i in range(160)]
    results: dict[str, list[AckStatus]] = {}
    checked_when_done: dict[str, int] = {}

    async def send(name: str, frames: list[bytes]) -> None:
        results[name] = await harness.relay.on_packets(frames)
        checked_when_done[name] = harness.relay.counters.received

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send, "flood", flood)
        while harness.relay.counters.received == 0:  # the flood's first slice (the twin in it) is checked
            await trio.lowlevel.checkpoint()
        nursery.start_soon(send, "honest", [twin, harness.packet(100, window)])
    # The short batch did not wait for the whole flood (ten slices of 16); the twin, accepted by the flood's
    # batch but not yet committed, is a replay in the other.
    assert checked_when_done["honest"] < len(flood) + 2 - 16
    assert results["flood"] == [AckStatus.ACCEPTED] * 161 and results["honest"] == [AckStatus.REJECTED, AckStatus.ACCEPTED]
    assert harness.relay.holdings.held == 162 and harness.relay.counters.dropped["replay"] == 1


async def test_a_peer_packet_waits_for_a_few_flooding_slices_not_a_batch_of_each_network(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Issue 25 (relay-junk-tokens): batches from 16 flooding networks were checked in the order trio ran
    their connections, so a peer's packet waited for a slice of each; now turns are fair per network."""
    harness = Harness(tmp_path, WallClock.starting_at(T0))
    late = [harness.packet(i, ReleaseWindow(T0 - 60, T0 - 1)) for i in range(64)]
    window = ReleaseWindow(T0 + 10, T0 + 20)
    waited: list[int] = []

    async def flood(source: str) -> None:
        while True:
            await harness.relay.on_packets(late, source)

    async def peer(index: int, before: int) -> None:
        assert await harness.relay.on_packets([harness.packet(1000 + index, window)], "127.0.0.1") == [
            AckStatus.ACCEPTED]
        waited.append(harness.relay.counters.received - before - 1)

    async with trio.open_nursery() as nursery:
        for network in range(1, 17):
            nursery.start_soon(flood, f"127.{network}.0.1")
        for index in range(8):
            under_way = harness.relay.counters.received + 16 * 64
            while harness.relay.counters.received < under_way:  # the floods check a batch each meanwhile
                await trio.lowlevel.checkpoint()
            async with trio.open_nursery() as peers:
                # Counted from when its connection's task is woken, as by the arrival of its frame.
                peers.start_soon(peer, index, harness.relay.counters.received)
        nursery.cancel_scope.cancel()
    # A few flooding slices (16 frames each: those granted before its task ran, one before each of its own
    # turns, its slice and its commit; 32-64 frames measured), not a batch of each network's: 176-640 before.
    assert len(waited) == 8 and max(waited) <= 4 * 16, waited


async def test_next_hops_of_two_connections_batches_count_together_before_either_commits(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Before, a batch counted only its own uncommitted next hops: two batches checked at once could
    each add a new one, and max_neighbours was exceeded."""
    harness = Harness(tmp_path, WallClock.starting_at(T0), max_neighbours=2)
    window = ReleaseWindow(T0 + 10, T0 + 20)
    hops = [NodeAddress("127.0.0.1", 9100 + i) for i in range(3)]
    # Slices of 16: the second batch's first slice (a new next hop) is checked before the first batch's
    # last slice (another new one), and the second commits only after the first.
    first = [harness.packet(i, window, next_hop=hops[0]) for i in range(48)]
    first += [harness.packet(100 + i, window, next_hop=hops[2]) for i in range(16)]
    second = [harness.packet(200 + i, window, next_hop=hops[1]) for i in range(64)]
    results: dict[str, list[AckStatus]] = {}

    async def send(name: str, frames: list[bytes]) -> None:
        results[name] = await harness.relay.on_packets(frames)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send, "first", first)
        while harness.relay.counters.received == 0:
            await trio.lowlevel.checkpoint()
        nursery.start_soon(send, "second", second)
    assert results["first"] == [AckStatus.ACCEPTED] * 48 + [AckStatus.REJECTED] * 16
    assert results["second"] == [AckStatus.ACCEPTED] * 64
    assert set(harness.relay.holdings.neighbours) == {(h.host, h.port) for h in hops[:2]}
    assert harness.relay.counters.dropped["too-many-neighbours"] == 16


def test_every_sphinx_refusal_has_its_own_drop_reason_spelled_one_way() -> None:
    """Issue 10: crypto's reasons (bad_mac) and the relay's (unknown-next-hop) shared one label set in two spellings."""
    import anonml.crypto as crypto
    from anonml.relay import DropReason

    kinds = [getattr(crypto, name) for name in ("WrongLength", "BadMac", "BadGroupElement", "BadRoutingInfo",
                                                "BadPayload", "ReplayedPacket")]
    reasons = {DropReason.from_packet_error(kind("x")) for kind in kinds}
    assert len(reasons) == len(kinds) and DropReason.INVALID_PACKET not in reasons
    assert all("_" not in reason for reason in DropReason)


def test_a_source_that_overspends_its_refusals_waits_and_others_do_not() -> None:
    from anonml.relay._budget import RefusalBudget

    budget = RefusalBudget(rate=50.0, burst=200)
    assert budget.delay("flood", 0.0) == 0.0
    budget.spend("flood", 300, 0.0)  # 100 beyond the burst: two seconds at 50 per second
    assert budget.delay("flood", 0.0) == 2.0 and budget.delay("flood", 1.0) == 1.0
    assert budget.delay("flood", 2.0) == 0.0 and budget.delay("honest", 0.0) == 0.0
    budget.spend("flood", 100, 2.0)  # refills only to zero, then spends again
    assert budget.delay("flood", 2.0) == 2.0


def test_the_refusal_budget_remembers_a_bounded_number_of_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond its bound the sources quiet longest are forgotten, even in debt: memory stays bounded
    whatever number of addresses a flood comes from (before, only full buckets were forgotten)."""
    import anonml.relay._budget as budget_module

    monkeypatch.setattr(budget_module, "_MAX_SOURCES", 4)
    budget = budget_module.RefusalBudget(rate=1.0, burst=10)
    for second in range(10):
        budget.spend(f"10.0.0.{second}", 20, float(second))  # 10 beyond the burst: 10 s of debt each
    # The four latest still owe what they spent; the six before them are forgotten (a fresh bucket).
    assert [budget.delay(f"10.0.0.{second}", 9.0) for second in range(10)] == [0.0] * 6 + [7.0, 8.0, 9.0, 10.0]


async def test_a_round_is_forgotten_an_hour_after_its_last_window(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Its next hops and phases leave the directory, and its manifest the store (relay._server._ROUND_GRACE_SECONDS)."""
    from test_manifest import SIGNING_KEY, fixed_manifest

    from anonml.protocol import SignedManifest

    signed = SignedManifest.sign(fixed_manifest(), SIGNING_KEY)
    end = signed.manifest.schedule.end
    directory = NextHopDirectory()
    clock = WallClock.starting_at(end)
    harness = Harness(tmp_path, clock, directory=directory)
    harness.relay.learn_round("http://aggregator", signed)
    known = {f"round {signed.round_id.hex()[:16]} from http://aggregator": 4}  # three relays and the final hop
    assert directory.sources() == known and len(harness.store.manifests()) == 1
    # A neighbour's share of the held packets divides the queue among its relays, not its final hop.
    assert harness.relay.shares.per_neighbour() == harness.config.max_held_packets // 3
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        await trio.sleep_until(clock.to_trio(end + 3600 - 1))
        assert directory.sources() == known  # still inside the grace
        await trio.sleep_until(clock.to_trio(end + 3600 + 11))  # past it, and one expiry tick later
        nursery.cancel_scope.cancel()
    assert directory.sources() == {} and harness.store.manifests() == []


async def test_a_burst_for_one_next_hop_goes_out_in_full_batches_whichever_task_takes_it() -> None:
    """A next hop's pipelined forwarding tasks all wait on one channel. Each used to take the first packet
    trio handed it and then what was left: a released burst went out as one batch of one packet per other
    waiting task and one of the rest (bench relay: the last relay's median batch was one packet), each a
    link round trip and a commit at the next hop. They take turns gathering now."""
    send, receive = trio.open_memory_channel[HeldPacket](math.inf)
    gathering = trio.Lock()
    batches: list[int] = []

    async def forward_batches() -> None:
        while batch := await gather_batch(receive, gathering, 8):
            batches.append(len(batch))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(forward_batches)
        await trio.testing.wait_all_tasks_blocked()
        for row in range(20):
            send.send_nowait(HeldPacket(row, 0.0, 1.0, "127.0.0.1", 9000, b""))
        await trio.testing.wait_all_tasks_blocked()
        await send.aclose()
    assert batches == [8, 8, 4]
