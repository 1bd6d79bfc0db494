"""A minimal final hop for the relay benchmark and tests.

It receives from last-hop relays with :func:`transport.serve_link`, removes the
final Sphinx layer with the aggregator's private key, and records when each
message arrived. It keeps replay tags in memory and stores nothing durably:
it measures the relays, it is not the aggregator (whose sink verifies tokens
and commits before acking, ``aggregator._sink``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from anonml.crypto import FinalMessage, InvalidPacket, SphinxGeometry, process_packet
from anonml.transport import AckStatus, LinkError, LinkIdentity, serve_link


@dataclass
class Arrival:
    """One message the sink decrypted, with its wall arrival time."""

    message: bytes
    arrived_at: float


@dataclass
class FinalHopSink:
    """The recording final hop (see module docstring)."""

    geometry: SphinxGeometry
    private_key: bytes
    wall_time: Callable[[], float] = time.time
    arrivals: list[Arrival] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    link_errors: Counter[str] = field(default_factory=Counter)
    process_seconds: float = 0.0  # CPU seconds in on_packets
    _seen_tags: set[bytes] = field(default_factory=set)
    _arrived: trio.Event = field(default_factory=trio.Event)
    _wanted: int = 0

    def _is_replay(self, tag: bytes) -> bool:
        if tag in self._seen_tags:
            return True
        self._seen_tags.add(tag)
        return False

    async def on_packets(self, frames: list[bytes]) -> list[AckStatus]:
        started = time.thread_time()  # once per batch, not per frame (a system call)
        now = self.wall_time()
        statuses = []
        for frame in frames:
            try:
                result = process_packet(self.geometry, self.private_key, frame, is_replay=self._is_replay)
            except InvalidPacket as exc:
                self.rejected[exc.reason] += 1
                statuses.append(AckStatus.REJECTED)
                continue
            if isinstance(result, FinalMessage):
                self.arrivals.append(Arrival(result.message, now))
                statuses.append(AckStatus.ACCEPTED)
            else:
                self.rejected["not-final"] += 1
                statuses.append(AckStatus.REJECTED)
        self.process_seconds += time.thread_time() - started
        if len(self.arrivals) >= self._wanted > 0:
            self._arrived.set()
        return statuses

    async def wait_for(self, count: int) -> None:
        """Return once ``count`` messages have arrived."""
        self._wanted = count
        if len(self.arrivals) < count:
            self._arrived = trio.Event()
            await self._arrived.wait()

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            # It proves it is the final hop (relays insist on the node id they forward to); it takes anyone's packets.
            await serve_link(
                stream, self.on_packets, packet_size=self.geometry.packet_size,
                geometry_hash=self.geometry.canonical_hash(), identity=LinkIdentity(self.private_key),
            )
        except LinkError as exc:
            self.link_errors[exc.reason] += 1
        finally:
            await trio.aclose_forcefully(stream)

    async def serve(
        self, host: str = "127.0.0.1", port: int = 0, *,
        task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` and serve until cancelled; reports the bound address."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()
        task_status.started((str(bound[0]), int(bound[1])))
        await trio.serve_listeners(self.handle, listeners)
