"""The packet sink: where the last relays deliver (DESIGN.md §5, §7, §10).

It speaks the relay link protocol (``protocol.serve_link``). Each batch of
frames is made durable in the round's inbox, stamped with its arrival time,
and only then acknowledged; a background worker verifies the inbox in order
(:func:`aggregator._verify.process_batch`, in a worker thread so the event
loop keeps serving HTTP) and moves each frame to the accepted packets or the
rejection counts. Judging the acceptance window at arrival keeps a slow
verifier from turning punctual packets into late ones, and acknowledging
quickly keeps the last relay's releases on time.
"""

from __future__ import annotations

import logging

import trio

from protocol import AckStatus, LinkError, LinkLimits, serve_link

from aggregator._round import RoundState
from aggregator._verify import process_batch
from aggregator._workers import IssuerWorkers

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

    async def on_packets(self, frames: list[bytes]) -> list[AckStatus]:
        """Store, then acknowledge: every frame is durable (DESIGN.md §10); its verdict comes later.

        A full inbox (a flood, or a verifier far behind) answers BUSY: the
        sender keeps the packets and may resend later; disk use stays bounded.
        """
        if self.state.store.inbox_size() + len(frames) > self.max_inbox:
            self.link_errors["inbox-full"] += len(frames)
            return [AckStatus.BUSY] * len(frames)
        await trio.to_thread.run_sync(self.state.store.enqueue, frames, self.state.now())
        self._wakeup.set()
        return [AckStatus.ACCEPTED] * len(frames)

    async def verify_forever(self) -> None:
        """Verify the inbox, oldest first, until cancelled (also drains what a restart left)."""
        store = self.state.store
        while True:
            # A fresh event before looking, so a batch stored after the look still wakes us.
            self._wakeup = trio.Event()
            rows = store.inbox_batch(self.verify_batch)
            if not rows:
                await self._wakeup.wait()
                continue
            ids = [row[0] for row in rows]
            frames = [row[1] for row in rows]
            arrivals = [row[2] for row in rows]
            await trio.to_thread.run_sync(
                lambda: process_batch(self.state, frames, arrivals, self.workers, inbox_ids=ids)
            )

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
