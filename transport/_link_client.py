"""The sending side of the relay link (wire format: :mod:`transport._link`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import tenacity
import trio

from anonml.base.threads import run_timed_work
from anonml.crypto import CLIENT_ROLE, SERVER_ROLE, InvalidKey, link_proof, link_proof_valid, link_session_key, node_id_of
from anonml.protocol import MAX_WORK_BITS, solve_stamp, stamp_seconds
from anonml.transport._link import (
    _CONFIRM,
    _REPLY,
    ANONYMOUS,
    CONFIRM_BYTES,
    HELLO_REPLY_BYTES,
    AckStatus,
    AuthVerdict,
    HelloStatus,
    LinkError,
    LinkErrorReason,
    LinkIdentity,
    _check_link_parameters,
    _ExactReader,
    _send_with_timeout,
    encode_hello,
    parse_acks_and_work,
    parse_hello_reply,
    reply_work,
)
from anonml.transport._network import TCP_NETWORK, Network

log = logging.getLogger(__name__)

# The most work a client does for one packet by default: 2**20 hashes, about a second in Python on one
# core, the same for every peer (protocol._work: no peer behaves differently on what the aggregator sees).
DEFAULT_MAX_WORK_BITS = 20
# Re-stamping rounds per send_batch: the work asked only rises between them, and a server that keeps
# asking more is answered BUSY rather than chased for ever.
_WORK_ROUNDS = 4


class _Connection:
    """One connected stream of a :class:`LinkClient` and its ack order.

    Batches are written in ticket order under the client's write lock, and
    their acks (which the receiver sends in frame order) are read in the same
    ticket order: ``served`` is the ticket whose acks are read next.
    """

    def __init__(self, stream: trio.abc.Stream, reader: _ExactReader) -> None:
        self.stream = stream
        self.reader = reader
        self.issued = 0
        self.served = 0
        self.turn = trio.Event()
        self.broken = False
        self.work_context: bytes | None = None
        """The nonce this session's stamps are bound to (None: its frames are bare packets)."""


# Seconds for a connection and its handshake (two round trips): room for a 300 ms round trip on a busy
# receiver, while a connection that swallows the hello (a black hole) costs this plus a backoff, not most
# of a delivery slice (issue 27: at 5 s, a black-holed relay link made a whole slice's packets late).
CONNECT_TIMEOUT = 2.0
MAX_BACKOFF = 2.0
"""The longest a link client waits between attempts to reach a next hop that is down (by default): a hop
back from a restart gets its packets at most this long after."""


def _stop_before(give_up_at: float) -> Callable[[tenacity.RetryCallState], bool]:
    """Stop when the next attempt would start at or after ``give_up_at`` (trio time, so MockClock works)."""

    def stop(state: tenacity.RetryCallState) -> bool:
        return trio.current_time() + (state.upcoming_sleep or 0.0) >= give_up_at

    return stop


