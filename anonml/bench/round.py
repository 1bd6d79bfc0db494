"""``anonml bench round --peers N``: one real round, what each role spent on it, and its cryptographic floor.

The round is ``anonml demo``'s (:func:`anonml.demo.run_demo`): real relay,
aggregator and peer-worker processes on loopback, windows planned from costs
measured on this machine. The peers are synthetic, drawn from ``--seed``
(:func:`synthetic_data`), so any N runs without a dataset.

While the round runs the benchmark samples every process it started (psutil,
every :data:`SAMPLE_SECONDS`): CPU seconds and resident memory, summed per
role (the aggregator with its worker processes, each relay, the peers'
workers, the operators' one-shot commands), and the aggregator's public
status (every :data:`STATUS_SECONDS`), whose phase changes give the wall time per phase. After the round it
measures, in the same process, each role's floor per accepted report: the
cryptography one report needs at that role and nothing else (the aggregator:
the final Sphinx hop and one token verified in a batch of 256; a relay: one
Sphinx hop times the share of packets it carries; a peer: one token made and
one packet built). The ratio CPU per accepted report / floor is what the
rest costs: covers, resends, registration, issuance, HTTP, storage, Python.
"""

from __future__ import annotations

import resource
import time
import tomllib
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import trio

from anonml.demo import DemoData, cores, exit_code, run_demo
from anonml.protocol import FeatureSpec, LabelSpec, NumericFeature

SAMPLE_SECONDS = 0.5
"""How often processes are sampled (a process's last half second can be missed)."""
STATUS_SECONDS = 0.1
"""How often the round's status is asked for: its outcome shows for under a second before the demo stops it."""
FLOOR_REPEAT = 200
"""Calls per floor figure; each figure is the least disturbed call (``anonml bench crypto``'s rule)."""
SYNTHETIC_FEATURES = 8
TEST_ROWS = 2000
PEERS_ROLE = "peers"
AGGREGATOR_ROLE = "aggregator"
COMMANDS_ROLE = "commands"


def synthetic_data(peers: int, seed: int) -> DemoData:
    """``peers`` training rows and :data:`TEST_ROWS` held-out rows: standard normal features
    (clipped to the spec's public bounds) and a label drawn from a logistic model, all from ``seed``."""
    if peers < 1:
        raise ValueError(f"peers must be at least 1, got {peers}")
    rng = np.random.default_rng(seed)
    names = [f"x{i}" for i in range(SYNTHETIC_FEATURES)]
    weights = rng.normal(0.0, 1.0, SYNTHETIC_FEATURES)
    features = np.clip(rng.normal(0.0, 1.0, (peers + TEST_ROWS, SYNTHETIC_FEATURES)), -4.0, 4.0)
    labels = (rng.random(peers + TEST_ROWS) < 1.0 / (1.0 + np.exp(-features @ weights))).astype(np.int64)
    spec = FeatureSpec(tuple(NumericFeature(name, -4.0, 4.0) for name in names), LabelSpec("y", ("1",), ("0",)))
    rows = [[repr(float(v)) for v in features[i]] + [str(labels[i])] for i in range(peers)]
    train, test = slice(0, peers), slice(peers, peers + TEST_ROWS)
    return DemoData(
        "synthetic", spec, (*names, "y"), rows,
        {name: features[test, i] for i, name in enumerate(names)}, labels[test],
        {name: features[train, i] for i, name in enumerate(names)}, labels[train],
    )


def role_of(cmdline: Sequence[str]) -> str:
    """The role a process the demo started plays, from its command line."""
    if any(arg.endswith("anonml.demo._swarm") for arg in cmdline):
        return PEERS_ROLE
    args = list(cmdline)
    for position, arg in enumerate(args[:-1]):
        if arg == "relay" and args[position + 1] == "run":
            data_dir = args[args.index("--data-dir") + 1] if "--data-dir" in args else "relay"
            return Path(data_dir).name
        if arg == AGGREGATOR_ROLE and args[position + 1] == "run":
            return AGGREGATOR_ROLE
    return COMMANDS_ROLE


