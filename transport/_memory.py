"""An in-memory network for one trio run: the round simulator's wire (STYLE.md 17).

Nodes are named by IP strings ("10.0.0.1"). :meth:`MemoryNetwork.listen`
registers a listener at ``(host, port)``; :meth:`MemoryNetwork.connect`
hands the listener one end of a :class:`MemoryStream` pair and returns the
other. Each end carries a ``.socket`` stand-in (family, ``getpeername``,
``getsockname``), so the gates' ``peer_address``, hypercorn's connection
handler and a server's reported address work on it unchanged, and
:meth:`MemoryNetwork.http_client` runs httpx over the same streams: the real
hypercorn server, its gate, pacer and timeouts, all on trio's clock (a
``MockClock`` included). Nothing here reads the wall clock or draws random
numbers: ports are handed out in order.

A role that must appear under its own address gets a view of the network
with that source IP (:meth:`MemoryNetwork.node`): a relay's forwarding links
then come from the relay's IP, which is what privileges them at the next hop.

Adversaries interpose through one hook, ``on_connect(dial)``, awaited for
every connection before the listener sees it. It may record ``dial``, sleep
(a slow connection), raise ``ConnectionRefusedError`` (a refused one), or
replace ``dial.server`` with a stream of its own making (e.g. one end of a
:func:`connection_pair`) and pump bytes between that and the original
``dial.server`` in its own tasks, to see, delay, drop or alter them.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import socket as _socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx
import trio

from anonml.transport._inprocess import AsgiApp, InProcessApp, InProcessClient
from anonml.transport._network import DEFAULT_HTTP_TIMEOUT, Listeners, no_cookies

Address = tuple[str, int]

# IANA's dynamic port range (RFC 6335 §6), from which ports are handed out in order.
_FIRST_EPHEMERAL_PORT = 49152
_LAST_PORT = 65535
# What one receive_some returns at most when the caller names no size (trio's socket default).
_RECEIVE_SIZE = 65536
_WILDCARDS = ("0.0.0.0", "::")


class MemorySocket:
    """The ``.socket`` stand-in of a memory stream or listener: its family and both ends' addresses."""

    def __init__(self, local: Address, remote: Address | None) -> None:
        self._local = local
        self._remote = remote

    @property
    def family(self) -> int:
        return _socket.AF_INET6 if ":" in self._local[0] else _socket.AF_INET

    def getsockname(self) -> Address:
        return self._local

    def getpeername(self) -> Address:
        if self._remote is None:
            raise OSError(errno.ENOTCONN, "a listener has no peer")
        return self._remote


class _Pipe:
    """One direction of a connection: the bytes written and not yet read."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.eof = False  # the writer sent EOF or closed its end
        self.reader_gone = False  # the reader closed its end: writing fails as on a reset connection
        self.readers = trio.lowlevel.ParkingLot()


class MemoryStream(trio.abc.HalfCloseableStream):
    """One end of an in-memory connection; buffered like a TCP stream (writes never wait for the reader)."""

    def __init__(self, incoming: _Pipe, outgoing: _Pipe, local: Address, remote: Address) -> None:
        self._incoming = incoming
        self._outgoing = outgoing
        self.socket = MemorySocket(local, remote)
        self._closed = False
        self._sending = False
        self._receiving = False

    def is_readable(self) -> bool:
        """Whether a read would return at once (bytes, or the end of the stream).

        httpcore asks it of an idle kept-alive connection: readable means the server has closed it."""
        return bool(self._incoming.buffer) or self._incoming.eof

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed or self._outgoing.eof:
            raise trio.ClosedResourceError("this end is closed for sending")
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            if self._outgoing.reader_gone:
                raise trio.BrokenResourceError("the other end closed the connection")
            self._outgoing.buffer += data
            self._outgoing.readers.unpark_all()
            await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, not {max_bytes!r}")
        self._receiving = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            pipe = self._incoming
            waited = False
            while not pipe.buffer and not pipe.eof:
                await pipe.readers.park()
                waited = True
                if self._closed:
                    raise trio.ClosedResourceError("this end was closed while receiving")
            size = min(len(pipe.buffer), max_bytes or _RECEIVE_SIZE)
            data = bytes(pipe.buffer[:size])
            del pipe.buffer[:size]
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data
        finally:
            self._receiving = False

    async def send_eof(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._outgoing.eof = True
        self._outgoing.readers.unpark_all()
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._outgoing.eof = True
            self._outgoing.readers.unpark_all()
            self._incoming.reader_gone = True
            self._incoming.buffer.clear()
            self._incoming.readers.unpark_all()  # a task of ours blocked in receive_some sees the close
        await trio.lowlevel.checkpoint()


def connection_pair(client: Address, server: Address) -> tuple[MemoryStream, MemoryStream]:
    """Both ends of one in-memory connection from ``client`` to ``server``: (the client's end, the server's end).

    An ``on_connect`` hook makes one to sit between a dialler and its listener (module docstring)."""
    upstream, downstream = _Pipe(), _Pipe()
    return MemoryStream(downstream, upstream, client, server), MemoryStream(upstream, downstream, server, client)


class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    """Connections to one ``(host, port)`` of a :class:`MemoryNetwork`, in the order they were made."""

    def __init__(self, network: MemoryNetwork, address: Address) -> None:
        self._network = network
        self.socket = MemorySocket(address, None)
        self._arrivals, self._queue = trio.open_memory_channel[trio.abc.Stream](math.inf)
        self.in_process: InProcessApp | None = None

    async def serve_in_process(self, app: AsgiApp, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Answer in-process HTTP requests to this address with ``app``, in tasks of this call, until cancelled
        (``transport._inprocess``; ``serve_http_on`` runs it beside hypercorn's accept loop)."""
        async with trio.open_nursery() as requests:
            self.in_process = InProcessApp(app, self.socket.getsockname(), requests)
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self.in_process = None

    def deliver(self, stream: trio.abc.Stream) -> None:
        """Queue ``stream`` for :meth:`accept` (a connection the kernel has completed)."""
        self._arrivals.send_nowait(stream)

    async def accept(self) -> trio.abc.Stream:
        return await self._queue.receive()

    async def aclose(self) -> None:
        self._network.forget(self)
        unaccepted = []
        while True:
            try:
                unaccepted.append(self._queue.receive_nowait())
            except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
                break
        await self._queue.aclose()
        await self._arrivals.aclose()
        for stream in unaccepted:
            await trio.aclose_forcefully(stream)


