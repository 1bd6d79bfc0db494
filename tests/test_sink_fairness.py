"""Issue 25 at the sink: a colluding relay (a listed key, through the handshake) floods junk; the other
relays' packets are not held behind it. Real SQLite, real sockets on loopback, the real verifier."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
import trio
from click.testing import CliRunner
from test_aggregator import RELAY_IDENTITIES, credentialed_peers, make_round, relay_client

from anonml.aggregator import AggregatorConfig, InboxLimits, IssuerWorkers, PacketSink, RoundState, serve_aggregator
from anonml.base.errors import ConfigError
from anonml.crypto import JobRefused, TokenJob
from anonml.protocol import SurveyId
from anonml.testing import SettableClock
from anonml.transport import TCP_NETWORK, AckStatus, LinkClient, listening_address, serve_streams

T0 = 1_800_000_000
COLLUDER, HONEST = 0, 1  # indexes into RELAY_IDENTITIES


class CountingWorkers(IssuerWorkers):
    """The real verifier, counting the tokens it is asked to verify."""

    tokens = 0

    def verify(self, jobs: list[TokenJob]) -> list[bytes | JobRefused]:
        self.tokens += len(jobs)
        return super().verify(jobs)


def packets(state: RoundState, clock: SettableClock, junk: int) -> tuple[bytes, list[bytes]]:
    """One honest packet straight to the sink, and ``junk`` packets whose final layers are authentic and
    whose tokens parse and fail their proofs (one peer's token, a byte flipped; distinct replay tags)."""
    peers = credentialed_peers(state, clock)
    data = state.manifest.schedule.data
    clock.now = data.t_s + data.delta + 1
    rng = np.random.default_rng(25)
    oracle = state.data_oracle(peers[0].partition, 0)
    report = oracle.encode_report(oracle.privatize(np.array([1]), rng)[0])
    honest, forger = peers[0], peers[1]
    forged = forger.message(SurveyId.data(state.round_id, forger.partition, 0), report, tamper=True)
    survey = SurveyId.data(state.round_id, forger.partition, 0)
    return (honest.packet(SurveyId.data(state.round_id, honest.partition, 0), report),
            [forger.packet_carrying(survey, forged) for _ in range(junk)])


async def send(client: LinkClient, frames: list[bytes]) -> list[AckStatus | None]:
    return await client.send_batch(frames, give_up_at=trio.current_time() + 30)


@asynccontextmanager
async def relays_to(sink: PacketSink, verifying: bool = True) -> AsyncIterator[tuple[LinkClient, LinkClient]]:
    """The sink served on loopback (verifying meanwhile, unless not ``verifying``), and the colluding and
    the honest relay's links to it."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_streams, TCP_NETWORK, sink.handle, "127.0.0.1", 0)
        if verifying:
            nursery.start_soon(sink.verify_forever)
        address = listening_address(listeners)
        colluder, relay = relay_client(address, sink.state, COLLUDER), relay_client(address, sink.state, HONEST)
        try:
            yield colluder, relay
        finally:
            await colluder.aclose()
            await relay.aclose()
            nursery.cancel_scope.cancel()


async def test_a_quiet_relays_packet_is_accepted_before_a_flooding_relays_backlog_drains(tmp_path: Path) -> None:
    """Before: one verifier took the inbox in arrival order, so the honest packet waited for every junk
    token ahead of it (accepted only once the inbox had drained)."""
    clock = SettableClock(T0 + 1)
    state, _ = make_round(tmp_path, clock)
    honest, junk = packets(state, clock, 600)
    sink = PacketSink(state, IssuerWorkers(state.secrets.issuer_key))
    async with relays_to(sink) as (colluder, relay):
        for offset in range(0, len(junk), 100):
            assert await send(colluder, junk[offset : offset + 100]) == [AckStatus.ACCEPTED] * 100
        assert await send(relay, [honest]) == [AckStatus.ACCEPTED]
        with trio.fail_after(30):
            while state.store.counts()["accepted"] == 0:
                await trio.sleep(0.002)
        # Accepted while much of the colluder's junk still waits for its verdict (its own backlog). The honest
        # packet's claim, opening and commit run beside the colluder's turns, so how much junk is verified
        # meanwhile grows with the machine's load: 164 of 300 in a loaded full run, hence 600 and a third.
        waiting = state.store.inbox_size()
        assert waiting >= 200, waiting
        with trio.fail_after(120):
            while state.store.inbox_size():
                await trio.sleep(0.05)
    assert state.store.counts()["accepted"] == 1
    assert state.store.rejections() == {"bad-token/bad-proof": 600}


async def test_a_relays_backlog_is_capped_and_only_that_relay_is_told_busy(tmp_path: Path) -> None:
    """Before: no cap per relay; one relay's junk could take the whole inbox, and then every relay got BUSY."""
    clock = SettableClock(T0 + 1)
    state, _ = make_round(tmp_path, clock)
    honest, junk = packets(state, clock, 8)
    sink = PacketSink(state, IssuerWorkers(state.secrets.issuer_key), inbox=InboxLimits(max_per_relay=5))
    async with relays_to(sink, verifying=False) as (colluder, relay), trio.open_nursery() as nursery:
        assert await send(colluder, junk[:6]) == [AckStatus.ACCEPTED] * 5 + [AckStatus.BUSY]
        assert await send(colluder, junk[6:]) == [AckStatus.BUSY] * 2  # refused before the final layer
        assert await send(relay, [honest]) == [AckStatus.ACCEPTED]
        assert sink.link_errors["relay-backlog-full"] == 3 and state.store.inbox_size() == 6
        # Once its backlog is verified, the colluder may deliver again (what got BUSY, resent).
        nursery.start_soon(sink.verify_forever)
        with trio.fail_after(30):
            while state.store.inbox_size():
                await trio.sleep(0.02)
        assert await send(colluder, junk[5:]) == [AckStatus.ACCEPTED] * 3
        nursery.cancel_scope.cancel()
    assert state.store.counts()["accepted"] == 1


async def test_the_cap_per_relay_is_set_in_the_aggregators_config(tmp_path: Path) -> None:
    """Before: ``max_inbox_per_relay`` was the sink's argument alone; ``aggregator run`` always served the default."""
    clock = SettableClock(T0 + 1)
    state, _ = make_round(tmp_path, clock)
    _, junk = packets(state, clock, 3)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(serve_aggregator, AggregatorConfig(state, inbox_limits=InboxLimits(max_per_relay=2)))
        colluder = relay_client(addresses.sink, state, COLLUDER)
        assert await send(colluder, junk) == [AckStatus.ACCEPTED] * 2 + [AckStatus.BUSY]
        await colluder.aclose()
        nursery.cancel_scope.cancel()


def test_the_cap_per_relay_is_an_equal_share_of_the_inbox_unless_set_and_bad_caps_are_refused(tmp_path: Path) -> None:
    state, _ = make_round(tmp_path, SettableClock(T0 + 1))
    workers = IssuerWorkers(state.secrets.issuer_key)
    assert len(state.manifest.relays) == 2
    assert PacketSink(state, workers, inbox=InboxLimits(max_inbox=11)).max_inbox_per_relay == 5
    assert PacketSink(state, workers, inbox=InboxLimits(max_inbox=11, max_per_relay=11)).max_inbox_per_relay == 11
    assert PacketSink(state, workers).max_inbox_per_relay == 250_000
    for bad, message in (({"max_per_relay": 0}, "max_inbox_per_relay must be between 1 and max_inbox"),
                         ({"max_inbox": 10, "max_per_relay": 11}, r"max_inbox \(10\), got 11"),
                         ({"max_inbox": 0}, "max_inbox must be at least 1, got 0")):
        with pytest.raises(ConfigError, match=message):
            InboxLimits(**bad)


def test_the_cli_refuses_a_cap_per_relay_above_the_inbox(tmp_path: Path) -> None:
    from anonml.aggregator import command

    result = CliRunner().invoke(command, ["worker", "--data-dir", str(tmp_path), "--name", "w",
                                          "--max-inbox-per-relay", "500001"])
    assert isinstance(result.exception, ConfigError) and "got 500001" in str(result.exception)


async def test_bad_mac_frames_are_refused_at_the_link_and_never_reach_the_verifier(tmp_path: Path) -> None:
    clock = SettableClock(T0 + 1)
    state, _ = make_round(tmp_path, clock)
    honest, _ = packets(state, clock, 0)
    workers = CountingWorkers(state.secrets.issuer_key)
    sink = PacketSink(state, workers)
    rng = np.random.default_rng(7)
    garbage = [rng.bytes(state.geometry.packet_size) for _ in range(512)]
    async with relays_to(sink) as (colluder, relay):
        for offset in range(0, len(garbage), 128):
            assert await send(colluder, garbage[offset : offset + 128]) == [AckStatus.REJECTED] * 128
        assert await send(relay, [honest]) == [AckStatus.ACCEPTED]
        with trio.fail_after(30):
            while state.store.counts()["accepted"] == 0 or sum(state.store.rejections().values()) < 512:
                await trio.sleep(0.02)
    assert workers.tokens == 1  # the honest packet's token alone
    assert state.store.rejections() == {"bad-packet": 512}
