"""The packet sink: where the last relays deliver (DESIGN.md §5, §7, §10).

It speaks the relay link protocol (``protocol.serve_link``). Each batch of
frames is made durable in the round's inbox, stamped with its arrival time,
and only then acknowledged; a background worker verifies the inbox in order
(:mod:`aggregator._verify`'s two stages, in worker threads and processes so
the event loop keeps serving HTTP) and moves each frame to the accepted
packets or the rejection counts. Judging the acceptance window at arrival keeps a slow
verifier from turning punctual packets into late ones, and acknowledging
quickly keeps the last relay's releases on time.
"""

from __future__ import annotations

import logging

import trio

from anonml.aggregator._round import RoundState
from anonml.aggregator._verify import OpenedBatch, finish_batch, open_batch
from anonml.aggregator._workers import IssuerWorkers
from anonml.protocol import AckStatus, LinkError, LinkLimits, serve_link

log = logging.getLogger(__name__)


class PacketSink:
    """Receives link batches durably, verifies them in the background, counts link failures by reason."""

    def __init__(
        self,
        state: RoundState,
        workers: IssuerWorkers,
        *,
        verify_batch: int = 256,
        max_inbox: int = 500_000,
        limits: LinkLimits = LinkLimits(),
    ) -> None:
        self.state = state
        self.workers = workers
        self.verify_batch = verify_batch
        self.max_inbox = max_inbox
        self.limits = limits
        self.link_errors = state.link_errors
        geometry = state.geometry
        self.packet_size = geometry.packet_size
        self.geometry_hash = geometry.canonical_hash()
        self._wakeup = trio.Event()
        self._in_flight: set[bytes] = set()
        """Replay tags of batches opened and not yet stored (they count as seen)."""

    async def on_packets(self, frames: list[bytes]) -> list[AckStatus]:
        """Store, then acknowledge: every frame is durable (DESIGN.md §10); its verdict comes later.

        A full inbox (a flood, or a verifier far behind) answers BUSY: the
        sender keeps the packets and may resend later; disk use stays bounded.
        """
        if self.state.store.inbox_size() + len(frames) > self.max_inbox:
            self.link_errors["inbox-full"] += len(frames)
            return [AckStatus.BUSY] * len(frames)
        # The arrival to the sub-second: what an aggregator logging every arrival
        # has (the anonymity report, DESIGN.md §11); windows compare it with whole seconds.
        await trio.to_thread.run_sync(self.state.store.enqueue, frames, float(self.state.clock()))
        self._wakeup.set()
        return [AckStatus.ACCEPTED] * len(frames)

    async def verify_forever(self) -> None:
        """Verify the inbox, oldest first, until cancelled (also drains what a restart left).

        Two stages overlap: one batch is opened (final Sphinx layer) in a
        thread while the previous one's tokens are verified and it is
        stored; batches are stored in arrival order, so the first of two
        submissions stays the one accepted.
        """
        opened_send, opened_receive = trio.open_memory_channel[OpenedBatch](0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._open_forever, opened_send)
            async for batch in opened_receive:
                await trio.to_thread.run_sync(finish_batch, self.state, batch, self.workers)
                # Stored now: the store's replay cache holds these tags.
                self._in_flight.difference_update(batch.tags)

    async def _open_forever(self, opened: trio.MemorySendChannel[OpenedBatch]) -> None:
        store, last_id = self.state.store, 0
        while True:
            # A fresh event before looking, so a batch stored after the look still wakes us.
            self._wakeup = trio.Event()
            # Off the event loop: the read waits for the store's lock, which a commit holds through its fsync.
            rows = await trio.to_thread.run_sync(store.inbox_batch, self.verify_batch, last_id)
            if not rows:
                await self._wakeup.wait()
                continue
            last_id = rows[-1][0]
            ids = [row[0] for row in rows]
            frames = [row[1] for row in rows]
            arrivals = [row[2] for row in rows]
            batch = await trio.to_thread.run_sync(
                lambda: open_batch(self.state, frames, arrivals, inbox_ids=ids, in_flight=self._in_flight)
            )
            self._in_flight.update(batch.tags)
            await opened.send(batch)

    async def handle(self, stream: trio.SocketStream) -> None:
        """One relay connection; never raises (DESIGN.md §2: outsiders can send anything)."""
        try:
            await serve_link(
                stream, self.on_packets, packet_size=self.packet_size, geometry_hash=self.geometry_hash, limits=self.limits
            )
        except LinkError as exc:
            self.link_errors[exc.reason] += 1
            log.info("link session ended: %s", exc)
        except Exception:
            self.link_errors["internal"] += 1
            log.exception("packet sink connection failed")
        finally:
            await stream.aclose()
