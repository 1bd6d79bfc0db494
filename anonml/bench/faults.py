"""``anonml bench faults``: a demo round under process kills and lossy links, then an audit.

The round is the demo's (:mod:`anonml.demo`: the same processes, the same
windows measured and planned on this machine, each delivery slice long
enough to hold one kill's outage, its downtime and a restart), with two
kinds of fault:

- kill-and-restart events: at seeded random times across the round, a relay,
  the aggregator or one of its ingest workers gets SIGKILL (its whole process
  group); the supervisor starts it again after ``--downtime`` seconds with
  the same command;
- lossy links: a :class:`LossyProxy` that drops, delays and resets the
  connections it carries sits on every link: in front of each relay (what
  peers and other relays open to it), of the aggregator's packet sink and of
  each ingest worker's (what relays deliver over) and of the aggregator's
  HTTP API as the peers reach it (registration, credentials, documents,
  receipt logs). The relays' mirrors are reached directly.

With ``ingest_workers`` the manifest lists that many ``aggregator worker``
processes beside the driver's own sink, and the last relays spread their
deliveries over all of them (issue 27); on PostgreSQL (``store_url``) driver
and workers share the round's schema, on SQLite its file. With
``kill_workers_only`` every kill is a worker's: what a killed worker had
acknowledged is committed, its claimed rows are taken again when it comes
back, and a batch it never acknowledged goes from the relay to another sink.

``data_kills`` of the events land at uniform times inside the data phase
(read from the round's signed schedule), the others before it, so the share
of kills that can hit data reports is stated, not left to chance. With
``relay_for_good`` one relay is also SIGKILLed at a random moment of the data
phase's first attempt and never started again: its peers' reports that it
held are missing at the first check and must reach the aggregator over paths
that avoid it (the demo runs more relays than a path is long).

Afterwards every message each peer's store recorded is matched against the
aggregator's accepted set (:func:`anonml.demo.audit_round`) and the command prints what was
lost (by kind and by reason), what was counted twice,
and what the round itself reported (its outcome, counts, rejections, the
peers' own receipts, missing and unconfirmed counts, the relays' drops).
Figures are counts of this run; the baseline is the same round's prepared
messages (loss as a fraction of them). :func:`failures` says what makes the
command exit non-zero.
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from anonml.protocol import PhaseTimes, SignedManifest, format_host_port
from anonml.bench._proxy import LinkFaults, LossyProxy, serve_lossy_proxy
from anonml.aggregator import PostgresLocation, RoundStore
from anonml.demo import (
    HOST,
    PATH_LENGTH,
    RELAYS,
    Child,
    Children,
    Network,
    Progress,
    audit_round,
    breast_cancer_data,
    collect_report,
    deliveries_to,
    follow_round,
    free_port,
    init_aggregator,
    measure_costs,
    open_children,
    open_round,
    peer_totals,
    plan_round,
    requests_in_flight,
    start_relays,
    start_workers,
)


@dataclass
class KillEvent:
    """One planned kill: seconds after the kills were planned (as the round opened), and whom."""

    at: float
    target: str
    outcome: str = "pending"
    phase: str = ""
    """The phase the aggregator reported when the kill came."""
    planned: str = "before data"
    """Where the schedule put it: ``before data``, ``data`` or (a relay killed for good) ``data, first attempt``."""

    def to_dict(self) -> dict[str, Any]:
        return {"at": round(self.at, 2), "target": self.target, "outcome": self.outcome, "phase": self.phase,
                "planned": self.planned}


@dataclass
class FaultPlan:
    """What the bench does to one round: ``events`` kill-and-restart events, ``data_kills`` of them
    inside the data phase, and with ``relay_for_good`` one relay killed in the data phase and not restarted."""

    events: int
    seed: int
    downtime: float
    links: LinkFaults
    data_kills: int = 0
    relay_for_good: bool = False
    ingest_workers: int = 0
    """``aggregator worker`` processes beside the driver, listed in the manifest (relays spread deliveries over them)."""
    kill_workers_only: bool = False
    """Kill only the ingest workers (else relays, the aggregator and the workers alike)."""
    store_url: str | None = None
    """The PostgreSQL database the driver and workers keep the round in; None: its SQLite file."""
    kills: list[KillEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 <= self.data_kills <= self.events:
            raise ValueError(f"data_kills must be in [0, events={self.events}], got {self.data_kills}")
        if self.kill_workers_only and not self.ingest_workers:
            raise ValueError("kill_workers_only needs ingest_workers: there is no worker to kill")


def plan_kills(events: int, data_kills: int, data: tuple[float, float], targets: list[str],
               rng: random.Random) -> list[KillEvent]:
    """``data_kills`` kills at uniform random times in the data phase ``data`` (seconds from now),
    the other ``events - data_kills`` in ``[0, data[0])``; each of a uniformly chosen target."""
    start, end = data
    times = [(rng.uniform(start, end), "data") for _ in range(data_kills)]
    times += [(rng.uniform(0, start), "before data") for _ in range(events - data_kills)]
    return sorted((KillEvent(at, rng.choice(targets), planned=planned) for at, planned in times), key=lambda e: e.at)


def data_phase(round_store: Path | PostgresLocation) -> PhaseTimes:
    """The data phase's times (UTC seconds) from the manifest ``round new`` signed into the round's store."""
    store = RoundStore(round_store)
    try:
        manifest = store.get_meta("manifest")
    finally:
        store.close()
    if manifest is None:
        raise ValueError(f"{str(round_store)!r} holds no manifest")
    return SignedManifest.from_json(manifest).manifest.schedule.data


def failures(result: dict[str, Any], max_lost_share: float = 0.0) -> list[str]:
    """Why the run fails, one line each (none: it passed).

    Nothing may be counted twice, accepted without a peer that prepared it,
    or missing after its peer saw it in the final log; at most
    ``max_lost_share`` of the prepared messages may be lost (0: none); every
    peer must have its credential, as the aggregator counts them (a peer the
    faults kept from registering or from its credential prepares nothing, so
    the audit alone would not see it; the peers' own summaries are not used:
    a worker stopped before it printed one would count as never joined); and
    no peer may stop with an error (the workers report each one).
    """
    found = result["audit"]
    joined = int(result["round"]["counts"].get("credentials", 0))
    problems = [f"{found[key]} {text}" for key, text in (
        ("counted_twice", "counted twice"),
        ("unknown_accepted", "accepted but prepared by no peer"),
        ("peer_acknowledged_but_lost", "acknowledged to their peer but not held by the aggregator"),
    ) if found[key]]
    if joined < result["peers"]:
        problems.append(f"{result['peers'] - joined} of {result['peers']} peers never got a credential")
    # A peer that stopped with an error prepared what it had (the audit counts that) and nothing after: a
    # credential issued whose answer was lost is counted by the aggregator, yet its peer sent nothing.
    stopped = result.get("peer_errors", [])
    if stopped:
        problems.append(f"{len(stopped)} peer(s) stopped with an error (first: {stopped[0]})")
    if found["lost"] > max_lost_share * found["prepared"]:
        problems.append(f"{found['lost']} of {found['prepared']} lost (allowed: {100 * max_lost_share:g}%)")
    return problems


async def inject_kills(children: Children, targets: dict[str, Child], kills: list[KillEvent], progress: Progress) -> None:
    """SIGKILL each event's target at its time (seconds after this starts); one that is down then is killed as soon as
    it is back, one killed for good (``outcome`` "for good" planned) is stopped and never restarted."""
    opened = trio.current_time()
    for event in kills:
        await trio.sleep_until(opened + event.at)
        child = targets[event.target]
        if child.finished:
            event.outcome = "already ended"
            continue
        await child.running.wait()
        # No status: the aggregator had not answered yet, or did not answer its last poll (it was down).
        event.phase = str(progress.status.phase) if progress.status is not None else "no status"
        if event.outcome == "for good":
            children.stop(child, signal.SIGKILL)
            event.outcome = "killed for good"
        else:
            event.outcome = "killed" if children.kill(child, signal.SIGKILL) else "not running"


def plan_faults(plan: FaultPlan, data: PhaseTimes, relays: list[str], restarted: list[str], rng: random.Random) -> list[KillEvent]:
    """Every kill of ``plan``, seconds from now: the kill-and-restart events, each of one of ``restarted``, and
    the relay killed for good (one of ``relays``) in the data phase's first attempt (before its first check);
    later kills spare that relay."""
    now = time.time()
    for_good: list[KillEvent] = []
    if plan.relay_for_good:
        for_good.append(KillEvent(rng.uniform(data.t_s, data.t_c) - now, rng.choice(relays), outcome="for good",
                                  planned="data, first attempt"))
    targets = [target for target in restarted if not for_good or target != for_good[0].target]
    kills = plan_kills(plan.events, plan.data_kills, (data.t_s - now, data.t_r - now), sorted(targets), rng)
    return sorted([*kills, *for_good], key=lambda e: e.at)


async def run_faults(peers: int, plan: FaultPlan, work: Path, console: Any) -> dict[str, Any]:
    """One round with the plan's faults; the audit and what the round reported."""
    data = breast_cancer_data(plan.seed)
    rows = data.train_rows[:peers]
    progress = Progress(peers=len(rows))
    sink_listen_port = free_port()
    network = Network(relay_listen_ports=[free_port() for _ in range(RELAYS)], sink_listen_port=sink_listen_port,
                      sink_worker_ports=[free_port() for _ in range(plan.ingest_workers)],
                      sink_worker_listen_ports=[free_port() for _ in range(plan.ingest_workers)], store_url=plan.store_url)
    rng = random.Random(plan.seed)
    # Each link's proxy: where it listens (what the others are told) and where it forwards to.
    links = {f"relay-{i}": (network.relay_ports[i], network.listen_port(i)) for i in range(RELAYS)}
    links["relay->aggregator"] = (network.sink_port, sink_listen_port)
    for i in range(plan.ingest_workers):
        links[f"relay->ingest-{i}"] = (network.sink_worker_ports[i], network.sink_worker_listen_port(i))
    links["peers->aggregator http"] = (free_port(), network.http_port)
    proxies = {name: LossyProxy((HOST, target), plan.links, random.Random(rng.getrandbits(64)))
               for name, (_, target) in links.items()}
    agg_dir = work / "aggregator"
    started = time.monotonic()

    def on_restart(child: Child, returncode: int) -> None:
        progress.exits.append(f"{child.name} ({returncode})")

    async with open_children(work / "logs", restart_delay=plan.downtime, max_restarts=plan.events + 5,
                             on_restart=on_restart) as children, trio.open_nursery() as faults:
        for name, (port, _) in links.items():
            await faults.start(serve_lossy_proxy, proxies[name], port)
        # The peers reach the aggregator's HTTP through its proxy; the bench follows the round directly.
        workers = await start_workers(children, data, rows, work, 2, plan.seed, f"http://{HOST}:{links['peers->aggregator http'][0]}")
        identity, process_start = await init_aggregator(children, agg_dir)
        descriptors = await start_relays(children, work, network, identity)
        measured = await measure_costs(PATH_LENGTH, process_start, requests_in_flight=requests_in_flight(2))
        # The calibration's HTTP exchange runs on loopback; the peers' cross a proxy that delays the request
        # and the answer by up to `delay` each (on average `delay` in all): the windows must hold that too.
        costs = replace(measured, http=measured.http + plan.links.delay)
        # A kill keeps its target away for the downtime and its restart (the aggregator's is the longer:
        # it starts its issuer processes too); every delivery slice holds that, so one kill costs no packet.
        outage = plan.downtime + 2 * costs.process_start if plan.events else 0.0
        params = plan_round(data, len(rows), 2.0, 2, plan.seed, costs, outage=outage, restart_delay=plan.downtime)
        round_id, aggregator = await open_round(children, work, agg_dir, data, params, descriptors, network)
        targets = {child.name: child for child in children.children if child.name.startswith(("relay-", "ingest-"))}
        targets["aggregator"] = aggregator
        data_times = data_phase(network.round_store(agg_dir, round_id))
        relays = sorted(t for t in targets if t.startswith("relay-"))
        ingest = sorted(t for t in targets if t.startswith("ingest-"))
        restarted = ingest if plan.kill_workers_only else [*relays, "aggregator", *ingest]
        plan.kills = plan_faults(plan, data_times, relays, restarted, rng)
        faults.start_soon(inject_kills, children, targets, plan.kills, progress)
        await follow_round(children, network, workers, aggregator, progress, console, started)
        faults.cancel_scope.cancel()
        round_dir = agg_dir / "rounds" / round_id
        report = await collect_report(aggregator, round_dir, children, console, network.url)
    found = audit_round(sorted((work / "peers").glob("worker-*.sqlite")), network.round_store(agg_dir, round_id),
                        bytes.fromhex(round_id))
    sinks = [format_host_port(HOST, port) for port in (network.sink_port, *network.sink_worker_ports)]
    return {
        "peers": len(rows),
        "ingest_workers": plan.ingest_workers,
        "store": "sqlite" if plan.store_url is None else "postgresql",
        # What each sink address took (the driver's own first), from the relays' traces.
        "sink_deliveries": deliveries_to(work, RELAYS, sinks),
        "seed": plan.seed,
        "links": plan.links.to_dict(),
        "downtime_seconds": plan.downtime,
        "schedule_seconds": params.total_seconds(),
        "costs": costs.to_dict(),
        "kills": [event.to_dict() for event in plan.kills],
        # Restarted kills in the data phase: as the schedule placed them, and as the aggregator's status said when they came.
        "kills_in_data_phase": sum(1 for event in plan.kills if event.planned == "data"),
        "kills_seen_in_data_phase": sum(1 for event in plan.kills if event.planned == "data" and event.phase == "data"),
        "relays": RELAYS,
        "path_length": PATH_LENGTH,
        "restarts": list(progress.exits),
        "proxies": {name: proxy.counts.to_dict() for name, proxy in proxies.items()},
        "audit": found.to_dict(),
        "lost_fraction": found.lost / found.prepared if found.prepared else 0.0,
        "accepted_fraction": found.accepted / found.prepared if found.prepared else 0.0,
        "round": {
            "status": report.get("status", progress.status.phase if progress.status else "unknown"),
            "counts": report.get("counts", dict(progress.status.counts) if progress.status else {}),
            "rejected": report.get("rejected", dict(progress.status.rejected) if progress.status else {}),
        },
        "peers_reported": peer_totals(progress),
        "peer_errors": progress.errors,
        "relay_drops": dict(progress.relay_drops()),
        "wall_seconds": round(time.monotonic() - started, 1),
        "work_dir": str(work),
    }
