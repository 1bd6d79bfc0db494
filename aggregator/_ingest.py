"""Scaling out on PostgreSQL: ingest workers beside the round driver, and the driver's lease (DESIGN.md §10).

An ingest worker (``anonml aggregator worker``) is a packet sink and a
verifier without the rest of the round: it takes link batches from the
round's relays, makes their messages durable in the shared inbox before
acknowledging, and verifies whatever inbox rows it claims — its own or
another worker's. Every worker of a round holds the final hop's key, so a
relay may deliver to any of them. Nothing depends on a worker staying up:
what it acknowledged is committed; what it claimed and had not committed
when it died lapses after the claim (``claim_seconds``) and is taken over;
a batch it commits is decided once (the store's rules,
:mod:`aggregator._store`).

The round driver (``anonml aggregator run``: schedule, thresholds, medians,
heads, learning) runs once per round: on PostgreSQL it first takes the
round's ``driver`` lease and renews it while it runs; a second driver waits,
and takes over when the first stops renewing.
"""

from __future__ import annotations

import logging
import time

import trio

from anonml.aggregator._round import RoundState
from anonml.aggregator._sink import InboxLimits, PacketSink
from anonml.aggregator._store import CLAIM_SECONDS, ROSTER_FINAL, RoundStore
from anonml.aggregator._workers import IssuerWorkers
from anonml.base.errors import AnonMLError, StorageError
from anonml.base.threads import run_blocking
from anonml.transport import TCP_NETWORK, listening_address, serve_streams

log = logging.getLogger(__name__)

DRIVER_LEASE = "driver"
LEASE_SECONDS = 15.0
"""How long a driver's lease lasts unless renewed (renewed every third of it)."""


class LeaseLost(AnonMLError):
    """Another driver holds the round's lease: this one must stop driving."""


async def serve_ingest(
    state: RoundState, *, host: str, port: int, worker: str, processes: int = 0,
    claim_seconds: float = CLAIM_SECONDS, inbox: InboxLimits = InboxLimits(),
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Take and verify packets for the round until cancelled; reports the bound (host, port)."""
    workers = IssuerWorkers(state.secrets.issuer_key, processes)
    try:
        sink = PacketSink(state, workers, inbox=inbox, worker=worker, claim_seconds=claim_seconds)
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(serve_streams, TCP_NETWORK, sink.handle, host, port)
            await run_blocking(workers.warm)
            nursery.start_soon(_verify_once_roster_final, state, sink)
            task_status.started(listening_address(listeners))
    finally:
        workers.close()


async def _verify_once_roster_final(state: RoundState, sink: PacketSink, poll: float = 1.0) -> None:
    """Verify once the driver froze the roster (reports need the partition plan); intake runs meanwhile."""
    while await run_blocking(state.store.get_meta, ROSTER_FINAL) is None:
        await trio.sleep(poll)
    await run_blocking(state.freeze_roster)
    state.close_registration()
    await sink.verify_forever()


async def hold_lease(
    store: RoundStore, holder: str, *, name: str = DRIVER_LEASE, seconds: float = LEASE_SECONDS,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Wait until lease ``name`` is ``holder``'s, report started, then renew it until cancelled.

    Raises :class:`LeaseLost` if a renewal finds another holder (this process
    stalled past its lease); a store that fails to renew is retried until the
    lease would have expired, then counts as lost.
    """
    while not await run_blocking(store.take_lease, name, holder, time.time(), seconds):
        other = await run_blocking(store.lease_holder, name, time.time())
        log.warning("the round's %s lease is held by %s: waiting for it", name, other)
        await trio.sleep(seconds / 3)
    task_status.started()
    held_until = time.time() + seconds
    while True:
        await trio.sleep(seconds / 3)
        try:
            renewed = await run_blocking(store.take_lease, name, holder, time.time(), seconds)
        except StorageError as exc:
            if time.time() < held_until:
                log.warning("could not renew the %s lease: %s", name, exc)
                continue
            raise LeaseLost(f"the {name} lease lapsed while the store failed: {exc}") from exc
        if not renewed:
            raise LeaseLost(f"another process took the round's {name} lease")
        held_until = time.time() + seconds