@dataclass
class Dial:
    """One connection being made, as the ``on_connect`` hook sees it.

    ``client`` is the dialler's end; ``server`` is what the listener will
    accept, and a hook may replace it to sit between the two.
    """

    source: Address
    destination: Address
    client: MemoryStream
    server: trio.abc.Stream
    _dialled: trio.abc.Stream | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._dialled = self.server

    @property
    def interposed(self) -> bool:
        """Whether a hook replaced ``server`` (it stands between the dialler and the listener)."""
        return self.server is not self._dialled


ConnectHook = Callable[[Dial], Awaitable[None]]


class MemoryNetwork:
    """Listeners and connections of one trio run, addressed by IP strings (see the module docstring).

    ``default_source`` is the IP a connection comes from when neither its
    caller nor the :meth:`node` view names one. With ``in_process_http`` (the
    round simulator's setting) a request to a ``serve_http`` app is handed to
    the app in process rather than sent as HTTP/1.1 over a connection
    (``transport._inprocess``).
    """

    def __init__(self, *, on_connect: ConnectHook | None = None, default_source: str = "10.255.0.1",
                 in_process_http: bool = False) -> None:
        self.on_connect = on_connect
        self.in_process_http = in_process_http
        self.default_source = default_source
        self._listeners: dict[Address, MemoryListener] = {}
        self._next_port: dict[str, int] = {}

    def node(self, address: str) -> MemoryHost:
        """This network as seen from the node at ``address``: its connections and HTTP clients come from that IP."""
        return MemoryHost(self, address)

    def _free_port(self, host: str) -> int:
        """The next dynamic port of ``host`` nobody listens on (wrapping around, as a kernel reuses them)."""
        for _ in range(_LAST_PORT - _FIRST_EPHEMERAL_PORT + 1):
            port = self._next_port.get(host, _FIRST_EPHEMERAL_PORT)
            self._next_port[host] = port + 1 if port < _LAST_PORT else _FIRST_EPHEMERAL_PORT
            if (host, port) not in self._listeners:
                return port
        raise OSError(errno.EADDRNOTAVAIL, f"no free port left on {host}")

    def _listening_at(self, host: str, port: int) -> MemoryListener | None:
        found = self._listeners.get((host, port))
        for wildcard in _WILDCARDS:
            found = found or self._listeners.get((wildcard, port))
        return found

    def forget(self, listener: MemoryListener) -> None:
        """Stop routing to ``listener`` (it is closing)."""
        self._listeners = {address: kept for address, kept in self._listeners.items() if kept is not listener}

    async def listen(self, host: str, port: int) -> Listeners:
        """One listener at ``host:port`` (port 0: the next free port); OSError if the address is taken."""
        await trio.lowlevel.checkpoint()
        port = port or self._free_port(host)
        if (host, port) in self._listeners:
            raise OSError(errno.EADDRINUSE, f"{host}:{port} is already listening")
        listener = self._listeners[(host, port)] = MemoryListener(self, (host, port))
        return [listener]

    async def connect(self, host: str, port: int, *, local_address: str | None = None) -> MemoryStream:
        """A connection from ``local_address`` (or ``default_source``) to whoever listens at ``host:port``.

        Raises ConnectionRefusedError when nobody does (after the ``on_connect`` hook had its say).
        """
        dial = await self.dial(host, port, local_address=local_address)
        self.complete(dial)
        return dial.client

    async def dial(self, host: str, port: int, *, local_address: str | None = None) -> Dial:
        """The first half of :meth:`connect`: a connection made and shown to the ``on_connect`` hook, not yet delivered."""
        await trio.lowlevel.checkpoint()
        source_ip = local_address or self.default_source
        client, server = connection_pair((source_ip, self._free_port(source_ip)), (host, port))
        dial = Dial(client.socket.getsockname(), (host, port), client, server)
        if self.on_connect is not None:
            await self.on_connect(dial)
        return dial

    def complete(self, dial: Dial) -> None:
        """The second half of :meth:`connect`: ``dial.server`` queued for its listener (ConnectionRefusedError if none)."""
        listener = self._listening_at(*dial.destination)
        if listener is None:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"nothing listens on {dial.destination[0]}:{dial.destination[1]}")
        listener.deliver(dial.server)

    def in_process_app(self, host: str, port: int) -> InProcessApp | None:
        """The app served in process at ``host:port``, if any (and if this network dispatches to it)."""
        listener = self._listening_at(host, port) if self.in_process_http else None
        return listener.in_process if listener is not None else None

    def http_client(
        self, *, local_address: str | None = None, timeout: httpx.Timeout | float = DEFAULT_HTTP_TIMEOUT,
        **kwargs: Any,
    ) -> httpx.AsyncClient:
        """An httpx client whose connections go through this network (http:// only; TLS is not simulated).

        httpcore's keep-alive expiry is wall time (``time.monotonic``); it is
        switched off, so an idle connection is kept until the server closes it
        (at hypercorn's keep-alive timeout, on trio's clock), which the pool
        sees as a readable end of stream. httpcore still reads the wall clock
        there, and httpx stamps ``response.elapsed`` with it; neither decides
        anything.
        ``verify`` is accepted and ignored; proxies from the environment are not used.
        With ``in_process_http``, a request to an address where ``serve_http`` serves an
        app is handed to that app directly (``transport._inprocess``).
        """
        limits: httpx.Limits = kwargs.pop("limits", httpx.Limits(max_connections=100, max_keepalive_connections=20))
        kwargs.pop("verify", None)
        pooled = functools.partial(_pooled, _HttpBackend(self, local_address), limits)
        transport = _InProcessTransport(self, local_address or self.default_source, pooled) if self.in_process_http else pooled()
        if self.in_process_http and "cookies" not in kwargs:
            return InProcessClient(timeout=timeout, transport=transport, trust_env=False, **kwargs)
        kwargs.setdefault("cookies", no_cookies())
        return httpx.AsyncClient(timeout=timeout, transport=transport, trust_env=False, **kwargs)


