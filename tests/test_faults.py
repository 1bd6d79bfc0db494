"""The fault benchmark's parts: the lossy proxy on real loopback sockets, the
seeded kill plan, the audit of prepared messages against accepted ones, and
what makes the bench fail."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import trio

from anonml.demo import Audit, audit
from anonml.bench._proxy import LinkFaults, LossyProxy, serve_lossy_proxy
from anonml.bench.faults import FaultPlan, failures, plan_faults, plan_kills
from anonml.peer import StoredPacket
from anonml.protocol import PhaseTimes, SurveyId, receipt_digest


async def serve_echo(received: list[int], *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    async def echo(stream: trio.SocketStream) -> None:
        received.append(0)
        try:
            while chunk := await stream.receive_some(65536):
                received[-1] += len(chunk)
                await stream.send_all(chunk)
        except trio.BrokenResourceError:
            pass

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(echo, listeners)


async def through_proxy(faults: LinkFaults, payload: bytes) -> tuple[bytes, str | None, list[int], LossyProxy]:
    """Send ``payload`` through a proxy to an echo server; what came back, any error, bytes the server got."""
    received: list[int] = []
    async with trio.open_nursery() as nursery:
        echo_port = await nursery.start(serve_echo, received)
        proxy = LossyProxy(("127.0.0.1", echo_port), faults, random.Random(1))
        proxy_port = await nursery.start(serve_lossy_proxy, proxy, 0)
        stream = await trio.open_tcp_stream("127.0.0.1", proxy_port)
        echoed, error = b"", None
        try:
            await stream.send_all(payload)
            await stream.send_eof()
            while chunk := await stream.receive_some(65536):
                echoed += chunk
        except (trio.BrokenResourceError, OSError) as exc:
            error = type(exc).__name__
        await stream.aclose()
        nursery.cancel_scope.cancel()
    return echoed, error, received, proxy


async def test_a_clean_or_delayed_link_passes_every_byte_both_ways() -> None:
    payload = bytes(range(256)) * 200
    echoed, error, received, proxy = await through_proxy(LinkFaults(delay=0.01), payload)
    assert error is None and echoed == payload and received == [len(payload)]
    assert proxy.counts.delayed_chunks >= 2 and proxy.counts.dropped == proxy.counts.reset == 0


async def test_a_dropped_link_reaches_nobody_and_answers_nothing() -> None:
    echoed, error, received, proxy = await through_proxy(LinkFaults(drop=1.0), b"x" * 5000)
    assert echoed == b"" and received == [] and proxy.counts.dropped == 1


async def test_a_reset_link_breaks_mid_stream() -> None:
    payload = b"y" * 100_000  # more than any reset point
    echoed, error, received, proxy = await through_proxy(LinkFaults(reset=1.0), payload)
    assert proxy.counts.reset == 1
    assert len(echoed) < len(payload) and sum(received) < len(payload)


def test_the_kill_plan_is_seeded_and_lands_the_stated_share_in_the_data_phase() -> None:
    targets = ["aggregator", "relay-0", "relay-1", "relay-2"]
    first = plan_kills(20, 10, (200.0, 300.0), targets, random.Random(7))
    again = plan_kills(20, 10, (200.0, 300.0), targets, random.Random(7))
    assert [(e.at, e.target) for e in first] == [(e.at, e.target) for e in again]
    assert len(first) == 20 and all(0 <= e.at < 300 for e in first)
    assert sum(1 for e in first if 200 <= e.at < 300) == 10
    assert all((e.planned == "data") == (e.at >= 200) for e in first)
    assert [e.at for e in first] == sorted(e.at for e in first)
    assert {e.target for e in first} == set(targets)
    assert all(e.at >= 200 for e in plan_kills(5, 5, (200.0, 300.0), targets, random.Random(1)))


def test_a_relay_killed_for_good_falls_in_the_first_attempt_and_later_kills_spare_it() -> None:
    now = time.time()
    data = PhaseTimes(t_s=int(now) + 100, delta=10, t_c=int(now) + 140, t_2=int(now) + 150, delta_2=10, t_r=int(now) + 200)
    relays = ["relay-0", "relay-1", "relay-2", "relay-3", "relay-4"]
    plan = FaultPlan(12, 0, 1.0, LinkFaults(), data_kills=6, relay_for_good=True)
    kills = plan_faults(plan, data, relays, [*relays, "aggregator"], random.Random(3))
    (gone,) = [e for e in kills if e.outcome == "for good"]
    assert gone.target in relays and 98 <= gone.at < 141 and gone.planned == "data, first attempt"
    restarted = [e for e in kills if e is not gone]
    assert len(restarted) == 12 and gone.target not in {e.target for e in restarted}
    assert sum(1 for e in restarted if e.at >= 98) == 6
    assert [e.at for e in kills] == sorted(e.at for e in kills)
    assert not any(e.outcome == "for good" for e in plan_faults(FaultPlan(4, 0, 1.0, LinkFaults()), data, relays,
                                                                [*relays, "aggregator"], random.Random(3)))


def test_a_plan_that_kills_workers_only_kills_each_of_them_and_nothing_else() -> None:
    now = time.time()
    data = PhaseTimes(t_s=int(now) + 100, delta=10, t_c=int(now) + 140, t_2=int(now) + 150, delta_2=10, t_r=int(now) + 200)
    plan = FaultPlan(20, 0, 1.0, LinkFaults(), data_kills=20, ingest_workers=2, kill_workers_only=True)
    kills = plan_faults(plan, data, [f"relay-{i}" for i in range(5)], ["ingest-0", "ingest-1"], random.Random(5))
    assert len(kills) == 20 and {e.target for e in kills} == {"ingest-0", "ingest-1"}
    assert all(e.planned == "data" and 98 <= e.at < 201 for e in kills)
    with pytest.raises(ValueError, match="ingest_workers"):
        FaultPlan(2, 0, 1.0, LinkFaults(), kill_workers_only=True)


def test_a_plan_cannot_put_more_kills_in_the_data_phase_than_it_has() -> None:
    with pytest.raises(ValueError, match="data_kills"):
        FaultPlan(3, 0, 1.0, LinkFaults(), data_kills=4)


def audited(lost: int = 0, counted_twice: int = 0, unknown: int = 0, acknowledged_lost: int = 0, prepared: int = 200) -> dict[str, Any]:
    found = Audit(prepared=prepared, accepted=prepared - lost, lost=lost, counted_twice=counted_twice,
                  unknown_accepted=unknown, peer_acknowledged_but_lost=acknowledged_lost)
    return {"audit": found.to_dict(), "peers": 100, "round": {"counts": {"registered": 100, "credentials": 100}}}


def test_the_bench_fails_on_one_lost_or_one_counted_twice_and_passes_a_clean_run() -> None:
    assert failures(audited()) == []
    assert failures(audited(lost=1)) == ["1 of 200 lost (allowed: 0%)"]
    assert failures(audited(counted_twice=1)) == ["1 counted twice"]
    assert failures(audited(unknown=1)) == ["1 accepted but prepared by no peer"]
    # a loss its peer was told was held fails whatever share of loss is allowed
    assert len(failures(audited(lost=1, acknowledged_lost=1), max_lost_share=0.01)) == 1
    assert failures(audited(lost=2), max_lost_share=0.01) == []
    assert failures(audited(lost=3), max_lost_share=0.01) == ["3 of 200 lost (allowed: 1%)"]
    refused = {**audited(), "round": {"counts": {"registered": 100, "credentials": 80}}}
    assert failures(refused) == ["20 of 100 peers never got a credential"]
    # issue 27's lossy bench: a credential issued, its answer lost, the retry refused; the peer sent nothing
    stopped = {**audited(), "peer_errors": ["aggregator answered 409: a credential was already issued"]}
    assert failures(stopped) == ["1 peer(s) stopped with an error (first: aggregator answered 409: a credential was already issued)"]


def test_the_audit_finds_lost_twice_counted_and_unknown_messages() -> None:
    round_id = bytes(32)
    surveys = [SurveyId.data(round_id, 0, 0), SurveyId.median(round_id, 0, 0)]

    def packet(survey: SurveyId, tag: int, sends: int, acknowledged: bool = False) -> StoredPacket:
        # the peer stores the receipt digest its report is listed under
        return StoredPacket(survey.to_bytes(), b"", receipt_digest(bytes([tag]) * 32), sends, acknowledged)

    prepared = [
        packet(surveys[0], 1, 1),  # accepted once
        packet(surveys[0], 2, 2),  # accepted twice
        packet(surveys[0], 3, 0),  # lost: never left
        packet(surveys[1], 4, 1, acknowledged=True),  # lost, although its peer saw a receipt
    ]
    accepted = {
        surveys[0]: [receipt_digest(bytes([1]) * 32), receipt_digest(bytes([2]) * 32), receipt_digest(bytes([2]) * 32),
                     receipt_digest(bytes([9]) * 32)],
        # the right tag in the wrong survey does not count for the median message
        surveys[1]: [receipt_digest(bytes([3]) * 32)],
    }
    found = audit(prepared, accepted)
    assert (found.prepared, found.accepted, found.lost, found.counted_twice) == (4, 2, 2, 1)
    assert found.unknown_accepted == 2
    assert found.peer_acknowledged_but_lost == 1
    assert found.lost_by_kind == {"data": 1, "median": 1}
    assert found.lost_by_reason == {"not-sent": 1, "acknowledged": 1}
