"""The relay service: link intake, durable holding, staggered release, forwarding.

Per accepted frame (DESIGN.md §5 order, §7 behaviour):

1. ``process_packet`` under each key the key ring accepts now (current epoch
   first); the replay tag is recorded inside the ``is_replay`` callback, in the
   same SQLite transaction as the packet, per key epoch.
2. A packet whose hop window has already closed is dropped ("late"); one
   whose next hop is not in the relay's directory at that address is dropped
   ("unknown-next-hop", "next-hop-address-mismatch"; :mod:`relay._directory`).
3. Otherwise its release time is drawn uniformly in ``[max(now, a), b]`` for
   its window ``[a, b]`` (the thesis's staggering) and the packet, already
   encrypted for the next hop, is stored with it. The link ack goes out only
   after the batch's transaction commits.
4. The scheduler releases packets at their times; one forwarder per next hop
   sends them over a reused :class:`protocol.LinkClient`, retrying until the
   window ends. Acknowledged (or definitively rejected) packets are deleted
   (lazily: in the next intake transaction; see ``Relay._settle``).

Restart (the release-time choice). Release times are persisted. On restart a
held packet whose time is still ahead keeps it, and one whose time passed
while the relay was down is re-drawn uniformly in ``[restart, b]``. A uniform
time on ``[a, b]`` conditioned on lying after the restart is uniform on
``[restart, b]``, so after a restart every held packet's release time is again
i.i.d. uniform on what is left of its window: independent of arrival order and
of the other packets, exactly as without the crash. Releasing the overdue ones
at once instead would put them in one burst that marks them as the crashed
relay's. A packet whose window closed while the relay was down is dropped and
counted ("expired-while-down"): releasing it outside its window would break
the timing guarantee, and the sender's receipt check (DESIGN.md §5) resends it.

Release times come from the operating system's CSPRNG unless a seeded numpy
Generator is passed (tests): a network observer sees release times, and a
PCG64 state can be recovered from enough outputs.
"""

from __future__ import annotations

import functools
from functools import partial
import heapq
import logging
import math
import random
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import trio

from anonml.errors import AnonMLError
from anonml.crypto import BadMac, ForwardPacket, InvalidPacket, SphinxGeometry, process_packet
from anonml.protocol import AckStatus, LinkClient, LinkError, serve_link
from anonml.relay._clock import RelayClock, WallClock
from anonml.relay._config import RelayConfig
from anonml.relay._directory import (
    DirectoryEntry,
    DirectoryError,
    NextHopDirectory,
    fetch_manifest_hops,
    load_directory_file,
)
from anonml.relay._errors import RelayConfigError
from anonml.relay._keys import EpochKey, KeyRing, load_identity
from anonml.relay._metrics import RelayCounters, log_event, serve_metrics
from anonml.relay._mirror import serve_mirror
from anonml.relay._store import STORE_FILE, HeldPacket, RelayStore

logger = logging.getLogger("anonml.relay")

# Most packets moved from the schedule to forwarders per wake-up, so a burst
# of due packets does not starve the link handlers.
_RELEASE_BATCH = 1024
# Rows of forwarded packets are deleted in the next intake transaction, or
# after this long if none comes (see Relay._settle).
_DELETE_FLUSH_SECONDS = 0.25
# Batches in flight per next hop on its one link connection (pipelining).
_FORWARD_PIPELINE = 4
# A batch the next hop answered BUSY (or that found it unreachable) is retried
# after this long, while its window lasts.
_FORWARD_RETRY_DELAY = 0.5
# Held packets also kept in memory (besides SQLite) until released, so the
# scheduler need not read each one back from SQLite; beyond this
# many (~16 MiB of 2 KiB packets) and after a restart, they are read back.
_RESIDENT_PACKETS = 8192

Uniform = Callable[[float, float], float]


class PacketSender(Protocol):
    """The sending side of a link to one neighbour (:class:`protocol.LinkClient`)."""

    async def send_batch(self, packets: Sequence[bytes], *, give_up_at: float) -> list[AckStatus | None]: ...

    async def aclose(self) -> None: ...


OpenSender = Callable[[tuple[str, int]], PacketSender]


class _ReplayCacheFull(AnonMLError):
    """Raised from the ``is_replay`` callback when an epoch's tag cache is full."""


