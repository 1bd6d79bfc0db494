"""Public HTTP servers (the aggregator's API, a relay's mirror): hypercorn's HTTP/1.1
protocol behind our own listener.

Issue 13 measured clients sending a body a byte every 5 s: hypercorn's read
timeout was unset and nothing capped connections, so 300 of them took down
the API and the packet sink (fd limit 256); a relay's mirror shares its
process, and its fds, with the relay's link. So each accepted connection takes
a slot of a :class:`transport.ConnectionGate` (a total cap below the fd limit,
and a per-source cap) before hypercorn sees it; hypercorn gets a read timeout
(per read) and a keep-alive timeout; the handlers bound each request body as
a whole (the aggregator's ``_service._read_body``). hypercorn's ``serve`` owns its accept loop,
so this module runs hypercorn's connection handler (``TCPServer``, the unit
its own trio worker runs per connection) from ours.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import ssl
from collections import Counter
from dataclasses import dataclass
from typing import Any

import h11
import httpx
import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext

from anonml.base.errors import TransportError
from anonml.transport._admission import ConnectionGate, GateRefusal, GateSlot, RequestPacer, peer_address
from anonml.transport._memory import MemoryListener
from anonml.transport._network import TCP_NETWORK, Listeners, Network, listening_address
from anonml.protocol import MAX_REQUEST_BYTES, format_host_port
from anonml.transport._link import check_positive_seconds

log = logging.getLogger(__name__)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The certificate-checking TLS context every HTTP client of this process shares.

    httpx builds a new one for each client it creates unless it is given one,
    loading the whole CA bundle each time: 300 ms of CPU per client at load 7.5
    against 1 ms with this shared context (measured on the 2-core CI machine),
    and a peer makes a client for its aggregator and one per relay mirror.
    """
    return httpx.create_ssl_context()


@dataclass(frozen=True)
class HttpLimits:
    """Connection caps and deadlines of an HTTP server (seconds).

    ``read_timeout``: the longest wait for the next bytes of a request.
    ``keep_alive_timeout``: how long an idle kept-alive connection stays open.
    ``body_timeout``: a whole request body must arrive within it (408 otherwise).
    ``request_rate``, ``request_burst``, ``request_floor``: the :class:`transport.RequestPacer`
    of the server's requests (a source alone may send ``request_rate`` per second; none is held
    below ``request_floor``).
    """

    # Below the usual 1024 file descriptors with the sink's and the store's; issue 13 measured
    # the API and the sink taken down by 300 slow clients at an fd limit of 256.
    max_connections: int = 512
    max_connections_per_source: int = 32
    read_timeout: float = 10.0
    keep_alive_timeout: float = 5.0
    body_timeout: float = 10.0
    # A snapshot GET costs about 0.55 ms of the server's process on the 2-core machine (1,500
    # a second took 82% of it in `anonml bench abuse`): 400 a second is about a fifth of one core,
    # the rest left to the packet sink (or a relay's link). A loopback demo's peers are all one
    # source, so its schedule counts each request at least 1 / request_rate (`demo._schedule`).
    request_rate: float = 400.0
    request_burst: float = 40.0
    # A peer polls a document not yet published at most 4 times a second (`peer._client.retry_delay`).
    request_floor: float = 5.0

    def __post_init__(self) -> None:
        check_positive_seconds(self, ("read_timeout", "keep_alive_timeout", "body_timeout"))
        self.pacer()  # validates the three

    def pacer(self) -> RequestPacer:
        return RequestPacer(self.request_rate, self.request_burst, self.request_floor)


def hypercorn_config(limits: HttpLimits) -> HypercornConfig:
    config = HypercornConfig()
    config.accesslog = None
    config.errorlog = log
    config.h11_max_incomplete_size = MAX_REQUEST_BYTES
    # hypercorn types read_timeout as int; it is used as a trio deadline.
    config.read_timeout = limits.read_timeout  # type: ignore[assignment]
    config.keep_alive_timeout = limits.keep_alive_timeout
    return config


class ClientGone(TransportError):
    """Raised inside the app when sending to a client that has hung up; caught and counted by
    :func:`counting_disconnects`, never logged (issue 13: each disconnect logged a traceback)."""


def counting_disconnects(app: Any, counts: Counter[str]) -> Any:
    """``app`` with every failure to send to a departed client counted instead of raised to hypercorn
    (which logs it as "Error in ASGI Framework"; hypercorn also races its own close against a response
    still being sent, and that surfaces here as BusyResourceError)."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        async def send_or_gone(message: Any) -> None:
            try:
                await send(message)
            except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError, OSError) as exc:
                raise ClientGone(f"client left before the response: {exc!r}") from None

        try:
            await app(scope, receive, send_or_gone)
        except ClientGone:
            counts["client-disconnected"] += 1

    return wrapped


def paced(app: Any, pacer: RequestPacer, counts: Counter[str]) -> Any:
    """``app`` with each HTTP request first admitted by ``pacer`` under its client's address
    (requests that had to wait are counted as ``paced``)."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            client = scope.get("client")
            if await pacer.admit(str(client[0]) if client else "?"):
                counts["paced"] += 1
        await app(scope, receive, send)

    return wrapped


