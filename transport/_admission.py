"""Connection and request admission for every listener (relay link, packet sink, HTTP API).

Issue 13 measured two cheap ways to take a server down: hundreds of idle or
slow connections from one client exhaust a connection limit (or the process's
file descriptors), and a flood from anyone crowds out the relays a server
must hear from. :class:`ConnectionGate` bounds both, per listener:

- ``max_total`` open connections in all; beyond it a new connection is closed
  at once and counted;
- ``max_per_source`` of the *public* ones from one IP address and
  ``max_per_prefix`` from one /24 (or /48), from the first connection (issue
  25: a cap that applied only once half the slots were taken let link churn
  from 8 addresses take all 224 public slots);
- when the slots are full (all of them, or the source's or its prefix's
  share), the public connection idle longest (no byte in either direction)
  of that pool (of all of them: of the /24 holding the most) is closed to
  admit the new one, so connections that sit
  silent, or are reopened as fast as they are closed, from however many
  addresses, cannot keep an honest client out (within a network, an active
  connection is never the one evicted while a silent one is open; a
  network is evicted from only while it holds the most), and peers behind one
  address or network take turns instead of being refused; a connection
  whose client has hung up (its end of the stream read) goes first, even
  while the server still works on its request (issue 27: clients that gave
  up on a slow answer and retried left as many such connections as the
  source's cap, and every new one from that address was refused);
- ``reserved`` of the slots only for *privileged* sources: addresses of the
  server's directory neighbours. A connection from such an address takes a
  privileged slot at accept time; once its link handshake shows who it is, a
  client that is not an authenticated neighbour is demoted to a public slot
  (or closed when none is free). So strangers, however many, leave
  ``reserved`` slots to the neighbours.

Issue 13 also measured clients that each hold one connection and poll in a
tight loop: eight of them took 80% of the aggregator's process, which runs the
packet sink too. :class:`RequestPacer` gives each source a fair share of a
request rate, so such a flood is slowed instead of served as fast as the CPU
allows.

Counts live on the trio thread (no locks).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import ipaddress
import math
import random
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import trio

from anonml.transport._network import socket_of


class GateRefusal(enum.StrEnum):
    """Why a connection was closed at accept (or at demotion), or to make room: one counter label each."""

    TOTAL = "total"
    PER_SOURCE = "per-source"
    PER_PREFIX = "per-prefix"
    EVICTED = "evicted-idle"  # an open connection closed to admit a new one (the oldest idle)
    OVER_SHARE = "over-share"  # the slots are full and the newcomer's network holds its share of them or more


@dataclass
class ConnectionGate:
    """Open-connection counts of one listener and its limits (module docstring)."""

    max_total: int
    max_per_source: int
    reserved: int = 0
    refused: Counter[GateRefusal] = field(default_factory=Counter)
    max_per_prefix: int = 0
    """Public connections from one /24 (or /48); 0: twice ``max_per_source``."""
    public_by_source: Counter[str] = field(default_factory=Counter)
    public_by_prefix: Counter[str] = field(default_factory=Counter)
    public: int = 0
    """Open public connections: the sum of ``public_by_source``, kept as connections come and go
    (checked on every accepted connection, a flood's too)."""
    privileged: int = 0
    last_refusal: GateRefusal | None = None
    hold_refused: float = 1.0
    """Seconds a refused connection is kept open, unread, before it is closed (:meth:`turn_away`), on average."""
    holding: int = 0
    _idle_order: dict[str, OrderedDict[GateSlot, None]] = field(default_factory=dict)
    """The public slots that may be evicted, least recently active first: all of them under ``""``,
    and each source's and each prefix's under its own name."""

    def __post_init__(self) -> None:
        if not (isinstance(self.max_total, int) and self.max_total >= 1):
            raise ValueError(f"max_total must be a positive integer, got {self.max_total!r}")
        if not (isinstance(self.max_per_source, int) and self.max_per_source >= 1):
            raise ValueError(f"max_per_source must be a positive integer, got {self.max_per_source!r}")
        if not (isinstance(self.reserved, int) and 0 <= self.reserved < self.max_total):
            raise ValueError(f"reserved must be an integer in [0, max_total), got {self.reserved!r}")
        if not (isinstance(self.hold_refused, (int, float)) and 0 <= self.hold_refused < math.inf):
            raise ValueError(f"hold_refused must be a number of seconds of at least 0, got {self.hold_refused!r}")
        if self.max_per_prefix == 0:
            self.max_per_prefix = 2 * self.max_per_source
        if not (isinstance(self.max_per_prefix, int) and self.max_per_prefix >= self.max_per_source):
            raise ValueError(f"max_per_prefix must be an integer of at least max_per_source, got {self.max_per_prefix!r}")

    @property
    def open_connections(self) -> int:
        return self.public + self.privileged

    async def turn_away(self, stream: trio.abc.Stream) -> None:
        """Close a connection :meth:`open` refused: after about ``hold_refused`` seconds, unread, while fewer than
        :func:`holding_room` of ``max_total`` are held; at once otherwise.

        A client that reopens each connection as soon as it is closed (issue 25's churn) would otherwise
        get its next one accepted, counted and refused as fast as the server can: 1,200 a second took 76%
        of the relay's process. Held, each of its connections costs the server a descriptor and a
        sleeping task for a second, and the churn runs at the rate the hold allows.
        """
        if self.holding < holding_room(self.max_total):
            self.holding += 1
            try:
                # Jittered: refusals that came together (a churner's connections, all refused at once) would
                # otherwise come back together, a burst of accepts each ``hold_refused`` (stalls of 40-60 ms
                # in the aggregator's process, every second, under http-slow-bodies).
                await trio.sleep(self.hold_refused * random.uniform(0.5, 1.5))
            finally:
                self.holding -= 1
        await trio.aclose_forcefully(stream)

    def _public_refusal(self, source: str, *, demoting: bool) -> GateRefusal | None:
        """Why ``source`` may not take one more public slot (None: it may, perhaps after an
        eviction). A demoted connection already holds one of the ``max_total``, so only a new one
        needs room in the total."""
        prefix = source_prefix(source)
        if self.public_by_source[source] >= self.max_per_source and not self._evict_oldest_idle(source):
            return GateRefusal.PER_SOURCE
        if self.public_by_prefix[prefix] >= self.max_per_prefix and not self._evict_oldest_idle(prefix):
            return GateRefusal.PER_PREFIX
        full = self.public >= self.max_total - self.reserved or (not demoting and self.open_connections >= self.max_total)
        if full and self._over_its_share(prefix):
            return GateRefusal.OVER_SHARE
        if full and not self._evict_from_the_largest_network():
            return GateRefusal.TOTAL
        return None

    def _over_its_share(self, prefix: str) -> bool:
        """Whether ``prefix``, one of several networks, holds its equal share of the public slots or more.

        Such a network's newcomer is refused rather than admitted in place of one of its own connections:
        issue 25's churners (16 networks, 10% more connections than slots) each evicted another of their
        own as fast as the server could accept, which took all of its CPU. A network alone (a loopback
        demo's peers) still takes turns among its own.
        """
        networks = len(self.public_by_prefix) + (prefix not in self.public_by_prefix)
        return networks > 1 and self.public_by_prefix[prefix] * networks >= self.max_total - self.reserved

    def _evict_from_the_largest_network(self) -> bool:
        """Make room in the total: close a connection whose client hung up, or else the idlest one of
        the /24 (or /48) that holds the most public slots; False if none may be closed.

        Issue 25's link churn reopened 1,200 connections a second into the relay's slots, so each lived
        about 0.2 s: an honest peer's kept-alive link, idle 0.3 s between its packets, was the idlest of
        all and was evicted again and again. Taken from the network holding the most, a slot goes to a
        network holding few, and churn from a few networks only evicts the churner's own connections
        (from as many networks as there are slots, each holds one, and this protects nothing: README).
        """
        everyone = self._idle_order.get("")
        if not everyone:
            return False
        idlest = next(iter(everyone))
        if not idlest.hung_up:
            by_size = self.public_by_prefix
            most = max(by_size[prefix] for prefix in by_size if prefix in self._idle_order)
            idlest = next(slot for slot in everyone if by_size[slot.prefix] == most)
        idlest.evict()
        self.refused[GateRefusal.EVICTED] += 1
        return True

    def _evict_oldest_idle(self, pool: str) -> bool:
        """Close the public connection of ``pool`` (a source or a prefix) that has been idle longest
        (counted); False if none may be."""
        order = self._idle_order.get(pool)
        if not order:
            return False
        oldest = next(iter(order))
        oldest.evict()
        self.refused[GateRefusal.EVICTED] += 1
        return True

    def _mark_active(self, slot: GateSlot, *, first_to_evict: bool = False) -> None:
        for pool in ("", slot.source, slot.prefix):
            order = self._idle_order.setdefault(pool, OrderedDict())
            order[slot] = None
            order.move_to_end(slot, last=not first_to_evict)

    def _forget(self, slot: GateSlot) -> None:
        for pool in ("", slot.source, slot.prefix):
            order = self._idle_order.get(pool)
            if order is not None:
                order.pop(slot, None)
                if not order and pool:
                    del self._idle_order[pool]

    def _take_public(self, source: str) -> None:
        self.public_by_source[source] += 1
        self.public_by_prefix[source_prefix(source)] += 1
        self.public += 1

    def _release_public(self, source: str) -> None:
        self.public -= 1
        for counter, key in ((self.public_by_source, source), (self.public_by_prefix, source_prefix(source))):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]

    def open(self, source: str, *, privileged: bool = False) -> GateSlot | None:
        """A slot for a new connection from ``source`` (an IP address), or None (counted) to close it."""
        self.last_refusal = None
        if privileged:
            if self.open_connections >= self.max_total and not self._evict_from_the_largest_network():
                self.refused[GateRefusal.TOTAL] += 1
                self.last_refusal = GateRefusal.TOTAL
                return None
            self.privileged += 1
            return GateSlot(self, source, privileged=True)
        refusal = self._public_refusal(source, demoting=False)
        if refusal is not None:
            self.refused[refusal] += 1
            self.last_refusal = refusal
            return None
        self._take_public(source)
        return GateSlot(self, source, privileged=False)


