"""One complete round on loopback, step by step, with every process supervised.

The steps (each its own function): start the peers' workers (their start-up
overlaps the rest), create the aggregator's identity and the relays (their
operators' commands), measure what each phase costs on this machine
(:mod:`._calibrate`) and plan the round from it (:mod:`._schedule`), open the
round, follow it until it ends, collect the report. A relay or the aggregator
that dies is started again with the same command (a relay keeps its held
packets and the aggregator resumes the round from its store), and the demo
keeps following the round; everything stops with the demo.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import httpx
import trio

from anonml.aggregator import LINKS_JSON, AggregatorHome, PostgresLocation, postgres_location, summarise_report
from anonml.aggregator import open_round as load_round
from anonml.base.process import anonml_command
from anonml.base.threads import run_blocking
from anonml.base.storage import replace_file
from anonml.demo._audit import audit_round
from anonml.demo._calibrate import QUIET_SHARE, QUIET_TIMEOUT, PhaseCosts, measure_costs
from anonml.demo._children import Child, ChildFailed, Children, open_children, resident_mb
from anonml.demo._data import DemoData, held_out_auc, write_peer_files, write_test_file
from anonml.demo._ports import HOST, free_port
from anonml.demo._progress import Progress, phase_rows, read_worker, scrape_relay
from anonml.demo._schedule import (AGGREGATOR_PROCESSES, PATH_LENGTH, RELAYS, SGD_STEPS, DemoParams, plan_round,
                                   requests_in_flight, round_spec, to_toml)
from anonml.demo._summary import anonymity_figures, summarise
from anonml.demo._trace import deliveries_to, explain_work_dir, relay_trace_file
from anonml.protocol import TaskKind, format_host_port
from anonml.demo._swarm import SwarmConfig
from anonml.transport import tls_context

# `anonml aggregator run` exits 0 when the round is done, 3 when it failed and
# 4 when it ended degraded: each is its normal end, not a crash to restart.
AGGREGATOR_ENDS = (0, 3, 4)
# How long the aggregator keeps serving after the round at least (peers read the final receipt log).
LINGER_SECONDS = 30.0
# How long the demo waits for the peers after the round has ended.
PEER_GRACE_SECONDS = 30.0


@dataclass
class Network:
    """The demo's addresses, chosen before any process starts (they go into the signed manifest)."""

    http_port: int = field(default_factory=free_port)
    sink_port: int = field(default_factory=free_port)
    relay_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(RELAYS)])
    """Where peers and relays reach each relay (in the manifest)."""
    relay_listen_ports: list[int] = field(default_factory=list)
    """Where each relay listens, if not there (the fault benchmark puts a lossy proxy between)."""
    metrics_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(RELAYS)])
    sink_worker_ports: list[int] = field(default_factory=list)
    """Where each of the aggregator's ingest workers takes packets (``anonml demo --sink-workers N``): the manifest
    lists them, and the last relays spread their deliveries over them and the aggregator's own sink."""
    sink_listen_port: int | None = None
    """Where the aggregator takes packets, if not at ``sink_port`` (the fault benchmark puts a lossy proxy between)."""
    sink_worker_listen_ports: list[int] = field(default_factory=list)
    """Where each ingest worker takes packets, if not at its ``sink_worker_ports`` entry (a lossy proxy between)."""
    aggregator_host: str = HOST
    """The aggregator's address: its HTTP API and packet sink listen there, and everyone reaches them there."""
    relay_hosts: list[str] = field(default_factory=list)
    """Each relay's address (its link, mirror and metrics), if not :data:`HOST` (``anonml bench netns``: each in its
    own network namespace)."""
    prefixes: dict[str, list[str]] = field(default_factory=dict)
    """Words put before a role's command (``ip netns exec NS``), by role: ``aggregator``, ``relay-N``, ``peers``."""
    round_trip: float = 0.0
    """The measured round trip between two hosts (0 on loopback): the planner's windows hold it (``plan_round``)."""
    store_url: str | None = None
    """The PostgreSQL database the aggregator and its ingest workers keep the round in (``anonml bench faults
    --store postgresql``); None: the round's own SQLite file."""

    def listen_port(self, relay: int) -> int:
        return self.relay_listen_ports[relay] if self.relay_listen_ports else self.relay_ports[relay]

    def sink_worker_listen_port(self, worker: int) -> int:
        return self.sink_worker_listen_ports[worker] if self.sink_worker_listen_ports else self.sink_worker_ports[worker]

    def relay_host(self, relay: int) -> str:
        return self.relay_hosts[relay] if self.relay_hosts else HOST

    def prefix(self, role: str) -> list[str]:
        return list(self.prefixes.get(role, []))

    @property
    def url(self) -> str:
        return f"http://{self.aggregator_host}:{self.http_port}"

    def round_store(self, agg_dir: Path, round_id: str) -> Path | PostgresLocation:
        """Where the round's store is, for what reads it beside the aggregator (the audit, the fault bench)."""
        if self.store_url is None:
            return agg_dir / "rounds" / round_id / "round.sqlite"
        return postgres_location(self.store_url, round_id)

    def store_options(self) -> list[str]:
        """The options that point ``aggregator run`` and ``aggregator worker`` at the round's store."""
        return ["--store", self.store_url] if self.store_url is not None else []


