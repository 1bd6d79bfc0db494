"""The packet sink: where the last relays deliver (DESIGN.md §5, §7, §10).

It speaks the relay link protocol (``protocol.serve_link``) and acknowledges
each frame only once :func:`aggregator._verify.process_batch` has committed
it. Verification runs in worker threads bounded by a CapacityLimiter, so the
event loop keeps serving HTTP while tokens are checked.
"""

from __future__ import annotations

import logging
import trio

from protocol import AckStatus, LinkError, LinkLimits, serve_link

from aggregator._round import RoundState
from aggregator._verify import TokenVerifier, process_batch

log = logging.getLogger(__name__)


class PacketSink:
    """Turns link batches into durable outcomes; counts link-level failures by reason."""

    def __init__(
        self, state: RoundState, *, threads: int = 2, processes: int = 0, limits: LinkLimits = LinkLimits()
    ) -> None:
        self.state = state
        self.limiter = trio.CapacityLimiter(threads)
        self.verifier = TokenVerifier(state.secrets.issuer_key, processes)
        self.limits = limits
        self.link_errors = state.link_errors
        geometry = state.geometry
        self.packet_size = geometry.packet_size
        self.geometry_hash = geometry.canonical_hash()

    async def on_packets(self, frames: list[bytes]) -> list[AckStatus]:
        now = self.state.now()
        self.state.batches_in_flight += 1
        try:
            outcomes = await trio.to_thread.run_sync(
                process_batch, self.state, frames, now, self.verifier, limiter=self.limiter
            )
        finally:
            self.state.batches_in_flight -= 1
        # A duplicate is durable already (its first copy): the sender may forget it.
        return [AckStatus.ACCEPTED if o in ("accepted", "duplicate") else AckStatus.REJECTED for o in outcomes]

    def close(self) -> None:
        self.verifier.close()

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
