"""What the demo shows while the round runs: the workers' progress lines, the
aggregator's public status and the relays' counters, drawn as one table.

The peers' worker processes print JSON lines (:mod:`._swarm`); each relay
exposes Prometheus counters; the aggregator answers ``GET /v1/status``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from anonml.protocol import RoundStatus

@dataclass
class Progress:
    """What the workers and the aggregator's status have said so far."""

    peers: int = 0
    workers: dict[int, dict[str, Any]] = field(default_factory=dict)
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    status: RoundStatus | None = None
    peak_rss_mb: float = 0.0  # all demo processes together, sampled
    relays: dict[int, dict[str, float]] = field(default_factory=dict)  # last metrics scraped from each relay
    exits: list[str] = field(default_factory=list)  # children that died and were restarted, as "name (code)"
    died: list[str] = field(default_factory=list)  # peer workers that died (never restarted), as "name (code)"
    cpu: dict[tuple[str, int], float] = field(default_factory=dict)  # CPU seconds by (child, pid), last sampled

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds sampled per role: the peers' workers, the relays, the aggregator (its issuer processes included)."""
        roles: dict[str, float] = {}
        for (name, _), seconds in self.cpu.items():
            role = "peers" if name.startswith("worker-") else "relays" if name.startswith("relay-") else name
            roles[role] = roles.get(role, 0.0) + seconds
        return {role: round(seconds, 1) for role, seconds in sorted(roles.items())}

    def relay_drops(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for metrics in self.relays.values():
            for name, value in metrics.items():
                if name.startswith("dropped/"):
                    total[name.removeprefix("dropped/")] += int(value)
        return total

    def events(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for record in self.workers.values():
            total.update(record.get("events", {}))
        return total


async def read_worker(process: trio.Process, progress: Progress) -> None:
    assert process.stdout is not None
    buffer = b""
    async for chunk in process.stdout:
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                record = json.loads(line)
            except ValueError:
                continue
            worker = int(record.get("worker", -1))
            if "error" in record:
                if len(progress.errors) < 20:
                    progress.errors.append(str(record["error"]))
            elif record.get("done"):
                progress.summaries[worker] = record
                progress.workers[worker] = record
            elif "events" in record:
                progress.workers[worker] = record


def phase_rows(progress: Progress, peers: int) -> list[tuple[str, str]]:
    """The live status, one row per phase's count (a table on a terminal, one line per update when piped)."""
    events = progress.events()
    status = progress.status
    phase = status.phase if status is not None else "starting"
    counts = status.counts if status is not None else {}
    rejected = status.rejected if status is not None else {}
    rows = [
        ("round phase", f"{phase}" + (f" (sub-round {status.sub_round})" if status is not None and status.sub_round is not None else "")),
        ("registered", f"{events['registered']} / {peers}  (aggregator: {counts.get('registered', 0)})"),
        ("credentials", f"{events['credential']} / {peers}  (aggregator: {counts.get('credentials', 0)})"),
        ("packets sent", f"{events['sent']}  (first-hop retries {events['first-hop-failed']})"),
        ("accepted by the aggregator", f"{counts.get('accepted', 0)}"),
        ("receipts found / resent / missing / unconfirmed",
         f"{events['acknowledged']} / {events['resent']} / {events['missing']} / {events['unconfirmed']}"),
        ("rejected", ", ".join(f"{k}: {v}" for k, v in sorted(rejected.items())) or "none"),
    ]
    relayed = sum(int(m.get("forwarded", 0)) for m in progress.relays.values())
    drops = progress.relay_drops()
    rows.append(("relays: forwarded / dropped", f"{relayed} / " + (", ".join(f"{k}: {v}" for k, v in sorted(drops.items())) or "none")))
    if progress.exits:
        rows.append(("restarted after dying", f"{len(progress.exits)}: {', '.join(progress.exits[-4:])}"))
    if progress.died:
        rows.append(("peer workers that died", ", ".join(progress.died)))
    if progress.errors:
        rows.append(("peer errors", f"{len(progress.errors)}: {progress.errors[-1][:80]}"))
    return rows


# The relay counters the demo keeps (besides the drops by reason).
_SCRAPED = ("packets_forwarded", "packets_received", "packets_held_after_window_opened",
            "packets_held_after_window_opened_seconds",
            "packets_due_before_stored")


async def scrape_relay(client: httpx.AsyncClient, host: str, port: int) -> dict[str, float]:
    """A relay's counters from its Prometheus endpoint (parsed by ``relay.parse_metrics``, i.e.
    prometheus_client): ``forwarded``, ``received``, ``dropped/<reason>``,
    ``held_after_window_opened`` (and its ``_seconds``), ``due_before_stored``. ``client`` is the
    one the demo keeps for its whole run (a new httpx client costs a TLS context each)."""
    from anonml.relay import parse_metrics

    try:
        text = (await client.get(f"http://{host}:{port}/metrics", timeout=2.0)).text
    except httpx.HTTPError:
        return {}
    return {name.removeprefix("packets_"): value for name, value in parse_metrics(text).items()
            if name in _SCRAPED or name.startswith("packets_dropped/")}