async def start_workers(children: Children, data: DemoData, rows: list[list[str]], work: Path, workers: int, seed: int, url: str,
                        prefix: Sequence[str] = (), rows_per_peer: int = 1) -> list[Child]:
    """The peers' worker processes (each command after ``prefix``, each peer holding ``rows_per_peer`` of
    ``rows``); they wait for the round to be served."""
    started = []
    for w, path in enumerate(write_peer_files(data, rows, work, workers, rows_per_peer)):
        config = SwarmConfig(w, url, path, work / "peers" / f"worker-{w}.sqlite", seed, rows_per_peer=rows_per_peer)
        config_path = work / "peers" / f"worker-{w}.json"
        config_path.write_text(config.to_json())
        started.append(await children.start(
            f"worker-{w}", [*prefix, sys.executable, "-m", "anonml.demo._swarm", str(config_path)], capture_stdout=True
        ))
    return started


async def init_aggregator(children: Children, agg_dir: Path) -> tuple[str, float]:
    """``anonml aggregator init``; the identity relays pin, and the seconds the command took."""
    started = time.monotonic()
    await children.run("aggregator-init", ["aggregator", "init", "--data-dir", str(agg_dir)])
    seconds = time.monotonic() - started
    from anonml.aggregator import AggregatorHome

    return bytes(AggregatorHome(agg_dir).signing_key().verify_key).hex(), seconds


async def start_relays(children: Children, work: Path, network: Network, identity: str) -> list[dict[str, Any]]:
    """Each relay operator's ``relay init`` and ``relay run``; the descriptors (``relay info``'s)."""
    from anonml.relay import load_config, relay_descriptor

    descriptors: list[dict[str, Any]] = [{} for _ in range(RELAYS)]

    async def one(i: int) -> None:
        relay_dir = work / f"relay-{i}"
        host = network.relay_host(i)
        await children.run(f"relay-{i}-init", [
            "relay", "init", "--data-dir", str(relay_dir),
            "--listen", f"{host}:{network.listen_port(i)}", "--advertise", f"{host}:{network.relay_ports[i]}",
            "--metrics", f"{host}:{network.metrics_ports[i]}",
            # Peers compare the aggregator's signed documents with this mirror's copies (DESIGN.md §5).
            "--mirror", f"{host}:{free_port()}",
            # The relay forwards only to next hops a manifest signed by that identity lists.
            "--aggregator", f"{identity}@{network.url}",
            # Every demo peer sends from 127.0.0.1: one address may hold the whole queue here (issue 25's
            # per-address share, 1/64 by default, would refuse all but ~3,000 of an Adult round's packets).
            "--source-shares", "1", "--prefix-shares", "1",
        ])
        # What `anonml relay info --json` prints, read in this process: one process start less per relay.
        descriptors[i] = json.loads(json.dumps(await trio.to_thread.run_sync(relay_descriptor, load_config(relay_dir), time.time())))
        # Which packet each relay sent on for each it took in, and when: the anonymity trace's hops (relay._trace).
        trace = ["--trace-packets", str(relay_trace_file(work, i))]
        await children.start(f"relay-{i}", [*network.prefix(f"relay-{i}"), *anonml_command("relay", "run", "--data-dir", str(relay_dir), *trace)],
                             restart=True)

    async with trio.open_nursery() as nursery:
        for i in range(RELAYS):
            nursery.start_soon(one, i)
    return descriptors