@dataclass
class Usage:
    """What the benchmark's sampler has seen: CPU per process, peak memory per role, phase changes."""

    cpu: dict[tuple[str, int], float] = field(default_factory=dict)
    """CPU seconds (user + system) by (role, pid), the last sample of each."""
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    """The most resident memory a role's processes held together at one sample."""
    phases: list[tuple[str, float]] = field(default_factory=list)
    """(phase, monotonic time it was first seen), in order."""
    phase_cpu: list[dict[str, float]] = field(default_factory=list)
    """CPU seconds by role at the sample just before each of :attr:`phases` was first seen."""

    def sample_processes(self) -> None:
        rss: dict[str, float] = {}
        for child in psutil.Process().children():
            with suppress(psutil.Error):
                role = role_of(child.cmdline())
                for process in (child, *child.children(recursive=True)):
                    with suppress(psutil.Error):
                        times = process.cpu_times()
                        # Its own time only: a reaped child's time would also sit under the child's pid.
                        self.cpu[(role, process.pid)] = times.user + times.system
                        rss[role] = rss.get(role, 0.0) + process.memory_info().rss / 2**20
        for role, mb in rss.items():
            self.peak_rss_mb[role] = max(self.peak_rss_mb.get(role, 0.0), mb)

    def cpu_by_role(self) -> dict[str, float]:
        roles: dict[str, float] = {}
        for (role, _), seconds in self.cpu.items():
            roles[role] = roles.get(role, 0.0) + seconds
        return roles

    def note_phase(self, phase: str, now: float) -> None:
        if not self.phases or self.phases[-1][0] != phase:
            self.phases.append((phase, now))
            self.phase_cpu.append(self.cpu_by_role())


def phase_seconds(phases: Sequence[tuple[str, float]], started: float, ended: float) -> list[tuple[str, float]]:
    """Wall seconds of each phase in the order seen: ``setup`` until the first status, each phase
    until the next, and ``report and audit`` from the round's outcome (its last phase, which
    gets no span of its own) until ``ended``."""
    if not phases:
        return [("setup", ended - started)]
    marks = [("setup", started), *phases]
    spans = [(name, later - at) for (name, at), (_, later) in zip(marks, marks[1:])]
    return [*spans, ("report and audit", ended - phases[-1][1])]


def phase_costs(phases: Sequence[tuple[str, float]], phase_cpu: Sequence[Mapping[str, float]], final_cpu: Mapping[str, float],
                started: float, ended: float, peers: int, n_cores: int) -> list[dict[str, Any]]:
    """Each phase of :func:`phase_seconds` with the CPU every role spent in it (the difference of the
    samples at its start and at the next phase's), that CPU per peer, and ``busy``: the share of the
    machine's ``n_cores`` the round's processes used in it. A phase whose busy share is far below one
    waited on its window; one near one was bound by its work (or by the other load on the machine)."""
    marks = [{}, *phase_cpu, final_cpu]
    rows = []
    for (name, seconds), before, after in zip(phase_seconds(phases, started, ended), marks, marks[1:]):
        by_role = {role: round(after.get(role, 0.0) - before.get(role, 0.0), 2) for role in sorted(after)}
        cpu = sum(by_role.values())
        rows.append({"phase": name, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1), "cpu_by_role": by_role,
                     "cpu_ms_per_peer": round(1e3 * cpu / peers, 2),
                     "busy": round(cpu / (seconds * n_cores), 2) if seconds > 0 else None})
    return rows


def role_floors_us(floor: Mapping[str, float], relays: Sequence[str], path_length: int) -> dict[str, float]:
    """Each role's cryptography per accepted report (µs) from the primitives' costs in ``floor``.

    Every report crosses ``path_length`` of the ``len(relays)`` relays, so each relay carries that share of them.
    """
    if not relays or not 1 <= path_length <= len(relays):
        raise ValueError(f"a path of {path_length} hops over {len(relays)} relays")
    per_relay = floor["sphinx_process_hop_us"] * path_length / len(relays)
    return {
        AGGREGATOR_ROLE: floor["sphinx_process_final_us"] + floor["token_verify_batch256_us"],
        **{relay: per_relay for relay in relays},
        PEERS_ROLE: floor["token_create_us"] + floor["sphinx_build_4hop_us"],
    }


