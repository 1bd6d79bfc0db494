"""A loopback TCP proxy that drops, delays and resets the connections it carries.

The fault benchmark advertises each relay at a proxy's address, so every
link to a relay (from a peer or from another relay) crosses one. Faults are
drawn per connection and per chunk from the proxy's seeded generator:

- drop: the connection is accepted and everything sent on it is read and
  discarded, nothing reaches the relay and nothing comes back (a black hole:
  the sender only learns from its own timeout);
- reset: after a random number of bytes both sides get a TCP RST (SO_LINGER
  0), mid-frame or between frames;
- delay: each chunk waits a uniform time up to ``delay`` seconds before it
  is passed on, in both directions.
"""

from __future__ import annotations

import random
import socket
import struct
from dataclasses import dataclass, field

import trio

CHUNK = 65536
# A reset happens within the first this-many bytes of a connection (a link's
# hello and its first 2 KiB packet), so it hits a hello, a frame or an ack alike.
RESET_WITHIN_BYTES = 4096


@dataclass(frozen=True)
class LinkFaults:
    """Per-connection probabilities of a drop or a reset, and the largest delay per chunk."""

    drop: float = 0.0
    reset: float = 0.0
    delay: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {"drop": self.drop, "reset": self.reset, "delay": self.delay}


@dataclass
class ProxyCounts:
    """What one proxy did."""

    connections: int = 0
    dropped: int = 0
    reset: int = 0
    refused: int = 0  # the relay behind it was down
    delayed_chunks: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _abort(stream: trio.SocketStream) -> None:
    """Close with an RST instead of a FIN: the peer's next read or write fails."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    stream.socket.close()


@dataclass
class LossyProxy:
    """One proxy in front of ``target``; see the module docstring."""

    target: tuple[str, int]
    faults: LinkFaults
    rng: random.Random
    counts: ProxyCounts = field(default_factory=ProxyCounts)

    async def handle(self, client: trio.SocketStream) -> None:
        self.counts.connections += 1
        draw = self.rng.random()
        if draw < self.faults.drop:
            self.counts.dropped += 1
            await self._black_hole(client)
            return
        reset_after = self.rng.randrange(RESET_WITHIN_BYTES) if draw < self.faults.drop + self.faults.reset else None
        try:
            upstream = await trio.open_tcp_stream(*self.target)
        except OSError:
            self.counts.refused += 1
            _abort(client)
            return
        passed = [0]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream, passed, reset_after, nursery.cancel_scope)
            nursery.start_soon(self._pump, upstream, client, passed, reset_after, nursery.cancel_scope)
        for stream in (client, upstream):
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _black_hole(self, client: trio.SocketStream) -> None:
        try:
            while await client.receive_some(CHUNK):
                pass
        except trio.BrokenResourceError:
            pass
        await client.aclose()

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream, passed: list[int],
                    reset_after: int | None, scope: trio.CancelScope) -> None:
        try:
            while chunk := await source.receive_some(CHUNK):
                if self.faults.delay > 0:
                    self.counts.delayed_chunks += 1
                    await trio.sleep(self.rng.uniform(0, self.faults.delay))
                passed[0] += len(chunk)
                if reset_after is not None and passed[0] >= reset_after:
                    self.counts.reset += 1
                    _abort(source)
                    _abort(sink)
                    scope.cancel()
                    return
                await sink.send_all(chunk)
            await sink.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            scope.cancel()


async def serve_lossy_proxy(proxy: LossyProxy, port: int, host: str = "127.0.0.1", *,
                            task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``proxy`` on ``host:port`` (0: any free port); reports the bound port."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(int(listeners[0].socket.getsockname()[1]))
    await trio.serve_listeners(proxy.handle, listeners)
