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

A failing commit (a full disk) never stops the sink: intake answers BUSY
(the relay keeps the packets and resends), the verifier retries its commit
with backoff, and both mark themselves unhealthy until a commit succeeds.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
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
    judge_batch,
    open_batch,
    open_frames,
    store_judged,
)
from anonml.aggregator._workers import IssuerWorkers
from anonml.base.errors import StorageError
from anonml.base.threads import run_blocking
from anonml.transport import AckStatus, ConnectionGate, LinkError, LinkIdentity, LinkLimits, peer_address, serve_link

log = logging.getLogger(__name__)

# Frames opened per worker-thread call: a flood's batch of 128 (~50 µs of
# X25519 and HMAC each) is split so another connection's frames get a turn
# between slices (issue 13: a flood's batches delayed honest relays' acks).
_OPEN_SLICE = 16


@dataclass(frozen=True)
class SinkLimits:
    """The sink's connection caps: relays (``reserved`` slots for connections from their
    addresses) and everyone else (``max_per_source`` each, refused after the handshake)."""

    max_connections: int = 128
    max_per_source: int = 8
    reserved: int = 64


class PacketSink:
    """Receives link batches durably, verifies them in the background, counts refusals by reason."""

    def __init__(
        self,
        state: RoundState,
        workers: IssuerWorkers,
        *,
        verify_batch: int = 256,
        max_inbox: int = 500_000,
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
        self.max_inbox = max_inbox
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
        self._retry_wait = retry_wait
        self.worker = worker
        self.claim_seconds = claim_seconds
        """The name this sink's verifier claims inbox rows under (unique among the processes sharing a store)."""
        # A shared store also fills from other workers' intake, and a killed worker's claims lapse
        # without waking anyone: an idle verifier looks again each second. Alone on its SQLite
        # file, only its own intake adds rows, and it wakes this verifier.
        self.idle_poll = 1.0 if state.store.engine == "postgresql" else math.inf
        self._wakeup = trio.Event()
        self._refused: Counter[str] = Counter()
        """Frames refused at intake and not yet counted in the store (they ride on its next commit)."""

    # -- intake -----------------------------------------------------------------

    async def on_packets(self, frames: list[bytes]) -> list[AckStatus]:
        """Check the final layer, store the authentic messages, then acknowledge (DESIGN.md §5, §10).

        A full inbox (a flood, or a verifier far behind) or a failing store
        answers BUSY: the sender keeps the packets and may resend later;
        disk use stays bounded and nothing not durable is acknowledged.
        """
        opened: list[Delivered | RejectionReason] = []
        for offset in range(0, len(frames), _OPEN_SLICE):
            opened += await run_blocking(open_frames, self.state, frames[offset : offset + _OPEN_SLICE])
        authentic = [item for item in opened if isinstance(item, Delivered)]
        self._refused.update(str(item) for item in opened if isinstance(item, RejectionReason))
        busy = [AckStatus.BUSY if isinstance(item, Delivered) else AckStatus.REJECTED for item in opened]
        if self.state.store.inbox_size() + len(authentic) > self.max_inbox:
            self.link_errors["inbox-full"] += len(authentic)
            return busy
        row_ids: list[int | None] = []
        if authentic:
            refused, self._refused = self._refused, Counter()
            # The arrival to the sub-second: what an aggregator logging every arrival
            # has (the anonymity report, DESIGN.md §11); windows compare it with whole seconds.
            arrived = float(self.state.clock())
            try:
                row_ids = await run_blocking(
                    self.state.store.enqueue, [(d.tag, d.message) for d in authentic], arrived, refused)
            except StorageError as exc:
                self._refused.update(refused)
                self.health.fail(Part.INBOX, exc)
                self.link_errors["store-failing"] += len(authentic)
                return busy
            self.health.recover(Part.INBOX)
        fresh = iter(row_ids)
        statuses: list[AckStatus] = []
        for item in opened:
            if not isinstance(item, Delivered):
                statuses.append(AckStatus.REJECTED)
            elif next(fresh) is None:
                self._refused[RejectionReason.REPLAY] += 1
                statuses.append(AckStatus.REJECTED)
            else:
                statuses.append(AckStatus.ACCEPTED)
        self._wakeup.set()
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

        Two stages overlap: one batch is opened (messages, surveys) and its
        tokens verified in threads and processes while the previous one is
        stored; batches are stored in arrival order, so the first of two
        submissions stays the one accepted.
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
        store = self.state.store
        while True:
            # A fresh event before looking, so a message stored after the look still wakes us.
            self._wakeup = trio.Event()
            # Off the event loop: the claim waits for the store's lock, which a commit holds through its fsync.
            # A claim is a commit too: on a failing store it is retried like the batch's.
            async for attempt in self._retrying():
                with attempt:
                    rows = await run_blocking(store.claim_inbox, self.worker, self.verify_batch, self.state.clock(),
                                              self.claim_seconds)
            self.health.recover(Part.VERIFIER)
            if not rows:
                await self._count_refusals()
                with trio.move_on_after(self.idle_poll):
                    await self._wakeup.wait()
                continue
            batch = await run_blocking(open_batch, self.state, rows)
            await judged.send(await run_blocking(judge_batch, self.state, batch, self.workers))

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

    def _admit(self, node_id: bytes | None) -> bool:
        """Only the manifest's relays deliver (DESIGN.md §5: the sink takes packets from last hops)."""
        return node_id is not None and node_id in self._relay_ids

    async def handle(self, stream: trio.abc.Stream) -> None:
        """One relay connection; never raises (DESIGN.md §2: outsiders can send anything)."""
        source = peer_address(stream)
        slot = self.gate.open(source, privileged=source in self._relay_hosts)
        if slot is None:
            self.link_errors[f"refused-{self.gate.last_refusal}"] += 1
            await trio.aclose_forcefully(stream)
            return

        async def on_packets(frames: list[bytes]) -> list[AckStatus]:
            with slot.busy():
                return await self.on_packets(frames)

        try:
            with slot.cancel_scope:  # cancelled if the gate evicts this connection as the one idle longest
                await serve_link(
                    slot.watch(stream), on_packets, packet_size=self.packet_size,
                    geometry_hash=self.geometry_hash, limits=self.limits, identity=self.identity, admit=self._admit,
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
