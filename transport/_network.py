"""The one seam between role code and the network it runs on (STYLE.md 16, 17).

Every role opens its connections, listeners and HTTP clients through a
:class:`Network`: over TCP in production (:data:`TCP_NETWORK`, which does
exactly what the roles did before the seam), inside one trio run in the
round simulator (:class:`transport.MemoryNetwork`). Role code reads only two
things of a connection beyond its bytes, both through the ``.socket`` of a
stream or listener: the peer's address (the gates' ``source``) and the
bound address a server reports; :func:`socket_of` and
:func:`listening_address` read them for either kind of network.
"""

from __future__ import annotations

import http.cookiejar
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx
import trio

Listeners = list[trio.abc.Listener[trio.abc.Stream]]
"""What :meth:`Network.listen` opens (one per address family on TCP, one in memory)."""

DEFAULT_HTTP_TIMEOUT = 5.0
"""httpx's own default (seconds), for a client whose caller names none."""


class SocketAddresses(Protocol):
    """What role code and hypercorn read of a connection's socket: its family and both ends' addresses."""

    @property
    def family(self) -> int: ...

    def getsockname(self) -> Any: ...

    def getpeername(self) -> Any: ...


class Network(Protocol):
    """Where a role connects, listens and makes HTTP clients.

    ``connect`` and ``listen`` raise ``OSError`` as TCP does (nothing listening,
    address in use); ``local_address`` binds the source IP of a connection.
    """

    async def connect(self, host: str, port: int, *, local_address: str | None = None) -> trio.abc.Stream: ...

    async def listen(self, host: str, port: int) -> Listeners: ...

    def http_client(
        self, *, local_address: str | None = None, timeout: httpx.Timeout | float = DEFAULT_HTTP_TIMEOUT,
        **kwargs: Any,
    ) -> httpx.AsyncClient:
        """The one factory of every HTTP client of role code; ``kwargs`` go to ``httpx.AsyncClient``."""
        ...


class _RefusingCookieJar(http.cookiejar.CookieJar):
    """A cookie jar that keeps nothing: no response's Set-Cookie is stored or sent back."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> None:
        return None


def no_cookies() -> http.cookiejar.CookieJar:
    """The cookie jar of every role's HTTP client: an empty one that stays empty.

    No role needs cookies, and a server that could set one could tie a
    client's requests together beyond what its address already does; httpx
    would also parse every response's headers for them.
    """
    return _RefusingCookieJar()


class TcpNetwork:
    """The real network: trio's TCP streams and listeners, plain httpx clients."""

    async def connect(self, host: str, port: int, *, local_address: str | None = None) -> trio.abc.Stream:
        return await trio.open_tcp_stream(host, port, local_address=local_address)

    async def listen(self, host: str, port: int) -> Listeners:
        return list(await trio.open_tcp_listeners(port, host=host))

    def http_client(
        self, *, local_address: str | None = None, timeout: httpx.Timeout | float = DEFAULT_HTTP_TIMEOUT,
        **kwargs: Any,
    ) -> httpx.AsyncClient:
        kwargs.setdefault("cookies", no_cookies())
        if local_address is None:
            return httpx.AsyncClient(timeout=timeout, **kwargs)
        # httpx binds a source address only in its transport, which then owns the pool and TLS settings.
        moved = {name: kwargs.pop(name) for name in ("verify", "limits") if name in kwargs}
        transport = httpx.AsyncHTTPTransport(local_address=local_address, **moved)
        return httpx.AsyncClient(timeout=timeout, transport=transport, **kwargs)


TCP_NETWORK: Network = TcpNetwork()
"""The default network of every role."""


def socket_of(resource: trio.abc.AsyncResource) -> SocketAddresses:
    """The socket under a stream or listener (a ``trio.SocketStream``'s, or the in-memory network's stand-in).

    Raises AttributeError for a stream with neither (a wrapper that hides its socket).
    """
    socket: SocketAddresses = getattr(resource, "socket")
    return socket


def listening_address(listeners: Listeners) -> tuple[str, int]:
    """The (host, port) the first of ``listeners`` is bound to (port 0 asks for a free one)."""
    bound = socket_of(listeners[0]).getsockname()
    return str(bound[0]), int(bound[1])


async def serve_streams(
    network: Network,
    handler: Callable[[trio.abc.Stream], Awaitable[object]],
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[Listeners] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``trio.serve_tcp`` on any network: listen at ``host:port``, report the listeners, then run
    ``handler`` on each connection."""
    listeners = await network.listen(host, port)
    await trio.serve_listeners(handler, listeners, task_status=task_status)
