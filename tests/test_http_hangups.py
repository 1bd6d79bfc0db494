"""The public HTTP server's connection gate (``transport.serve_http_on``) under clients that give up and retry.

Issue 27: in the network-namespace round the aggregator answered registrations
seconds late; each peer's client gave up after its attempt timeout, hung up
and retried on a new connection. The server kept working on every abandoned
request, so each hung-up connection held one of its address's slots as busy
(never evicted) until all of them were taken, and from then on every new
connection from that address was closed at accept: each request reset
(``ReadError [Errno 104]``) until the round's deadline. Real sockets on
loopback, hypercorn's own connection handler.
"""

from __future__ import annotations

import gc
from collections import Counter
from typing import Any

import httpx
import trio

from anonml.transport import HttpLimits
from anonml.transport._http import serve_http_on

SLOTS_PER_SOURCE = 2


class SlowApp:
    """An ASGI app that answers each request only once ``answer`` is set (a commit on a loaded machine)."""

    def __init__(self) -> None:
        self.answer = trio.Event()
        self.requests = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body", False):
            pass  # the whole body read: from here the server is answering (busy, never evicted as idle)
        self.requests += 1
        await self.answer.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"answered"})


async def served_slowly(nursery: trio.Nursery) -> tuple[SlowApp, Counter[str], str]:
    """A :class:`SlowApp` served on loopback with SLOTS_PER_SOURCE connections per address; its counts and URL."""
    app = SlowApp()
    counts: Counter[str] = Counter()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = await nursery.start(serve_http_on, app, listeners, HttpLimits(max_connections_per_source=SLOTS_PER_SOURCE),
                              counts)
    return app, counts, url


async def requests_seen(app: SlowApp, count: int) -> None:
    while app.requests < count:
        await trio.sleep(0.01)


async def test_connections_whose_clients_hung_up_leave_their_slots_to_the_clients_retries(nursery: trio.Nursery) -> None:
    app, counts, url = await served_slowly(nursery)
    host, port = httpx.URL(url).host, httpx.URL(url).port
    assert port is not None
    # As many attempts as the address may hold connections: each sends its request, waits, and hangs up.
    for attempt in range(SLOTS_PER_SOURCE):
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"POST /v1/register HTTP/1.1\r\nhost: aggregator\r\ncontent-length: 2\r\n\r\n{}")
        with trio.fail_after(5):
            await requests_seen(app, attempt + 1)
        await stream.aclose()
    await trio.sleep(0.2)  # the server reads each end of stream

    async def answer_soon() -> None:
        await trio.sleep(0.5)
        app.answer.set()

    nursery.start_soon(answer_soon)
    with trio.fail_after(10):
        async with httpx.AsyncClient(base_url=url) as client:
            response = await client.post("/v1/register", content=b"{}")
    assert (response.status_code, response.text) == (200, "answered")
    # The retry took the slot of one attempt that had hung up, not a connection still waiting for its answer.
    assert counts["refused/evicted-idle"] == 1 and counts["refused/per-source"] == 0


async def test_a_client_still_waiting_for_its_answer_is_never_evicted_for_a_newcomer(nursery: trio.Nursery) -> None:
    app, counts, url = await served_slowly(nursery)
    answers: list[int] = []
    async with httpx.AsyncClient(base_url=url) as client:

        async def wait_for_answer() -> None:
            answers.append((await client.post("/v1/register", content=b"{}")).status_code)

        async with trio.open_nursery() as waiting:
            for _ in range(SLOTS_PER_SOURCE):
                waiting.start_soon(wait_for_answer)
            with trio.fail_after(5):
                await requests_seen(app, SLOTS_PER_SOURCE)
            # A third connection from the same address: the two waiting ones keep their slots.
            async with httpx.AsyncClient(base_url=url) as newcomer:
                try:
                    await newcomer.get("/")
                except httpx.TransportError:
                    pass
                else:
                    raise AssertionError("a connection beyond the address's slots was served")
            app.answer.set()
    assert answers == [200] * SLOTS_PER_SOURCE
    assert counts["refused/per-source"] == 1 and counts["refused/evicted-idle"] == 0


async def test_a_connection_that_ended_mid_body_is_freed_without_the_cycle_collector(nursery: trio.Nursery) -> None:
    """Issue 25's http-slow-bodies: hypercorn's objects of each connection ended mid-request referred to each
    other, so only the cycle collector freed them; under a churn of 460 connections a second its full
    collections took 160-210 ms every 2 s, a stall of the API and the packet sink. Now nothing of them is
    left for it: with the collector off, no connection's server object outlives its connection."""
    from hypercorn.trio.tcp_server import TCPServer

    app, counts, url = await served_slowly(nursery)
    app.answer.set()  # the app answers at once (its answer reaches no one)
    host, port = httpx.URL(url).host, httpx.URL(url).port
    assert port is not None
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(b"POST /v1/register HTTP/1.1\r\nhost: aggregator\r\ncontent-length: 9\r\n\r\n{")
            await trio.sleep(0.05)
            await stream.aclose()  # gone with its body unfinished
        with trio.fail_after(5):
            await requests_seen(app, 3)

        def servers_left() -> int:
            return sum(isinstance(o, TCPServer) for o in gc.get_objects())

        with trio.move_on_after(5):  # each handler ends (a busy machine may take a moment)
            while servers_left():
                await trio.sleep(0.05)
        assert servers_left() == 0
    finally:
        gc.enable()
