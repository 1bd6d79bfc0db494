"""Fair turns at a CPU-bound intake (transport/_fair.py; issue 25): a light flow waits for at most
the slice being processed, however many slices flooding flows have queued."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from anonml.transport import FairTurns

SLICE = 16


async def _flood(turns: FairTurns, flow: str, log: list[str], slices: int) -> None:
    for _ in range(slices):
        async with turns.lane(flow).turn(SLICE):
            log.append(flow)


async def test_a_quiet_flow_goes_before_sixteen_flooding_ones() -> None:
    turns = FairTurns()
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        for index in range(16):
            nursery.start_soon(_flood, turns, f"flood-{index}", log, 50)
        while len(log) < 3 * 16:  # the floods are under way, each with a slice queued
            await trio.sleep(0)
        for _ in range(10):
            await trio.sleep(0)  # the floods have taken turns and queued more
            asked = len(log)
            async with turns.lane("honest").turn(1):
                # Granted after at most the turn already handed out when it asked.
                assert len(log) - asked <= 1
                log.append("honest")
    assert log.count("honest") == 10
    # Flooding flows share equally, in turns: any 16 consecutive flooding slices are one of each.
    floods = [flow for flow in log if flow != "honest"]
    assert len(floods) == 16 * 50
    assert all(len(set(floods[i : i + 16])) == 16 for i in range(len(floods) - 15))


async def test_a_flow_served_in_an_earlier_busy_period_starts_the_next_as_a_new_one() -> None:
    """Start-time fair queueing forgets every flow's tags when a busy period ends (Goyal, Vin and Cheng: V
    is then the largest finish tag served). Kept across idle spells, a flow's last finish tag stayed ahead
    of V, so its next batch counted as backlogged and waited behind a whole round of other flows'
    slices: in bench abuse's relay-junk-tokens, 479 of the honest /24's 481 batches at the relay, waiting
    up to 88 ms for a turn while no slice took more than 16 ms."""
    turns = FairTurns()
    log: list[str] = []
    async with turns.lane("honest").turn(1):
        log.append("honest")
    # The intake is idle. A new busy period: sixteen floods queue behind a turn that is held meanwhile.
    async with trio.open_nursery() as nursery:
        async with turns.lane("first").turn(1):
            for index in range(16):
                nursery.start_soon(_flood, turns, f"flood-{index}", log, 1)
            await trio.testing.wait_all_tasks_blocked()

            async def honest() -> None:
                async with turns.lane("honest").turn(1):
                    log.append("honest")

            nursery.start_soon(honest)
            await trio.testing.wait_all_tasks_blocked()
            log.append("first")
    assert log[:3] == ["honest", "first", "honest"], log[:4]


async def test_a_cancelled_waiter_passes_its_turn_on_and_is_skipped() -> None:
    turns = FairTurns()
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        async with turns.lane("a").turn(1):
            cancelled = trio.CancelScope()

            async def waiter() -> None:
                with cancelled:
                    async with turns.lane("b").turn(1):
                        log.append("b")

            nursery.start_soon(waiter)
            nursery.start_soon(_flood, turns, "c", log, 1)
            await trio.testing.wait_all_tasks_blocked()
            cancelled.cancel()
            await trio.testing.wait_all_tasks_blocked()
    assert log == ["c"]
    # Nothing is left holding the intake.
    with trio.move_on_after(1) as timeout:
        async with turns.lane("d").turn(1):
            pass
    assert not timeout.cancelled_caught


async def test_a_turn_must_cost_something() -> None:
    with pytest.raises(ValueError, match="cost must be positive"):
        async with FairTurns().lane("a").turn(0):
            pass
