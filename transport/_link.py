"""The relay link: fixed-size Sphinx frames over one TCP stream per neighbour.

DESIGN.md §7 ("one TCP stream per neighbour, fixed-size frames, timeouts on
every read") and §10 ("a packet is acknowledged only after it is durable").
Relays use both sides; the aggregator's packet sink reuses the receiving side
to take packets from last-hop relays.

Wire format, version 3 (all integers big-endian)::

    client -> server   HELLO   = b"AMLK" | version u8 | packet_size u32 | geometry_hash[32]
                                 | client_key[32] | client_nonce[32]
    server -> client   REPLY   = b"AMLK" | version u8 | HelloStatus u8 | server_key[32] | server_nonce[32]
                                 | work u8
    (only when both keys are non-zero: the authenticated handshake)
    client -> server   PROOF   = HMAC(K, "client" | HELLO | REPLY)                      [32]
    server -> client   CONFIRM = AuthVerdict u8 | HMAC(K, "server" | HELLO | REPLY)     [33]
    client -> server   FRAME*  = packet_size bytes each (+ a stamp, see below), back to back, no header
    server -> client   ACK*    = one AckStatus byte per frame, in frame order (0x40 | k: MORE_WORK, k bits)

First-hop work (issue 25, protocol._work). A server given a :class:`WorkDemand`
decides in the handshake whether the client must do work: ``work`` is 0 when
its frames are bare packets (a listed neighbour, or a server asking no work),
else 1 + the bits of work asked now, and every frame of the session is then
the packet followed by its ``STAMP_BYTES`` stamp, bound to the packet and to
``server_nonce``. A frame whose stamp does less work than the server asks
when it checks it is answered MORE_WORK with the bits asked in the ack byte
itself, so the client can re-stamp and resend on the same connection; the
server checks a stamp before anything else of the frame.

Authentication (crypto._link_auth). A key is a node's static X25519 public
key, whose hash is the node id every relay directory and round manifest lists
(a relay's identity key; the aggregator's final-hop key); 32 zero bytes mean
"anonymous" (a peer sending to its first relay, or a server without an
identity). K comes from the static-static X25519 agreement salted with the
transcript, whose two fresh nonces make every session's proofs new. So after
the handshake the server knows which directory node (if any) is connecting:
a relay reserves capacity for its directory neighbours, and the aggregator's
sink takes packets only from the relays its signed manifest lists. The client
may insist on the server's node id (a relay forwarding to the next hop a
packet names), so a host that took over the address cannot swallow packets.
Why not TLS or Noise: frames are Sphinx packets, already encrypted and MACed
per hop, so the link needs only to know who connected, for admission; the
node ids are already X25519 key hashes, so no certificates or signature keys
are needed, and the cost is one X25519 per side per connection. The frames
after the handshake are not MACed: an on-path attacker who can inject into a
TCP stream can only inject Sphinx frames, which are checked hop by hop.

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
import os
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

from anonml.crypto import (
    CLIENT_ROLE,
    LINK_PROOF_BYTES,
    SERVER_ROLE,
    InvalidKey,
    link_proof,
    link_proof_valid,
    link_session_key,
    node_id_of,
    public_key_of,
)
from anonml.base.errors import TransportError
from anonml.protocol import MAX_WORK_BITS, STAMP_BYTES
from anonml.transport._network import TCP_NETWORK, Network

LINK_MAGIC = b"AMLK"
LINK_VERSION = 3
GEOMETRY_HASH_BYTES = 32
LINK_KEY_BYTES = 32
_NONCE_BYTES = 32
ANONYMOUS = bytes(LINK_KEY_BYTES)
_PREFIX = struct.Struct(">4sB")
_HELLO = struct.Struct(">4sBI32s32s32s")
_REPLY = struct.Struct(">4sBB32s32sB")
_CONFIRM = struct.Struct(">B32s")
HELLO_BYTES = _HELLO.size
HELLO_REPLY_BYTES = _REPLY.size
CONFIRM_BYTES = _CONFIRM.size
# Bytes asked of the socket per read: large enough that a batch of frames
# costs few system calls, small enough to bound per-connection memory.
_READ_CHUNK = 131072


class HelloStatus(enum.IntEnum):
    """The server's answer to a hello."""

    OK = 1
    UNSUPPORTED_VERSION = 2
    GEOMETRY_MISMATCH = 3
    AUTH_REQUIRED = 4  # this server takes packets only from authenticated directory nodes


