"""A demo worker process: many peers, each its own identity, credential,
ledger and randomness, run as concurrent :func:`peer.join_round` tasks.

``python -m anonml.demo._swarm CONFIG.json`` reads its peers' rows from one CSV
file (one row per peer: the importer turns the file into events and each peer
gets the dataset of its own event), shares one HTTP connection pool and one
link per relay between its peers (the only thing they share: public documents
and sockets), and prints progress as JSON lines on stdout for ``anonml demo``.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from anonml.peer import JoinResult, PeerEvent, SentMessage

# Peers a worker has started that have not registered yet. A worker holds thousands of peers, and each
# one's start (its identity, generator, ledger and manifest record: about a millisecond) used to run for
# all of them at once: in the Adult demo (32,561 peers) that took the workers' CPU for the first 20 s of
# registration, which ran at 25 a second instead of the pacing rate's 400 and closed on 89% of the peers.
# Started in step with their registrations, they keep the worker's HTTP connections busy from the start.
STARTING_AHEAD = 64


@dataclass(frozen=True)
class SwarmConfig:
    """What one worker runs: ``csv`` holds one row per peer."""

    worker: int
    aggregator: str
    csv: Path
    store: Path
    seed: int
    max_connections: int = 8
    rows_per_peer: int = 1
    """Consecutive rows of ``csv`` each peer holds (a model-averaging round's peers hold many)."""

    @property
    def sent_file(self) -> Path:
        """Where the worker writes one JSON line per message a first relay took (:func:`sent_record`)."""
        return self.store.with_suffix(".sent.jsonl")

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "csv": str(self.csv), "store": str(self.store)})

    @classmethod
    def from_json(cls, text: str) -> SwarmConfig:
        data = json.loads(text)
        return cls(
            worker=int(data["worker"]),
            aggregator=str(data["aggregator"]),
            csv=Path(data["csv"]),
            store=Path(data["store"]),
            seed=int(data["seed"]),
            max_connections=int(data.get("max_connections", 16)),
            rows_per_peer=int(data.get("rows_per_peer", 1)),
        )


class StartSlots:
    """At most ``ahead`` of a worker's peers between their start and their registration (:data:`STARTING_AHEAD`)."""

    def __init__(self, ahead: int) -> None:
        self._free = trio.Semaphore(ahead)

    @asynccontextmanager
    async def holding(self) -> AsyncIterator[Callable[[PeerEvent], None]]:
        """Wait for a slot; yields the listener that gives it back when the peer has registered (or resumed
        a registration), and gives it back on the way out if the peer stopped before that."""
        from anonml.peer import PeerEvent

        await self._free.acquire()
        held = True

        def registered(event: PeerEvent) -> None:
            nonlocal held
            if held and event in (PeerEvent.REGISTERED, PeerEvent.RESUMED):
                held = False
                self._free.release()

        try:
            yield registered
        finally:
            if held:
                self._free.release()


def results_summary(results: Sequence[JoinResult]) -> dict[str, Any]:
    """What a worker's peers did, summed over their rounds (its summary line's counts)."""
    return {
        "joined": len(results),
        "packets": sum(r.packets for r in results),
        "sends": sum(r.sends for r in results),
        "resends": sum(r.resends for r in results),
        "covers": sum(r.covers for r in results),
        "acknowledged": sum(r.acknowledged for r in results),
        "missing": sum(r.missing for r in results),
        "missing_reasons": dict(sum((r.missing_reasons for r in results), Counter[str]())),
        "unconfirmed": sum(r.unconfirmed for r in results),
        "epsilon": [r.epsilon_spent for r in results],
    }


def sent_record(identity: str, message: SentMessage) -> dict[str, Any]:
    """A ``peer.SentMessage`` as the demo's anonymity trace reads it (``anonml.demo._trace``)."""
    return {"identity": identity, "survey": message.survey.to_bytes().hex(), "receipt": message.receipt.hex(),
            "drawn_at": message.drawn_at, "sent_at": message.sent_at, "packet": message.packet_hash.hex(),
            "window": int(message.attempt) + 1}


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


