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

On the client's side, :class:`InProcessClient` builds each request as httpx
does and hands it to the network's transport, without the parts of httpx's
client that no role uses (auth, event hooks, redirects followed, a cookie
jar that keeps nothing): the same request reaches the same app, at the same
steps of trio's scheduler, for about half of httpx's client-side CPU.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import trio

from anonml.base.memo import PureCache
from anonml.transport._network import no_cookies

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
        if self._read_timeout > 0:
            # A message already sent is taken as the channel's receive takes it (the same checkpoints, so the
            # same schedule), without the deadline, which cannot expire before this task runs again.
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                message = self._from_app.receive_nowait()
            except trio.WouldBlock:
                pass
            except trio.EndOfChannel:
                return None
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return message
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


# Request URLs merged with their client's base URL, by (base URL, URL as the role wrote it): in the round
# simulator every peer's clients ask the same few paths of the same few servers, and httpx parses each
# URL in pure Python. A merge is a pure function of the two strings, and httpx.URL is immutable.
_MERGED_URLS: PureCache[tuple[str, str], httpx.URL] = PureCache(max_entries=4096)


class InProcessClient(httpx.AsyncClient):
    """The HTTP client of a memory network with in-process HTTP: httpx's, with a shorter ``request``.

    A request whose client and arguments use nothing beyond a URL, a body,
    headers and the client's timeout (every role's) is built as httpx builds
    it (``build_request``: the base URL and the client's headers merged, the
    timeout extension) and handed to the transport, and its body read; what
    httpx's ``send`` would do besides is skipped because it does nothing
    here: no auth flow, no event hooks, no redirect followed (a 3xx comes
    back as is, as with ``follow_redirects=False``, without ``next_request``),
    no cookies (the jar is :func:`no_cookies`, which keeps none), and no
    ``elapsed`` (wall time, meaningless on trio's virtual clock). A URL is
    merged with a base URL once per process. Any other request goes through
    httpx's own ``request``.
    """

    def __init__(self, *, transport: httpx.AsyncBaseTransport, **kwargs: Any) -> None:
        if "cookies" in kwargs:
            raise TypeError("an InProcessClient keeps no cookies (its jar is no_cookies())")
        super().__init__(transport=transport, cookies=no_cookies(), **kwargs)
        self._dispatch = transport
        self._base, self._base_text = self.base_url, str(self.base_url)

    async def request(  # type: ignore[override]  # the same signature as httpx's, keywords passed through
        self, method: str, url: httpx.URL | str, *, content: bytes | None = None,
        headers: Any = None, **options: Any,
    ) -> httpx.Response:
        if not self._plain(url, content, options):
            return await super().request(method, url, content=content, headers=headers, **options)
        if self.is_closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        assert isinstance(url, str)
        merged = self.headers  # httpx.Request copies the headers it is given
        if headers:
            merged = httpx.Headers(self.headers)
            merged.update(headers)
        request = httpx.Request(method, self._merged_url(url), content=content, headers=merged,
                                extensions={"timeout": self.timeout.as_dict()})
        response = await self._dispatch.handle_async_request(request)
        response.request = request
        try:
            await response.aread()
        except BaseException:
            await response.aclose()
            raise
        return response

    def _plain(self, url: httpx.URL | str, content: bytes | None, options: dict[str, Any]) -> bool:
        """Whether this request may skip httpx's ``send`` (see the class docstring)."""
        defaults = all(value is None or value is httpx.USE_CLIENT_DEFAULT for value in options.values())
        return (defaults and isinstance(url, str) and (content is None or isinstance(content, bytes))
                and self.auth is None and not self.follow_redirects and not self.params
                and not any(self.event_hooks.values()))

    def _merged_url(self, url: str) -> httpx.URL:
        """``url`` merged with the base URL, as ``build_request`` merges it."""
        if self.base_url is not self._base:
            self._base, self._base_text = self.base_url, str(self.base_url)
        key = (self._base_text, url)
        merged = _MERGED_URLS.get(key)
        if merged is None:
            merged = self.build_request("GET", url).url
            _MERGED_URLS.put(key, merged)
        return merged
