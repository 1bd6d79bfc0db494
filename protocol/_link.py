"""The relay link: fixed-size Sphinx frames over one TCP stream per neighbour.

DESIGN.md §7 ("one TCP stream per neighbour, fixed-size frames, timeouts on
every read") and §10 ("a packet is acknowledged only after it is durable").
Relays use both sides; the aggregator's packet sink reuses the receiving side
to take packets from last-hop relays.

Wire format, version 1 (all integers big-endian)::

    client -> server   HELLO  = b"AMLK" | version u8 | packet_size u32 | geometry_hash[32]
    server -> client   REPLY  = b"AMLK" | version u8 | HelloStatus u8
    client -> server   FRAME* = packet_size bytes each, back to back, no header
    server -> client   ACK*   = one AckStatus byte per frame, in frame order

A frame carries no length or type: every packet of a round has the same size
(DESIGN.md §5), so the hello fixes the size once and a frame is just the next
``packet_size`` bytes. That keeps parsing total (there is nothing to parse but
a count of bytes) and memory bounded (a connection never buffers more than
``max(max_pending_frames, max_batch) + 2 * max_batch`` frames plus one socket
read, whatever the sender does).

The receiver may acknowledge several frames after one durable write ("group
commit"): ``serve_link`` hands every frame already read to ``on_packets`` in
one call and writes their statuses only after that call returns, so the
caller's store decides when a packet is durable.

An ack says only ACCEPTED, REJECTED (never resend this frame) or BUSY (the
receiver is full; resend later). Which check a rejected packet failed is never
sent back (STYLE.md 8); receivers count the precise reason locally.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from anonml.errors import TransportError

LINK_MAGIC = b"AMLK"
LINK_VERSION = 1
GEOMETRY_HASH_BYTES = 32
_HELLO = struct.Struct(">4sBI32s")
_REPLY = struct.Struct(">4sBB")
HELLO_BYTES = _HELLO.size
HELLO_REPLY_BYTES = _REPLY.size
# Bytes asked of the socket per read: large enough that a batch of frames
# costs few system calls, small enough to bound per-connection memory.
_READ_CHUNK = 131072


class HelloStatus(enum.IntEnum):
    """The server's answer to a hello."""

    OK = 1
    UNSUPPORTED_VERSION = 2
    GEOMETRY_MISMATCH = 3


class AckStatus(enum.IntEnum):
    """The receiver's verdict on one frame, sent only once it is final."""

    ACCEPTED = 1  # durable at the receiver; the sender may forget the packet
    REJECTED = 2  # invalid, late or a replay; resending cannot help
    BUSY = 3  # the receiver is at capacity; the sender may resend later


class LinkError(TransportError):
    """A link session failed.

    Raised by :func:`serve_link`, :func:`read_hello` and :class:`LinkClient` for
    anything a peer on the other end can cause: malformed or mismatched hellos,
    truncated frames, invalid ack bytes, timeouts and broken connections.
    ``reason`` is a short stable label for counters and logs (one of
    :data:`LINK_ERROR_REASONS`).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


LINK_ERROR_REASONS = (
    "bad-magic",
    "bad-version",
    "geometry-mismatch",
    "truncated",
    "hello-timeout",
    "idle-timeout",
    "frame-timeout",
    "ack-timeout",
    "bad-ack",
    "connect-failed",
    "broken",
)


@dataclass(frozen=True)
class LinkLimits:
    """Per-connection limits of the receiving side (seconds and frame counts).

    ``hello_timeout``: the whole hello must arrive within it.
    ``idle_timeout``: the longest wait for the first byte of the next frame;
    an idle sender is disconnected (a :class:`LinkClient` reconnects).
    ``frame_timeout``: once a frame has started, all of it must arrive within
    this, so a slow sender holds a connection slot for a bounded time.
    ``send_timeout``: writing acks (or the hello reply) must finish within it.
    ``max_pending_frames``: frames read but not yet handed to ``on_packets``
    (rounded down to whole batches, at least one).
    ``max_batch``: most frames handed to one ``on_packets`` call.
    """

    hello_timeout: float = 5.0
    idle_timeout: float = 60.0
    frame_timeout: float = 10.0
    send_timeout: float = 10.0
    max_pending_frames: int = 256
    max_batch: int = 128

    def __post_init__(self) -> None:
        for name in ("hello_timeout", "idle_timeout", "frame_timeout", "send_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("max_pending_frames", "max_batch"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_link_parameters(packet_size: int, geometry_hash: bytes) -> None:
    if not (isinstance(packet_size, int) and 0 < packet_size < 2**32):
        raise ValueError(f"packet_size must be a positive 32-bit integer, got {packet_size!r}")
    if not (isinstance(geometry_hash, bytes) and len(geometry_hash) == GEOMETRY_HASH_BYTES):
        raise ValueError(f"geometry_hash must be {GEOMETRY_HASH_BYTES} bytes, got {geometry_hash!r}")


def encode_hello(packet_size: int, geometry_hash: bytes) -> bytes:
    """The client's hello for a link carrying ``packet_size``-byte frames."""
    _check_link_parameters(packet_size, geometry_hash)
    return _HELLO.pack(LINK_MAGIC, LINK_VERSION, packet_size, geometry_hash)