async def run_swarm(config: SwarmConfig) -> dict[str, Any]:
    from anonml.mechanisms import BudgetExceeded
    from anonml.peer import (
        AggregatorClient,
        AggregatorError,
        Dataset,
        JoinRefused,
        JoinResult,
        Peer,
        PeerIdentity,
        PeerStore,
        RoundPipeline,
        RoundSession,
        join_round,
        open_transport,
        peer_generator,
    )
    from anonml.protocol import FeatureSpec

    started = time.monotonic()
    events: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    # The workers start before the aggregator serves (the demo overlaps their start-up with its own).
    client = AggregatorClient(config.aggregator, max_connections=config.max_connections, retry_for=300.0, wait_for_service=True)
    store = PeerStore(config.store, durable=False)
    sent_log = config.sent_file.open("w", encoding="utf-8", buffering=1)  # this round's only (a worker is never restarted)
    results: list[JoinResult] = []
    sent: list[tuple[str, str, float]] = []
    """(identity, receipt, send time) of every message a first relay took: the truth the anonymity report is scored against."""
    try:
        session_manifest = await client.manifest()
        spec = FeatureSpec.from_dict(dict(session_manifest.manifest.features))
        # The demo's people are made for this one round: a promise above the
        # default lifetime budget (``anonml demo --epsilon 12``) is theirs to accept.
        if store.lifetime_epsilon() < session_manifest.manifest.eps_total:
            store.set_lifetime_epsilon(session_manifest.manifest.eps_total)
        pipeline = RoundPipeline.for_manifest(session_manifest.manifest)
        dataset = pipeline.importer.import_file(config.csv)
        rows = [pipeline.vector_of(Dataset((event,))) for event in dataset.events]
        size = config.rows_per_peer
        holdings = [tuple(rows[g * size:(g + 1) * size]) for g in range(len(rows) // size)]
        geometry = session_manifest.manifest.sphinx_geometry()
        _emit({"worker": config.worker, "peers": len(holdings)})

        slots = StartSlots(STARTING_AHEAD)

        async def one(held: tuple[Any, ...]) -> None:
            async with slots.holding() as registered:

                def listen(event: PeerEvent) -> None:
                    events.update((event,))
                    registered(event)

                await run_peer(held, listen)

        async def run_peer(held: tuple[Any, ...], listen: Callable[[PeerEvent], None]) -> None:
            try:
                # Each peer its own ChaCha20 generator keyed from the OS (peer_generator).
                peer = Peer(PeerIdentity.generate(), store, held[-1], peer_generator(), rows=held if size > 1 else ())
                result = await join_round(peer, session, session_manifest, pipeline, listener=listen)
                results.append(result)
                identity = peer.identity.public_key.hex()
                sent.extend((identity, message.receipt.hex(), message.sent_at) for message in result.sent)
                # On disk as each peer finishes: a worker stopped after the round's grace keeps what it had.
                sent_log.writelines(json.dumps(sent_record(identity, message)) + "\n" for message in result.sent)
            except (JoinRefused, AggregatorError, BudgetExceeded) as exc:
                failures[getattr(exc, "reason", type(exc).__name__)] += 1
                _emit({"worker": config.worker, "error": str(exc)[:300]})

        async def report_progress() -> None:
            while True:
                _emit({"worker": config.worker, "events": dict(events), "failures": dict(failures)})
                await trio.sleep(0.5)

        async with open_transport(packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash()) as transport:
            session = RoundSession(client, transport)
            async with trio.open_nursery() as outer:
                outer.start_soon(report_progress)
                async with trio.open_nursery() as peers:
                    for held in holdings:
                        peers.start_soon(one, held)
                outer.cancel_scope.cancel()
    finally:
        store.close()
        sent_log.close()
        await client.aclose()
    summary = {
        "worker": config.worker,
        "done": True,
        "events": dict(events),
        "failures": dict(failures),
        **results_summary(results),
        "sent": sent,
        "http_requests": client.requests,
        "http_retries": client.retries,
        "seconds": time.monotonic() - started,
    }
    _emit(summary)
    return summary


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m anonml.demo._swarm CONFIG.json", file=sys.stderr)
        return 2
    config = SwarmConfig.from_json(Path(argv[1]).read_text())
    trio.run(run_swarm, config)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