@dataclass(frozen=True)
class RelayStarted:
    """What :func:`serve_relay` reports once it listens.

    ``link`` and ``metrics`` are the bound ``(host, port)``s; ``keys`` the
    published epoch keys (current and next); ``counters`` and ``directory``
    (the allowed next hops; None when none is configured) are live.
    """

    link: tuple[str, int]
    metrics: tuple[str, int] | None
    node_id: bytes
    keys: tuple[EpochKey, ...]
    counters: RelayCounters
    directory: NextHopDirectory | None = None


def _uniform_from(rng: np.random.Generator | None) -> Uniform:
    if rng is None:
        return random.SystemRandom().uniform
    generator = rng

    def uniform(low: float, high: float) -> float:
        return float(generator.uniform(low, high)) if high > low else low

    return uniform


class Relay:
    """Intake, schedule and forwarding state of one running relay."""

    def __init__(
        self,
        config: RelayConfig,
        *,
        geometry: SphinxGeometry,
        keyring: KeyRing,
        store: RelayStore,
        clock: RelayClock,
        uniform: Uniform,
        counters: RelayCounters,
        open_sender: OpenSender | None = None,
        directory: NextHopDirectory | None = None,
    ) -> None:
        """``open_sender(neighbour)`` makes the link to a next hop; the default
        is a :class:`protocol.LinkClient` (tests of window logic under MockClock
        pass an in-memory recorder instead of opening sockets). ``directory``
        holds the allowed next hops; None forwards anywhere (legacy, see
        ``REQUIRE_DIRECTORY_DEFAULT`` in :mod:`relay._config`)."""
        self.config = config
        self.geometry = geometry
        self.geometry_hash = geometry.canonical_hash()
        self.keyring = keyring
        self.store = store
        self.clock = clock
        self.uniform = uniform
        self.counters = counters
        self._schedule: list[tuple[float, int]] = []
        self._wakeup = trio.Event()
        self._tag_counts: dict[int, int] = store.tag_counts()
        # Held (or in-flight) packets per next hop: bounds the next hops in use
        # by max_neighbours, and tells which forwarders are idle.
        self._neighbours: dict[tuple[str, int], int] = {}
        self._forwarders: dict[tuple[str, int], trio.MemorySendChannel[HeldPacket]] = {}
        self._nursery: trio.Nursery | None = None
        self._finished: list[int] = []
        self._resident: dict[int, HeldPacket] = {}
        self._open_sender = open_sender if open_sender is not None else self._link_client
        self.directory = directory
        self._directory_wanted = trio.Event()

    def _link_client(self, neighbour: tuple[str, int]) -> PacketSender:
        return LinkClient(
            neighbour[0],
            neighbour[1],
            packet_size=self.geometry.packet_size,
            geometry_hash=self.geometry_hash,
            connect_timeout=self.config.connect_timeout,
            ack_timeout=self.config.ack_timeout,
        )

    def attach(self, nursery: trio.Nursery) -> None:
        """Give the relay the nursery its forwarder tasks run in."""
        self._nursery = nursery

    # -- restart ---------------------------------------------------------

    def recover(self) -> None:
        """Reload held packets after a restart (module docstring: release times)."""
        now = self.clock.now()
        rows = self.store.schedule()
        expired = [row_id for _, row_id, window_end in rows if window_end < now]
        redrawn: list[tuple[int, float]] = []
        for release_at, row_id, window_end in rows:
            if window_end < now:
                continue
            if release_at < now:
                release_at = self.uniform(now, window_end)
                redrawn.append((row_id, release_at))
            self._schedule.append((release_at, row_id))
        heapq.heapify(self._schedule)
        self.store.delete(expired)
        self.store.reschedule(redrawn)
        if expired:
            self.counters.drop("expired-while-down", len(expired))
        self.counters.held = len(self._schedule)
        self._neighbours = self.store.neighbours()
        log_event(logger, logging.INFO, "recovered", held=len(self._schedule), redrawn=len(redrawn),
                  expired=len(expired))

    # -- intake ----------------------------------------------------------

    def _seen(self, epoch: int, tag: bytes) -> bool:
        if self._tag_counts.get(epoch, 0) >= self.config.max_replay_tags_per_epoch:
            raise _ReplayCacheFull(epoch)
        if self.store.record_tag(epoch, tag):
            self._tag_counts[epoch] = self._tag_counts.get(epoch, 0) + 1
            return False
        return True

    def _intake(
        self, frame: bytes, now: float, keys: Sequence[EpochKey], accepted: list[tuple[float, float, str, int, bytes]]
    ) -> AckStatus:
        """Process one frame inside the batch transaction; an accepted one is
        appended to ``accepted`` (stored when the batch is)."""
        self.counters.received += 1
        if self.counters.held + len(accepted) >= self.config.max_held_packets:
            self.counters.drop("capacity")
            return AckStatus.BUSY
        result = None
        reason = "bad_mac"
        for key in keys:
            try:
                result = process_packet(
                    self.geometry, key.private_key, frame, is_replay=functools.partial(self._seen, key.epoch)
                )
                break
            except BadMac as exc:  # not this key's packet (or not a packet): try the next key
                reason = exc.reason
            except _ReplayCacheFull:
                self.counters.drop("replay-cache-full")
                return AckStatus.BUSY
            except InvalidPacket as exc:
                self.counters.drop(exc.reason)
                return AckStatus.REJECTED
        if result is None:
            self.counters.drop(reason)
            return AckStatus.REJECTED
        if not isinstance(result, ForwardPacket):
            # A final-hop packet addressed to a relay: relays never deliver.
            self.counters.drop("not-for-relay")
            return AckStatus.REJECTED
        window = result.window
        if now > window.end:
            self.counters.drop("late")
            return AckStatus.REJECTED
        if self.directory is not None:
            refused = self.directory.check(result.next_node_id, result.next_address)
            if refused is not None:
                self.counters.drop(refused)
                # Perhaps a round (or a relay's new address) newer than the
                # last fetch: ask the sources again, rate-limited and in the
                # background (the intake never waits on the network). The
                # packet is dropped; its sender's receipt check resends it.
                self._directory_wanted.set()
                return AckStatus.REJECTED
        neighbour = (result.next_address.host, result.next_address.port)
        if neighbour not in self._neighbours and len(self._neighbours) >= self.config.max_neighbours:
            self.counters.drop("too-many-neighbours")
            return AckStatus.REJECTED
        self._neighbours[neighbour] = self._neighbours.get(neighbour, 0) + 1
        release_at = self.uniform(max(now, float(window.start)), float(window.end))
        accepted.append((release_at, float(window.end), neighbour[0], neighbour[1], result.packet))
        return AckStatus.ACCEPTED

    async def on_packets(self, frames: list[bytes]) -> list[AckStatus]:
        """The link's callback: statuses for ``frames``, after their durable commit."""
        now = self.clock.now()
        keys = self.keyring.accepting(now)
        accepted: list[tuple[float, float, str, int, bytes]] = []
        scheduled: list[tuple[float, int]] = []
        statuses: list[AckStatus] = []
        # CPU time of the whole batch: one thread_time call per batch (a
        # system call, ~0.6 µs measured) rather than two per packet.
        cpu_started = time.thread_time()
        finished, self._finished = self._finished, []
        try:
            with self.store.transaction():
                self.store.delete(finished)
                for frame in frames:
                    statuses.append(self._intake(frame, now, keys, accepted))
                row_ids = self.store.insert_held(accepted)
                scheduled = [(row[0], row_id) for row, row_id in zip(accepted, row_ids)]
        except sqlite3.Error as exc:
            self._finished.extend(finished)
            for row in accepted:
                self._release_neighbour((row[2], row[3]), 1)
            # Nothing of the batch is stored: the sender keeps it and retries.
            log_event(logger, logging.ERROR, "store-error", error=repr(exc), frames=len(frames))
            self.counters.drop("store-error", len(frames))
            return [AckStatus.BUSY] * len(frames)
        finally:
            self.counters.store_seconds = self.store.busy_seconds
            self.counters.intake_cpu_seconds += time.thread_time() - cpu_started
        for item in scheduled:
            heapq.heappush(self._schedule, item)
        for row, row_id in zip(accepted, row_ids):
            if len(self._resident) >= _RESIDENT_PACKETS:
                break
            self._resident[row_id] = HeldPacket(row_id, *row)
        self.counters.accepted += len(scheduled)
        self.counters.held += len(scheduled)
        if scheduled:
            self._wakeup.set()
        return statuses

    async def handle_connection(self, stream: trio.SocketStream) -> None:
        """Serve one link connection; never raises (STYLE.md 2)."""
        counters = self.counters
        if counters.connections_open >= self.config.max_connections:
            counters.connections_refused += 1
            await trio.aclose_forcefully(stream)
            return
        counters.connections_open += 1
        counters.connections_accepted += 1
        try:
            peer = stream.socket.getpeername()
        except OSError:
            peer = "?"
        try:
            await serve_link(
                stream,
                self.on_packets,
                packet_size=self.geometry.packet_size,
                geometry_hash=self.geometry_hash,
                limits=self.config.link,
            )
        except LinkError as exc:
            counters.link_errors[exc.reason] += 1
            log_event(logger, logging.DEBUG, "link-error", peer=peer, reason=exc.reason, detail=str(exc))
        except Exception as exc:
            counters.link_errors["internal"] += 1
            logger.exception("event=link-internal-error peer=%s error=%r", peer, exc)
        finally:
            counters.connections_open -= 1
            await trio.aclose_forcefully(stream)

    # -- release ---------------------------------------------------------

    async def run_scheduler(self) -> None:
        """Release held packets at their times, for ever."""
        while True:
            self._wakeup = trio.Event()
            deadline = self.clock.to_trio(self._schedule[0][0]) if self._schedule else math.inf
            with trio.move_on_at(deadline):
                await self._wakeup.wait()
            now = self.clock.now()
            due: list[int] = []
            while self._schedule and self._schedule[0][0] <= now and len(due) < _RELEASE_BATCH:
                due.append(heapq.heappop(self._schedule)[1])
            if due:
                self._dispatch(due)
                if self._schedule and self._schedule[0][0] <= now:
                    self._wakeup.set()
                await trio.lowlevel.checkpoint()

    def _dispatch(self, row_ids: list[int]) -> None:
        packets: list[HeldPacket] = []
        stored_only: list[int] = []
        for row_id in row_ids:
            resident = self._resident.pop(row_id, None)
            if resident is None:
                stored_only.append(row_id)
            else:
                packets.append(resident)
        packets.extend(self.store.load(stored_only))
        for packet in packets:
            neighbour = (packet.next_host, packet.next_port)
            channel = self._forwarders.get(neighbour)
            if channel is None:
                assert self._nursery is not None  # attach() runs before the scheduler starts
                self._retire_idle_forwarders()
                channel, receive = trio.open_memory_channel[HeldPacket](math.inf)
                self._forwarders[neighbour] = channel
                self._nursery.start_soon(self._run_forwarder, neighbour, receive)
            channel.send_nowait(packet)

    def _retire_idle_forwarders(self) -> None:
        """Close forwarders (and their connections) with nothing held, once
        there are max_neighbours of them: a long-lived relay sees its
        neighbours change with the directory."""
        if len(self._forwarders) < self.config.max_neighbours:
            return
        for neighbour in [n for n in self._forwarders if n not in self._neighbours]:
            self._forwarders.pop(neighbour).close()

    async def _run_forwarder(
        self, neighbour: tuple[str, int], receive: trio.MemoryReceiveChannel[HeldPacket]
    ) -> None:
        client = self._open_sender(neighbour)

        async def forward_batches(receive: trio.MemoryReceiveChannel[HeldPacket]) -> None:
            async with receive:
                async for first in receive:
                    batch = [first]
                    while len(batch) < self.config.forward_batch:
                        try:
                            batch.append(receive.receive_nowait())
                        except trio.WouldBlock:
                            break
                    give_up_at = self.clock.to_trio(min(p.window_end for p in batch))
                    statuses = await client.send_batch([p.packet for p in batch], give_up_at=give_up_at)
                    self._settle(neighbour, batch, statuses)

        try:
            async with trio.open_nursery() as pipeline:
                for _ in range(_FORWARD_PIPELINE - 1):
                    pipeline.start_soon(forward_batches, receive.clone())
                pipeline.start_soon(forward_batches, receive)
        finally:
            await client.aclose()

    def _release_neighbour(self, neighbour: tuple[str, int], count: int) -> None:
        remaining = self._neighbours.get(neighbour, 0) - count
        if remaining > 0:
            self._neighbours[neighbour] = remaining
        else:
            self._neighbours.pop(neighbour, None)

    def _settle(self, neighbour: tuple[str, int], batch: list[HeldPacket], statuses: list[AckStatus | None]) -> None:
        now = self.clock.now()
        finished: list[int] = []
        retry_at: list[tuple[float, int]] = []
        for packet, status in zip(batch, statuses):
            if status is AckStatus.ACCEPTED:
                self.counters.forwarded += 1
                finished.append(packet.row_id)
            elif status is AckStatus.REJECTED:
                self.counters.drop("next-hop-rejected")
                finished.append(packet.row_id)
            elif now + _FORWARD_RETRY_DELAY <= packet.window_end:
                retry_at.append((now + _FORWARD_RETRY_DELAY, packet.row_id))
                if len(self._resident) < _RESIDENT_PACKETS:
                    self._resident[packet.row_id] = packet
            else:
                reason = "next-hop-busy" if status is AckStatus.BUSY else "next-hop-unreachable"
                self.counters.drop(reason)
                log_event(logger, logging.WARNING, "forward-dropped", neighbour=f"{neighbour[0]}:{neighbour[1]}",
                          reason=reason, window_end=packet.window_end)
                finished.append(packet.row_id)
        if retry_at:
            self.counters.forward_retries += 1
            log_event(logger, logging.WARNING, "forward-retry", neighbour=f"{neighbour[0]}:{neighbour[1]}",
                      packets=len(retry_at))
            for item in retry_at:
                heapq.heappush(self._schedule, item)
            self._wakeup.set()
        # Deleting is not urgent: a row that outlives a crash is re-sent after
        # the restart and the next hop's replay cache rejects the copy. So the
        # deletes ride on the next intake commit instead of costing a commit
        # (an fsync) of their own per forwarded batch.
        self._finished.extend(finished)
        self.counters.held -= len(finished)
        self._release_neighbour(neighbour, len(finished))

    async def run_delete_flush(self) -> None:
        """Delete forwarded rows when no intake transaction has done it."""
        while True:
            await trio.sleep(_DELETE_FLUSH_SECONDS)
            if self._finished:
                finished, self._finished = self._finished, []
                try:
                    self.store.delete(finished)
                except sqlite3.Error as exc:
                    self._finished.extend(finished)
                    log_event(logger, logging.ERROR, "store-error", error=repr(exc), rows=len(finished))
                self.counters.store_seconds = self.store.busy_seconds

    # -- directory -------------------------------------------------------

    async def _read_directory_source(self, source: str) -> tuple[DirectoryEntry, ...]:
        identities = {aggregator.url: aggregator.identity for aggregator in self.config.directory_aggregators}
        if source in identities:
            return await fetch_manifest_hops(source, identity=identities[source],
                                             timeout=self.config.directory_fetch_timeout)
        return await trio.to_thread.run_sync(load_directory_file, Path(source))

    async def _refresh_directory(self, failing: set[str]) -> None:
        """Re-read every directory source; ``failing`` holds those whose last
        read failed (a failure is logged as a warning once per streak)."""
        assert self.directory is not None
        path = self.config.directory_path
        sources = [*(a.url for a in self.config.directory_aggregators), *([str(path)] if path is not None else [])]
        before = dict(self.directory.sources())
        for source in sources:
            try:
                self.directory.replace_source(source, await self._read_directory_source(source))
            except DirectoryError as exc:
                level = logging.DEBUG if source in failing else logging.WARNING
                failing.add(source)
                log_event(logger, level, "directory-source-failed", source=source, error=str(exc))
            else:
                failing.discard(source)
        level = logging.INFO if self.directory.sources() != before else logging.DEBUG
        log_event(logger, level, "directory", next_hops=len(self.directory),
                  sources=",".join(f"{source}={count}" for source, count in self.directory.sources().items()))

    async def run_directory_refresh(self) -> None:
        """Read the directory sources now; again every min_refresh_seconds
        while one fails (an aggregator may start after its relays), and when
        a packet names a next hop the directory refuses, at most once per
        min_refresh_seconds."""
        min_interval = self.config.directory_min_refresh_seconds
        failing: set[str] = set()
        while True:
            started = trio.current_time()
            self._directory_wanted = trio.Event()
            await self._refresh_directory(failing)
            if not failing:
                await self._directory_wanted.wait()
            await trio.sleep_until(started + min_interval)

    # -- keys ------------------------------------------------------------

    def rotate_keys(self) -> None:
        """Create due keys, erase expired ones and their replay tags."""
        erased = self.keyring.rotate(self.clock.now())
        if erased:
            self.store.erase_epochs(erased)
            for epoch in erased:
                self._tag_counts.pop(epoch, None)
            log_event(logger, logging.INFO, "keys-erased", epochs=",".join(map(str, erased)))

    async def run_key_rotation(self) -> None:
        while True:
            await trio.sleep_until(self.clock.to_trio(self.keyring.next_rotation(self.clock.now())))
            self.rotate_keys()


