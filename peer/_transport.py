"""Sending Sphinx packets to first-hop relays over the relay link protocol.

A peer hands a packet to the first relay of its path (thesis §5.1 step 4) with
:class:`transport.LinkClient`. :class:`PacketTransport` keeps one link per
relay and coalesces the packets queued for the same relay while a send is in
flight into one batch (the link acknowledges a batch after one durable write
at the relay), so a process running many peers — the demo — does not pay one
round trip per packet. A single peer gets batches of one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from anonml.transport import TCP_NETWORK, AckStatus, LinkClient, Network

MAX_BATCH = 256


@dataclass
class _Pending:
    packet: bytes
    give_up_at: float
    done: trio.Event = field(default_factory=trio.Event)
    status: AckStatus | None = None


class _RelayQueue:
    """The packets waiting for one relay, drained by one task."""

    def __init__(self, client: LinkClient) -> None:
        self.client = client
        self.waiting: list[_Pending] = []
        self.wakeup = trio.Event()

    def _drop_abandoned(self) -> bool:
        """Drop the packets whose senders gave up while they waited (behind a batch in a black-holed
        handshake); whether any are left. A sender that gave up has moved on, to another first relay or the
        second window: a late copy would reach the relay after its send window (a timing leak) or as a duplicate."""
        now = trio.current_time()
        for pending in self.waiting:
            if pending.give_up_at <= now:
                pending.done.set()  # its status stays None: not acknowledged
        self.waiting = [pending for pending in self.waiting if not pending.done.is_set()]
        return bool(self.waiting)

    async def drain(self) -> None:
        while True:
            await self.wakeup.wait()
            self.wakeup = trio.Event()
            while self._drop_abandoned():
                batch, self.waiting = self.waiting[:MAX_BATCH], self.waiting[MAX_BATCH:]
                give_up_at = max(p.give_up_at for p in batch)
                statuses = await self.client.send_batch([p.packet for p in batch], give_up_at=give_up_at)
                for pending, status in zip(batch, statuses, strict=True):
                    pending.status = status
                    pending.done.set()


class PacketTransport:
    """Send packets to relays; one link and one draining task per relay address.

    Use :func:`open_transport`. ``geometry_hash`` and ``packet_size`` come
    from the round's Sphinx geometry (the link hello checks them). Links go
    over ``network`` from ``local_address`` (a simulated peer's own IP).
    """

    def __init__(
        self, nursery: trio.Nursery, *, packet_size: int, geometry_hash: bytes, network: Network = TCP_NETWORK,
        local_address: str | None = None,
    ) -> None:
        self._nursery = nursery
        self._packet_size = packet_size
        self._geometry_hash = geometry_hash
        self._network = network
        self._local_address = local_address
        self._queues: dict[tuple[str, int], _RelayQueue] = {}
        self.sent = 0
        self.acknowledged = 0

    def _queue(self, host: str, port: int) -> _RelayQueue:
        key = (host, port)
        queue = self._queues.get(key)
        if queue is None:
            client = LinkClient(host, port, packet_size=self._packet_size, geometry_hash=self._geometry_hash,
                                network=self._network, local_address=self._local_address)
            queue = self._queues[key] = _RelayQueue(client)
            self._nursery.start_soon(queue.drain)
        return queue

    async def send(self, host: str, port: int, packet: bytes, *, give_up_at: float) -> AckStatus | None:
        """Send one packet to the relay at ``host:port``; its ack, or None if none came by ``give_up_at`` (trio time)."""
        queue = self._queue(host, port)
        pending = _Pending(packet, give_up_at)
        queue.waiting.append(pending)
        queue.wakeup.set()
        self.sent += 1
        # The link may still be in its connect or handshake timeout (a connection that swallows it) when the
        # caller's time is up: the caller moves on, to another relay. The packet is then dropped if it is still
        # queued (_RelayQueue._drop_abandoned), and goes on if its batch is already being sent.
        with trio.move_on_at(give_up_at):
            await pending.done.wait()
        if pending.status is AckStatus.ACCEPTED:
            self.acknowledged += 1
        return pending.status

    async def aclose(self) -> None:
        for queue in self._queues.values():
            await queue.client.aclose()


@asynccontextmanager
async def open_transport(
    *, packet_size: int, geometry_hash: bytes, network: Network = TCP_NETWORK, local_address: str | None = None,
) -> AsyncIterator[PacketTransport]:
    async with trio.open_nursery() as nursery:
        transport = PacketTransport(nursery, packet_size=packet_size, geometry_hash=geometry_hash, network=network,
                                    local_address=local_address)
        try:
            yield transport
        finally:
            nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await transport.aclose()