class LinkClient:
    """The sending side of a link: one reused connection to one neighbour.

    :meth:`send_batch` writes frames and waits for their acks; on a broken
    connection or timeout it reconnects (with exponential backoff, tenacity)
    and resends only the frames not yet acknowledged, until ``give_up_at``. A
    frame may thus reach the receiver twice (its ack was lost); the
    receiver's replay cache rejects the copy, which is harmless because the
    first copy was durably accepted.

    ``identity`` authenticates this client to the server (a relay to its
    next hop); ``expect_node_id`` makes the client refuse a server that does
    not prove it is that node; ``local_address`` binds the source address;
    ``network`` is where it connects (TCP unless the round simulator's).

    First-hop work (protocol._work). When the server asks for stamps, each
    frame is stamped with the work it asked last (in its hello reply, or in a
    MORE_WORK ack, after which the frame is re-stamped and resent on the same
    connection), up to ``max_work_bits``: a server asking more is answered
    no more work, and those packets come back BUSY (a warning is logged), as
    from a relay at capacity; the caller's retries and other paths apply.

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
        identity: LinkIdentity | None = None,
        expect_node_id: bytes | None = None,
        local_address: str | None = None,
        network: Network = TCP_NETWORK,
        connect_timeout: float = CONNECT_TIMEOUT,
        ack_timeout: float = 30.0,
        initial_backoff: float = 0.05,
        max_backoff: float = MAX_BACKOFF,
        max_work_bits: int = DEFAULT_MAX_WORK_BITS,
    ) -> None:
        _check_link_parameters(packet_size, geometry_hash)
        if not (isinstance(max_work_bits, int) and 0 <= max_work_bits <= MAX_WORK_BITS):
            raise ValueError(f"max_work_bits must be an integer in 0..{MAX_WORK_BITS}, got {max_work_bits!r}")
        self.max_work_bits = max_work_bits
        self.work_bits = 0
        """The work the server asked last (its stamps carry up to max_work_bits of it)."""
        self.stamps = 0  # frames stamped with work (bits > 0), for benchmarks
        self.stamping_seconds = 0.0  # time (trio's clock) spent finding those stamps, for benchmarks
        self.host = host
        self.port = port
        self.packet_size = packet_size
        self.geometry_hash = geometry_hash
        self.identity = identity
        self.expect_node_id = expect_node_id
        self._local_address = local_address
        self._network = network
        self._connect_timeout = connect_timeout
        self._ack_timeout = ack_timeout
        self._wait = tenacity.wait_exponential(multiplier=initial_backoff, max=max_backoff)
        self._connection: _Connection | None = None
        self._write_lock = trio.Lock()
        self.connects = 0
        self.failures = 0

    async def _handshake(self, connection: _Connection) -> None:
        stream, reader = connection.stream, connection.reader
        where = f"{self.host}:{self.port}"
        deadline = trio.current_time() + self._connect_timeout
        own_key = self.identity.public_key if self.identity is not None else ANONYMOUS
        hello = encode_hello(self.packet_size, self.geometry_hash, key=own_key)
        await _send_with_timeout(stream, hello, self._connect_timeout)
        reply = await reader.read_handshake(HELLO_REPLY_BYTES, deadline)
        status = parse_hello_reply(reply)
        context, asked = reply_work(reply)
        if status is HelloStatus.AUTH_REQUIRED:
            raise LinkError(LinkErrorReason.AUTH_REQUIRED, f"{where} takes packets only from directory nodes")
        if status is not HelloStatus.OK:
            raise LinkError(LinkErrorReason.GEOMETRY_MISMATCH, f"{where} refused the hello: {status.name}")
        server_key = _REPLY.unpack(reply)[3]
        if self.expect_node_id is not None and (server_key == ANONYMOUS or node_id_of(server_key) != self.expect_node_id):
            raise LinkError(LinkErrorReason.WRONG_PEER, f"{where} is not node {self.expect_node_id.hex()}")
        if asked is not None:
            connection.work_context = context
            self.work_bits = asked
        if self.identity is None or server_key == ANONYMOUS:
            return
        transcript = hello + reply
        try:
            key = link_session_key(self.identity.private_key, server_key, transcript)
        except InvalidKey:
            raise LinkError(LinkErrorReason.AUTH_FAILED, f"{where} sent an unusable key") from None
        proof = link_proof(key, CLIENT_ROLE, transcript)
        await _send_with_timeout(stream, proof, self._connect_timeout)
        verdict, server_proof = _CONFIRM.unpack(await reader.read_handshake(CONFIRM_BYTES, deadline))
        if verdict != AuthVerdict.ACCEPTED:
            raise LinkError(LinkErrorReason.REFUSED, f"{where} refused this node ({self.identity.node_id.hex()})")
        if not link_proof_valid(key, SERVER_ROLE, transcript + proof, server_proof):
            raise LinkError(LinkErrorReason.AUTH_FAILED, f"{where} did not prove it holds its key")

    async def _connect(self) -> _Connection:
        """The open connection, or a new one (handshake done); call under the write lock."""
        if self._connection is not None:
            return self._connection
        try:
            with trio.fail_after(self._connect_timeout):
                stream = await self._network.connect(self.host, self.port, local_address=self._local_address)
        except (OSError, trio.TooSlowError) as exc:
            raise LinkError(LinkErrorReason.CONNECT_FAILED, f"cannot connect to {self.host}:{self.port}: {exc!r}") from None
        connection = _Connection(stream, _ExactReader(stream))
        try:
            await self._handshake(connection)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        self._connection = connection
        self.connects += 1
        return connection

    async def _stamped(self, connection: _Connection, frames: Sequence[bytes]) -> Sequence[bytes]:
        """``frames`` as this session sends them: each followed by its stamp when the server asks for work."""
        context = connection.work_context
        if context is None:
            return frames
        bits = min(self.work_bits, self.max_work_bits)
        if bits == 0:
            return [frame + solve_stamp(context, frame, 0) for frame in frames]
        self.stamps += len(frames)
        started = trio.current_time()
        # In a thread, so the caller's other tasks are not stalled for the whole search (2**bits hashes each);
        # in the round simulator on its clock, charged the time it takes a slow peer (protocol.stamp_seconds).
        stamped = await run_timed_work(len(frames) * stamp_seconds(bits),
                                       lambda: [frame + solve_stamp(context, frame, bits) for frame in frames])
        self.stamping_seconds += trio.current_time() - started
        return stamped

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
                sent = await self._stamped(connection, frames)
                await _send_with_timeout(connection.stream, b"".join(sent), self._ack_timeout)
            except BaseException:
                await self._break(connection)
                raise
        try:
            while connection.served != ticket and not connection.broken:
                await connection.turn.wait()
            if connection.broken:
                raise LinkError(LinkErrorReason.BROKEN, f"connection to {self.host}:{self.port} failed before these acks")
            outstanding = len(frames)
            while outstanding:
                record = await connection.reader.read_available(
                    outstanding, deadline=trio.current_time() + self._ack_timeout, reason=LinkErrorReason.ACK_TIMEOUT
                )
                if record is None:
                    raise LinkError(
                        LinkErrorReason.TRUNCATED, f"{self.host}:{self.port} closed with {outstanding} frames unacknowledged"
                    )
                acked, asked = parse_acks_and_work(record)
                if AckStatus.MORE_WORK in acked:
                    self.work_bits = asked
                statuses.extend(acked)
                outstanding -= len(record)
        except BaseException:
            # A failed or cancelled read leaves the ack stream out of step.
            await self._break(connection)
            raise
        connection.served += 1
        connection.turn.set()
        connection.turn = trio.Event()

    async def _attempt_until_progress(self, packets: Sequence[bytes], statuses: list[AckStatus]) -> None:
        """One attempt at what is not yet acknowledged; raises only if it acknowledged nothing."""
        acked_before = len(statuses)
        try:
            await self._attempt(packets[acked_before:], statuses)
        except LinkError:
            self.failures += 1
            if len(statuses) == acked_before:
                raise

    async def send_batch(self, packets: Sequence[bytes], *, give_up_at: float) -> list[AckStatus | None]:
        """Send ``packets``; one status per packet, None where none was acknowledged.

        Retries (reconnecting, with backoff) start only before ``give_up_at``
        (trio time, ``trio.current_time()``); the first attempt always runs,
        bounded by the connect and ack timeouts, so a packet released at the
        very end of its window still gets sent. An attempt that got some acks
        before failing starts a fresh backoff. Packets answered MORE_WORK are
        re-stamped and resent (class docstring), and come back BUSY when the
        work asked is above ``max_work_bits``. Raises ``ValueError`` for a
        packet of the wrong size (a caller bug).
        """
        for packet in packets:
            if len(packet) != self.packet_size:
                raise ValueError(f"packet must be {self.packet_size} bytes, got {len(packet)}")
        statuses = await self._send_until(packets, give_up_at)
        for _ in range(_WORK_ROUNDS):
            short = [index for index, status in enumerate(statuses) if status is AckStatus.MORE_WORK]
            if not short:
                break
            if self.work_bits > self.max_work_bits:
                log.warning("%s:%s asks %d bits of work per packet, above this client's cap of %d: treated as busy",
                            self.host, self.port, self.work_bits, self.max_work_bits)
                break
            for index, status in zip(short, await self._send_until([packets[i] for i in short], give_up_at)):
                statuses[index] = status
        return [AckStatus.BUSY if status is AckStatus.MORE_WORK else status for status in statuses]

    async def _send_until(self, packets: Sequence[bytes], give_up_at: float) -> list[AckStatus | None]:
        """One status per packet (MORE_WORK included), None where none was acknowledged by ``give_up_at``."""
        statuses: list[AckStatus] = []
        while len(statuses) < len(packets):
            retrying = tenacity.AsyncRetrying(
                retry=tenacity.retry_if_exception_type(LinkError), wait=self._wait, stop=_stop_before(give_up_at),
                sleep=trio.sleep, reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        await self._attempt_until_progress(packets, statuses)
            except LinkError:
                break
        return [*statuses, *([None] * (len(packets) - len(statuses)))]

    async def aclose(self) -> None:
        async with self._write_lock:
            if self._connection is not None:
                await self._break(self._connection)