async def open_round(children: Children, work: Path, agg_dir: Path, data: DemoData, params: DemoParams,
                     descriptors: list[dict[str, Any]], network: Network, linger: float = 0.0) -> tuple[str, Child]:
    """``aggregator round new`` with the planned spec, then ``aggregator run`` (restarted if it dies)."""
    spec_path = work / "round.toml"
    # `bench round` and the browser test read the spec as soon as it exists:
    # a half-written one once failed CI there (no [network] table yet).
    replace_file(spec_path, to_toml(round_spec(data, params, descriptors, network.http_port, network.sink_port,
                                                  host=network.aggregator_host, sink_workers=network.sink_worker_ports)))
    # The schedule starts once `aggregator run` can be serving: its start-up, measured, with headroom.
    out = await children.run("aggregator-round-new", [
        "aggregator", "round", "new", "--data-dir", str(agg_dir), "--spec", str(spec_path),
        "--start", f"+{params.start_seconds}",
    ])
    round_id = out.strip().splitlines()[-1]
    if network.store_url is not None:
        # Moved to the server before any process opens it: the driver and its workers started together would
        # each find it missing there and copy it (one copy wins, the others fail and are restarted).
        await run_blocking(lambda: load_round(AggregatorHome(agg_dir), round_id, store_url=network.store_url).store.close())
    # Blind issuance and token verification in worker processes: the
    # aggregator's one interpreter then only serves HTTP and the sink.
    run_aggregator = [
        "aggregator", "run", "--data-dir", str(agg_dir), "--round", round_id,
        "--linger", f"{max(LINGER_SECONDS, linger + 5):g}", "--processes", str(AGGREGATOR_PROCESSES),
        # The report then carries the AUC on the held-out rows.
        "--test-file", str(write_test_file(data, work)),
        *(["--sink-port", str(network.sink_listen_port)] if network.sink_listen_port is not None else []),
        *network.store_options(),
    ]
    aggregator = await children.start(
        "aggregator", [*network.prefix("aggregator"), *anonml_command(*run_aggregator)], restart=True, done=lambda code: code in AGGREGATOR_ENDS,
    )
    for i in range(len(network.sink_worker_ports)):
        # Beside `aggregator run` on its store (on SQLite they take turns at its write lock), verifying in a thread.
        run_worker = ["aggregator", "worker", "--data-dir", str(agg_dir), "--round", round_id, "--name", f"w{i}",
                      "--host", network.aggregator_host, "--port", str(network.sink_worker_listen_port(i)), "--processes", "0",
                      *network.store_options()]
        await children.start(f"ingest-{i}", [*network.prefix("aggregator"), *anonml_command(*run_worker)], restart=True)
    return round_id, aggregator


def dead_workers(workers: Sequence[Child]) -> list[str]:
    """The peer workers that ended other than by their normal exit (0) or the demo's stop, as "name (code)".

    A worker is not restarted (its peers' state is in its memory), so its peers stop answering: the
    summary names it beside "peers registered / answered" rather than leave that figure unexplained.
    """
    return [f"{worker.name} ({worker.exits[-1]})" for worker in workers
            if worker.finished and not worker.stopping and worker.exits and worker.exits[-1] != 0]


async def follow_round(children: Children, network: Network, workers: list[Child], aggregator: Child,
                       progress: Progress, console: Any, started: float) -> None:
    """Show the round's progress until it has ended and the peers are done (or have had their grace)."""
    from anonml.base.display import StatusBoard
    from anonml.peer import AggregatorClient

    client = AggregatorClient(network.url, max_connections=2, retry_for=1.0)
    ended_at: float | None = None
    next_scrape = 0.0
    try:
        async with httpx.AsyncClient(verify=tls_context()) as scraper, trio.open_nursery() as readers:
            for worker in workers:
                assert worker.process is not None
                readers.start_soon(read_worker, worker.process, progress)
            # A live table on a terminal; piped, a line whenever the phase changes and every 5 s.
            with StatusBoard(f"anonml demo — {progress.peers} peers", stream=console.file, interval=5.0, live=console.is_terminal) as board:
                while True:
                    try:
                        progress.status = await client.status()
                    except Exception:  # noqa: BLE001 - the aggregator may be restarting; keep the last status
                        pass
                    if trio.current_time() >= next_scrape:
                        # Relay metrics and every process's memory: a few system calls per process, not each tick.
                        next_scrape = trio.current_time() + 2.0
                        for i, port in enumerate(network.metrics_ports):
                            progress.relays[i] = await scrape_relay(scraper, network.relay_host(i), port) or progress.relays.get(i, {})
                        progress.peak_rss_mb = max(progress.peak_rss_mb, resident_mb([*children.pids(), os.getpid()]))
                        progress.cpu.update(children.cpu_seconds())
                    progress.died = dead_workers(workers)
                    board.update(phase_rows(progress, progress.peers), key=progress.status.phase if progress.status else "starting")
                    ended = progress.status is not None and progress.status.phase in ("done", "degraded", "failed")
                    if ended or aggregator.finished:
                        # Peers finish before t_r; after the round nothing is left for them to do.
                        ended_at = trio.current_time() if ended_at is None else ended_at
                        if all(w.finished for w in workers) or trio.current_time() - ended_at > PEER_GRACE_SECONDS:
                            break
                    # Twice a second: the board changes at most every few seconds, and each status costs the aggregator a request.
                    await trio.sleep(0.5)
            progress.died = dead_workers(workers)  # before the stops, which end the rest
            for worker in workers:
                children.stop(worker)
            readers.cancel_scope.cancel()
    finally:
        await client.aclose()


