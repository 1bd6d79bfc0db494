"""Issue 29: `relay run` and a piped `peer join` were silent for minutes at a time; each now says every minute
what it holds and where the round is (on trio's MockClock: no sleeping)."""

from __future__ import annotations

from collections import Counter
from functools import partial

import trio

from anonml.base.heartbeat import HEARTBEAT_SECONDS, heartbeat
from anonml.peer._cli import peer_heartbeat
from anonml.relay import RelayCounters
from anonml.relay._cli import relay_heartbeat
from test_manifest import T0, fixed_schedule


async def test_relay_run_says_each_minute_what_it_holds_and_forwarded(autojump_clock: trio.testing.MockClock) -> None:
    counters = RelayCounters(received=10, forwarded=7, held=3)
    lines: list[str] = []
    with trio.move_on_after(2.5 * HEARTBEAT_SECONDS):
        await heartbeat(partial(relay_heartbeat, counters), lines.append)
    assert len(lines) == 2
    assert "holding 3 packet(s)" in lines[0] and "received 10" in lines[0] and "forwarded 7" in lines[0]


async def test_a_quiet_peer_join_says_each_minute_where_the_round_is(autojump_clock: trio.testing.MockClock) -> None:
    events = Counter({"sent": 2, "acknowledged": 1})
    lines: list[str] = []
    with trio.move_on_after(1.5 * HEARTBEAT_SECONDS):
        await heartbeat(partial(peer_heartbeat, fixed_schedule(), events, T0 + 210), lines.append)
    assert len(lines) == 1
    assert "(data phase" in lines[0] and "2 packet(s) sent" in lines[0] and "1 receipt(s) found" in lines[0]
