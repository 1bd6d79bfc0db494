"""``anonml bench ingest``: accepted reports per second through ingest workers, SQLite beside PostgreSQL.

One round is made once (real identities, blind credentials, tokens and Sphinx
packets); each configuration then gets a fresh copy of it before any packet:
SQLite with one ``anonml aggregator worker`` process, PostgreSQL (a private
server in a temporary directory, or ``--store``'s) with one, and with two.
The bench acts as the round's last relays: it delivers link batches over TCP
on loopback, spread over the workers, and times from the first frame sent
until every frame is decided in the store (accepted or rejected, the inbox
empty). The ratio PostgreSQL-2 / PostgreSQL-1 is the scale-out figure; the
machine's load average is printed beside it (DESIGN.md §11: ratios, because
absolute times drift on shared machines).

Each worker starts in a session of its own (``setsid``), as a service manager
starts each service, or as a worker on its own host runs: Linux's scheduler
(autogroup) shares the CPU fairly between sessions, not processes, so
workers started in the bench's session would split that one session's
share between them on a machine shared with other jobs: two would get no
more CPU than one, and the ratio would measure that. ``--one-session`` starts
them there, to show it.

``--kills N``: N more PostgreSQL runs with two workers, in each of which one
worker is killed (SIGKILL) at a random moment of the delivery; the relay
resends what the dead worker had not acknowledged to the survivor. Each run
is audited: accepted reports lost, counted twice (a receipt twice in the log,
or a duplicate counted), frames never acknowledged. Exits 1 if any run lost
or doubled anything.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import trio

from anonml.base.threads import run_blocking
from anonml.aggregator import ROSTER_FINAL, AggregatorHome, PostgresLocation, RoundStore, create_round, parse_round_spec
from anonml.bench.aggregator import bench_spec
from anonml.protocol import SurveyId
from anonml.testing import PostgresServer, SettableClock, enrol, private_postgres
from anonml.transport import AckStatus, LinkClient, LinkIdentity

LINK_BATCH = 128
"""Frames per link batch (a relay's release batch)."""


@dataclass(frozen=True)
class CpuSeconds:
    """User + system CPU seconds of some processes (``own``) and of all their descendants, live or already reaped."""

    own: float
    descendants: float

    @property
    def total(self) -> float:
        return self.own + self.descendants

    def __sub__(self, before: CpuSeconds) -> CpuSeconds:
        return CpuSeconds(self.own - before.own, self.descendants - before.descendants)


@dataclass
class PreparedRound:
    """A round before any packet: its home (copied per run), its id, the frames and the relays' link keys."""

    home: Path
    round_id: str
    frames: list[bytes]
    relays: list[LinkIdentity]
    packet_size: int
    geometry_hash: bytes


@dataclass
class RunResult:
    """One configuration's figures and audit."""

    engine: str
    workers: int
    frames: int
    seconds: float
    accepted: int
    rejected: dict[str, int]
    unacknowledged: int
    doubled: int
    killed_after: float | None = None
    resent: int = 0
    claimed_at_kill: int = 0
    """Inbox rows the killed worker held claimed and undecided when it died (taken over after the claim lapsed)."""
    worker_cpu: CpuSeconds = CpuSeconds(0.0, 0.0)
    """CPU seconds the worker processes (``own``: intake, the event loop, store calls) and their token verification
    processes (``descendants``) spent from the first frame sent until every frame was decided (a killed worker's
    time is missing)."""
    server_cpu: float = 0.0
    """CPU seconds the PostgreSQL server (postmaster, backends, background processes) spent meanwhile (0 on SQLite)."""
    lost: int = field(init=False)

    def __post_init__(self) -> None:
        # Every frame is a valid report of a distinct peer: each must end accepted exactly once.
        self.lost = self.frames - self.accepted

    @property
    def per_second(self) -> float:
        return self.accepted / self.seconds if self.seconds else 0.0

    def milliseconds_per_report(self, cpu_seconds: float) -> float:
        return 1000 * cpu_seconds / self.accepted if self.accepted else 0.0


def cpu_seconds(root_pids: list[int]) -> CpuSeconds:
    """The CPU time of the processes ``root_pids`` and of their descendants (a reaped child's time is in its
    parent's ``children_*``); a process gone meanwhile adds nothing."""
    own = descendants = 0.0
    for pid in root_pids:
        try:
            root = psutil.Process(pid)
            times = root.cpu_times()
            children = root.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        own += times.user + times.system
        descendants += times.children_user + times.children_system
        for child in children:
            try:
                times = child.cpu_times()
            except psutil.NoSuchProcess:
                continue
            descendants += times.user + times.system + times.children_user + times.children_system
    return CpuSeconds(own, descendants)


def prepare_round(work: Path, n_packets: int, seed: int) -> PreparedRound:
    """A round whose data window is open now (in real time, which the workers read) and ``n_packets`` frames for it."""
    rng = np.random.default_rng(seed)
    relays = [LinkIdentity(os.urandom(32)) for _ in range(3)]
    spec_relays = [{"node_id": r.node_id.hex(), "host": "127.0.0.1", "port": 9000 + i, "public_key": r.public_key.hex(),
                    "key_epoch": 1} for i, r in enumerate(relays)]
    schedule = {"register": 100, "issue": 100, "median_send": 10, "median_delivery": 20, "data_send": 10,
                "data_delivery": 3600}
    spec = parse_round_spec(bench_spec(spec_relays, schedule))
    # Started in the past, so that now is early in the data phase's delivery (its acceptance window).
    start = int(time.time()) - 100 - 100 - 30
    home = AggregatorHome(work / "agg")
    from anonml.crypto import generate_keypair

    home.initialise(os.urandom(32), generate_keypair()[0])
    clock = SettableClock(start + 1)
    state, _ = create_round(home, spec, now=start)
    state.clock = clock
    peers = enrol(state, clock, [rng.bytes(32) for _ in range(n_packets)])
    data = state.manifest.schedule.data
    if not data.t_s + data.delta < time.time() < data.t_s + data.delta + 3000:
        raise RuntimeError("the bench round's data window is not open now: the set-up took too long")
    frames = []
    for peer in peers:
        oracle = state.data_oracle(peer.partition, 0)
        report = oracle.encode_report(oracle.privatize(np.array([int(rng.integers(0, 12))]), rng)[0])
        frames.append(peer.packet(SurveyId.data(state.round_id, peer.partition, 0), report))
    # What the round driver does once every registration is stored: the workers verify from then on.
    state.store.put_meta(ROSTER_FINAL, b"1")
    geometry = state.geometry
    round_id = state.round_id.hex()
    state.store.close()
    return PreparedRound(home.root, round_id, frames, relays, geometry.packet_size, geometry.canonical_hash())


def _start_workers(home: Path, round_id: str, store: str | None, count: int, claim_seconds: float,
                   *, processes: int = 1, own_sessions: bool = True,
                   within: float = 120.0) -> list[tuple[subprocess.Popen[bytes], int]]:
    """``count`` ``anonml aggregator worker`` processes, each once it printed its port (stderr goes to a file
    beside the round, so a worker that logs much never blocks on a full pipe); each in a session of its own
    unless not ``own_sessions`` (see the module's docstring)."""
    started = []
    environment = {**os.environ, **({"ANONML_AGGREGATOR_STORE": store} if store else {})}
    anonml = Path(sys.executable).with_name("anonml")
    for index in range(count):
        log_path = home / f"worker-{index}.log"
        command = [str(anonml), "aggregator", "worker", "--data-dir", str(home), "--round", round_id,
                   "--name", f"w{index}", "--host", "127.0.0.1", "--claim-seconds", str(claim_seconds),
                   "--processes", str(processes)]
        with log_path.open("wb") as log_file:
            child = subprocess.Popen(command, stderr=log_file, env=environment, start_new_session=own_sessions)
        deadline = time.monotonic() + within
        while (port := _announced_port(log_path)) is None:
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {index} did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        started.append((child, port))
    return started


def _announced_port(log_path: Path) -> int | None:
    for line in log_path.read_text(errors="replace").splitlines():
        if "taking packets at" in line:
            return int(line.rsplit(":", 1)[1])
    return None


def _stop(workers: list[tuple[subprocess.Popen[bytes], int]]) -> None:
    for child, _ in workers:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child, _ in workers:
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run_config(prepared: PreparedRound, work: Path, label: str, store: str | None, workers: int, *,
               kill_at: float | None = None, claim_seconds: float = 30.0, timeout: float = 600.0,
               server_pid: int | None = None, processes: int = 1, own_sessions: bool = True) -> RunResult:
    """Deliver every frame through ``workers`` worker processes (each with ``processes`` token verification
    processes) on a fresh copy of the round; audit the store.
    ``server_pid``: the PostgreSQL server's postmaster, whose CPU time is measured beside the workers'."""
    home = work / label
    shutil.copytree(prepared.home, home)
    location: Path | PostgresLocation
    if store is None:
        location = home / "rounds" / prepared.round_id / "round.sqlite"
    else:
        location = PostgresLocation(store, f"round_{prepared.round_id[:32]}")
    children = _start_workers(home, prepared.round_id, store, workers, claim_seconds, processes=processes,
                              own_sessions=own_sessions)
    observer = RoundStore(location)
    worker_pids = [child.pid for child, _ in children]
    server_pids = [] if server_pid is None else [server_pid]
    try:
        workers_before, server_before = cpu_seconds(worker_pids), cpu_seconds(server_pids)
        began = time.perf_counter()
        unacknowledged, resent, killed_after, held = trio.run(_deliver, prepared, children, kill_at, observer)
        deadline = time.monotonic() + timeout
        while True:
            # Every acknowledged frame is in the inbox or decided: an empty inbox means all are decided.
            if not observer.inbox_pending_before(2**62):
                break
            for index, (child, _) in enumerate(children):
                if child.poll() is not None and not (killed_after is not None and index == 0):
                    log_text = (home / f"worker-{index}.log").read_text(errors="replace")
                    raise RuntimeError(f"{label}: worker {index} exited ({child.returncode}): {log_text[-3000:]}")
            if time.monotonic() > deadline:
                logs = "; ".join(path.read_text(errors="replace")[-800:] for path in sorted(home.glob("worker-*.log")))
                raise RuntimeError(f"{label}: frames still undecided after {timeout:.0f} s: {observer.counts()}, "
                                   f"claims {observer.claims()} at {time.time():.1f}; worker logs: {logs}")
            time.sleep(0.05)
        seconds = time.perf_counter() - began
        worker_cpu, server_cpu = cpu_seconds(worker_pids) - workers_before, (cpu_seconds(server_pids) - server_before).total
        counts, rejections = observer.counts(), observer.rejections()
        receipts = observer.receipts()
        leaves = [leaf for log in receipts.values() for leaf in log]
        doubled = (len(leaves) - len(set(leaves))) + rejections.get("duplicate", 0) + rejections.get("double-submission", 0)
        return RunResult(engine="sqlite" if store is None else "postgresql", workers=workers, frames=len(prepared.frames),
                         seconds=seconds, accepted=counts["accepted"], rejected=rejections, unacknowledged=unacknowledged,
                         doubled=doubled, killed_after=killed_after, resent=resent, claimed_at_kill=held,
                         worker_cpu=worker_cpu, server_cpu=server_cpu)
    finally:
        observer.close()
        _stop(children)


async def _deliver(prepared: PreparedRound, children: list[tuple[subprocess.Popen[bytes], int]],
                   kill_at: float | None, observer: RoundStore) -> tuple[int, int, float | None, int]:
    """Send every frame, batches spread over the workers; kill worker 0 after ``kill_at`` seconds if given.
    Returns (frames never acknowledged, frames resent to another worker, when the kill happened,
    inbox rows the killed worker held claimed)."""
    batches = [prepared.frames[i : i + LINK_BATCH] for i in range(0, len(prepared.frames), LINK_BATCH)]
    # The same relays deliver whatever the number of workers (a link each to every worker, as a last relay
    # holds one to every sink address the manifest lists), so one worker and two take the same concurrent
    # batches: with a relay per worker, one worker had a single batch in flight.
    clients = [[LinkClient("127.0.0.1", port, packet_size=prepared.packet_size, geometry_hash=prepared.geometry_hash,
                           identity=identity, connect_timeout=2.0, ack_timeout=10.0) for _, port in children]
               for identity in prepared.relays]
    unacknowledged: list[bytes] = []
    killed: list[float] = []
    held: list[int] = []
    began = trio.current_time()

    async def relay(index: int) -> None:
        # Each relay takes its batches' sink addresses in turn (relay._delivery.DeliveryAddresses).
        for turn, batch in enumerate(batches[index :: len(clients)]):
            client = clients[index][(index + turn) % len(children)]
            statuses = await client.send_batch(batch, give_up_at=trio.current_time() + 1.0)
            unacknowledged.extend(frame for frame, status in zip(batch, statuses) if status is None)

    async def kill_later(delay: float) -> None:
        await trio.sleep(delay)
        # The moment that matters most: worker 0 holds claimed rows it has not decided (up to 5 s more).
        with trio.move_on_after(5.0):
            while not (await run_blocking(observer.claims)).get("w0"):
                await trio.sleep(0.005)
        # The worker and its verification processes, as a lost host loses them (killed alone, they would
        # outlive it, idle, for the rest of the bench).
        for process in [*psutil.Process(children[0][0].pid).children(recursive=True), psutil.Process(children[0][0].pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        killed.append(trio.current_time() - began)
        held.append((await run_blocking(observer.claims)).get("w0", 0))

    async with trio.open_nursery() as nursery:
        if kill_at is not None:
            nursery.start_soon(kill_later, kill_at)
        for index in range(len(clients)):
            nursery.start_soon(relay, index)
    resent = len(unacknowledged)
    still: list[bytes] = []
    if unacknowledged and len(children) > 1:
        # The relay delivers what the dead worker never acknowledged to a live one (any worker takes any packet).
        survivor = clients[0][-1]
        for offset in range(0, len(unacknowledged), LINK_BATCH):
            batch = unacknowledged[offset : offset + LINK_BATCH]
            statuses = await survivor.send_batch(batch, give_up_at=trio.current_time() + 5.0)
            still += [frame for frame, status in zip(batch, statuses) if status is None or status is AckStatus.BUSY]
    else:
        still = unacknowledged
    return len(still), resent, (killed[0] if killed else None), (held[0] if held else 0)


def run_bench(n_packets: int, seed: int, kills: int, processes: int = 1, own_sessions: bool = True,
              pairs: int = 1) -> dict[str, Any]:
    """The three configurations and ``kills`` kill runs, each on a fresh copy of one round (and a fresh database);
    each worker verifies tokens in ``processes`` processes of its own (0: in a thread of the worker), in a
    session of its own unless not ``own_sessions``.

    ``pairs``: PostgreSQL with one worker and with two this many times, alternating which goes first; the
    scale-out ratio is the median of the pairs' ratios (one pair's moves with the scheduler: x1.52-2.04 in
    four quiet runs of 12,000 frames)."""
    if pairs < 1:
        raise ValueError(f"pairs must be at least 1, got {pairs!r}")
    with tempfile.TemporaryDirectory(prefix="anonml-bench-ingest-") as tmp, private_postgres() as server:
        work = Path(tmp)
        prepared = prepare_round(work / "prepared", n_packets, seed)
        sqlite = run_config(prepared, work, "sqlite1", None, 1, processes=processes, own_sessions=own_sessions)

        def postgresql(label: str, workers: int) -> RunResult:
            return run_config(prepared, work, label, _fresh_database(server, label), workers,
                              server_pid=server.postmaster_pid(), processes=processes, own_sessions=own_sessions)

        measured: list[tuple[RunResult, RunResult]] = []
        for pair in range(pairs):
            if pair % 2:
                two = postgresql(f"pg2x{pair}", 2)
                one = postgresql(f"pg1x{pair}", 1)
            else:
                one = postgresql(f"pg1x{pair}", 1)
                two = postgresql(f"pg2x{pair}", 2)
            measured.append((one, two))
        runs = {"sqlite, 1 worker": sqlite, "postgresql, 1 worker": measured[0][0], "postgresql, 2 workers": measured[0][1]}
        rng = random.Random(seed)
        # Kill moments spread over the delivery and the verification after it (two workers take about half as long).
        killed = [run_config(prepared, work, f"kill{k}", _fresh_database(server, f"kill{k}"), 2,
                             kill_at=rng.uniform(0.05, 0.9) * measured[0][0].seconds / 2, claim_seconds=3.0,
                             processes=processes, own_sessions=own_sessions)
                  for k in range(kills)]
    cores = os.cpu_count() or 1
    figures: dict[str, Any] = {"frames": len(prepared.frames), "load_average": os.getloadavg(), "cpus": cores,
                               "processes": processes, "own_sessions": own_sessions, "runs": {k: _figures(v) for k, v in runs.items()}}
    ratios = [two.per_second / one.per_second if one.per_second else 0.0 for one, two in measured]
    figures["pairs"] = [{"postgresql, 1 worker": _figures(one), "postgresql, 2 workers": _figures(two), "ratio": ratio,
                         "cpu_bound_ratio_ceiling": cpu_bound_ceiling(one, cores, processes)}
                        for (one, two), ratio in zip(measured, ratios)]
    figures["ratio_pg2_to_pg1"] = float(np.median(ratios))
    base = float(np.median([one.per_second for one, _ in measured]))
    figures["ratio_pg1_to_sqlite1"] = base / sqlite.per_second if sqlite.per_second else 0.0
    figures["cpu_bound_ratio_ceiling"] = float(np.median([pair["cpu_bound_ratio_ceiling"] for pair in figures["pairs"]]))
    figures["kills"] = [_figures(k) for k in killed]
    return figures


def cpu_bound_ceiling(one_worker: RunResult, cores: int, processes: int) -> float:
    """The most two workers can gain over one if CPU alone limits them, from the one-worker run's CPU per report.

    Per report a worker's own process spends ``m`` (intake, the event loop, its store calls), its
    verification processes ``v`` (spread over ``processes``; inside ``m`` when 0) and the server ``s``. One
    worker goes no faster than its busiest process (``max(m, v / processes)``); any number of workers no
    faster than ``cores / (m + v + s)``. Independent of other jobs' load (CPU time, not wall time), but only an
    upper bound: it ignores waits (commits, round trips) that leave a worker idle.
    """
    if not one_worker.accepted:
        return 0.0
    m, v = one_worker.worker_cpu.own / one_worker.accepted, one_worker.worker_cpu.descendants / one_worker.accepted
    s = one_worker.server_cpu / one_worker.accepted
    busiest = max(m, v / processes) if processes else m
    if busiest <= 0:
        return 0.0
    shared = cores / (m + v + s)
    return min(2 / busiest, shared) / min(1 / busiest, shared)


def _fresh_database(server: PostgresServer, name: str) -> str:
    return server.create_database(f"bench_{name}")


def _figures(result: RunResult) -> dict[str, Any]:
    return {
        "engine": result.engine, "workers": result.workers, "seconds": result.seconds,
        "accepted_per_second": result.per_second, "accepted": result.accepted, "lost": result.lost,
        "doubled": result.doubled, "unacknowledged": result.unacknowledged, "rejected": result.rejected,
        "killed_after_seconds": result.killed_after, "resent": result.resent, "claimed_at_kill": result.claimed_at_kill,
        "worker_cpu_seconds": result.worker_cpu.own, "verifier_cpu_seconds": result.worker_cpu.descendants,
        "server_cpu_seconds": result.server_cpu,
        "worker_cpu_ms_per_report": result.milliseconds_per_report(result.worker_cpu.own),
        "verifier_cpu_ms_per_report": result.milliseconds_per_report(result.worker_cpu.descendants),
        "server_cpu_ms_per_report": result.milliseconds_per_report(result.server_cpu),
    }