class MemoryHost:
    """A :class:`MemoryNetwork` as seen from one node: connections default to the node's IP."""

    def __init__(self, network: MemoryNetwork, address: str) -> None:
        self.network = network
        self.address = address

    async def connect(self, host: str, port: int, *, local_address: str | None = None) -> MemoryStream:
        return await self.network.connect(host, port, local_address=local_address or self.address)

    async def listen(self, host: str, port: int) -> Listeners:
        return await self.network.listen(host, port)

    def http_client(
        self, *, local_address: str | None = None, timeout: httpx.Timeout | float = DEFAULT_HTTP_TIMEOUT,
        **kwargs: Any,
    ) -> httpx.AsyncClient:
        return self.network.http_client(local_address=local_address or self.address, timeout=timeout, **kwargs)


@contextmanager
def _httpcore_errors(timeout: float | None, on_timeout: type[Exception], on_error: type[Exception]) -> Iterator[None]:
    """trio's timeout and stream errors as the httpcore exceptions httpx maps to its own."""
    try:
        with trio.fail_after(math.inf if timeout is None else timeout):
            yield
    except trio.TooSlowError:
        raise on_timeout(f"no progress within {timeout!r} s") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        raise on_error(str(exc) or type(exc).__name__) from None


class _HttpStream(httpcore.AsyncNetworkStream):
    def __init__(self, stream: MemoryStream) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with _httpcore_errors(timeout, httpcore.ReadTimeout, httpcore.ReadError):
            return await self._stream.receive_some(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            with _httpcore_errors(timeout, httpcore.WriteTimeout, httpcore.WriteError):
                await self._stream.send_all(buffer)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("TLS is not simulated on the memory network: use http:// URLs")

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return self._stream.is_readable()
        if info == "client_addr":
            return self._stream.socket.getsockname()
        if info == "server_addr":
            return self._stream.socket.getpeername()
        return None


class _HttpBackend(httpcore.AsyncNetworkBackend):
    """httpcore's dialler, through a :class:`MemoryNetwork` from one source IP."""

    def __init__(self, network: MemoryNetwork, local_address: str | None) -> None:
        self._network = network
        self._local_address = local_address

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        with _httpcore_errors(timeout, httpcore.ConnectTimeout, httpcore.ConnectError):
            stream = await self._network.connect(host, port, local_address=local_address or self._local_address)
        return _HttpStream(stream)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


def _pooled(backend: httpcore.AsyncNetworkBackend, limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """httpx's transport over an httpcore pool that dials through ``backend``."""
    pool = httpcore.AsyncConnectionPool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=None,
        network_backend=backend,
    )
    # httpx takes no network backend: its transport (request and error mapping) gets our pool in place of
    # the one it builds (httpx 0.28 reads only `_pool`; tests/test_transport_memory.py covers it).
    transport = httpx.AsyncHTTPTransport(verify=False)
    transport._pool = pool
    return transport


class _DialledBackend(httpcore.AsyncNetworkBackend):
    """httpcore's dialler for one connection already made (an ``on_connect`` hook stood in front of it)."""

    def __init__(self, stream: MemoryStream) -> None:
        self._stream: MemoryStream | None = stream

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        stream, self._stream = self._stream, None
        if stream is None:
            raise httpcore.ConnectError("the one connection of this request is used")
        return _HttpStream(stream)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


class _ClosingBody(httpx.AsyncByteStream):
    """A response body that closes its one-connection transport with it."""

    def __init__(self, body: httpx.AsyncByteStream, transport: httpx.AsyncHTTPTransport) -> None:
        self._body = body
        self._transport = transport

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._body:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._body.aclose()
        finally:
            await self._transport.aclose()


class _InProcessTransport(httpx.AsyncBaseTransport):
    """httpx's transport on a network with ``in_process_http`` (``transport._inprocess``).

    A request for an address with an in-process app is dialled (the ``on_connect`` hook
    has its say), then answered by the app directly, or, when the hook stood in front of
    the address, sent as HTTP/1.1 over that one connection. Any other request goes
    through the connection pool every memory client has, made by ``make_pooled`` when
    first needed (most simulated clients never need it, and each costs an SSL context).
    """

    def __init__(self, network: MemoryNetwork, source_ip: str, make_pooled: Callable[[], httpx.AsyncHTTPTransport]) -> None:
        self._network = network
        self._source_ip = source_ip
        self._make_pooled = make_pooled
        self._pooled: httpx.AsyncHTTPTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host, port = request.url.host, request.url.port or 80
        if request.url.scheme != "http" or self._network.in_process_app(host, port) is None:
            if self._pooled is None:
                self._pooled = self._make_pooled()
            return await self._pooled.handle_async_request(request)
        connect_timeout = request.extensions.get("timeout", {}).get("connect")
        # Without a hook a dial is one checkpoint, which no deadline can outlast (this task runs again before
        # trio's clock moves): the connect timeout then needs no cancel scope.
        with _httpx_errors(connect_timeout if self._network.on_connect is not None else None, request):
            dial = await self._network.dial(host, port, local_address=self._source_ip)
        app = self._network.in_process_app(host, port)
        if not dial.interposed and app is not None:
            return await app.answer(request, dial.source)  # the dialled pair is dropped unused
        with _httpx_errors(connect_timeout, request):
            self._network.complete(dial)
        one_connection = _pooled(_DialledBackend(dial.client), httpx.Limits(max_connections=1))
        try:
            response = await one_connection.handle_async_request(request)
        except BaseException:
            await one_connection.aclose()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _ClosingBody(response.stream, one_connection)
        return response

    async def aclose(self) -> None:
        if self._pooled is not None:
            await self._pooled.aclose()


@contextmanager
def _httpx_errors(timeout: float | None, request: httpx.Request) -> Iterator[None]:
    """A dial's timeout (None: none) and refusal as httpx's ConnectTimeout and ConnectError."""
    try:
        with trio.fail_after(timeout) if timeout is not None else contextlib.nullcontext():
            yield
    except trio.TooSlowError:
        raise httpx.ConnectTimeout(f"no connection within {timeout!r} s", request=request) from None
    except OSError as exc:
        raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from None
