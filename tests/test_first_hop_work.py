"""First-hop work (issue 25: junk that costs the attacker, not the honest): a relay asks work of each frame
from a sender that is not a listed neighbour, more while its first-hop intake is busy, checks it before
the Sphinx unwrap, and a peer's link client pays what is asked (protocol._work, relay._work)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

import anonml.relay._server as relay_server
from anonml.crypto import ReleaseWindow
from anonml.protocol import STAMP_BYTES, solve_stamp, stamp_work
from anonml.relay import RelayCounters, WallClock
from anonml.relay._work import (
    FALL_SECONDS,
    FIRST_BITS,
    GRACE_SECONDS,
    INTERVAL,
    RAISE_BITS,
    FirstHopWork,
)
from anonml.transport import (
    HELLO_REPLY_BYTES,
    AckStatus,
    FixedWork,
    LinkClient,
    LinkError,
    LinkSessionStats,
    MemoryNetwork,
    encode_hello,
    parse_acks,
    receive_exactly,
    serve_link,
)
from anonml.transport._link import encode_acks, parse_acks_and_work, reply_work

from test_relay_windows import GEOMETRY, T0, Harness

RELAY = ("10.9.0.1", 9000)
WINDOW = ReleaseWindow(T0 + 10, T0 + 20)


class FakeTime:
    """A settable clock for the work level (its backlog is averaged over it)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def interval(work: FirstHopWork, time: FakeTime, backlog: int) -> int:
    """One INTERVAL with ``backlog`` first-hop batches inside the intake throughout; the level after it."""
    with contextlib.ExitStack() as batches:
        for _ in range(backlog):
            batches.enter_context(work.inside())
        time.now += INTERVAL
        return work.bits()


def loaded_work(bits: int, counters: RelayCounters | None = None) -> tuple[FirstHopWork, FakeTime]:
    """A work level driven up to ``bits`` by a busy intake (whole intervals of it)."""
    time = FakeTime()
    work = FirstHopWork(lambda node: False, counters if counters is not None else RelayCounters(), max_bits=bits,
                        now=time)
    work.bits()
    while interval(work, time, 8) < bits:
        pass
    while work.passing_bits() < bits:  # a steady load: the level holds, past the grace of the last rise
        interval(work, time, 2)
    return work, time


def counting_unwraps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The relay's real Sphinx processing, counted."""
    calls = [0]
    real = relay_server.process_packet

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(relay_server, "process_packet", counted)
    return calls


def test_the_work_asked_rises_while_the_intake_is_busy_and_falls_back_when_calm() -> None:
    time = FakeTime()
    top = FIRST_BITS + 3 * RAISE_BITS
    work = FirstHopWork(lambda node: False, RelayCounters(), max_bits=top, now=time)
    assert work.bits() == 0
    assert interval(work, time, 3) == 0  # a backlog under RAISE_BACKLOG (4) asks nothing
    levels = [interval(work, time, 5) for _ in range(6)]
    # From 0 straight to FIRST_BITS, then RAISE_BITS per loaded interval, up to max_bits.
    assert levels == [FIRST_BITS, FIRST_BITS + RAISE_BITS, FIRST_BITS + 2 * RAISE_BITS, top, top, top]
    # Between FALL_BACKLOG (1) and RAISE_BACKLOG the level holds.
    assert [interval(work, time, 2) for _ in range(8)] == [top] * 8
    # A quiet intake: one bit per FALL_SECONDS, down to 0.
    assert [interval(work, time, 0) for _ in range(int(FALL_SECONDS / INTERVAL))][-1] == top - 1
    time.now += 100 * FALL_SECONDS
    assert work.bits() == 0


def test_a_rise_keeps_the_previous_level_passing_for_the_grace_period() -> None:
    time = FakeTime()
    work = FirstHopWork(lambda node: False, RelayCounters(), max_bits=20, now=time)
    work.bits()
    assert interval(work, time, 8) == FIRST_BITS and work.passing_bits() == 0
    assert interval(work, time, 8) == FIRST_BITS + RAISE_BITS and work.passing_bits() == FIRST_BITS
    time.now += GRACE_SECONDS * 0.9  # the intake idles: the level holds (less than FALL_SECONDS of calm)
    assert work.passing_bits() == FIRST_BITS
    time.now += GRACE_SECONDS * 0.2
    assert work.passing_bits() == work.bits() == FIRST_BITS + RAISE_BITS