async def collect_report(aggregator: Child, round_dir: Path, children: Children, console: Any, url: str,
                         linger: float = 0.0) -> dict[str, Any]:
    """The round's report once the aggregator has written it (or has ended without one)."""
    report_path = round_dir / "report.json"
    with trio.move_on_after(120):
        while not aggregator.finished and not report_path.is_file():
            await trio.sleep(0.2)
    if linger > 0 and not aggregator.finished:
        console.print(f"    the dashboard stays up for {linger:g} s more: {url}/dashboard")
        await trio.sleep(linger)
    # The aggregator lingers so peers can read the final receipt log; they are done.
    children.stop(aggregator)
    return json.loads(report_path.read_text()) if report_path.is_file() else {}


async def run_demo(data: DemoData, *, peers: int, epsilon: float, workers: int, seed: int, work: Path, console: Any,
                   linger: float = 0.0, task: TaskKind = TaskKind.ENSEMBLE, queries: Sequence[str] = (),
                   rows_per_peer: int = 1, network: Network | None = None, sgd_steps: int = SGD_STEPS,
                   sgd_learning_rate: float | None = None, sgd_loss: str | None = None,
                   regularization_rule: float | None = None, categorical_weight: float | None = None) -> tuple[dict[str, Any], DemoParams]:
    """Run one complete round (``peers`` peers of ``rows_per_peer`` rows each; an SGD task's in ``sgd_steps`` gradient
    steps of γ0 ``sgd_learning_rate`` on ``sgd_loss``; a model-averaging task's ``regularization_rule`` and
    ``categorical_weight``; None: the spec's default); returns the summary figures and the round's parameters.

    ``network``: where each role listens and how its processes start (default: every role on loopback)."""
    started = time.monotonic()
    rows = data.train_rows[:peers * rows_per_peer]
    progress = Progress(peers=peers)
    network = network or Network()
    agg_dir = work / "aggregator"

    def on_restart(child: Child, returncode: int) -> None:
        progress.exits.append(f"{child.name} ({returncode})")

    def step(number: int, text: str) -> None:
        console.print(f"[bold]{number}/6[/] {time.monotonic() - started:5.1f} s  {text}")

    async with open_children(work / "logs", on_restart=on_restart) as children:
        step(1, f"starting {peers} peers ({rows_per_peer} row(s) each) in {workers} worker processes, {RELAYS} relays and the aggregator's identity")
        # The workers start first: their start-up overlaps the operators' commands.
        peer_workers = await start_workers(children, data, rows, work, workers, seed, network.url,
                                           prefix=network.prefix("peers"), rows_per_peer=rows_per_peer)
        identity, process_start = await init_aggregator(children, agg_dir)
        descriptors = await start_relays(children, work, network, identity)
        step(2, "measuring each phase's cost on this machine to size the round's windows")
        # The costs are the machine's load now, not the demo's own start-up (the workers' and relays'
        # imports), which is over before the round opens: measured under it, a 2,000-peer plan's
        # registration window was 93 s for 15 s of work (issue 26).
        await children.until_quiet(QUIET_SHARE, QUIET_TIMEOUT)
        costs = await measure_costs(PATH_LENGTH, process_start, requests_in_flight=requests_in_flight(workers))
        params = plan_round(data, peers, epsilon, workers, seed, costs, task=task, queries=queries, rows_per_peer=rows_per_peer,
                            round_trip=network.round_trip, sgd_steps=sgd_steps,
                            sgd_learning_rate=sgd_learning_rate, sgd_loss=sgd_loss,
                            regularization_rule=regularization_rule, categorical_weight=categorical_weight)
        console.print("    " + describe_plan(costs, params, network.round_trip))
        step(3, "the aggregator opens the round (anonml aggregator round new / run)")
        round_id, aggregator = await open_round(children, work, agg_dir, data, params, descriptors, network, linger)
        console.print(f"    round manifest hash (the round id): {round_id}")
        console.print(f"    live dashboard: {network.url}/dashboard")
        step(4, "the peers join the round")
        await follow_round(children, network, peer_workers, aggregator, progress, console, started)
        if progress.status is None:
            raise ChildFailed(f"the round never started; see {work / 'logs' / 'aggregator.log'}")
        step(5, "the round is over; the aggregator writes its report")
        round_dir = agg_dir / "rounds" / round_id
        report = await collect_report(aggregator, round_dir, children, console, network.url, linger)
        if report:
            # What the aggregator's operator reads at the end of a round (`anonml aggregator report` prints the
            # same lines), made here: a child process for it cost the demo most of a second.
            for line in [*summarise_report(report), f"report: {round_dir / 'report.html'}"]:
                # Plain text: the report's formulas hold brackets (Var[n̂_c]) that rich would read as markup.
                console.print(f"    {line}", markup=False)
    step(6, "auditing every prepared message against the accepted set; evaluating the published model on the held-out rows")
    found = audit_round(sorted((work / "peers").glob("worker-*.sqlite")), network.round_store(agg_dir, round_id),
                        bytes.fromhex(round_id))
    summary = summarise(data, params, progress, report, found, work, time.monotonic() - started)
    summary["costs"] = costs.to_dict()
    # An SGD round's model is its coefficients in the report, and an averaged model the aggregator's own: each
    # scored by the aggregator on the same held-out rows (`aggregator run --test-file`).
    sgd_utility = ((report or {}).get("sgd") or {}).get("utility")
    if task == TaskKind.SGD:
        summary["auc"] = sgd_utility["auc"] if sgd_utility else None
    elif task == TaskKind.MODEL_AVERAGING:
        summary["auc"] = ((report or {}).get("utility") or {}).get("auc")
    else:
        summary["auc"] = held_out_auc(data, round_dir / "model.json")
    summary["report_path"] = str(round_dir / "report.html")
    if network.sink_worker_ports:
        summary["sink_deliveries"] = deliveries_to(work, RELAYS, [format_host_port(network.aggregator_host, port)
                                                                  for port in (network.sink_port, *network.sink_worker_ports)])
    summary["anonymity"] = anonymity_figures(progress, round_dir / LINKS_JSON)
    if (round_dir / LINKS_JSON).is_file():
        # Which stage of the paths carries any correlation (anonml demo --explain-anonymity reads it again).
        summary["anonymity"]["stages"] = explain_work_dir(work, RELAYS, round_dir / LINKS_JSON)
    return summary, params


