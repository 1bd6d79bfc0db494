"""The relay service: link intake, durable holding, staggered release, forwarding.

Per accepted frame (DESIGN.md §5 order, §7 behaviour):

1. ``process_packet`` under each key the key ring accepts now (current epoch
   first). Its replay callback only *looks* the tag up: a tag is recorded
   only for a packet that passes every check below, in the same SQLite
   transaction as the packet, and kept until the packet's window ends (issue
   13: tags recorded first let late packets fill the cache).
2. Its hop window must not have closed ("late"), nor, at the first hop
   (from an address, not an authenticated neighbour), have opened
   ("late-first-hop": the peer counts such a packet as not sent), must end within
   ``max_hold_seconds`` ("window-too-far"), and, once the relay knows a
   round from a signed manifest, lie inside one of its phases
   ("unknown-window"). Its next hop must be in the relay's directory at that
   address (:mod:`relay._directory`). A window or next hop the directory does
   not know is answered BUSY, not REJECTED, and a fetch of the directory is
   asked for: the directory may simply be older than the round, and BUSY makes
   the sender retry instead of dropping the packet for good (issue 13: 7 of
   17 losses in one relay-crash run came from REJECTED ``unknown-next-hop``).
   Before any of this, a full queue, or a sending address or /24 that holds
   its share of it, is answered BUSY, and the refusal is charged to the
   sender's budget like a rejected frame. An authenticated neighbour (a
   listed relay) is charged by its node id and answered BUSY beyond its own
   share, outside the budget (:mod:`relay._shares`).
3. Otherwise its release time is drawn uniformly in ``[max(now, a), b]`` for
   its window ``[a, b]`` (the thesis's staggering) and the packet, already
   encrypted for the next hop, is stored with it. The link ack goes out only
   after the batch's transaction commits; a failing commit (a full disk)
   answers BUSY, so nothing that is not durable is acknowledged, and the
   relay reports itself unhealthy until a commit succeeds again. A packet
   taken in after its window opened is counted
   (:class:`relay._metrics.LateIntake`): its release time is drawn from what
   is left of the window, so it follows its intake time.
4. The scheduler releases packets at their times; one forwarder per next hop
   sends them over a reused :class:`transport.LinkClient` (authenticated with
   the relay's identity key, insisting on the next hop's node id), retrying
   with backoff while a next hop can still take the packet: until its round
   phase ends (:meth:`Relay.forward_deadline`; every later hop's window ends
   by then, and a next hop whose own window has closed refuses it as late).
   A next hop that is down for a while delays its packets, not loses them;
   their release times were drawn already, so the delay depends on the
   outage, not on when they were sent. Acknowledged (or definitively
   rejected) packets are deleted in the background
   (:meth:`Relay.run_housekeeping`).

Connections (issue 13). Each listener connection takes a slot of a
:class:`transport.ConnectionGate`: at most ``max_connections_per_source``
from one address that is not an authenticated neighbour, and
``neighbour_connections`` slots kept for the directory's nodes, which prove
who they are in the link handshake. A silent connection is closed after
``link.first_frame_timeout``. A source (not a neighbour) whose frames the
relay refuses beyond its :class:`relay._budget.RefusalBudget` waits before
its next batch is processed, so a flood of authentic but useless packets
costs the relay a bounded share of its CPU; a frame from anyone but a neighbour
carries a stamp of the work the relay asks, checked first (relay._work). Each batch is checked in slices
of 16 frames, each taking a fair turn per source network or neighbour
(:class:`transport.FairTurns`; issue 25), so another connection's frames
never wait for a whole batch, and a network sending little goes before
flooding ones.

Restart (the release-time choice). Release times are persisted. On restart a
held packet whose time is still ahead keeps it, and one whose time passed
while the relay was down is re-drawn uniformly in ``[restart, b]``. A uniform
time on ``[a, b]`` conditioned on lying after the restart is uniform on
``[restart, b]``, so after a restart every held packet's release time is again
i.i.d. uniform on what is left of its window: independent of arrival order and
of the other packets, exactly as without the crash. Releasing the overdue ones
at once instead would put them in one burst that marks them as the crashed
relay's.

A packet whose own window closed while the relay was down can still reach
the aggregator: the hops after this one have later windows, the last of them
the aggregator's, which lasts until its phase's ``t_r``
(``protocol.acceptance_window``). It is released at once, each at an i.i.d.
uniform time in the first ``_OVERDUE_SPREAD`` seconds after the restart (so
their order is a uniform shuffle, not their arrival order); the next hop
takes it if its own window is still open and re-draws its release time there,
else refuses it as late. This leaks nothing the downtime did not: the burst
is what this relay still held, unreleased, for windows that closed while it
was down, a set an observer of its links knows already (which packets it took
in, and which it sent on before it went silent), and each one's release time
is the restart's, set by the crash, so it is independent of when its peer
sent it and of the other packets, as a uniform draw in its window would have
been; the order inside the burst is a fresh shuffle. Dropping them instead loses every such report that its
peer's second chance cannot repair (half the reports go only in the second
window). Only a packet whose phase ended while the relay was down (or whose
window lies in no known round: there is no later deadline to go by) is
dropped and counted ("expired-while-down"). The directory as last verified
is reloaded from the store before the held packets, so a restarted relay
knows the phases and forwards at once.

Release times come from the operating system's CSPRNG unless a seeded numpy
Generator is passed (tests): a network observer sees release times, and a
PCG64 state can be recovered from enough outputs.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import trio

from anonml.crypto import (
    BadMac,
    ForwardPacket,
    InvalidPacket,
    ReplayedPacket,
    SphinxGeometry,
    process_packet,
)
from anonml.base.errors import StorageError
from anonml.base.threads import run_blocking
from anonml.protocol import SignedManifest, format_host_port
from anonml.transport import (
    TCP_NETWORK,
    AckStatus,
    ConnectionGate,
    FairTurns,
    LinkClient,
    LinkError,
    LinkIdentity,
    LinkSessionStats,
    Network,
    peer_address,
    serve_link,
    source_prefix,
)
from anonml.relay._clock import RelayClock, Uniform
from anonml.relay._config import RelayConfig
from anonml.relay._directory import (
    DirectoryError,
    NextHopDirectory,
    entries_from_manifest,
    fetch_manifest,
    load_directory_file,
    relays_from_manifest,
    spans_from_manifest,
    verify_manifest,
)
from anonml.relay._budget import RefusalBudget
from anonml.relay._delivery import SINK_ATTEMPT_SECONDS, DeliveryAddresses, Forwarders, gather_batch
from anonml.relay._shares import HeldShares, Sender
from anonml.relay._holdings import Holdings, Neighbour
from anonml.relay._keys import EpochKey, KeyRing
from anonml.relay._metrics import DropReason, LateIntake, RelayCounters, log_event
from anonml.relay._store import HeldPacket, RelayStore, StoredManifest
from anonml.relay._work import FirstHopWork, with_refusals

logger = logging.getLogger("anonml.relay")

# Most packets moved from the schedule to forwarders per wake-up, so a burst
# of due packets does not starve the link handlers.
_RELEASE_BATCH = 1024
# Forwarded rows are deleted this often (one small commit), and replay tags
# and rounds whose windows have ended are forgotten every _EXPIRY_SECONDS.
_HOUSEKEEPING_SECONDS = 0.25
_EXPIRY_SECONDS = 10.0
# A round's manifest is kept this long after its last window closed.
_ROUND_GRACE_SECONDS = 3600.0
# Frames processed between yields to the event loop: a connection's batch
# (up to link.max_batch frames, ~0.3 ms of Sphinx each) must not hold the
# loop while another connection's frames wait (issue 13: a flood's batches
# delayed honest packets). 16 frames is ~5 ms of Sphinx.
INTAKE_SLICE = 16
# Batches in flight per next hop on its one link connection (pipelining).
_FORWARD_PIPELINE = 4
# A batch the next hop answered BUSY is retried after this long, until no next hop can take it any more
# (Relay.forward_deadline); an unreachable one is retried by the link client, with backoff, until then.
_FORWARD_RETRY_DELAY = 0.5
# A packet whose window closed while the relay was down is released within this many seconds of the
# restart, at an i.i.d. uniform time (module docstring: restart).
_OVERDUE_SPREAD = 0.25
# Held packets also kept in memory (besides SQLite) until released, so the
# scheduler need not read each one back from SQLite; beyond this
# many (~16 MiB of 2 KiB packets) and after a restart, they are read back.
_RESIDENT_PACKETS = 8192



class PacketSender(Protocol):
    """The sending side of a link to one neighbour (:class:`transport.LinkClient`)."""

    async def send_batch(self, packets: Sequence[bytes], *, give_up_at: float) -> list[AckStatus | None]: ...

    async def aclose(self) -> None: ...


OpenSender = Callable[[Neighbour], PacketSender]


@dataclass
class _Batch:
    """One link batch's accepted packets before its commit: nothing else changes until it commits."""

    now: float
    sender: Sender | None
    """Who its packets are charged to (relay._shares); None: nobody (the window-logic tests)."""
    rows: list[tuple[float, float, str, int, bytes]] = field(default_factory=list)
    tags: list[tuple[bytes, float]] = field(default_factory=list)
    neighbours: Counter[Neighbour] = field(default_factory=Counter)
    charged: int = 0
    """Frames refused (REJECTED, or BUSY for capacity or a share) that the sender's refusal budget pays for."""
    late_intake: LateIntake = field(default_factory=LateIntake)