def test_only_listed_neighbours_are_spared_the_work() -> None:
    neighbour = os.urandom(32)
    work = FirstHopWork(lambda node: node == neighbour, RelayCounters(), max_bits=20)
    assert not work.asks_work(neighbour)
    assert work.asks_work(None) and work.asks_work(os.urandom(32))  # anonymous, or a key nobody lists
    with pytest.raises(ValueError, match="max_bits"):
        FirstHopWork(lambda node: False, RelayCounters(), max_bits=64)


def test_a_stamp_proves_its_work_only_for_its_packet_and_session() -> None:
    context, packet = os.urandom(32), os.urandom(512)
    stamp = solve_stamp(context, packet, 12)
    assert stamp_work(context, packet, stamp) >= 12
    others = [stamp_work(context, os.urandom(512), stamp) for _ in range(64)]
    others += [stamp_work(os.urandom(32), packet, stamp) for _ in range(64)]
    # Each other (packet, context) is a fresh hash: 12 bits by chance has odds 1 in 4096 per try.
    assert sum(bits >= 12 for bits in others) <= 2
    with pytest.raises(ValueError, match="context"):
        solve_stamp(b"short", packet, 1)


def test_more_work_acks_name_the_bits_and_other_bytes_are_refused() -> None:
    data = encode_acks([AckStatus.ACCEPTED, AckStatus.MORE_WORK, AckStatus.BUSY], 17)
    assert data == bytes([1, 0x40 | 17, 3])
    assert parse_acks_and_work(data) == ([AckStatus.ACCEPTED, AckStatus.MORE_WORK, AckStatus.BUSY], 17)
    with pytest.raises(LinkError):
        parse_acks(bytes([0x80]))


async def _served_relay(harness: Harness, nursery: trio.Nursery, network: MemoryNetwork) -> None:
    listeners = await network.listen(*RELAY)
    harness.start(nursery)
    nursery.start_soon(partial(trio.serve_listeners, harness.relay.handle_connection, listeners,
                               handler_nursery=nursery))


def _client(network: MemoryNetwork, **options: Any) -> LinkClient:
    return LinkClient(*RELAY, packet_size=GEOMETRY.packet_size, geometry_hash=GEOMETRY.canonical_hash(),
                      network=network, local_address="192.0.2.7", **options)


async def test_frames_short_of_the_work_are_refused_before_any_sphinx_work_and_a_paying_peer_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On main, a relay unwrapped every frame (no stamp was asked): the refused client's packets were
    accepted, and unwrapped."""
    unwraps = counting_unwraps(monkeypatch)
    harness = Harness(tmp_path, WallClock.starting_at(T0))
    harness.relay.work, _ = loaded_work(14, harness.relay.counters)
    network = MemoryNetwork()
    packets = [harness.packet(index, WINDOW) for index in range(3)]
    async with trio.open_nursery() as nursery:
        await _served_relay(harness, nursery, network)
        # A client that does no work: its stamps are refused before the unwrap (unless one does 14 bits by
        # chance: odds 3 in 2**14 for the three).
        stingy = _client(network, max_work_bits=0)
        assert await stingy.send_batch(packets, give_up_at=trio.current_time() + 5) == [AckStatus.BUSY] * 3
        await stingy.aclose()
        assert unwraps[0] == 0 and harness.relay.counters.dropped["insufficient-work"] == 3
        peer = _client(network)
        assert await peer.send_batch(packets, give_up_at=trio.current_time() + 30) == [AckStatus.ACCEPTED] * 3
        await peer.aclose()
        nursery.cancel_scope.cancel()
    assert peer.work_bits == 14 and peer.stamps == 3 and peer.stamping_seconds > 0 and unwraps[0] == 3
    assert harness.relay.counters.work_bits == 14


async def test_a_stamp_moved_onto_another_packet_is_refused_unwrapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stamp paid for one packet, sent with another on the same session, is answered MORE_WORK without
    an unwrap; the packet it was paid for is taken once (again, it is a Sphinx replay). On main the
    hello reply named no work and frames carried no stamp."""
    unwraps = counting_unwraps(monkeypatch)
    harness = Harness(tmp_path, WallClock.starting_at(T0))
    harness.relay.work, _ = loaded_work(8, harness.relay.counters)
    network = MemoryNetwork()
    paid, others = harness.packet(1, WINDOW), [harness.packet(index, WINDOW) for index in range(2, 6)]
    async with trio.open_nursery() as nursery:
        await _served_relay(harness, nursery, network)
        stream = await network.connect(*RELAY, local_address="192.0.2.7")
        await stream.send_all(encode_hello(GEOMETRY.packet_size, GEOMETRY.canonical_hash()))
        context, asked = reply_work(await receive_exactly(stream, HELLO_REPLY_BYTES))
        assert asked == 8
        stamp = solve_stamp(context, paid, 8)
        # A packet this stamp does no 8 bits of work for (any one of them, but with odds 1 in 256).
        other = next(packet for packet in others if stamp_work(context, packet, stamp) < 8)
        acks = []
        for frame in (other + stamp, paid + stamp, paid + stamp):
            await stream.send_all(frame)
            acks.append((await receive_exactly(stream, 1))[0])
        await stream.aclose()
        nursery.cancel_scope.cancel()
    assert acks == [0x40 | 8, AckStatus.ACCEPTED, AckStatus.REJECTED]
    assert unwraps[0] == 2 and harness.relay.counters.dropped["insufficient-work"] == 1
    assert harness.relay.counters.dropped["replay"] == 1