class AuthVerdict(enum.IntEnum):
    """The server's answer to a client's proof."""

    ACCEPTED = 1
    REFUSED = 2  # the proof failed, or the node is not one this server takes packets from


class AckStatus(enum.IntEnum):
    """The receiver's verdict on one frame, sent only once it is final."""

    ACCEPTED = 1  # durable at the receiver; the sender may forget the packet
    REJECTED = 2  # invalid, late or a replay; resending cannot help
    BUSY = 3  # the receiver is at capacity (or not ready); the sender may resend later
    MORE_WORK = 4  # the frame's stamp did less work than the receiver asks; on the wire 0x40 | bits asked


class LinkErrorReason(enum.StrEnum):
    """Why a link session ended: the one spelling of each counter label."""

    BAD_MAGIC = "bad-magic"
    BAD_VERSION = "bad-version"
    GEOMETRY_MISMATCH = "geometry-mismatch"
    TRUNCATED = "truncated"
    HELLO_TIMEOUT = "hello-timeout"
    FIRST_FRAME_TIMEOUT = "first-frame-timeout"
    IDLE_TIMEOUT = "idle-timeout"
    FRAME_TIMEOUT = "frame-timeout"
    ACK_TIMEOUT = "ack-timeout"
    BAD_ACK = "bad-ack"
    AUTH_REQUIRED = "auth-required"
    AUTH_FAILED = "auth-failed"
    WRONG_PEER = "wrong-peer"
    REFUSED = "refused"
    CONNECT_FAILED = "connect-failed"
    BROKEN = "broken"