def issuance_us_per_report(issue_us: float, credentials: int, accepted: int) -> float | None:
    """The aggregator's blind issuance (one credential per peer) spread over the accepted reports:
    outside its floor (a cost per peer, not per report), but a floor of its own when each peer sends few."""
    return round(issue_us * credentials / accepted, 1) if accepted else None


def cost_rows(cpu: Mapping[str, float], peak_rss_mb: Mapping[str, float], floors_us: Mapping[str, float],
              accepted: int) -> list[dict[str, Any]]:
    """One row per role: CPU seconds, CPU per accepted report, its floor and their ratio, peak memory."""
    rows = []
    for role in sorted(set(cpu) | set(floors_us)):
        seconds = cpu.get(role, 0.0)
        per_report = 1e6 * seconds / accepted if accepted else None
        floor = floors_us.get(role)
        rows.append({
            "role": role,
            "cpu_seconds": round(seconds, 2),
            "cpu_us_per_report": round(per_report, 1) if per_report is not None else None,
            "floor_us_per_report": round(floor, 1) if floor is not None else None,
            "x_floor": round(per_report / floor, 2) if per_report is not None and floor else None,
            "peak_rss_mb": round(peak_rss_mb.get(role, 0.0), 1),
        })
    return rows


def measure_floor(geometry: Any = None) -> dict[str, float]:
    """The primitives a report costs (µs, least disturbed call), measured now (``anonml bench crypto``'s code)."""
    from anonml.bench.crypto import measure_sphinx, measure_tokens

    figures = {**measure_sphinx(FLOOR_REPEAT, geometry), **measure_tokens(FLOOR_REPEAT)}
    keys = ("sphinx_process_hop_us", "sphinx_process_final_us", "sphinx_build_4hop_us", "token_create_us",
            "token_verify_batch256_us", "issue_us", "p256_mult_us")
    return {key: round(figures[key], 1) for key in keys}