async def test_a_peer_stamps_with_the_work_asked_and_restamps_on_the_same_connection_when_it_rises() -> None:
    """The client pays the hello's level; when the server asks more, its MORE_WORK ack names the level and
    the client re-stamps and resends those packets on the same connection."""
    network = MemoryNetwork()
    listeners = await network.listen(*RELAY)
    demand = FixedWork(0)
    size = GEOMETRY.packet_size
    received: list[tuple[int, int]] = []  # (work done, work asked) per frame the server took

    async def handler(stream: Any) -> None:
        session = LinkSessionStats()

        async def on_packets(frames: list[bytes]) -> Sequence[AckStatus]:
            assert session.work_context is not None and all(len(frame) == size + STAMP_BYTES for frame in frames)
            statuses = []
            for frame in frames:
                done = stamp_work(session.work_context, frame[:size], frame[size:])
                received.append((done, demand.level))
                statuses.append(AckStatus.ACCEPTED if done >= demand.level else AckStatus.MORE_WORK)
            return statuses

        await serve_link(stream, on_packets, packet_size=size, geometry_hash=GEOMETRY.canonical_hash(),
                         stats=session, work=demand)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trio.serve_listeners, handler, listeners, handler_nursery=nursery))
        client = _client(network)
        first = [os.urandom(size) for _ in range(3)]
        assert await client.send_batch(first, give_up_at=trio.current_time() + 5) == [AckStatus.ACCEPTED] * 3
        demand.level = 12  # the stamps it made for 0 bits do 12 by chance with odds 1 in 4096 each
        second = [os.urandom(size) for _ in range(2)]
        assert await client.send_batch(second, give_up_at=trio.current_time() + 5) == [AckStatus.ACCEPTED] * 2
        assert client.connects == 1 and client.work_bits == 12
        demand.level = 30  # more than the client pays (its cap, 2**20 hashes): busy, not chased
        assert await client.send_batch([os.urandom(size)], give_up_at=trio.current_time() + 5) == [AckStatus.BUSY]
        await client.aclose()
        nursery.cancel_scope.cancel()
    accepted = [(done, asked) for done, asked in received if done >= asked]
    assert len(accepted) == 5 and all(asked in (0, 12) for _, asked in accepted)
    assert sum(1 for done, asked in received if asked == 12 and done < 12) == 2  # each re-stamped once


def test_relay_config_refuses_more_work_than_a_peer_pays(tmp_path: Path) -> None:
    from anonml.relay import RelayConfig, RelayConfigError

    with pytest.raises(RelayConfigError, match="max_work_bits"):
        RelayConfig(data_dir=tmp_path, listen=("127.0.0.1", 0), max_work_bits=21)