def encode_hello_reply(status: HelloStatus) -> bytes:
    return _REPLY.pack(LINK_MAGIC, LINK_VERSION, int(status))


def check_hello(data: bytes, packet_size: int, geometry_hash: bytes) -> HelloStatus:
    """Parse a received hello; the status to reply with, or :class:`LinkError`.

    Raises ``LinkError("bad-magic")`` when the bytes are not an AnonML link
    hello at all (the server then closes without a reply). A well-formed hello
    for another version or geometry returns the status to send back before
    closing, so an honest but misconfigured sender learns why.
    """
    if len(data) != HELLO_BYTES:
        raise LinkError("truncated", f"hello must be {HELLO_BYTES} bytes, got {len(data)}")
    magic, version, size, digest = _HELLO.unpack(data)
    if magic != LINK_MAGIC:
        raise LinkError("bad-magic", f"not a link hello: magic {magic!r}")
    if version != LINK_VERSION:
        return HelloStatus.UNSUPPORTED_VERSION
    # The geometry hash is public; a plain comparison leaks nothing secret.
    if size != packet_size or digest != geometry_hash:
        return HelloStatus.GEOMETRY_MISMATCH
    return HelloStatus.OK


def parse_hello_reply(data: bytes) -> HelloStatus:
    """Parse the server's hello reply, or raise :class:`LinkError`."""
    if len(data) != HELLO_REPLY_BYTES:
        raise LinkError("truncated", f"hello reply must be {HELLO_REPLY_BYTES} bytes, got {len(data)}")
    magic, version, status = _REPLY.unpack(data)
    if magic != LINK_MAGIC:
        raise LinkError("bad-magic", f"not a link hello reply: magic {magic!r}")
    if version != LINK_VERSION:
        raise LinkError("bad-version", f"server speaks link version {version!r}")
    try:
        return HelloStatus(status)
    except ValueError:
        raise LinkError("bad-magic", f"unknown hello status {status!r}") from None


def parse_acks(data: bytes) -> list[AckStatus]:
    """Parse ack bytes, or raise ``LinkError("bad-ack")``."""
    try:
        return [AckStatus(byte) for byte in data]
    except ValueError:
        raise LinkError("bad-ack", f"invalid ack bytes {data!r}") from None


