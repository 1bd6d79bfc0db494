"""``anonml bench faults``: a demo round under process kills and lossy links, then an audit.

The round is the demo's (:mod:`anonml.demo`: the same processes, the same
windows measured and planned on this machine), with two kinds of fault:

- kill-and-restart events: at seeded random times across the round, a relay
  or the aggregator gets SIGKILL (its whole process group); the supervisor
  starts it again after ``--downtime`` seconds with the same command;
- lossy links: every relay is advertised at a :class:`LossyProxy` that drops,
  delays and resets the connections peers and other relays open to it.

Afterwards every message each peer's store recorded is matched against the
aggregator's accepted set (:func:`anonml.demo.audit_round`) and the command prints what was
lost (by kind and by reason), what was counted twice,
and what the round itself reported (its outcome, counts, rejections, the
peers' own receipts, missing and unconfirmed counts, the relays' drops).
Figures are counts of this run; the baseline is the same round's prepared
messages (loss as a fraction of them).
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from anonml.bench._proxy import LinkFaults, LossyProxy, serve_lossy_proxy
from anonml.demo import (
    HOST,
    RELAYS,
    Child,
    Children,
    Network,
    Progress,
    audit_round,
    breast_cancer_data,
    collect_report,
    follow_round,
    free_port,
    init_aggregator,
    measure_costs,
    open_children,
    open_round,
    peer_totals,
    plan_round,
    start_relays,
    start_workers,
)


@dataclass
class KillEvent:
    """One planned kill: seconds after the round opened, and whom."""

    at: float
    target: str
    outcome: str = "pending"
    phase: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"at": round(self.at, 2), "target": self.target, "outcome": self.outcome, "phase": self.phase}


@dataclass
class FaultPlan:
    events: int
    seed: int
    downtime: float
    links: LinkFaults
    kills: list[KillEvent] = field(default_factory=list)


def plan_kills(events: int, span: float, targets: list[str], rng: random.Random) -> list[KillEvent]:
    """``events`` kills at uniform random times in ``[0, span)``, each of a uniformly chosen target."""
    return sorted((KillEvent(rng.uniform(0, span), rng.choice(targets)) for _ in range(events)), key=lambda e: e.at)


async def inject_kills(children: Children, targets: dict[str, Child], kills: list[KillEvent], progress: Progress) -> None:
    """SIGKILL each event's target at its time; one that is down then is killed as soon as it is back."""
    opened = trio.current_time()
    for event in kills:
        await trio.sleep_until(opened + event.at)
        child = targets[event.target]
        if child.finished:
            event.outcome = "already ended"
            continue
        await child.running.wait()
        event.phase = progress.status.phase if progress.status is not None else "starting"
        event.outcome = "killed" if children.kill(child, signal.SIGKILL) else "not running"


async def run_faults(peers: int, plan: FaultPlan, work: Path, console: Any) -> dict[str, Any]:
    """One round with the plan's faults; the audit and what the round reported."""
    data = breast_cancer_data(plan.seed)
    rows = data.train_rows[:peers]
    network = Network(relay_listen_ports=[free_port() for _ in range(RELAYS)])
    progress = Progress(peers=len(rows))
    rng = random.Random(plan.seed)
    proxies = [
        LossyProxy((HOST, network.listen_port(i)), plan.links, random.Random(rng.getrandbits(64)))
        for i in range(RELAYS)
    ]
    agg_dir = work / "aggregator"
    started = time.monotonic()

    def on_restart(child: Child, returncode: int) -> None:
        progress.exits.append(f"{child.name} ({returncode})")

    async with open_children(work / "logs", restart_delay=plan.downtime, max_restarts=plan.events + 5,
                             on_restart=on_restart) as children, trio.open_nursery() as faults:
        for proxy, port in zip(proxies, network.relay_ports, strict=True):
            await faults.start(serve_lossy_proxy, proxy, port)
        workers = await start_workers(children, data, rows, work, 2, plan.seed, network.url)
        identity, process_start = await init_aggregator(children, agg_dir)
        descriptors = await start_relays(children, work, network, identity)
        costs = await measure_costs(RELAYS, process_start)
        params = plan_round(data, len(rows), 2.0, 2, plan.seed, costs)
        round_id, aggregator = await open_round(children, work, agg_dir, data, params, descriptors, network)
        targets = {child.name: child for child in children.children if child.name.startswith("relay-")}
        targets["aggregator"] = aggregator
        plan.kills = plan_kills(plan.events, params.total_seconds(), sorted(targets), rng)
        faults.start_soon(inject_kills, children, targets, plan.kills, progress)
        await follow_round(children, network, workers, aggregator, progress, console, started)
        faults.cancel_scope.cancel()
        round_dir = agg_dir / "rounds" / round_id
        report = await collect_report(aggregator, round_dir, children, console, network.url)
    found = audit_round(sorted((work / "peers").glob("worker-*.sqlite")), round_dir / "round.sqlite", bytes.fromhex(round_id))
    return {
        "peers": len(rows),
        "seed": plan.seed,
        "links": plan.links.to_dict(),
        "downtime_seconds": plan.downtime,
        "schedule_seconds": params.total_seconds(),
        "costs": costs.to_dict(),
        "kills": [event.to_dict() for event in plan.kills],
        "restarts": list(progress.exits),
        "proxies": [proxy.counts.to_dict() for proxy in proxies],
        "audit": found.to_dict(),
        "lost_fraction": found.lost / found.prepared if found.prepared else 0.0,
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
