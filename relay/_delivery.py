"""Where a released packet is delivered: the next hop its Sphinx header names, or, for a round's packet sink
with ingest workers (the manifest's ``aggregator.workers``, issue 27), any of that sink's addresses; and the
forwarding task (one per address) that takes it there.

The workers share the aggregator's key and the round's store, so any of them may take any packet: a last
relay hands them packets in turn, and moves what one does not acknowledge within a few seconds to the others
while that one rests. The choice depends on nothing about the packet (a turn counter), so it tells no one
anything about who sent it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container

import trio

from anonml.relay._holdings import Neighbour
from anonml.relay._store import HeldPacket

StartForwarder = Callable[[Neighbour, trio.MemoryReceiveChannel[HeldPacket]], None]
"""Starts the task that sends what arrives on the channel to the address."""

SINK_ATTEMPT_SECONDS = 5.0
"""How long a batch is tried at one address of a sink that has others, before it is retried at them."""
UNREACHABLE_REST = 30.0
"""How long an address that did not acknowledge a batch is passed over while its sink has others."""


class DeliveryAddresses:
    """Chooses each packet's address among its next hop's (``addresses_of``: the directory's sink addresses)."""

    def __init__(self, addresses_of: Callable[[Neighbour], tuple[Neighbour, ...]]) -> None:
        self.addresses_of = addresses_of
        self._turn = 0
        self._resting_until: dict[Neighbour, float] = {}

    def has_others(self, address: Neighbour) -> bool:
        """Whether a batch that ``address`` does not take can go elsewhere."""
        return len(self.addresses_of(address)) > 1

    def choose(self, neighbour: Neighbour, now: float) -> Neighbour:
        """``neighbour`` itself, or the next of its sink's addresses in turn, passing over those resting."""
        addresses = self.addresses_of(neighbour)
        if len(addresses) == 1:
            return neighbour
        awake = [a for a in addresses if self._resting_until.get(a, -math.inf) <= now] or list(addresses)
        self._turn += 1
        return awake[self._turn % len(awake)]

    def failed(self, address: Neighbour, now: float) -> None:
        """``address`` acknowledged nothing of a batch by its deadline: rest it, if its sink has others."""
        if self.has_others(address):
            self._resting_until[address] = now + UNREACHABLE_REST


class Forwarders:
    """A forwarding task per address delivered to, started when a packet first goes there."""

    def __init__(self, delivery: DeliveryAddresses, start: StartForwarder, max_neighbours: int) -> None:
        self.delivery = delivery
        self._start = start
        self._max_neighbours = max_neighbours
        self._channels: dict[Neighbour, trio.MemorySendChannel[HeldPacket]] = {}

    def send(self, packet: HeldPacket, now: float, held: Container[Neighbour]) -> None:
        """Hand ``packet`` to its address's forwarder; ``held``: the next hops packets are still held for."""
        address = self.delivery.choose((packet.next_host, packet.next_port), now)
        channel = self._channels.get(address)
        if channel is None:
            self._retire_idle(held)
            channel, receive = trio.open_memory_channel[HeldPacket](math.inf)
            self._channels[address] = channel
            self._start(address, receive)
        channel.send_nowait(packet)

    def _retire_idle(self, held: Container[Neighbour]) -> None:
        """Close forwarders (and their connections) with nothing held, once there are ``max_neighbours`` of
        them: a long-lived relay sees its neighbours change with the directory."""
        if len(self._channels) < self._max_neighbours:
            return
        for address in [a for a in self._channels if not any(n in held for n in self.delivery.addresses_of(a))]:
            self._channels.pop(address).close()


async def gather_batch(
    receive: trio.MemoryReceiveChannel[HeldPacket], gathering: trio.Lock, size: int
) -> list[HeldPacket]:
    """Up to ``size`` packets from ``receive``, waiting for the first; [] once it is closed and empty.

    The pipelined forwarding tasks of one address take turns gathering (``gathering``): trio hands a sent item
    straight to a receiver that waits, so when all of them waited, a burst the scheduler released went out as
    one full batch and a batch of one packet per other task (bench relay: the last relay's median batch was
    one packet), each costing a link round trip and, at the next hop, a commit of its own.
    """
    async with gathering:
        try:
            batch = [await receive.receive()]
        except trio.EndOfChannel:
            return []
        while len(batch) < size:
            try:
                batch.append(receive.receive_nowait())
            except trio.WouldBlock:
                break
        return batch
