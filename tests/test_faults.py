"""The fault benchmark's parts: the lossy proxy on real loopback sockets, the
seeded kill plan, and the audit of prepared messages against accepted ones."""

from __future__ import annotations

import random

import trio

from anonml.demo import audit
from anonml.bench._proxy import LinkFaults, LossyProxy, serve_lossy_proxy
from anonml.bench.faults import plan_kills
from anonml.peer import StoredPacket
from anonml.protocol import SurveyId, receipt_digest


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


def test_the_kill_plan_is_seeded_and_inside_the_round() -> None:
    targets = ["aggregator", "relay-0", "relay-1", "relay-2"]
    first = plan_kills(20, 300.0, targets, random.Random(7))
    again = plan_kills(20, 300.0, targets, random.Random(7))
    assert [(e.at, e.target) for e in first] == [(e.at, e.target) for e in again]
    assert len(first) == 20 and all(0 <= e.at < 300 for e in first)
    assert [e.at for e in first] == sorted(e.at for e in first)
    assert {e.target for e in first} == set(targets)


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
