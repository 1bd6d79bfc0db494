"""First-hop work in the round simulator: a stamp takes its wall time on the virtual clock, and colluding
first relays that ask one target alone for the most work its client pays (``anonml.simulate._work``)
neither stall the round nor link the target's reports."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import trio
import trio.testing

from anonml.base.threads import blocking_work_inline
from anonml.protocol import STAMP_BYTES, stamp_seconds, stamp_work
from anonml.simulate import RandomStrategy, SimulationConfig, estimate, peer_ip, simulate_round
from anonml.simulate._work import FirstHopWork
from anonml.transport import AckStatus, FixedWork, LinkClient, LinkSessionStats, MemoryNetwork, serve_link

from test_relay_windows import GEOMETRY

RELAY = ("10.9.0.1", 9000)


def _send_stamped(bits: int, packets: int) -> tuple[float, list[AckStatus | None], list[int]]:
    """Send ``packets`` to a server asking ``bits``, on the simulator's clock: the virtual seconds the send took,
    its statuses, and the work each frame the server took did."""
    size = GEOMETRY.packet_size
    done: list[int] = []

    async def main() -> tuple[float, list[AckStatus | None]]:
        network = MemoryNetwork()
        listeners = await network.listen(*RELAY)

        async def handler(stream: Any) -> None:
            session = LinkSessionStats()

            async def on_packets(frames: list[bytes]) -> Sequence[AckStatus]:
                assert session.work_context is not None
                done.extend(stamp_work(session.work_context, f[:-STAMP_BYTES], f[-STAMP_BYTES:]) for f in frames)
                return [AckStatus.ACCEPTED] * len(frames)

            await serve_link(stream, on_packets, packet_size=size, geometry_hash=GEOMETRY.canonical_hash(),
                             stats=session, work=FixedWork(bits))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(trio.serve_listeners, handler, listeners, handler_nursery=nursery))
            client = LinkClient(*RELAY, packet_size=size, geometry_hash=GEOMETRY.canonical_hash(), network=network,
                                local_address="192.0.2.7")
            await client.send_batch([os.urandom(size)], give_up_at=trio.current_time() + 60)  # the connection, unstamped time
            started = trio.current_time()
            statuses = await client.send_batch([os.urandom(size) for _ in range(packets)], give_up_at=started + 60)
            elapsed = trio.current_time() - started
            await client.aclose()
            nursery.cancel_scope.cancel()
        return elapsed, statuses

    with blocking_work_inline():
        elapsed, statuses = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return elapsed, statuses, done


def test_a_stamp_takes_its_wall_time_on_the_simulators_clock() -> None:
    # Before, the client hashed in a thread: under the simulator's autojumping clock a task waiting on a
    # thread is blocked, so virtual time jumped to whatever deadline came next (here the link's ack timeout:
    # the send failed), and run inline it would have taken no time at all. Now each stamp costs its
    # modelled time, the same on every run: 2**14 hashes at the reference rate, twice.
    elapsed, statuses, done = _send_stamped(14, 2)
    assert statuses == [AckStatus.ACCEPTED] * 2
    assert len(done) == 3 and all(work >= 14 for work in done[1:])
    assert 2 * stamp_seconds(14) <= elapsed < 2 * stamp_seconds(14) + 0.01
    assert stamp_seconds(20) == 1.0 and stamp_seconds(0) == 0.0


def test_colluding_first_relays_that_make_one_peer_work_move_its_sends_but_do_not_link_its_reports() -> None:
    # Seed 1's target meets colluding relay 0 as first hop (8 peers, 4 relays, 3-relay paths; relays 0 and 1
    # collude). 16 bits keep the test's hashing cheap (2**16 per stamp, 1/16 s modelled); the named strategy
    # asks the client's cap, 20.
    target = 1
    work = FirstHopWork([peer_ip(target)], bits=16)
    trace = simulate_round(replace(SimulationConfig(peers=8), seed=1), work)
    assert trace.outcome == "done"
    frames = [f for f in trace.view.frames if f.source == peer_ip(target)]
    assert frames and {f.relay for f in frames} <= {0, 1} and all(f.work_bits == 16 for f in frames)
    assert not [f for f in trace.view.frames if f.source != peer_ip(target)], "only the target's links are taken"
    # Each packet refused four times, then taken: five stamps, each its modelled time after the one before
    # (with the client hashing in a thread, the clock jumped 0.46 to 51 s between them, a different jump each).
    assert work.refused and set(work.refused.values()) == {4}
    times = sorted(f.at for f in frames)
    restamped = [b - a for a, b in zip(times, times[1:]) if abs(b - a - stamp_seconds(16)) < 1e-3]
    assert len(restamped) == 4 * len(work.refused)
    # Every report of the target's (and everyone's) still arrives, once.
    result = trace.peers[target].result
    assert result is not None and result.acknowledged == result.packets > 0 and result.missing == 0
    assert len(trace.arrivals) == sum(p.result.packets for p in trace.peers if p.result is not None)
    success, reports = estimate(trace, target)
    assert reports == result.packets
    # The rules that know of the work guess among half a partition or a quarter of a window's reports: not one.
    assert success["after-work"] and max(success["after-work"] + success["late-after-work"]) < 1.0


def test_the_random_search_draws_first_hop_work_where_no_relay_drops() -> None:
    drawn = [RandomStrategy([peer_ip(0)], seed) for seed in range(60)]
    workers = [d.worker for d in drawn if d.worker is not None]
    assert 10 < len(workers) < 30 and not [d for d in drawn if d.worker is not None and d.dropper is not None]
    assert all(isinstance(w, FirstHopWork) and 12 <= w.bits <= 20 for w in workers)
    assert {w.refusals for w in workers} == set(range(5)) and any(w.hold > 0 for w in workers)


def test_a_first_relay_that_holds_its_refusals_cannot_push_a_retry_into_an_open_window() -> None:
    # Seed 1's target meets colluding relay 0 first; it refuses every stamp and holds each refusal until just
    # before the client's ack timeout, so the target's retry comes late. Before the rule, the retry reached an
    # honest first relay 0.2 s after that relay's window had opened and was released in what was left of it,
    # after an intake that followed the send. Now a packet not taken before its first relay's window opens
    # is not sent: every packet any peer sent was acknowledged before that window opened.
    from anonml.simulate._work import held_first_hop_work

    trace = simulate_round(replace(SimulationConfig(peers=8), seed=1), held_first_hop_work([peer_ip(1)]))
    assert trace.outcome == "done"
    manifest = trace.manifest.manifest
    sent = [s for p in trace.peers if p.result is not None for s in p.result.sent]
    assert sent and len({s.attempt for s in sent}) == 2
    late = [(s.sent_at - manifest.hop_windows(s.survey, s.attempt)[0].start, s.attempt) for s in sent
            if s.sent_at >= manifest.hop_windows(s.survey, s.attempt)[0].start]
    assert not late, f"taken after the first relay's window opened (seconds, window): {late}"
    # The target's reports that the work kept from their first relay still arrive: resent in the second window.
    result = trace.peers[1].result
    assert result is not None and result.missing == 0 and result.acknowledged == result.packets > 0