def _intake_flow(sender: Sender | None) -> Sender | None:
    """Whose turn a batch's slices take (transport.FairTurns): a source address's network (an
    attacker's 64 addresses in one /24 are one flow, as for the held shares), a neighbour's node id."""
    return source_prefix(sender) if isinstance(sender, str) else sender


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
        identity: LinkIdentity | None = None,
        open_sender: OpenSender | None = None,
        directory: NextHopDirectory | None = None,
        network: Network = TCP_NETWORK,
    ) -> None:
        """``open_sender(neighbour)`` makes the link to a next hop; the default
        is a :class:`transport.LinkClient` (tests of window logic under MockClock
        pass an in-memory recorder instead of opening sockets). ``identity``
        authenticates the relay on its links. ``directory`` holds the allowed
        next hops; None forwards anywhere (legacy, see
        ``REQUIRE_DIRECTORY_DEFAULT`` in :mod:`relay._config`). ``network``
        carries its forwarding links and directory fetches."""
        self.config = config
        self.geometry = geometry
        self.geometry_hash = geometry.canonical_hash()
        self.keyring = keyring
        self.store = store
        self.clock = clock
        self.uniform = uniform
        self.counters = counters
        self.identity = identity
        self.holdings = Holdings(resident_limit=_RESIDENT_PACKETS)
        self.replay_tags = store.tag_count()
        # Batches of several connections are checked at once (each yields between slices):
        # their accepted packets and tags count as held and seen before they commit.
        self._pending_tags: set[bytes] = set()
        self._pending_rows = 0
        self._pending_neighbours: Counter[Neighbour] = Counter()
        # Slices of batches (and their commits) in fair order per source network (issue 25: an honest
        # packet waited behind a slice and an fsync'd commit of every flooding connection).
        self.intake_turns = FairTurns()
        self.gate = ConnectionGate(config.max_connections, config.max_connections_per_source,
                                   config.neighbour_connections, refused=counters.connections_refused)
        self.refusals = RefusalBudget(config.refusals_per_second, config.refusal_burst)
        self.work = FirstHopWork(lambda node: self.directory is not None and self.directory.is_neighbour(node),
                                 counters, max_bits=config.max_work_bits)
        self.shares = HeldShares(per_source=config.max_held_per_source, per_prefix=config.max_held_per_prefix,
                                 per_neighbour=self._held_per_neighbour)
        self._wakeup = trio.Event()
        self.delivery = DeliveryAddresses(
            lambda neighbour: self.directory.sink_endpoints(*neighbour) if self.directory is not None else (neighbour,))
        self._forwarders = Forwarders(self.delivery, self._start_forwarder, config.max_neighbours)
        self._nursery: trio.Nursery | None = None
        self._open_sender = open_sender if open_sender is not None else self._link_client
        self.directory = directory
        self.network = network
        self._directory_wanted = trio.Event()
        self._rounds: dict[bytes, tuple[float, str]] = {}
        """Known rounds: id -> (when their last window closes, their source in the directory)."""

    def _held_per_neighbour(self) -> int:
        """A neighbour's share of the held packets, by the relays the directory lists now."""
        own = self.identity.node_id if self.identity is not None else None
        other_relays = self.directory.relays_besides(own) if self.directory is not None else 0
        return self.config.max_held_per_neighbour(other_relays)

    def _link_client(self, neighbour: Neighbour) -> PacketSender:
        expected = self.directory.node_at(*neighbour) if self.directory is not None else None
        return LinkClient(
            neighbour[0],
            neighbour[1],
            packet_size=self.geometry.packet_size,
            geometry_hash=self.geometry_hash,
            identity=self.identity,
            expect_node_id=expected,
            network=self.network,
            connect_timeout=self.config.connect_timeout,
            ack_timeout=self.config.ack_timeout,
        )

    def attach(self, nursery: trio.Nursery) -> None:
        """Give the relay the nursery its forwarder tasks run in."""
        self._nursery = nursery

    def _sync_counters(self) -> None:
        self.counters.held = self.holdings.held
        self.counters.replay_tags = self.replay_tags
        self.counters.work_bits = self.work.bits()
        self.counters.store_seconds = self.store.busy_seconds

    # -- restart ---------------------------------------------------------

    def forward_deadline(self, window_end: float) -> float:
        """The last moment a next hop can take a packet whose hop window ends at ``window_end``: the end of
        its round phase (every later hop's window ends by then), or its own window's end when the
        directory knows no such phase."""
        phase_end = self.directory.phase_end(window_end) if self.directory is not None else None
        return window_end if phase_end is None else max(window_end, float(phase_end))

    def recover(self) -> None:
        """Reload held packets after a restart (module docstring: restart); the directory is loaded first."""
        now = self.clock.now()
        rows = self.store.schedule()
        expired = [row_id for _, row_id, window_end in rows if self.forward_deadline(window_end) < now]
        redrawn: list[tuple[int, float]] = []
        schedule: list[tuple[float, int]] = []
        for release_at, row_id, window_end in rows:
            deadline = self.forward_deadline(window_end)
            if deadline < now:
                continue
            if window_end < now:
                release_at = self.uniform(now, min(now + _OVERDUE_SPREAD, deadline))
                redrawn.append((row_id, release_at))
            elif release_at < now:
                release_at = self.uniform(now, window_end)
                redrawn.append((row_id, release_at))
            schedule.append((release_at, row_id))
        self.store.delete(expired)
        self.store.reschedule(redrawn)
        if expired:
            self.counters.drop(DropReason.EXPIRED_WHILE_DOWN, len(expired))
        self.holdings.restore(schedule, Counter(self.store.neighbours()))
        self._sync_counters()
        log_event(logger, logging.INFO, "recovered", held=len(schedule), redrawn=len(redrawn), expired=len(expired))

    # -- intake ----------------------------------------------------------

    def _intake(self, frame: bytes, batch: _Batch, keys: Sequence[EpochKey]) -> AckStatus:
        """Check one frame; an accepted one is added to ``batch`` (stored when the batch is)."""
        self.counters.received += 1
        # Before any Sphinx work: a source over its share costs the relay nothing more.
        full = DropReason.CAPACITY if self.holdings.held + self._pending_rows >= self.config.max_held_packets else None
        if full is None and batch.sender is not None:
            full = self.shares.refusal(batch.sender)
        if full is not None:
            self.counters.drop(full)
            batch.charged += 1
            return AckStatus.BUSY

        def is_replay(tag: bytes) -> bool:
            return tag in self._pending_tags or self.store.tag_seen(tag)

        result = None
        refusal: DropReason = DropReason.BAD_MAC
        for key in keys:
            try:
                result = process_packet(self.geometry, key.private_key, frame, is_replay=is_replay)
                break
            except BadMac as exc:  # not this key's packet (or not a packet): try the next key
                refusal = DropReason.from_packet_error(exc)
            except ReplayedPacket:
                self.counters.drop(DropReason.REPLAY)
                return AckStatus.REJECTED
            except InvalidPacket as exc:
                self.counters.drop(DropReason.from_packet_error(exc))
                return AckStatus.REJECTED
        if result is None:
            self.counters.drop(refusal)
            return AckStatus.REJECTED
        if not isinstance(result, ForwardPacket):
            # A final-hop packet addressed to a relay: relays never deliver.
            self.counters.drop(DropReason.NOT_FOR_RELAY)
            return AckStatus.REJECTED
        status = self._check_route(result, batch)
        if status is not AckStatus.ACCEPTED:
            return status
        window = result.window
        neighbour = (result.next_address.host, result.next_address.port)
        release_at = self.uniform(max(batch.now, float(window.start)), float(window.end))
        if batch.now > window.start:
            # From an authenticated neighbour (a later hop), or a caller naming no sender: a first hop this late
            # was refused above.
            batch.late_intake.add(batch.now - window.start)
        batch.rows.append((release_at, float(window.end), neighbour[0], neighbour[1], result.packet))
        batch.tags.append((result.replay_tag, float(window.end)))
        batch.neighbours[neighbour] += 1
        if batch.sender is not None:
            self.shares.take(batch.sender)
        self._pending_neighbours[neighbour] += 1
        self._pending_tags.add(result.replay_tag)
        self._pending_rows += 1
        return AckStatus.ACCEPTED

    def _check_route(self, result: ForwardPacket, batch: _Batch) -> AckStatus:
        """The window, next hop and capacity checks of an authentic packet (module docstring, step 2)."""
        window, now = result.window, batch.now
        if now > window.end:
            self.counters.drop(DropReason.LATE)
            return AckStatus.REJECTED
        if now > window.start and isinstance(batch.sender, str):
            # A first hop (from an address, not an authenticated neighbour's node id) whose window has opened: its
            # release would be drawn from what is left of the window, so it would follow its intake, which follows
            # the send (protocol.first_hop_guard). The peer counts a packet not taken by then as not sent.
            self.counters.drop(DropReason.LATE_FIRST_HOP)
            return AckStatus.REJECTED
        if window.end > now + self.config.max_hold_seconds:
            self.counters.drop(DropReason.WINDOW_TOO_FAR)
            return AckStatus.REJECTED
        if self.directory is not None:
            refused = None
            if not self.directory.window_known(window.start, window.end):
                refused = DropReason.UNKNOWN_WINDOW
            else:
                refused = self.directory.check(result.next_node_id, result.next_address)
            if refused is not None:
                self.counters.drop(refused)
                # Perhaps a round (or a relay's new address) newer than the
                # last fetch: ask the sources again, rate-limited and in the
                # background (the intake never waits on the network).
                self._directory_wanted.set()
                return AckStatus.BUSY
        neighbour = (result.next_address.host, result.next_address.port)
        pending = self._pending_neighbours  # of every batch being checked, not only this one
        if neighbour not in self.holdings.neighbours and neighbour not in pending:
            # Only a new next hop needs the count (the union is a set as large as the neighbours).
            if len(self.holdings.neighbours.keys() | pending.keys()) >= self.config.max_neighbours:
                self.counters.drop(DropReason.TOO_MANY_NEIGHBOURS)
                return AckStatus.REJECTED
        if self.replay_tags + len(self._pending_tags) >= self.config.max_replay_tags:
            self.counters.drop(DropReason.REPLAY_CACHE_FULL)
            return AckStatus.BUSY
        return AckStatus.ACCEPTED

    async def on_packets(self, frames: list[bytes], sender: Sender | None = None) -> list[AckStatus]:
        """Statuses for ``frames`` from ``sender`` (an address, or a neighbour's node id; None: charged to
        nobody), after their durable commit."""
        statuses, _ = await self.receive(frames, sender)
        return statuses

    async def receive(self, frames: list[bytes], sender: Sender | None) -> tuple[list[AckStatus], int]:
        """The link's callback: statuses for ``frames``, after their durable commit, and how many
        refusals ``sender``'s budget pays for (REJECTED, and BUSY for capacity or its share)."""
        now = self.clock.now()
        keys = self.keyring.accepting(now)
        batch = _Batch(now, sender)
        statuses: list[AckStatus] = []
        committed = False
        lane = self.intake_turns.lane(_intake_flow(sender))
        try:
            for offset in range(0, len(frames), INTAKE_SLICE):
                sliced = frames[offset : offset + INTAKE_SLICE]
                async with lane.turn(len(sliced)):
                    # CPU time per slice: one thread_time call per slice (a system call,
                    # ~0.6 µs measured) rather than two per packet.
                    cpu_started = time.thread_time()
                    # One read transaction for the slice's replay-tag lookups (no await inside, no writes:
                    # the batch is stored by _commit below).
                    with self.store.reading():
                        statuses += [self._intake(frame, batch, keys) for frame in sliced]
                    self.counters.intake_cpu_seconds += time.thread_time() - cpu_started
            if batch.rows:
                # The commit's fsync holds the event loop too (~5 ms, more on a busy disk): a turn.
                async with lane.turn(INTAKE_SLICE):
                    statuses, committed = self._commit(batch, statuses)
            return statuses, batch.charged + statuses.count(AckStatus.REJECTED)
        finally:
            if batch.sender is not None and batch.rows and not committed:
                self.shares.give_back(batch.sender, len(batch.rows))
            self._pending_tags.difference_update(tag for tag, _ in batch.tags)
            self._pending_rows -= len(batch.rows)
            self._pending_neighbours -= batch.neighbours
            self._sync_counters()

    def _commit(self, batch: _Batch, statuses: list[AckStatus]) -> tuple[list[AckStatus], bool]:
        """Store the batch's accepted packets and tags in one transaction; BUSY for them if it fails
        (and whether it committed)."""
        cpu_started = time.thread_time()
        try:
            with self.store.transaction():
                row_ids = self.store.insert_held(batch.rows)
                self.store.record_tags(batch.tags)
        except StorageError as exc:
            # Nothing of the batch is stored: the sender keeps it and retries.
            self.counters.store_failing = True
            self.counters.store_failures += 1
            self.counters.drop(DropReason.STORE_ERROR, len(batch.rows))
            log_event(logger, logging.ERROR, "store-error", error=str(exc), frames=len(statuses))
            return [AckStatus.BUSY if s is AckStatus.ACCEPTED else s for s in statuses], False
        finally:
            self.counters.intake_cpu_seconds += time.thread_time() - cpu_started
        self.counters.store_failing = False
        self.holdings.add([HeldPacket(row_id, *row) for row_id, row in zip(row_ids, batch.rows)])
        if batch.sender is not None:
            self.shares.own(batch.sender, row_ids)
        self.replay_tags += len(batch.tags)
        self.counters.accepted += len(row_ids)
        stored_at = self.clock.now()
        batch.late_intake.due_before_stored += sum(1 for release_at, *_ in batch.rows if release_at < stored_at)
        self.counters.late_intake.merge(batch.late_intake)
        self._wakeup.set()
        return statuses, True

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one link connection; never raises (STYLE.md 2)."""
        counters = self.counters
        source = peer_address(stream)
        privileged = self.directory is not None and source in self.directory.neighbour_hosts()
        slot = self.gate.open(source, privileged=privileged)
        if slot is None:
            await self.gate.turn_away(stream)
            return
        counters.connections_open += 1
        counters.connections_accepted += 1
        neighbour: bytes | None = None  # its node id, once it has proven it in the handshake
        session = LinkSessionStats()

        def admit(node_id: bytes | None) -> bool:
            nonlocal neighbour
            if node_id is not None and self.directory is not None and self.directory.is_neighbour(node_id):
                neighbour = node_id
                counters.neighbour_connections_open += 1
                return True
            return slot.demote()

        async def on_packets(frames: list[bytes]) -> list[AckStatus]:
            if neighbour is not None:
                # Charged to its key's share (a colluding relay filled the queue while neighbours were
                # exempt), not to the refusal budget: after a crash an honest relay re-sends what it had
                # forwarded, every copy refused as a replay, and its peers' packets would wait behind them.
                return await self.on_packets(frames, neighbour)
            wait = self.refusals.delay(source, trio.current_time())
            if wait > 0:
                counters.throttled_batches += 1
                await trio.sleep(wait)  # idle meanwhile: an overspent source may be evicted
            with slot.busy(), self.work.inside():
                packets, short = self.work.check(frames, session.work_context)  # before any Sphinx work
                statuses, charged = await self.receive(packets, source)
            self.refusals.spend(source, charged + len(short), trio.current_time())
            return with_refusals(statuses, short)

        try:
            with slot.cancel_scope:  # cancelled if the gate evicts this connection as the one idle longest
                await serve_link(
                    slot.watch(stream),
                    on_packets,
                    packet_size=self.geometry.packet_size,
                    geometry_hash=self.geometry_hash,
                    limits=self.config.link,
                    identity=self.identity,
                    admit=admit,
                    stats=session,
                    work=self.work,
                )
            if slot.evicted:
                counters.link_errors["evicted-idle"] += 1
        except LinkError as exc:
            counters.link_errors[exc.reason] += 1
            log_event(logger, logging.DEBUG, "link-error", peer=source, reason=exc.reason, detail=str(exc))
        except Exception as exc:
            counters.link_errors["internal"] += 1
            logger.exception("event=link-internal-error peer=%s error=%r", source, exc)
        finally:
            slot.close()
            counters.connections_open -= 1
            if neighbour is not None:
                counters.neighbour_connections_open -= 1
            await trio.aclose_forcefully(stream)

    # -- release ---------------------------------------------------------

    async def run_scheduler(self) -> None:
        """Release held packets at their times, for ever."""
        while True:
            self._wakeup = trio.Event()
            upcoming = self.holdings.next_release()
            deadline = self.clock.to_trio(upcoming) if upcoming is not None else math.inf
            with trio.move_on_at(deadline):
                await self._wakeup.wait()
            now = self.clock.now()
            due = self.holdings.due(now, _RELEASE_BATCH)
            if due:
                self._dispatch(due)
                upcoming = self.holdings.next_release()
                if upcoming is not None and upcoming <= now:
                    self._wakeup.set()
                await trio.lowlevel.checkpoint()

    def _dispatch(self, row_ids: list[int]) -> None:
        # Released: their senders' shares are free again, while they are forwarded (a slow next hop
        # must not hold an honest sender to its share: bench abuse refused 65 of its probe's packets).
        self.shares.release(row_ids)
        packets, stored_only = self.holdings.take_resident(row_ids)
        packets.extend(self.store.load(stored_only))
        for packet in packets:
            self._forwarders.send(packet, self.clock.now(), self.holdings.neighbours)

    def _start_forwarder(self, address: Neighbour, receive: trio.MemoryReceiveChannel[HeldPacket]) -> None:
        assert self._nursery is not None  # attach() runs before the scheduler starts
        self._nursery.start_soon(self._run_forwarder, address, receive)

    async def _run_forwarder(self, neighbour: Neighbour, receive: trio.MemoryReceiveChannel[HeldPacket]) -> None:
        client = self._open_sender(neighbour)
        gathering = trio.Lock()  # one pipelined task at a time gathers a batch (gather_batch)

        async def forward_batches(receive: trio.MemoryReceiveChannel[HeldPacket]) -> None:
            async with receive:
                while batch := await gather_batch(receive, gathering, self.config.forward_batch):
                    give_up_at = self.clock.to_trio(min(self.forward_deadline(p.window_end) for p in batch))
                    if self.delivery.has_others(neighbour):
                        give_up_at = min(give_up_at, trio.current_time() + SINK_ATTEMPT_SECONDS)
                    statuses = await client.send_batch([p.packet for p in batch], give_up_at=give_up_at)
                    self._settle(neighbour, batch, statuses)

        try:
            async with trio.open_nursery() as pipeline:
                for _ in range(_FORWARD_PIPELINE - 1):
                    pipeline.start_soon(forward_batches, receive.clone())
                pipeline.start_soon(forward_batches, receive)
        finally:
            await client.aclose()

    def _settle(self, endpoint: Neighbour, batch: list[HeldPacket], statuses: list[AckStatus | None]) -> None:
        """Account for a batch sent to ``endpoint``; its packets are held under the next hop they name
        (``endpoint`` itself, or another address of the same packet sink)."""
        now = self.clock.now()
        finished: dict[Neighbour, list[int]] = {}
        retried = 0
        for packet, status in zip(batch, statuses):
            done = finished.setdefault((packet.next_host, packet.next_port), [])
            if status is AckStatus.ACCEPTED:
                self.counters.forwarded += 1
                done.append(packet.row_id)
            elif status is AckStatus.REJECTED:
                self.counters.drop(DropReason.NEXT_HOP_REJECTED)
                done.append(packet.row_id)
            elif now + _FORWARD_RETRY_DELAY <= (deadline := self.forward_deadline(packet.window_end)):
                self.holdings.retry(packet, now + _FORWARD_RETRY_DELAY)
                retried += 1
            else:
                reason = DropReason.NEXT_HOP_BUSY if status is AckStatus.BUSY else DropReason.NEXT_HOP_UNREACHABLE
                self.counters.drop(reason)
                log_event(logger, logging.WARNING, "forward-dropped", neighbour=format_host_port(*endpoint),
                          reason=reason, window_end=packet.window_end, deadline=deadline)
                done.append(packet.row_id)
        if None in statuses:
            self.delivery.failed(endpoint, now)
        if retried:
            self.counters.forward_retries += 1
            log_event(logger, logging.WARNING, "forward-retry", neighbour=format_host_port(*endpoint), packets=retried)
            self._wakeup.set()
        # Deleting is not urgent: a row that outlives a crash is re-sent after
        # the restart and the next hop's replay cache rejects the copy.
        for neighbour, row_ids in finished.items():
            self.holdings.finish(neighbour, row_ids)
        self._sync_counters()

    async def run_housekeeping(self) -> None:
        """Delete forwarded rows; forget replay tags and rounds whose windows have ended.

        A failing store (a full disk) is retried at the next tick: deletes
        and expiry only free space, and nothing waits for them.
        """
        next_expiry = trio.current_time()
        while True:
            await trio.sleep(_HOUSEKEEPING_SECONDS)
            finished = self.holdings.take_finished()
            try:
                self.store.delete(finished)
                if trio.current_time() >= next_expiry:
                    next_expiry = trio.current_time() + _EXPIRY_SECONDS
                    self.replay_tags -= self.store.expire_tags(self.clock.now())
                    self._expire_rounds()
            except StorageError as exc:
                self.holdings.return_finished(finished)
                self.counters.store_failures += 1
                log_event(logger, logging.ERROR, "store-error", error=str(exc), rows=len(finished))
            self._sync_counters()

    # -- directory -------------------------------------------------------

    def learn_round(self, source: str, signed: SignedManifest, *, persist: bool = True) -> None:
        """Add a verified manifest's next hops and phases to the directory (and keep it in the store)."""
        assert self.directory is not None
        round_id = signed.round_id
        ends_at = float(signed.manifest.schedule.end)
        if round_id in self._rounds:
            return
        label = f"round {round_id.hex()[:16]} from {source}"
        self._rounds[round_id] = (ends_at, label)
        self.directory.replace_source(label, entries_from_manifest(signed), spans_from_manifest(signed),
                                      relays_from_manifest(signed), sink=signed.manifest.aggregator_hop.endpoints)
        log_event(logger, logging.INFO, "round-known", round=round_id.hex()[:16], source=source, ends_at=ends_at)
        if persist:
            try:
                self.store.save_manifest(StoredManifest(round_id, source, signed.to_json(), ends_at))
            except StorageError as exc:
                log_event(logger, logging.ERROR, "store-error", error=str(exc), manifest=round_id.hex()[:16])

    def load_rounds(self) -> None:
        """The rounds last verified, from the store: re-verified against today's pinned keys."""
        pinned = {aggregator.url: aggregator.identity for aggregator in self.config.directory_aggregators}
        stale: list[bytes] = []
        for stored in self.store.manifests():
            identity = pinned.get(stored.source)
            try:
                if identity is None:
                    raise DirectoryError(f"{stored.source!r} is no longer a configured aggregator")
                signed = verify_manifest(stored.signed, identity=identity, source=stored.source)
            except DirectoryError as exc:
                log_event(logger, logging.WARNING, "stored-manifest-dropped", round=stored.round_id.hex()[:16],
                          reason=str(exc))
                stale.append(stored.round_id)
                continue
            self.learn_round(stored.source, signed, persist=False)
        self.store.forget_manifests(stale)
        self._expire_rounds()

    def _expire_rounds(self) -> None:
        if self.directory is None:
            return
        now = self.clock.now()
        ended = [round_id for round_id, (ends_at, _) in self._rounds.items() if ends_at + _ROUND_GRACE_SECONDS < now]
        for round_id in ended:
            _, label = self._rounds.pop(round_id)
            self.directory.remove_source(label)
        self.store.forget_manifests(ended)

    async def _refresh_directory(self, failing: set[str]) -> None:
        """Re-read every directory source; ``failing`` holds those whose last
        read failed (a failure is logged as a warning once per streak)."""
        assert self.directory is not None
        path = self.config.directory_path
        before = dict(self.directory.sources())
        sources = [*(a.url for a in self.config.directory_aggregators), *([str(path)] if path is not None else [])]
        identities = {aggregator.url: aggregator.identity for aggregator in self.config.directory_aggregators}
        for source in sources:
            try:
                if source in identities:
                    signed = await fetch_manifest(source, identity=identities[source],
                                                  timeout=self.config.directory_fetch_timeout, network=self.network)
                    self.learn_round(source, signed)
                else:
                    entries = await run_blocking(load_directory_file, Path(source))
                    self.directory.replace_source(source, entries)
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
        a packet names a next hop or window the directory refuses, at most
        once per min_refresh_seconds."""
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
        """Create due keys and erase expired ones (replay tags expire with their windows)."""
        erased = self.keyring.rotate(self.clock.now())
        if erased:
            log_event(logger, logging.INFO, "keys-erased", epochs=",".join(map(str, erased)))

    async def run_key_rotation(self) -> None:
        while True:
            await trio.sleep_until(self.clock.to_trio(self.keyring.next_rotation(self.clock.now())))
            self.rotate_keys()