async def serve_relay(
    config: RelayConfig,
    *,
    clock: RelayClock | None = None,
    rng: np.random.Generator | None = None,
    task_status: trio.TaskStatus[RelayStarted] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the relay of ``config.data_dir`` until cancelled.

    Raises :class:`relay.RelayDataDirError` if the data directory is not
    initialised (it never creates an identity), :class:`relay.RelayConfigError`
    if the static directory file cannot be read or no directory source is
    configured while ``require_directory`` is set. Reports a
    :class:`RelayStarted` through ``task_status`` once listening. ``clock``
    defaults to :meth:`WallClock.anchored`; ``rng`` (a seeded numpy Generator,
    for tests) replaces the CSPRNG that draws release times.
    """
    node_id, _ = load_identity(config.data_dir)
    directory = _initial_directory(config)
    geometry = SphinxGeometry.create(max_hops=config.max_hops, packet_size=config.packet_size)
    keyring = KeyRing(config.data_dir, epoch_seconds=config.key_epoch_seconds, grace_seconds=config.key_grace_seconds)
    store = RelayStore(config.data_dir / STORE_FILE, synchronous=config.synchronous)
    counters = RelayCounters()
    try:
        relay = Relay(
            config,
            geometry=geometry,
            keyring=keyring,
            store=store,
            clock=clock if clock is not None else WallClock.anchored(),
            uniform=_uniform_from(rng),
            counters=counters,
            directory=directory,
        )
        relay.rotate_keys()
        relay.recover()
        listeners = await trio.open_tcp_listeners(config.listen[1], host=config.listen[0])
        sockname = listeners[0].socket.getsockname()
        link = (str(sockname[0]), int(sockname[1]))
        async with trio.open_nursery() as nursery:
            relay.attach(nursery)
            metrics = None
            if config.metrics is not None:
                metrics = await nursery.start(serve_metrics, config.metrics[0], config.metrics[1], counters)
            nursery.start_soon(relay.run_scheduler)
            nursery.start_soon(relay.run_key_rotation)
            nursery.start_soon(relay.run_delete_flush)
            if directory is not None:
                nursery.start_soon(relay.run_directory_refresh)
            if config.mirror is not None:
                await nursery.start(partial(serve_mirror, config.mirror, config.directory_aggregators))
            nursery.start_soon(functools.partial(trio.serve_listeners, relay.handle_connection, listeners,
                                                 handler_nursery=nursery))
            published = tuple(keyring.published(relay.clock.now()))
            log_event(logger, logging.INFO, "listening", link=f"{link[0]}:{link[1]}", node_id=node_id.hex(),
                      epoch=published[0].epoch, held=counters.held)
            task_status.started(RelayStarted(link, metrics, node_id, published, counters, directory))
    finally:
        store.close()
        log_event(logger, logging.INFO, "stopped", received=counters.received, forwarded=counters.forwarded,
                  held=counters.held)


def _initial_directory(config: RelayConfig) -> NextHopDirectory | None:
    """The directory at start: the static file read now (an error is fatal:
    the operator named it), aggregators fetched by ``run_directory_refresh``."""
    if not config.has_directory:
        if config.require_directory:
            raise RelayConfigError(
                "no next-hop directory: set [directory] aggregators (or `relay init --aggregator URL`) "
                f"or [directory] file in {str(config.data_dir)!r}"
            )
        log_event(logger, logging.WARNING, "no-directory-insecure",
                  detail="no [directory] source configured: forwarding to ANY address a packet names "
                         "(an open forwarder); configure aggregators or a directory file")
        return None
    directory = NextHopDirectory()
    path = config.directory_path
    if path is not None:
        try:
            directory.replace_source(str(path), load_directory_file(path))
        except DirectoryError as exc:
            raise RelayConfigError(str(exc)) from None
    return directory