def describe_plan(costs: PhaseCosts, params: DemoParams, round_trip: float = 0.0) -> str:
    """One line: the measured per-unit costs, each the slowest core's (and round trip between hosts), and the windows they give."""
    return (
        f"per peer: register {1e3 * costs.register:.1f} ms, credential {1e3 * costs.issue:.1f} ms, "
        f"roster entry {1e6 * costs.roster_entry:.0f} us, "
        f"HTTP {1e3 * costs.http:.1f} ms ({requests_in_flight(params.workers)} in flight){f' + round trip {1e3 * round_trip:.1f} ms' if round_trip else ''}; per message: token+packet {1e3 * costs.token:.1f} ms, "
        f"verify {1e3 * costs.verify:.1f} ms; process start {costs.process_start:.1f} s, aggregator serving "
        f"{costs.serving_start:.1f} s -> windows (s): start {params.start_seconds}, "
        f"register {params.register_seconds}, issue {params.issue_seconds}, "
        f"median {params.median_rounds}x({params.send_window}+{params.delivery_window}, second delivery "
        f"{params.second_delivery_window}), data {params.data_send_window}+{params.data_delivery_window} "
        f"(second delivery {params.data_second_delivery_window}), check {params.check_seconds}, "
        f"gap {params.publish_gap}; round {params.total_seconds()} s"
    )
