"""The packet sink: where the last relays deliver (DESIGN.md §5, §7, §10).

It speaks the relay link protocol (``transport.serve_link``) and takes
packets only from the relays of the round's signed manifest: each proves in
the link handshake that it holds the key its node id names (the sink proves
it is the final hop the same way); a stranger's connection is refused after
the handshake. Each batch of frames has its final Sphinx layer checked (MAC
first) in a worker thread before anything is stored: a frame that fails is
refused and counted, never stored (DESIGN.md §5). The messages of the
authentic ones are made durable in the round's inbox under their replay
tags, stamped with their arrival time, and only then acknowledged; a
background verifier checks the inbox in order (:mod:`aggregator._verify`,
in worker threads and processes so the event loop keeps serving HTTP) and
moves each message to the accepted packets or the rejection counts. Judging
the acceptance window at arrival keeps a slow verifier from turning punctual
packets into late ones, and acknowledging quickly keeps the last relay's
releases on time.

Fair per delivering relay (issue 25: a colluding relay holds a listed key,
passes the handshake, and floods junk). Each relay's frames are opened in
fair turns (``transport.FairTurns``, one flow per relay's node id), so a
batch from a quiet relay waits for at most one slice of a flooding one's;
frames whose final layer fails its MAC are refused there, before any token
work. Each relay's backlog of undecided inbox rows is capped
(``max_inbox_per_relay``): past it that relay alone is answered BUSY, before
its frames are opened. The verifier takes each relay's rows in turn: one
task per relay of the manifest claims only that relay's rows, and their
tokens are verified in fair turns of a few tokens each, so a quiet relay's
packets wait for one slice of the flood's, not its backlog. The relay that
delivered a message is kept beside it in the inbox until it is decided, and
nowhere else: the sink learns it from the link anyway (DESIGN.md §11's
aggregator sees each packet's last hop). Batches of different relays are
decided in the order their verification ends, not in arrival order: of two
submissions of one token through two relays (a double submission), the one
committed first is kept, as with several ingest workers.

A failing commit (a full disk) never stops the sink: intake answers BUSY
(the relay keeps the packets and resends), the verifier retries its commit
with backoff, and both mark themselves unhealthy until a commit succeeds.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import tenacity
import trio

from anonml.aggregator._health import Health, Part
from anonml.aggregator._rejections import RejectionReason
from anonml.aggregator._round import RoundState
from anonml.aggregator._store import CLAIM_SECONDS, BatchTaken
from anonml.aggregator._verify import (
    Delivered,
    JudgedBatch,
    judge_verified,
    open_batch,
    open_frames,
    store_judged,
)
from anonml.aggregator._workers import IssuerWorkers
from anonml.base.errors import ConfigError, StorageError
from anonml.base.threads import run_blocking
from anonml.crypto import JobRefused, TokenJob
from anonml.transport import (
    AckStatus,
    ConnectionGate,
    FairTurns,
    LinkError,
    LinkIdentity,
    LinkLimits,
    peer_address,
    serve_link,
)

log = logging.getLogger(__name__)

# Frames opened per worker-thread call: a flood's batch of 128 (~50 µs of
# X25519 and HMAC each) is split so another connection's frames get a turn
# between slices (issue 13: a flood's batches delayed honest relays' acks).
_OPEN_SLICE = 16
# Tokens per verification turn at most. A relay whose slice had a refused token gets half as many next
# (down to _MIN_VERIFY_SLICE), one whose slice passed twice as many: a refused proof costs its slice's batch
# check a bisection (measured, load 8.8: 16 junk tokens 64 ms, 4.0 ms each; one alone 0.6 ms; 16 honest
# 19 ms), so a junk relay's turns stay short and cheap, an honest relay's keep the batch check's saving.
_VERIFY_SLICE = 16
_MIN_VERIFY_SLICE = 2  # IssuerWorkers.verify runs a single token in the calling thread, not the pool
_NOT_ADMITTED = -1  # not a row id (they start at 1): a message past its relay's cap, not stored
_UNKNOWN_RELAY = ""
"""The flow of inbox rows whose delivering relay is not known (stored by an older release, or by a caller
that names none)."""


@dataclass(frozen=True)
class SinkLimits:
    """The sink's connection caps: relays (``reserved`` slots for connections from their
    addresses) and everyone else (``max_per_source`` each, refused after the handshake)."""

    max_connections: int = 128
    max_per_source: int = 8
    reserved: int = 64


@dataclass(frozen=True)
class InboxLimits:
    """How many undecided messages the sink keeps in the round's inbox before it answers BUSY.

    ``max_inbox`` in all; ``max_per_relay`` per delivering relay, so that a relay flooding the sink fills
    only its own backlog (issue 25). None: an equal share of ``max_inbox`` among the manifest's relays
    (``max_inbox // relays``, at least 1).
    """

    max_inbox: int = 500_000
    max_per_relay: int | None = None

    def __post_init__(self) -> None:
        if self.max_inbox < 1:
            raise ConfigError(f"max_inbox must be at least 1, got {self.max_inbox!r}")
        if self.max_per_relay is not None and not 1 <= self.max_per_relay <= self.max_inbox:
            raise ConfigError(f"max_inbox_per_relay must be between 1 and max_inbox ({self.max_inbox}), "
                              f"got {self.max_per_relay!r}")

    def per_relay(self, relays: int) -> int:
        """The cap per relay among ``relays`` relays: ``max_per_relay``, or an equal share of ``max_inbox``."""
        return self.max_per_relay if self.max_per_relay is not None else max(1, self.max_inbox // max(1, relays))


class PacketSink:
    """Receives link batches durably, verifies them in the background, counts refusals by reason."""

    def __init__(
        self,
        state: RoundState,
        workers: IssuerWorkers,
        *,
        verify_batch: int = 256,
        inbox: InboxLimits = InboxLimits(),
        limits: LinkLimits = LinkLimits(),
        connections: SinkLimits = SinkLimits(),
        health: Health | None = None,
        retry_wait: tenacity.wait.wait_base = tenacity.wait_exponential(multiplier=0.05, max=5.0),
        worker: str = "main",
        claim_seconds: float = CLAIM_SECONDS,
    ) -> None:
        self.state = state
        self.workers = workers
        self.verify_batch = verify_batch
        self.max_inbox = inbox.max_inbox
        self.limits = limits
        self.health = health if health is not None else Health()
        self.link_errors = state.link_errors
        geometry = state.geometry
        self.packet_size = geometry.packet_size
        self.geometry_hash = geometry.canonical_hash()
        self.identity = LinkIdentity(state.secrets.final_hop_private_key)
        relays = state.manifest.relays
        self._relay_ids = frozenset(relay.node_id for relay in relays)
        self._relay_hosts = frozenset(relay.host for relay in relays)
        self.gate = ConnectionGate(connections.max_connections, connections.max_per_source,
                                   min(connections.reserved, connections.max_connections - 1))
        self.max_inbox_per_relay = inbox.per_relay(len(relays))
        """Undecided messages one relay may have in the inbox: its backlog is its own (default: an equal share)."""
        self.intake_turns = FairTurns()
        self.verify_turns = FairTurns()
        self._flows = (_UNKNOWN_RELAY, *sorted(relay.hex() for relay in self._relay_ids))
        self._wakeups = {flow: trio.Event() for flow in self._flows}
        self._verify_slice = dict.fromkeys(self._flows, _VERIFY_SLICE)
        self._retry_wait = retry_wait
        self.worker = worker
        self.claim_seconds = claim_seconds
        """The name this sink's verifier claims inbox rows under (unique among the processes sharing a store)."""
        # A shared store also fills from other workers' intake, and a killed worker's claims lapse
        # without waking anyone: an idle verifier looks again each second. Alone on its SQLite
        # file, only its own intake adds rows, and it wakes this verifier.
        self.idle_poll = 1.0 if state.store.engine == "postgresql" else math.inf
        self._refused: Counter[str] = Counter()
        """Frames refused at intake and not yet counted in the store (they ride on its next commit)."""

    # -- intake -----------------------------------------------------------------

    async def on_packets(self, frames: list[bytes], relay: bytes | None = None) -> list[AckStatus]:
        """Check the final layer, store the authentic messages, then acknowledge (DESIGN.md §5, §10).

        ``relay`` is the delivering relay's node id (None: unknown, one flow for all such callers).
        A full inbox (a flood, or a verifier far behind), the relay's full backlog, or a failing
        store answers BUSY: the sender keeps the packets and may resend later;
        disk use stays bounded and nothing not durable is acknowledged.
        """
        flow = relay.hex() if relay is not None else _UNKNOWN_RELAY
        # The store keeps each relay's backlog, committed and being committed (RoundStore.relay_backlog): the one
        # count the caps read, refreshed from the stored counters at each of the verifier's claims.
        store = self.state.store
        if store.relay_backlog(flow) >= self.max_inbox_per_relay:
            # Before any Sphinx work: the relay's own backlog is full, whatever it sends now.
            self.link_errors["relay-backlog-full"] += len(frames)
            return [AckStatus.BUSY] * len(frames)
        lane = self.intake_turns.lane(flow)
        opened: list[Delivered | RejectionReason] = []
        for offset in range(0, len(frames), _OPEN_SLICE):
            async with lane.turn(min(_OPEN_SLICE, len(frames) - offset)):
                opened += await run_blocking(open_frames, self.state, frames[offset : offset + _OPEN_SLICE])
        authentic = [item for item in opened if isinstance(item, Delivered)]
        self._refused.update(str(item) for item in opened if isinstance(item, RejectionReason))
        busy = [AckStatus.BUSY if isinstance(item, Delivered) else AckStatus.REJECTED for item in opened]
        if store.inbox_backlog() + len(authentic) > self.max_inbox:
            self.link_errors["inbox-full"] += len(authentic)
            return busy
        # Up to the relay's cap; the rest BUSY (resent later, when its backlog has shrunk).
        admitted = authentic[: max(0, self.max_inbox_per_relay - store.relay_backlog(flow))]
        if len(admitted) < len(authentic):
            self.link_errors["relay-backlog-full"] += len(authentic) - len(admitted)
        row_ids: list[int | None] = []
        if admitted:
            refused, self._refused = self._refused, Counter()
            # The arrival to the sub-second: what an aggregator logging every arrival
            # has (the anonymity report, DESIGN.md §11); windows compare it with whole seconds.
            arrived = float(self.state.clock())
            try:
                with store.entering(flow, len(admitted)):
                    row_ids = await run_blocking(
                        store.enqueue, [(d.tag, d.message) for d in admitted], arrived, refused, flow)
            except StorageError as exc:
                self._refused.update(refused)
                self.health.fail(Part.INBOX, exc)
                self.link_errors["store-failing"] += len(admitted)
                return busy
            self.health.recover(Part.INBOX)
        fresh = iter(row_ids)
        statuses: list[AckStatus] = []
        for item in opened:
            if not isinstance(item, Delivered):
                statuses.append(AckStatus.REJECTED)
            elif (row_id := next(fresh, _NOT_ADMITTED)) == _NOT_ADMITTED:
                statuses.append(AckStatus.BUSY)
            elif row_id is None:
                self._refused[RejectionReason.REPLAY] += 1
                statuses.append(AckStatus.REJECTED)
            else:
                statuses.append(AckStatus.ACCEPTED)
        if flow in self._wakeups:
            self._wakeups[flow].set()
        return statuses

    async def admit_legacy_frames(self) -> None:
        """Frames an older release stored unchecked: open them now, in arrival order, as intake would."""
        store = self.state.store
        legacy = await run_blocking(store.legacy_frames)
        for _, frame, arrived in legacy:
            [opened] = await run_blocking(open_frames, self.state, [frame])
            if isinstance(opened, Delivered):
                [row_id] = await run_blocking(store.enqueue, [(opened.tag, opened.message)], arrived)
                if row_id is None:
                    self._refused[RejectionReason.REPLAY] += 1
            else:
                self._refused[opened] += 1
        if legacy:
            log.info("admitted %d frames stored by an older release", len(legacy))
        await run_blocking(store.drop_legacy_frames)

    # -- verification -----------------------------------------------------------

    async def verify_forever(self) -> None:
        """Verify the inbox, oldest first, until cancelled (also drains what a restart left).

        Two stages overlap: a batch of one relay's rows is opened (messages,
        surveys) and its tokens verified in threads and processes, in fair
        turns with the other relays' batches, while the previous one is
        stored; each relay's batches are stored in arrival order, so of two
        submissions through one relay the first stays the one accepted.
        """
        # What this worker claimed before a restart is its own to verify again, at once.
        async for attempt in self._retrying():
            with attempt:
                await run_blocking(self.state.store.release_claims, self.worker)
        judged_send, judged_receive = trio.open_memory_channel[JudgedBatch](0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._judge_forever, judged_send)
            async for judged in judged_receive:
                await self._store_until_done(judged)

    async def _store_until_done(self, judged: JudgedBatch) -> None:
        """Commit a judged batch, retrying with backoff while the store fails (the service stays up).

        A batch another worker decided meanwhile (this worker's claim lapsed) is dropped: its
        rows were decided there, and whatever of it nobody decided is given back to be claimed again."""
        try:
            async for attempt in self._retrying():
                with attempt:
                    await run_blocking(store_judged, self.state, judged)
        except BatchTaken as exc:
            self.link_errors["batch-taken"] += 1
            log.warning("a verified batch was dropped: %s", exc)
            # Its rows nobody decided are claimed again at once (by this worker or another).
            async for attempt in self._retrying():
                with attempt:
                    await run_blocking(self.state.store.release_claims, self.worker, judged.batch.inbox_ids)
        self.health.recover(Part.VERIFIER)

    def _retrying(self) -> tenacity.AsyncRetrying:
        """Retries with backoff while the store fails, the verifier marked unhealthy meanwhile."""
        return tenacity.AsyncRetrying(retry=tenacity.retry_if_exception_type(StorageError), wait=self._retry_wait,
                                      sleep=trio.sleep, reraise=True, before_sleep=lambda state: self._failed(state))

    def _failed(self, retry_state: tenacity.RetryCallState) -> None:
        error = retry_state.outcome.exception() if retry_state.outcome is not None else None
        self.health.fail(Part.VERIFIER, error if error is not None else StorageError("commit failed"))

    async def _judge_forever(self, judged: trio.MemorySendChannel[JudgedBatch]) -> None:
        """One judging task per delivering relay (and one for rows whose relay is unknown)."""
        async with trio.open_nursery() as nursery:
            for flow in self._flows:
                nursery.start_soon(self._judge_relay_forever, flow, judged)

    async def _judge_relay_forever(self, flow: str, judged: trio.MemorySendChannel[JudgedBatch]) -> None:
        """Claim, open and verify the rows relay ``flow`` delivered, a batch at a time, oldest first."""
        store = self.state.store
        while True:
            # A fresh event before looking, so a message stored after the look still wakes us.
            wakeup = self._wakeups[flow] = trio.Event()
            # Off the event loop: the claim waits for the store's lock, which a commit holds through its fsync.
            # A claim is a commit too: on a failing store it is retried like the batch's.
            async for attempt in self._retrying():
                with attempt:
                    rows = await run_blocking(store.claim_inbox, self.worker, self.verify_batch, self.state.clock(),
                                              self.claim_seconds, flow)
            self.health.recover(Part.VERIFIER)
            if not rows:
                await self._count_refusals()
                with trio.move_on_after(self.idle_poll):
                    await wakeup.wait()
                continue
            batch = await run_blocking(open_batch, self.state, rows)
            verdicts = await self._verify_in_turns(flow, batch.token_jobs())
            await judged.send(await run_blocking(judge_verified, self.state, batch, verdicts))

    async def _verify_in_turns(self, flow: str, jobs: Sequence[TokenJob]) -> list[bytes | JobRefused]:
        """``IssuerWorkers.verify`` on ``jobs``, a slice per fair turn of relay ``flow`` (``_VERIFY_SLICE``)."""
        lane = self.verify_turns.lane(flow)
        verdicts: list[bytes | JobRefused] = []
        while len(verdicts) < len(jobs):
            size = self._verify_slice[flow]
            part = list(jobs[len(verdicts) : len(verdicts) + size])
            async with lane.turn(len(part)):
                results = await run_blocking(self.workers.verify, part)
            verdicts += results
            refused = any(isinstance(result, JobRefused) for result in results)
            self._verify_slice[flow] = max(_MIN_VERIFY_SLICE, size // 2) if refused else min(_VERIFY_SLICE, size * 2)
        return verdicts

    async def _count_refusals(self) -> None:
        """Store the counts of frames refused since the last commit (when intake had nothing else to store)."""
        if not self._refused:
            return
        refused, self._refused = self._refused, Counter()
        try:
            await run_blocking(self.state.store.count_rejections, refused)
        except StorageError as exc:
            self._refused.update(refused)
            self.health.fail(Part.VERIFIER, exc)

    def pending_refusals(self) -> dict[str, int]:
        """Refusals counted in memory only (``GET /v1/status`` adds them to the stored counts)."""
        return dict(self._refused)

    # -- connections ------------------------------------------------------------


    async def handle(self, stream: trio.abc.Stream) -> None:
        """One relay connection; never raises (DESIGN.md §2: outsiders can send anything)."""
        source = peer_address(stream)
        slot = self.gate.open(source, privileged=source in self._relay_hosts)
        if slot is None:
            self.link_errors[f"refused-{self.gate.last_refusal}"] += 1
            await self.gate.turn_away(stream)
            return

        relay: bytes | None = None  # its node id, once it has proven it in the handshake

        def admit(node_id: bytes | None) -> bool:
            """Only the manifest's relays deliver (DESIGN.md §5: the sink takes packets from last hops)."""
            nonlocal relay
            if node_id is None or node_id not in self._relay_ids:
                return False
            relay = node_id
            return True

        async def on_packets(frames: list[bytes]) -> list[AckStatus]:
            with slot.busy():
                return await self.on_packets(frames, relay)

        try:
            with slot.cancel_scope:  # cancelled if the gate evicts this connection as the one idle longest
                await serve_link(
                    slot.watch(stream), on_packets, packet_size=self.packet_size,
                    geometry_hash=self.geometry_hash, limits=self.limits, identity=self.identity, admit=admit,
                )
            if slot.evicted:
                self.link_errors["evicted-idle"] += 1
        except LinkError as exc:
            self.link_errors[exc.reason] += 1
            log.info("link session from %s ended: %s", source, exc)
        except Exception:
            self.link_errors["internal"] += 1
            log.exception("packet sink connection from %s failed", source)
        finally:
            slot.close()
            await trio.aclose_forcefully(stream)