class _ExactReader:
    """Reads fixed-size records from a stream through one bounded buffer.

    The buffer never holds more than one record plus one socket read
    (``_READ_CHUNK``), whatever the sender does.
    """

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    async def _fill(self) -> bool:
        """One socket read into the buffer; False at end of stream."""
        try:
            chunk = await self._stream.receive_some(_READ_CHUNK)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise LinkError("broken", f"connection broken: {exc!r}") from None
        self._buffer += chunk
        return bool(chunk)

    async def read_exactly(
        self,
        size: int,
        *,
        first_byte_deadline: float,
        complete_timeout: float,
        idle_reason: str,
        slow_reason: str,
    ) -> bytes | None:
        """The next ``size`` bytes; None on a clean end of stream before any byte.

        The first byte must arrive by ``first_byte_deadline`` (trio time), else
        ``LinkError(idle_reason)``; the rest within ``complete_timeout`` seconds,
        else ``LinkError(slow_reason)``.
        """
        if not self._buffer:
            with trio.move_on_at(first_byte_deadline):
                if not await self._fill():
                    return None
            if not self._buffer:
                raise LinkError(idle_reason, f"nothing received before the deadline ({idle_reason})")
        with trio.move_on_after(complete_timeout):
            while len(self._buffer) < size:
                if not await self._fill():
                    raise LinkError("truncated", f"stream ended after {len(self._buffer)} of {size} bytes")
            record = bytes(self._buffer[:size])
            del self._buffer[:size]
            return record
        raise LinkError(slow_reason, f"only {len(self._buffer)} of {size} bytes within {complete_timeout}s")

    def take_complete(self, size: int, max_count: int) -> list[bytes]:
        """Up to ``max_count`` complete ``size``-byte records already buffered (no waiting)."""
        count = min(len(self._buffer) // size, max_count)
        if count <= 0:
            return []
        block = bytes(self._buffer[: count * size])
        del self._buffer[: count * size]
        return [block[i * size : (i + 1) * size] for i in range(count)]

    async def read_available(self, max_size: int, *, deadline: float, reason: str) -> bytes | None:
        """Between 1 and ``max_size`` bytes by ``deadline``; None at end of stream."""
        if not self._buffer:
            with trio.move_on_at(deadline):
                if not await self._fill():
                    return None
            if not self._buffer:
                raise LinkError(reason, f"nothing received before the deadline ({reason})")
        record = bytes(self._buffer[:max_size])
        del self._buffer[: len(record)]
        return record


async def _send_with_timeout(stream: trio.abc.SendStream, data: bytes, timeout: float) -> None:
    try:
        with trio.fail_after(timeout):
            await stream.send_all(data)
    except trio.TooSlowError:
        raise LinkError("broken", f"peer did not read {len(data)} bytes within {timeout}s") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise LinkError("broken", f"connection broken: {exc!r}") from None


OnPackets = Callable[[list[bytes]], Awaitable[Sequence[AckStatus]]]


@dataclass
class LinkSessionStats:
    """What one :func:`serve_link` session did (for the caller's counters)."""

    frames: int = 0
    batches: int = 0


async def serve_link(
    stream: trio.abc.Stream,
    on_packets: OnPackets,
    *,
    packet_size: int,
    geometry_hash: bytes,
    limits: LinkLimits = LinkLimits(),
    stats: LinkSessionStats | None = None,
) -> None:
    """Serve one link session on ``stream`` until the sender closes it.

    Reads the hello, then frames; calls ``await on_packets(frames)`` with every
    frame already read (one to ``limits.max_batch``), which must return one
    :class:`AckStatus` per frame once the accepted ones are durable; then
    writes those statuses. Frames completely received before an error are still
    handed over and acknowledged. Returns on a clean end of stream at a frame
    boundary; raises :class:`LinkError` for everything the sender can cause.
    Exceptions from ``on_packets`` propagate unchanged (they are the caller's
    bugs, not the sender's). Does not close ``stream``.
    """
    _check_link_parameters(packet_size, geometry_hash)
    stats = stats if stats is not None else LinkSessionStats()
    reader = _ExactReader(stream)
    hello = await reader.read_exactly(
        HELLO_BYTES,
        first_byte_deadline=trio.current_time() + limits.hello_timeout,
        complete_timeout=limits.hello_timeout,
        idle_reason="hello-timeout",
        slow_reason="hello-timeout",
    )
    if hello is None:
        raise LinkError("truncated", "connection closed before the hello")
    status = check_hello(hello, packet_size, geometry_hash)
    await _send_with_timeout(stream, encode_hello_reply(status), limits.send_timeout)
    if status is HelloStatus.UNSUPPORTED_VERSION:
        raise LinkError("bad-version", f"hello for an unsupported link version: {hello[4]!r}")
    if status is HelloStatus.GEOMETRY_MISMATCH:
        raise LinkError("geometry-mismatch", f"hello for another geometry: {hello[5:]!r}")

    reader_error: list[LinkError] = []
    # Items are lists of frames: every complete frame already buffered when
    # one arrives, so frames that came together are committed together.
    capacity = max(1, limits.max_pending_frames // limits.max_batch)
    send_batches, receive_batches = trio.open_memory_channel[list[bytes]](capacity)

    async def read_frames() -> None:
        async with send_batches:
            try:
                while True:
                    frame = await reader.read_exactly(
                        packet_size,
                        first_byte_deadline=trio.current_time() + limits.idle_timeout,
                        complete_timeout=limits.frame_timeout,
                        idle_reason="idle-timeout",
                        slow_reason="frame-timeout",
                    )
                    if frame is None:
                        return
                    await send_batches.send([frame, *reader.take_complete(packet_size, limits.max_batch - 1)])
            except LinkError as exc:
                reader_error.append(exc)

    # Errors of the batch loop are kept and raised after the nursery closes, so
    # callers see a bare LinkError, not an ExceptionGroup.
    loop_error: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_frames)
        try:
            async with receive_batches:
                pending: list[bytes] = []
                while True:
                    if not pending:
                        try:
                            pending = await receive_batches.receive()
                        except trio.EndOfChannel:
                            break
                    # Lists that queued during the last commit go into this one (one fsync for all).
                    while len(pending) < limits.max_batch:
                        try:
                            pending += receive_batches.receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    batch, pending = pending[: limits.max_batch], pending[limits.max_batch :]
                    statuses = await on_packets(batch)
                    if len(statuses) != len(batch):
                        raise RuntimeError(f"on_packets returned {len(statuses)} statuses for {len(batch)} frames")
                    stats.frames += len(batch)
                    stats.batches += 1
                    await _send_with_timeout(stream, bytes(int(s) for s in statuses), limits.send_timeout)
        except Exception as exc:
            loop_error.append(exc)
            nursery.cancel_scope.cancel()
    if loop_error:
        raise loop_error[0]
    if reader_error:
        raise reader_error[0]


class _Connection:
    """One connected stream of a :class:`LinkClient` and its ack order.

    Batches are written in ticket order under the client's write lock, and
    their acks (which the receiver sends in frame order) are read in the same
    ticket order: ``served`` is the ticket whose acks are read next.
    """

    def __init__(self, stream: trio.SocketStream, reader: _ExactReader) -> None:
        self.stream = stream
        self.reader = reader
        self.issued = 0
        self.served = 0
        self.turn = trio.Event()
        self.broken = False


class LinkClient:
    """The sending side of a link: one reused connection to one neighbour.

    :meth:`send_batch` writes frames and waits for their acks; on a broken
    connection or timeout it reconnects (with exponential backoff) and resends
    only the frames not yet acknowledged, until ``give_up_at``. A frame may
    thus reach the receiver twice (its ack was lost); the receiver's replay
    cache rejects the copy, which is harmless because the first copy was
    durably accepted.

    Several tasks may call :meth:`send_batch` at once: their batches are
    pipelined on the one connection (the next batch is written while earlier
    ones wait for their acks), which keeps a receiver that commits batch by
    batch busy instead of idle for a round trip per batch.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        packet_size: int,
        geometry_hash: bytes,
        connect_timeout: float = 5.0,
        ack_timeout: float = 30.0,
        initial_backoff: float = 0.05,
        max_backoff: float = 2.0,
    ) -> None:
        _check_link_parameters(packet_size, geometry_hash)
        self.host = host
        self.port = port
        self.packet_size = packet_size
        self._hello = encode_hello(packet_size, geometry_hash)
        self._connect_timeout = connect_timeout
        self._ack_timeout = ack_timeout
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._connection: _Connection | None = None
        self._write_lock = trio.Lock()
        self.connects = 0
        self.failures = 0

    async def _connect(self) -> _Connection:
        """The open connection, or a new one (hello exchanged); call under the write lock."""
        if self._connection is not None:
            return self._connection
        try:
            with trio.fail_after(self._connect_timeout):
                stream = await trio.open_tcp_stream(self.host, self.port)
        except (OSError, trio.TooSlowError) as exc:
            raise LinkError("connect-failed", f"cannot connect to {self.host}:{self.port}: {exc!r}") from None
        reader = _ExactReader(stream)
        try:
            await _send_with_timeout(stream, self._hello, self._connect_timeout)
            reply = await reader.read_exactly(
                HELLO_REPLY_BYTES,
                first_byte_deadline=trio.current_time() + self._connect_timeout,
                complete_timeout=self._connect_timeout,
                idle_reason="hello-timeout",
                slow_reason="hello-timeout",
            )
            if reply is None:
                raise LinkError("truncated", f"{self.host}:{self.port} closed before its hello reply")
            status = parse_hello_reply(reply)
            if status is not HelloStatus.OK:
                raise LinkError("geometry-mismatch", f"{self.host}:{self.port} refused the hello: {status.name}")
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        self._connection = _Connection(stream, reader)
        self.connects += 1
        return self._connection

    async def _break(self, connection: _Connection) -> None:
        """Give up ``connection``: every batch waiting on it fails and is retried."""
        if self._connection is connection:
            self._connection = None
        if not connection.broken:
            connection.broken = True
            connection.turn.set()
            await trio.aclose_forcefully(connection.stream)

    async def _attempt(self, frames: Sequence[bytes], statuses: list[AckStatus]) -> None:
        """Send ``frames`` on the current connection, appending their acks to ``statuses``."""
        async with self._write_lock:
            connection = await self._connect()
            ticket = connection.issued
            connection.issued += 1
            try:
                await _send_with_timeout(connection.stream, b"".join(frames), self._ack_timeout)
            except BaseException:
                await self._break(connection)
                raise
        try:
            while connection.served != ticket and not connection.broken:
                await connection.turn.wait()
            if connection.broken:
                raise LinkError("broken", f"connection to {self.host}:{self.port} failed before these acks")
            outstanding = len(frames)
            while outstanding:
                record = await connection.reader.read_available(
                    outstanding, deadline=trio.current_time() + self._ack_timeout, reason="ack-timeout"
                )
                if record is None:
                    raise LinkError(
                        "truncated", f"{self.host}:{self.port} closed with {outstanding} frames unacknowledged"
                    )
                statuses.extend(parse_acks(record))
                outstanding -= len(record)
        except BaseException:
            # A failed or cancelled read leaves the ack stream out of step.
            await self._break(connection)
            raise
        connection.served += 1
        connection.turn.set()
        connection.turn = trio.Event()

    async def send_batch(self, packets: Sequence[bytes], *, give_up_at: float) -> list[AckStatus | None]:
        """Send ``packets``; one status per packet, None where none was acknowledged.

        Retries (reconnecting, with backoff) start only before ``give_up_at``
        (trio time, ``trio.current_time()``); the first attempt always runs,
        bounded by the connect and ack timeouts. Raises
        ``ValueError`` for a packet of the wrong size (a caller bug).
        """
        for packet in packets:
            if len(packet) != self.packet_size:
                raise ValueError(f"packet must be {self.packet_size} bytes, got {len(packet)}")
        statuses: list[AckStatus] = []
        backoff = self._initial_backoff
        # The first attempt always starts, even at or after give_up_at: a
        # packet released at the very end of its window still gets sent.
        # Each attempt is bounded by the connect and ack timeouts.
        while len(statuses) < len(packets):
            acked_before = len(statuses)
            try:
                await self._attempt(packets[acked_before:], statuses)
            except LinkError:
                self.failures += 1
                if len(statuses) > acked_before:
                    backoff = self._initial_backoff
                retry_at = trio.current_time() + backoff
                if retry_at >= give_up_at:
                    break  # a retry would start at or after give_up_at
                await trio.sleep_until(retry_at)
                backoff = min(backoff * 2, self._max_backoff)
        return [*statuses, *([None] * (len(packets) - len(statuses)))]

    async def aclose(self) -> None:
        async with self._write_lock:
            if self._connection is not None:
                await self._break(self._connection)