async def follow(usage: Usage, work: Path) -> None:
    """Sample the processes, and once the round's spec is written the aggregator's status, until cancelled."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_follow_status, usage, work)
        while True:
            await trio.to_thread.run_sync(usage.sample_processes)
            await trio.sleep(SAMPLE_SECONDS)


async def _follow_status(usage: Usage, work: Path) -> None:
    """Note each phase change of the aggregator's status. Polled apart from the (slower) process samples: the
    round's outcome shows only from the end of learning until the demo stops the aggregator, under a second
    now that learning no longer imports scikit-learn then, and a 0.5 s loop behind the samples missed it."""
    from anonml.peer import AggregatorClient

    spec_path = work / "round.toml"
    while not spec_path.is_file():
        await trio.sleep(STATUS_SECONDS)
    network = tomllib.loads(spec_path.read_text())["network"]
    client = AggregatorClient(f"http://{network['http_host']}:{network['http_port']}", max_connections=1, retry_for=1.0)
    try:
        while True:
            with suppress(Exception):  # the aggregator may be starting, restarting or gone
                status = await client.status()
                if status is not None:
                    usage.note_phase(str(status.phase) + (f" {status.sub_round}" if status.sub_round is not None else ""),
                                     time.monotonic())
            await trio.sleep(STATUS_SECONDS)
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


async def run_round_bench(peers: int, workers: int, seed: int, epsilon: float, work: Path, console: Any) -> dict[str, Any]:
    """Run the round, then measure the floor; every figure the command prints."""
    data = synthetic_data(peers, seed)
    usage = Usage()
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow, usage, work)
        summary, _ = await run_demo(data, peers=peers, epsilon=epsilon, workers=workers, seed=seed, work=work, console=console)
        nursery.cancel_scope.cancel()
    ended = time.monotonic()
    network = tomllib.loads((work / "round.toml").read_text())["network"]
    relays = [f"relay-{i}" for i in range(len(network["relays"]))]
    floor = await trio.to_thread.run_sync(measure_floor)
    accepted = int(summary["accepted"])
    cpu = usage.cpu_by_role()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "peers": peers,
        "workers": workers,
        "seed": seed,
        "data": f"synthetic: {SYNTHETIC_FEATURES} standard normal features, logistic labels, seed {seed}",
        "phase": summary["phase"],
        "accepted": accepted,
        "audit": summary["audit"],
        "exit_code": exit_code(summary),
        "wall_seconds": round(ended - started, 1),
        "phases": phase_costs(usage.phases, usage.phase_cpu, cpu, started, ended, peers, cores()),
        "cores": cores(),
        "path_length": int(network["path_length"]),
        "floor_us": floor,
        # More packets than reports cross the relays (covers, resends): part of what the ratios count.
        "packets": {key: int(summary[key]) for key in ("sends", "covers", "resends", "relay_forwarded")},
        "credentials": int(summary["credentials"]),
        "issuance_us_per_report": issuance_us_per_report(floor["issue_us"], int(summary["credentials"]), accepted),
        "roles": cost_rows(cpu, usage.peak_rss_mb, role_floors_us(floor, relays, int(network["path_length"])), accepted),
        # Sampling misses a process's last half second; the kernel's total for every reaped child is the check.
        "cpu_seconds_sampled": round(sum(cpu.values()), 1),
        "cpu_seconds_children_rusage": round(children.ru_utime + children.ru_stime, 1),
        "cpu_seconds_bench": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1),
        "peak_rss_mb_total": round(summary["peak_rss_mb_total"], 1),
        "load_average": [round(x, 2) for x in psutil.getloadavg()],
        "work_dir": str(work),
    }


def report_lines(result: Mapping[str, Any]) -> list[str]:
    """The figures as text: the phases, then one line per role."""
    audit = result["audit"]
    lines = [
        f"round of {result['peers']} peers ({result['data']}): {result['phase']}, {audit['accepted']} of "
        f"{audit['prepared']} prepared messages accepted, {result['accepted']} reports counted; "
        f"{result['wall_seconds']} s; load {result['load_average']}",
        "wall seconds per phase: " + ", ".join(f"{p['phase']} {p['seconds']}" for p in result["phases"]),
        f"CPU per phase (all roles; busy = share of the {result['cores']} cores used): "
        + ", ".join(f"{p['phase']} {p['cpu_seconds']} s = {p['cpu_ms_per_peer']} ms/peer, busy {p['busy']}"
                    for p in result["phases"]),
        f"{'role':12} {'CPU s':>8} {'µs/report':>10} {'floor µs':>9} {'x floor':>8} {'peak MB':>8}",
    ]
    for row in result["roles"]:
        cells = [row["cpu_us_per_report"], row["floor_us_per_report"], row["x_floor"]]
        shown = [f"{c:g}" if c is not None else "-" for c in cells]
        lines.append(f"{row['role']:12} {row['cpu_seconds']:8.1f} {shown[0]:>10} {shown[1]:>9} {shown[2]:>8} {row['peak_rss_mb']:8.0f}")
    floor = result["floor_us"]
    lines.append(
        f"floor (µs, this run): final hop {floor['sphinx_process_final_us']} + token verify (batch of 256) "
        f"{floor['token_verify_batch256_us']} at the aggregator; hop {floor['sphinx_process_hop_us']} x "
        f"{result['path_length']} hops over the relays; token {floor['token_create_us']} + packet "
        f"{floor['sphinx_build_4hop_us']} at a peer; one P-256 multiplication {floor['p256_mult_us']}"
    )
    packets = result["packets"]
    lines.append(f"packets: {packets['sends']} sent by the peers ({packets['covers']} covers, {packets['resends']} resent), "
                 f"{packets['relay_forwarded']} forwarded by the relays in all, for {result['accepted']} accepted reports")
    lines.append(f"not in the floor: the aggregator's blind issuance, {floor['issue_us']} µs per credential x "
                 f"{result['credentials']} credentials = {result['issuance_us_per_report']} µs per accepted report")
    lines.append(f"CPU seconds: sampled {result['cpu_seconds_sampled']}, every reaped child (rusage) "
                 f"{result['cpu_seconds_children_rusage']}, this process {result['cpu_seconds_bench']}; "
                 f"peak memory of all processes together {result['peak_rss_mb_total']} MB")
    return lines
