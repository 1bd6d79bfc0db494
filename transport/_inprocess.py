"""HTTP requests handed to the server's ASGI app in process: the round simulator's fast path (issue 24).

Over the in-memory network an HTTP request is otherwise serialized by httpx
and h11 on the client, carried as bytes, parsed again by hypercorn and h11 on
the server, and answered back the same way: about half the CPU of a simulated
round. With ``MemoryNetwork(in_process_http=True)`` a client whose request is
for an address where :func:`transport.serve_http` serves an app builds the
ASGI scope itself and calls that app directly (:class:`InProcessApp`):

* the app is the one hypercorn would run, with the request pacer and the
  disconnect counting in front (``serve_http_on`` mounts it), and it runs in
  a task of the *server* (as under hypercorn, a client that gives up does not
  cancel a request the server is handling; the server's end cancels it);
* ``scope["client"]`` is the requester's address, so what the aggregator and
  an adversary's ASGI interposer see (who asked what, when) is unchanged;
* the network's ``on_connect`` hook is awaited for every request, before the
  app sees it, as for a connection: it may refuse it, and a hook that stands
  in front of the address (replaces ``dial.server``) gets the request as
  HTTP/1.1 bytes over that connection, through the real server;
* httpx's timeouts hold on trio's clock: the response's start and each
  chunk of its body must come within the read timeout, the dial within the
  connect timeout; the response body streams as the app sends it.

What this path no longer exercises, and where it is still tested: hypercorn
and h11 (parsing, their limits), the connection gate (per-source and total
caps, eviction of the idlest connection), keep-alive and its timeouts, and
hypercorn's read timeout (tests/test_transport_memory.py runs them over the
memory network; tests/test_aggregator_abuse.py and tests/test_relay_mirror_abuse.py
over TCP). The request body is read whole by the client before the app sees
it, so a slowly sent body (a client-side choice no simulated role makes) is
not simulated.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import trio

log = logging.getLogger(__name__)

Address = tuple[str, int]
AsgiApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
                   Awaitable[None]]


class InProcessApp:
    """The ASGI app served at one address of a memory network, and the nursery its requests run in."""

    def __init__(self, app: AsgiApp, address: Address, nursery: trio.Nursery) -> None:
        self.app = app
        self.address = address
        self._nursery = nursery

    async def answer(self, request: httpx.Request, client: Address) -> httpx.Response:
        """``request`` answered by the app, as coming from ``client``; the body streams as the app sends it.

        Raises httpx.ReadTimeout when the response (or, later, a chunk of its body) does not
        start within the request's read timeout, on trio's clock.
        """
        body = [chunk async for chunk in request.stream]  # type: ignore[union-attr]
        read_timeout = request.extensions.get("timeout", {}).get("read")
        exchange = _Exchange(body, read_timeout)
        self._nursery.start_soon(self._handle, _scope(request, client, self.address), exchange)
        try:
            start = await exchange.next_message(request)
        except BaseException:
            exchange.disconnect()
            raise
        if start is None:
            raise httpx.RemoteProtocolError("the server closed the connection without a response", request=request)
        headers = [(bytes(name), bytes(value)) for name, value in start.get("headers", [])]
        stream = _ResponseBody(exchange, request, with_body=request.method != "HEAD")
        return httpx.Response(int(start["status"]), headers=headers, stream=stream, request=request)

    async def _handle(self, scope: dict[str, Any], exchange: _Exchange) -> None:
        """The app on one request, in the server's nursery; failures end this request, never the server."""
        try:
            try:
                await self.app(scope, exchange.receive, exchange.send)
            except Exception:
                log.exception("Error in ASGI Framework (in-process request to %s:%d)", *self.address)
            # hypercorn's answer to an app that ended (or failed) without one: a 500. A server shutting
            # down (Cancelled) sends nothing: its client sees the connection closed without a response.
            if not exchange.started:
                with contextlib.suppress(trio.BrokenResourceError):
                    exchange.send_nowait({"type": "http.response.start", "status": 500, "headers": []})
        finally:
            exchange.finished()


def _scope(request: httpx.Request, client: Address, server: Address) -> dict[str, Any]:
    """The ASGI scope hypercorn builds for ``request`` (HTTP/1.1 over plain TCP)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.url.path,
        "raw_path": request.url.raw_path.split(b"?", 1)[0],
        "query_string": request.url.query,
        "root_path": "",
        "headers": [(name.lower(), value) for name, value in request.headers.raw],
        "client": client,
        "server": server,
        "extensions": {},
        "state": {},
    }


class _Exchange:
    """One request's messages between the app (server side) and the client, on trio's clock."""

    def __init__(self, body: list[bytes], read_timeout: float | None) -> None:
        self._body = body or [b""]
        self._read_timeout = math.inf if read_timeout is None else read_timeout
        self._to_client, self._from_app = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._gone = trio.Event()
        self.started = False

    # The app's side.
    async def receive(self) -> dict[str, Any]:
        if self._body:
            chunk = self._body.pop(0)
            await trio.lowlevel.checkpoint()
            return {"type": "http.request", "body": chunk, "more_body": bool(self._body)}
        await self._gone.wait()  # after the body, the next event is the client leaving
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        await trio.lowlevel.checkpoint()
        self.send_nowait(message)

    def send_nowait(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        # A client that has gone raises BrokenResourceError here, as a closed connection does under hypercorn.
        self._to_client.send_nowait(message)

    def finished(self) -> None:
        self._to_client.close()

    # The client's side.
    async def next_message(self, request: httpx.Request) -> dict[str, Any] | None:
        """The app's next message (None: it has returned); httpx.ReadTimeout after the read timeout."""
        try:
            with trio.fail_after(self._read_timeout):
                return await self._from_app.receive()
        except trio.TooSlowError:
            raise httpx.ReadTimeout(f"no response within {self._read_timeout!r} s", request=request) from None
        except trio.EndOfChannel:
            return None

    def disconnect(self) -> None:
        """The client is gone: the app's receive returns ``http.disconnect``, its sends fail."""
        self._gone.set()
        self._from_app.close()


class _ResponseBody(httpx.AsyncByteStream):
    """A response body as the app sends it (each chunk within the read timeout)."""

    def __init__(self, exchange: _Exchange, request: httpx.Request, *, with_body: bool) -> None:
        self._exchange = exchange
        self._request = request
        self._with_body = with_body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        more = True
        while more:
            message = await self._exchange.next_message(self._request)
            if message is None:
                return  # the app returned: hypercorn ends the response there
            if message["type"] != "http.response.body":
                continue
            more = bool(message.get("more_body", False))
            if self._with_body and message.get("body"):
                yield bytes(message["body"])

    async def aclose(self) -> None:
        self._exchange.disconnect()