def holding_room(max_total: int) -> int:
    """How many refused connections a gate of ``max_total`` slots holds open at once (:meth:`ConnectionGate.turn_away`):
    what a server adds to its connection caps when it fits them to its descriptors.

    A quarter of the slots: issue 25's churners bring 10% more connections than all the slots, and a
    relay keeps an eighth of its slots for its neighbours, so 22% of its slots' worth come back refused.
    """
    return max(1, max_total // 4)


class GateSlot:
    """One admitted connection; :meth:`close` it when the connection ends.

    A handler that runs its connection inside :attr:`cancel_scope` and reads
    and writes through :meth:`watch`'s stream makes its connection evictable:
    when the gate is full, the public connection idle longest (no byte in
    either direction) is cancelled to admit a new one.
    """

    def __init__(self, gate: ConnectionGate, source: str, *, privileged: bool) -> None:
        self._gate = gate
        self.source = source
        self.prefix = source_prefix(source)
        self.privileged = privileged
        self.cancel_scope = trio.CancelScope()
        self.evicted = False
        self._watched = False
        self._stream: trio.abc.Stream | None = None
        self._busy = 0
        self._open = True
        self.hung_up = False
        """The client closed its end: whatever the server still works on has no one to answer."""

    def watch(self, stream: trio.abc.Stream) -> ActiveStream:
        """``stream``, each byte through which marks this connection active (and evictable when idle)."""
        self._watched = True
        self._stream = stream
        self.touch()
        return ActiveStream(stream, self)

    def touch(self) -> None:
        """The connection moved a byte: it is now the most recently active (a hung-up one stays first to evict)."""
        if self._watched and self._open and not self.privileged and not self._busy and not self.hung_up:
            self._gate._mark_active(self)

    def client_hung_up(self) -> None:
        """The client closed its end of the stream: busy or not, this connection is the first one its
        pools evict (an answer it still waits for reaches nobody; a half-closing client that still
        reads loses its answer only when its address's slots are all taken)."""
        if self.hung_up:
            return
        self.hung_up = True
        if self._watched and self._open and not self.privileged:
            self._gate._mark_active(self, first_to_evict=True)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """While the server works on what the connection asked (a batch, a complete request), it
        moves no byte but is not idle: it is never evicted, however long the work takes (a loaded
        machine made an honest request wait longer than silent connections had been open)."""
        self._busy += 1
        if not self.hung_up:
            self._gate._forget(self)
        try:
            yield
        finally:
            self._busy -= 1
            self.touch()

    def evict(self) -> None:
        """Free the slot now, close the socket now and cancel the connection's handler.

        The socket is closed here, not when the cancelled handler gets to it: the slot goes to the
        newcomer at once, and a descriptor still open behind a freed slot would let a fast churn
        hold more descriptors than the gate admits (the caps fit RLIMIT_NOFILE).
        """
        self.evicted = True
        self.cancel_scope.cancel()
        if isinstance(self._stream, trio.SocketStream):
            self._stream.socket.close()  # trio wakes a task blocked on it with ClosedResourceError
        self.close()

    def demote(self) -> bool:
        """Move a privileged slot to a public one; False (counted) if no public slot is free."""
        gate = self._gate
        if not self.privileged:
            return True
        # Demotion keeps the total; only the public pool and the source's share grow.
        refusal = gate._public_refusal(self.source, demoting=True)
        if refusal is not None:
            gate.refused[refusal] += 1
            return False
        gate.privileged -= 1
        gate._take_public(self.source)
        self.privileged = False
        self.touch()
        return True

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        gate = self._gate
        if self.privileged:
            gate.privileged -= 1
        else:
            gate._forget(self)
            gate._release_public(self.source)


class ActiveStream(trio.abc.HalfCloseableStream):
    """A connection's stream that tells its :class:`GateSlot` whenever a byte moves (hypercorn reads
    the socket's addresses from ``.socket``, which it passes through)."""

    def __init__(self, stream: trio.abc.Stream, slot: GateSlot) -> None:
        self._stream = stream
        self._slot = slot
        self.socket = getattr(stream, "socket", None)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._slot.touch()
        await self._stream.send_all(data)
        self._slot.touch()

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._stream.receive_some(max_bytes)
        if data:
            self._slot.touch()
        else:
            self._slot.client_hung_up()
        return data

    async def send_eof(self) -> None:
        if isinstance(self._stream, trio.abc.HalfCloseableStream):
            await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


@dataclass
class _Bucket:
    tokens: float
    updated: float
    last_request: float


class RequestPacer:
    """Each source's fair share of ``rate`` requests per second; a request beyond it waits its turn.

    A source's share is ``rate`` divided by the number of sources that sent a
    request in the last :attr:`ACTIVE_SECONDS`, but never below ``floor``. So
    a source alone (a loopback demo's peers, all on 127.0.0.1) may use the
    whole rate, a client asking for less than its share never waits however
    many others flood, and floods from a few sources together get at most
    ``rate``. The floor keeps a round of many peers, each at its own address,
    from being held to ``rate`` in all: a peer polling no faster than ``floor``
    never waits, however many others poll. Each source saves up to ``burst``
    requests while it is quiet.

    A request over its share waits, it is not refused: an honest burst (every
    peer polling for the roster as registration closes) is slowed, never failed.
    The wait costs no CPU, and how many requests wait is bounded by the
    connection gate (HTTP/1.1 serves one request at a time per connection).
    Time is trio's clock, so tests run it under MockClock.
    """

    ACTIVE_SECONDS = 2.0
    _RECOUNT_SECONDS = 0.25  # the active sources are recounted (and idle ones forgotten) at most this often

    def __init__(self, rate: float, burst: float, floor: float) -> None:
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a positive number of requests per second, got {rate!r}")
        if not (isinstance(burst, (int, float)) and math.isfinite(burst) and burst >= 1):
            raise ValueError(f"burst must be a number of requests of at least 1, got {burst!r}")
        if not (isinstance(floor, (int, float)) and 0 < floor <= rate):
            raise ValueError(f"floor must be a number of requests per second in (0, rate], got {floor!r}")
        self.rate = float(rate)
        self.burst = float(burst)
        self.floor = float(floor)
        self._buckets: dict[str, _Bucket] = {}  # the active sources'
        self._counted_at = -math.inf

    def _forget_idle(self, now: float) -> None:
        """Forget sources without a request in the last ACTIVE_SECONDS (at most every _RECOUNT_SECONDS).

        A forgotten source comes back with a full bucket, which gives it at most
        ``burst`` extra requests per ACTIVE_SECONDS.
        """
        if now - self._counted_at >= self._RECOUNT_SECONDS:
            horizon = now - self.ACTIVE_SECONDS
            self._buckets = {source: bucket for source, bucket in self._buckets.items()
                             if bucket.last_request >= horizon}
            self._counted_at = now

    async def admit(self, source: str) -> bool:
        """Wait until ``source`` may send one more request; True if it had to wait."""
        now = trio.current_time()
        self._forget_idle(now)
        bucket = self._buckets.get(source)
        if bucket is None:
            bucket = self._buckets[source] = _Bucket(self.burst, now, now)
        share = max(self.rate / len(self._buckets), self.floor)  # the active sources' fair share
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * share) - 1
        bucket.updated = now
        # In debt, the request waits until the share has repaid it: requests of one source queue
        # up in order, each behind the debt of those before it. The source counts as active
        # until its last queued request goes through, so waiting never earns it a fresh bucket.
        wait = max(0.0, -bucket.tokens / share)
        bucket.last_request = max(bucket.last_request, now + wait)
        if wait == 0:
            await trio.lowlevel.checkpoint()
            return False
        await trio.sleep(wait)
        return True


# The network an attacker's addresses share (issue 25's model: up to 64 addresses in each of up to
# 16 /24s): an IPv4 /24, an IPv6 /48 (the usual smallest assignment to a site).
_IPV4_PREFIX = 24
_IPV6_PREFIX = 48


@functools.lru_cache(maxsize=4096)  # asked per frame and per connection, of a few sources at a time
def source_prefix(source: str) -> str:
    """The network of an IP address (``"10.1.2.0/24"``), the unit of per-prefix caps; a
    string that is no IP address (``"?"``, a simulated name) is its own network."""
    try:
        address = ipaddress.ip_address(source)
    except ValueError:
        return source
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    bits = _IPV4_PREFIX if address.version == 4 else _IPV6_PREFIX
    return str(ipaddress.ip_network((address, bits), strict=False))


def peer_address(stream: trio.abc.Stream) -> str:
    """The IP address a connection comes from (a gate's ``source``), or ``"?"`` once it has gone."""
    try:
        return str(socket_of(stream).getpeername()[0])
    except OSError:
        return "?"
