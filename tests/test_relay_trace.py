"""The loopback demo's relay packet trace (``relay._trace``): one intake line per packet taken in,
naming the frame and the packet it became, and one line when the next hop took that packet; off unless
asked for."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import trio
import trio.testing

from anonml.crypto import ReleaseWindow
from anonml.relay import WallClock
from anonml.relay._trace import PacketTrace, TracingRelay
from anonml.transport import AckStatus
from test_relay_windows import T0, Harness


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_a_tracing_relay_names_each_packet_in_and_out_with_its_times(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    clock = WallClock.starting_at(T0)
    trace_path = tmp_path / "trace.jsonl"
    trace = PacketTrace(trace_path)
    harness = Harness(tmp_path, clock, relay_class=functools.partial(TracingRelay, trace=trace))
    window = ReleaseWindow(T0 + 10, T0 + 20)
    frames = [harness.packet(i, window) for i in range(40)]
    late = harness.packet(99, ReleaseWindow(T0 - 20, T0 - 10))
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        assert await harness.relay.on_packets([*frames, late]) == [AckStatus.ACCEPTED] * 40 + [AckStatus.REJECTED]
        await trio.sleep_until(clock.to_trio(window.end + 1))
        nursery.cancel_scope.cancel()
    trace.close()
    records = [json.loads(line) for line in trace_path.read_text().splitlines()]
    taken = [r for r in records if "in" in r]
    forwarded = {r["out"]: r["forwarded"] for r in records if "forwarded" in r}
    # Every accepted frame once (the refused one not at all), each naming the packet the next hop got.
    assert sorted(r["in"] for r in taken) == sorted(_sha(f) for f in frames)
    assert {r["out"] for r in taken} == set(forwarded) == {_sha(p) for p in harness.seen}
    for record in taken:
        assert record["taken_in"] == T0 and (record["window_start"], record["window_end"]) == (window.start, window.end)
        assert window.start <= record["release_at"] <= window.end
        assert record["release_at"] <= forwarded[record["out"]] <= window.end + 1


def test_relay_run_does_not_offer_the_trace_in_its_help() -> None:
    # A real operator must not come across it: the demo passes it by name.
    from click.testing import CliRunner

    from anonml.cli import main

    help_text = CliRunner().invoke(main, ["relay", "run", "--help"]).output
    assert "--data-dir" in help_text and "trace" not in help_text