def busy_while_answering(app: Any) -> Any:
    """``app`` with its connection's :class:`GateSlot` (``scope["state"]["gate_slot"]``) marked busy
    from the end of each request's body to the end of its response, so a request the server is
    slow to answer is never evicted as idle; a body still trickling in leaves the connection idle."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        slot = scope.get("state", {}).get("gate_slot") if scope["type"] == "http" else None
        if not isinstance(slot, GateSlot):
            await app(scope, receive, send)
            return
        with contextlib.ExitStack() as answering:
            complete = False

            def request_complete() -> None:
                nonlocal complete
                if not complete:
                    complete = True
                    answering.enter_context(slot.busy())

            headers = {name.lower() for name, _ in scope.get("headers", [])}
            if b"content-length" not in headers and b"transfer-encoding" not in headers:
                request_complete()  # no body: the request is complete

            async def receive_then_busy() -> Any:
                message = await receive()
                if message["type"] == "http.request" and not message.get("more_body", False):
                    request_complete()
                return message

            await app(scope, receive_then_busy, send)

    return wrapped


def _client_left(error: BaseException) -> bool:
    """Whether ``error`` (from hypercorn's connection handler) only says the client went away.

    A client that hangs up inside a request body makes hypercorn answer 400
    while it is still sending, and trio refuses the second sender: the
    handler raises RemoteProtocolError and BusyResourceError together.
    """
    if isinstance(error, BaseExceptionGroup):
        return all(_client_left(inner) for inner in error.exceptions)
    return isinstance(error, (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError,
                              h11.RemoteProtocolError, OSError))


def _drop_references(server: TCPServer) -> None:
    """Break the reference cycles a finished hypercorn connection leaves, so it is freed at once.

    Its protocol holds the server's bound send method, and an HTTP/1.1 protocol and a request
    it was still reading (a client evicted or gone mid-body) hold each other's. Left to the
    cycle collector, a churn of 460 connections a second (``bench abuse``'s http-slow-bodies)
    piled up until a full collection took 160-210 ms every 2 s, a stall of everything the
    process serves (the API and the packet sink).
    """
    wrapper = getattr(server, "protocol", None)
    for each in (getattr(wrapper, "protocol", None), wrapper, server):
        if each is not None:
            vars(each).clear()


async def serve_http(
    app: Any,
    host: str,
    port: int,
    limits: HttpLimits,
    counts: Counter[str],
    *,
    network: Network = TCP_NETWORK,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` on ``host:port`` of ``network`` until cancelled; reports its base URL once listening.

    ``counts`` gets connections refused by the gate (``refused/<why>``), requests the pacer
    held back (``paced``), clients that left (``client-disconnected``) and connections that
    failed otherwise (``connection-failed``).
    """
    listeners = await network.listen(host, port)
    await serve_http_on(app, listeners, limits, counts, task_status=task_status)


async def serve_http_on(
    app: Any,
    listeners: Listeners,
    limits: HttpLimits,
    counts: Counter[str],
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`serve_http` on listeners already open (a caller that must report a bind failure itself)."""
    config = hypercorn_config(limits)
    gate = ConnectionGate(limits.max_connections, limits.max_connections_per_source)
    pacer = limits.pacer()
    context = WorkerContext(None)
    # Busy inside the pacer: a request waiting for its turn is idle (a client polling over its share
    # from every slot could otherwise hold them all unevictable).
    admitted = paced(busy_while_answering(counting_disconnects(app, counts)), pacer, counts)
    wrapped = ASGIWrapper(admitted)

    async def handle(stream: trio.abc.Stream) -> None:
        source = peer_address(stream)
        slot = gate.open(source)
        if slot is None:
            counts[f"refused/{gate.last_refusal}"] += 1
            await gate.turn_away(stream)
            return
        try:
            with slot.cancel_scope:  # cancelled if the gate evicts this connection as the one idle longest
                # hypercorn copies this state into each request's scope (busy_while_answering reads it).
                state = {"gate_slot": slot}
                server = TCPServer(wrapped, config, context, state, slot.watch(stream))  # type: ignore[arg-type]
                try:
                    await server
                finally:
                    _drop_references(server)
            if slot.evicted:
                counts[f"refused/{GateRefusal.EVICTED}"] += 1
        except Exception as exc:  # hypercorn's own failures end one connection, never the server
            if _client_left(exc):
                counts["client-disconnected"] += 1
            else:
                counts["connection-failed"] += 1
                log.exception("HTTP connection from %s failed", source)
        finally:
            slot.close()

    async with trio.open_nursery() as nursery:
        for listener in listeners:
            if isinstance(listener, MemoryListener):
                # The simulator's clients may hand their requests to the app itself (transport._inprocess).
                await nursery.start(functools.partial(listener.serve_in_process, admitted))
        task_status.started(f"http://{format_host_port(*listening_address(listeners))}")
        await trio.serve_listeners(handle, listeners)