class LinkError(TransportError):
    """A link session failed.

    Raised by :func:`serve_link` and :class:`LinkClient` for anything a peer
    on the other end can cause: malformed or mismatched hellos, failed or
    refused authentication, truncated frames, invalid ack bytes, timeouts and
    broken connections. ``reason`` is its :class:`LinkErrorReason`.
    """

    def __init__(self, reason: LinkErrorReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_positive_seconds(limits: object, names: Sequence[str]) -> None:
    """ValueError naming the first of ``limits``' attributes ``names`` that is not a positive finite number."""
    for name in names:
        value = getattr(limits, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


@dataclass(frozen=True)
class LinkLimits:
    """Per-connection limits of the receiving side (seconds and frame counts).

    ``hello_timeout``: the whole handshake (hello, and proof when
    authenticating) must arrive within it.
    ``first_frame_timeout``: after the handshake, the first frame must start
    within it: a sender connects when it has packets, so a connection that
    stays silent is an idle-slot attack (issue 13), closed early.
    ``idle_timeout``: the longest wait for the first byte of each later frame;
    an idle sender is disconnected (a :class:`LinkClient` reconnects).
    ``frame_timeout``: once a frame has started, all of it must arrive within
    this, so a slow sender holds a connection slot for a bounded time.
    ``send_timeout``: writing acks (or handshake replies) must finish within it.
    ``max_pending_frames``: frames read but not yet handed to ``on_packets``
    (rounded down to whole batches, at least one).
    ``max_batch``: most frames handed to one ``on_packets`` call.
    """

    hello_timeout: float = 5.0
    first_frame_timeout: float = 5.0
    idle_timeout: float = 60.0
    frame_timeout: float = 10.0
    send_timeout: float = 10.0
    max_pending_frames: int = 256
    max_batch: int = 128

    def __post_init__(self) -> None:
        check_positive_seconds(self, ("hello_timeout", "first_frame_timeout", "idle_timeout", "frame_timeout",
                                      "send_timeout"))
        for name in ("max_pending_frames", "max_batch"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class LinkIdentity:
    """A node's static X25519 key for link authentication (its node id is the public key's hash)."""

    private_key: bytes
    public_key: bytes = field(init=False)
    node_id: bytes = field(init=False)

    def __post_init__(self) -> None:
        public = public_key_of(self.private_key)
        object.__setattr__(self, "public_key", public)
        object.__setattr__(self, "node_id", node_id_of(public))


def _check_link_parameters(packet_size: int, geometry_hash: bytes) -> None:
    if not (isinstance(packet_size, int) and 0 < packet_size < 2**32):
        raise ValueError(f"packet_size must be a positive 32-bit integer, got {packet_size!r}")
    if not (isinstance(geometry_hash, bytes) and len(geometry_hash) == GEOMETRY_HASH_BYTES):
        raise ValueError(f"geometry_hash must be {GEOMETRY_HASH_BYTES} bytes, got {geometry_hash!r}")


def _nonce() -> bytes:
    return os.urandom(_NONCE_BYTES)


def encode_hello(packet_size: int, geometry_hash: bytes, *, key: bytes = ANONYMOUS, nonce: bytes | None = None) -> bytes:
    """The client's hello for a link carrying ``packet_size``-byte frames (``key``: its static public key)."""
    _check_link_parameters(packet_size, geometry_hash)
    return _HELLO.pack(LINK_MAGIC, LINK_VERSION, packet_size, geometry_hash, key, nonce if nonce is not None else _nonce())


def encode_hello_reply(status: HelloStatus, *, key: bytes = ANONYMOUS, nonce: bytes | None = None,
                       work_bits: int | None = None) -> bytes:
    """The server's hello reply; ``work_bits`` is the work its frames must carry now (None: bare packets)."""
    work = 0 if work_bits is None else 1 + min(work_bits, MAX_WORK_BITS)
    return _REPLY.pack(LINK_MAGIC, LINK_VERSION, int(status), key, nonce if nonce is not None else _nonce(), work)


def reply_work(reply: bytes) -> tuple[bytes, int | None]:
    """A parsed hello reply's session nonce and the work its frames must carry (None: bare packets)."""
    nonce, work = _REPLY.unpack(reply)[4:]
    return nonce, (None if work == 0 else work - 1)


def check_hello(data: bytes, packet_size: int, geometry_hash: bytes) -> HelloStatus:
    """Parse a received hello; the status to reply with, or :class:`LinkError`.

    Raises ``LinkError(BAD_MAGIC)`` when the bytes are not an AnonML link
    hello at all (the server then closes without a reply). A well-formed hello
    for another version or geometry returns the status to send back before
    closing, so an honest but misconfigured sender learns why.
    """
    if len(data) < _PREFIX.size:
        raise LinkError(LinkErrorReason.TRUNCATED, f"hello must be {HELLO_BYTES} bytes, got {len(data)}")
    magic, version = _PREFIX.unpack(data[: _PREFIX.size])
    if magic != LINK_MAGIC:
        raise LinkError(LinkErrorReason.BAD_MAGIC, f"not a link hello: magic {magic!r}")
    if version != LINK_VERSION:
        return HelloStatus.UNSUPPORTED_VERSION
    if len(data) != HELLO_BYTES:
        raise LinkError(LinkErrorReason.TRUNCATED, f"hello must be {HELLO_BYTES} bytes, got {len(data)}")
    _, _, size, digest, _, _ = _HELLO.unpack(data)
    # The geometry hash is public; a plain comparison leaks nothing secret.
    if size != packet_size or digest != geometry_hash:
        return HelloStatus.GEOMETRY_MISMATCH
    return HelloStatus.OK


def parse_hello_reply(data: bytes) -> HelloStatus:
    """Parse the server's hello reply's status, or raise :class:`LinkError`."""
    if len(data) != HELLO_REPLY_BYTES:
        raise LinkError(LinkErrorReason.TRUNCATED, f"hello reply must be {HELLO_REPLY_BYTES} bytes, got {len(data)}")
    magic, version, status, _, _, work = _REPLY.unpack(data)
    if magic != LINK_MAGIC:
        raise LinkError(LinkErrorReason.BAD_MAGIC, f"not a link hello reply: magic {magic!r}")
    if version != LINK_VERSION:
        raise LinkError(LinkErrorReason.BAD_VERSION, f"server speaks link version {version!r}")
    if work > MAX_WORK_BITS + 1:
        raise LinkError(LinkErrorReason.BAD_MAGIC, f"hello reply asks unnamable work {work!r}")
    try:
        return HelloStatus(status)
    except ValueError:
        raise LinkError(LinkErrorReason.BAD_MAGIC, f"unknown hello status {status!r}") from None


_MORE_WORK_ACK = 0x40  # | the bits asked (0..MAX_WORK_BITS)


def encode_acks(statuses: Sequence[AckStatus], work_bits: int) -> bytes:
    """The ack bytes of ``statuses``; MORE_WORK names ``work_bits``, the work asked now."""
    if AckStatus.MORE_WORK not in statuses:
        return bytes(statuses)  # each status is its own byte (an IntEnum); no generator step per frame
    more_work = _MORE_WORK_ACK | min(work_bits, MAX_WORK_BITS)
    return bytes(more_work if status is AckStatus.MORE_WORK else int(status) for status in statuses)


_FINAL_ACKS = {int(status): status for status in (AckStatus.ACCEPTED, AckStatus.REJECTED, AckStatus.BUSY)}


def parse_acks_and_work(data: bytes) -> tuple[list[AckStatus], int]:
    """Parse ack bytes: their statuses, and the most work a MORE_WORK among them asks (0 if none);
    ``LinkError(BAD_ACK)`` for any other byte."""
    statuses: list[AckStatus] = []
    asked = 0
    for byte in data:
        # A dict lookup, not AckStatus(byte): an enum call per acked packet cost more than the rest of the loop.
        status = _FINAL_ACKS.get(byte)
        if status is not None:
            statuses.append(status)
        elif (byte & ~MAX_WORK_BITS) == _MORE_WORK_ACK:
            statuses.append(AckStatus.MORE_WORK)
            asked = max(asked, byte & MAX_WORK_BITS)
        else:
            raise LinkError(LinkErrorReason.BAD_ACK, f"invalid ack bytes {data!r}")
    return statuses, asked


def parse_acks(data: bytes) -> list[AckStatus]:
    """Parse ack bytes, or raise ``LinkError(BAD_ACK)``."""
    return parse_acks_and_work(data)[0]


async def receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    """The next ``size`` bytes of ``stream``, or fewer if it ends first.

    It asks for no byte beyond them, so the stream stays positioned for what
    follows (a hello reply, then the acks); a session that reads many records
    through one buffer uses :class:`_ExactReader` instead. Timeouts are the
    caller's (a ``trio.fail_after`` around the call).
    """
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


class _ExactReader:
    """Reads fixed-size records from a stream through one bounded buffer.

    The buffer never holds more than one record plus one socket read
    (``_READ_CHUNK``), whatever the sender does.
    """

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def _fill(self) -> bool:
        """One socket read into the buffer; False at end of stream."""
        try:
            chunk = await self._stream.receive_some(_READ_CHUNK)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise LinkError(LinkErrorReason.BROKEN, f"connection broken: {exc!r}") from None
        self._buffer += chunk
        return bool(chunk)

    async def _await_first_byte(self, deadline: float, reason: LinkErrorReason) -> bool:
        """Whether the buffer holds a byte (read by ``deadline``, trio time, if it was empty); False at a clean end
        of stream before any byte; ``LinkError(reason)`` when the deadline passes first."""
        if not self._buffer:
            with trio.move_on_at(deadline):
                if not await self._fill():
                    return False
            if not self._buffer:
                raise LinkError(reason, f"nothing received before the deadline ({reason})")
        return True

    async def read_exactly(
        self,
        size: int,
        *,
        first_byte_deadline: float,
        complete_timeout: float,
        idle_reason: LinkErrorReason,
        slow_reason: LinkErrorReason,
    ) -> bytes | None:
        """The next ``size`` bytes; None on a clean end of stream before any byte.

        The first byte must arrive by ``first_byte_deadline`` (trio time), else
        ``LinkError(idle_reason)``; the rest within ``complete_timeout`` seconds,
        else ``LinkError(slow_reason)``.
        """
        if not await self._await_first_byte(first_byte_deadline, idle_reason):
            return None
        with trio.move_on_after(complete_timeout):
            while len(self._buffer) < size:
                if not await self._fill():
                    raise LinkError(LinkErrorReason.TRUNCATED,
                                    f"stream ended after {len(self._buffer)} of {size} bytes")
            record = bytes(self._buffer[:size])
            del self._buffer[:size]
            return record
        raise LinkError(slow_reason, f"only {len(self._buffer)} of {size} bytes within {complete_timeout}s")

    async def read_handshake(self, size: int, deadline: float) -> bytes:
        """The next ``size`` handshake bytes by ``deadline``; ``LinkError`` otherwise."""
        record = await self.read_exactly(
            size, first_byte_deadline=deadline, complete_timeout=max(0.0, deadline - trio.current_time()),
            idle_reason=LinkErrorReason.HELLO_TIMEOUT, slow_reason=LinkErrorReason.HELLO_TIMEOUT,
        )
        if record is None:
            raise LinkError(LinkErrorReason.TRUNCATED, "connection closed during the handshake")
        return record

    def take_complete(self, size: int, max_count: int) -> list[bytes]:
        """Up to ``max_count`` complete ``size``-byte records already buffered (no waiting)."""
        count = min(len(self._buffer) // size, max_count)
        if count <= 0:
            return []
        block = bytes(self._buffer[: count * size])
        del self._buffer[: count * size]
        return [block[i * size : (i + 1) * size] for i in range(count)]

    async def read_available(self, max_size: int, *, deadline: float, reason: LinkErrorReason) -> bytes | None:
        """Between 1 and ``max_size`` bytes by ``deadline``; None at end of stream."""
        if not await self._await_first_byte(deadline, reason):
            return None
        record = bytes(self._buffer[:max_size])
        del self._buffer[: len(record)]
        return record


async def _send_with_timeout(stream: trio.abc.SendStream, data: bytes, timeout: float) -> None:
    try:
        with trio.fail_after(timeout):
            await stream.send_all(data)
    except trio.TooSlowError:
        raise LinkError(LinkErrorReason.BROKEN, f"peer did not read {len(data)} bytes within {timeout}s") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise LinkError(LinkErrorReason.BROKEN, f"connection broken: {exc!r}") from None


OnPackets = Callable[[list[bytes]], Awaitable[Sequence[AckStatus]]]
Admit = Callable[[bytes | None], bool]
"""``admit(node_id)``: whether the server serves this client, given its
authenticated node id (None: anonymous). Called once, after the handshake."""


def _admit_everyone(node_id: bytes | None) -> bool:
    return True


class WorkDemand(Protocol):
    """What a server asks of a client's frames (module docstring: first-hop work)."""

    def asks_work(self, node_id: bytes | None) -> bool:
        """Whether the frames of a client claiming ``node_id`` (None: anonymous) must carry stamps (decided in
        the handshake; a claimed node id that the client then fails to prove ends the session)."""
        ...

    def bits(self) -> int:
        """The work (leading zero bits) asked of a stamp now."""
        ...


class FixedWork:
    """A :class:`WorkDemand` asking every client ``level`` bits, whatever the load (set it to change it): a
    server that does not follow its intake, as in tests and the round simulator's colluding relays."""

    def __init__(self, level: int) -> None:
        self.level = level

    def asks_work(self, node_id: bytes | None) -> bool:
        return True

    def bits(self) -> int:
        return self.level


@dataclass
class LinkSessionStats:
    """What one :func:`serve_link` session did (for the caller's counters)."""

    frames: int = 0
    batches: int = 0
    peer: bytes | None = None
    """The client's authenticated node id (None: anonymous)."""
    work_context: bytes | None = None
    """The nonce its frames' stamps are bound to (None: its frames are bare packets)."""


async def _server_handshake(
    stream: trio.abc.Stream,
    reader: _ExactReader,
    *,
    packet_size: int,
    geometry_hash: bytes,
    identity: LinkIdentity | None,
    admit: Admit,
    limits: LinkLimits,
    work: WorkDemand | None,
) -> tuple[bytes | None, bytes | None]:
    """Run the server's side of the handshake; the client's node id (None: anonymous) once admitted, and the
    nonce its frames' stamps are bound to (None: bare packets)."""
    deadline = trio.current_time() + limits.hello_timeout
    prefix = await reader.read_handshake(_PREFIX.size, deadline)
    magic, version = _PREFIX.unpack(prefix)
    if magic != LINK_MAGIC:
        raise LinkError(LinkErrorReason.BAD_MAGIC, f"not a link hello: magic {magic!r}")
    if version != LINK_VERSION:
        await _send_with_timeout(stream, encode_hello_reply(HelloStatus.UNSUPPORTED_VERSION), limits.send_timeout)
        raise LinkError(LinkErrorReason.BAD_VERSION, f"hello for an unsupported link version: {prefix[4]!r}")
    hello = prefix + await reader.read_handshake(HELLO_BYTES - _PREFIX.size, deadline)
    status = check_hello(hello, packet_size, geometry_hash)
    if status is HelloStatus.GEOMETRY_MISMATCH:
        await _send_with_timeout(stream, encode_hello_reply(status), limits.send_timeout)
        raise LinkError(LinkErrorReason.GEOMETRY_MISMATCH, f"hello for another geometry: {hello[5:41]!r}")
    client_key = _HELLO.unpack(hello)[4]
    authenticating = identity is not None and client_key != ANONYMOUS
    if not authenticating and not admit(None):
        await _send_with_timeout(stream, encode_hello_reply(HelloStatus.AUTH_REQUIRED), limits.send_timeout)
        raise LinkError(LinkErrorReason.AUTH_REQUIRED, "an anonymous client was not admitted")
    claimed = node_id_of(client_key) if authenticating else None
    stamped = work is not None and work.asks_work(claimed)
    nonce = _nonce()
    reply = encode_hello_reply(HelloStatus.OK, key=identity.public_key if identity is not None else ANONYMOUS,
                               nonce=nonce, work_bits=work.bits() if work is not None and stamped else None)
    context = nonce if stamped else None
    await _send_with_timeout(stream, reply, limits.send_timeout)
    if not authenticating:
        return None, context
    assert identity is not None
    transcript = hello + reply
    proof = await reader.read_handshake(LINK_PROOF_BYTES, deadline)
    try:
        key = link_session_key(identity.private_key, client_key, transcript)
    except InvalidKey:
        key = None
    node_id = node_id_of(client_key)
    if key is None or not link_proof_valid(key, CLIENT_ROLE, transcript, proof):
        await _send_with_timeout(stream, _CONFIRM.pack(AuthVerdict.REFUSED, bytes(LINK_PROOF_BYTES)), limits.send_timeout)
        raise LinkError(LinkErrorReason.AUTH_FAILED, f"node {node_id.hex()} did not prove it holds its key")
    admitted = admit(node_id)
    verdict = AuthVerdict.ACCEPTED if admitted else AuthVerdict.REFUSED
    confirm = _CONFIRM.pack(verdict, link_proof(key, SERVER_ROLE, transcript + proof))
    await _send_with_timeout(stream, confirm, limits.send_timeout)
    if not admitted:
        raise LinkError(LinkErrorReason.REFUSED, f"node {node_id.hex()} is not admitted")
    return node_id, context


async def serve_link(
    stream: trio.abc.Stream,
    on_packets: OnPackets,
    *,
    packet_size: int,
    geometry_hash: bytes,
    limits: LinkLimits = LinkLimits(),
    stats: LinkSessionStats | None = None,
    identity: LinkIdentity | None = None,
    admit: Admit = _admit_everyone,
    work: WorkDemand | None = None,
) -> None:
    """Serve one link session on ``stream`` until the sender closes it.

    Runs the handshake (authenticating a client that presents a key, when
    ``identity`` is given) and asks ``admit`` whether to serve it; then reads
    frames and calls ``await on_packets(frames)`` with every frame already
    read (one to ``limits.max_batch``), which must return one
    :class:`AckStatus` per frame once the accepted ones are durable; then
    writes those statuses. Frames completely received before an error are
    still handed over and acknowledged. Returns on a clean end of stream at a
    frame boundary; raises :class:`LinkError` for everything the sender can
    cause. Exceptions from ``on_packets`` propagate unchanged (they are the
    caller's bugs, not the sender's). Does not close ``stream``. With ``work``,
    a client it asks work of sends stamped frames (module docstring), handed
    to ``on_packets`` whole (packet then stamp, ``stats.work_context`` their
    context): the caller checks them, and answers MORE_WORK for those short of it.
    """
    _check_link_parameters(packet_size, geometry_hash)
    stats = stats if stats is not None else LinkSessionStats()
    reader = _ExactReader(stream)
    stats.peer, stats.work_context = await _server_handshake(
        stream, reader, packet_size=packet_size, geometry_hash=geometry_hash, identity=identity, admit=admit,
        limits=limits, work=work,
    )
    frame_size = packet_size + (STAMP_BYTES if stats.work_context is not None else 0)

    reader_error: list[LinkError] = []
    # Items are lists of frames: every complete frame already buffered when
    # one arrives, so frames that came together are committed together.
    capacity = max(1, limits.max_pending_frames // limits.max_batch)
    send_batches, receive_batches = trio.open_memory_channel[list[bytes]](capacity)

    async def read_frames() -> None:
        async with send_batches:
            wait, reason = limits.first_frame_timeout, LinkErrorReason.FIRST_FRAME_TIMEOUT
            try:
                while True:
                    frame = await reader.read_exactly(
                        frame_size,
                        first_byte_deadline=trio.current_time() + wait,
                        complete_timeout=limits.frame_timeout,
                        idle_reason=reason,
                        slow_reason=LinkErrorReason.FRAME_TIMEOUT,
                    )
                    if frame is None:
                        return
                    wait, reason = limits.idle_timeout, LinkErrorReason.IDLE_TIMEOUT
                    await send_batches.send([frame, *reader.take_complete(frame_size, limits.max_batch - 1)])
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
                    acks = encode_acks(statuses, work.bits() if work is not None else 0)
                    await _send_with_timeout(stream, acks, limits.send_timeout)
        except Exception as exc:
            loop_error.append(exc)
            nursery.cancel_scope.cancel()
    if loop_error:
        raise loop_error[0]
    if reader_error:
        raise reader_error[0]
