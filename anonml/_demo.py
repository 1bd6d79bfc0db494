"""``anonml demo``: one complete round of the whole system on loopback.

Three relays and the aggregator run as separate processes, started with their
own operators' commands (``anonml relay init/info/run``, ``anonml aggregator
init / round new / run``) in a temporary work directory; N peers run as
concurrent :func:`peer.join_round` tasks in a few worker processes
(:mod:`anonml._swarm`), each peer with its own identity, credential, ledger
and randomness. The demo watches the round's public status, shows each phase,
and ends with a summary: participation, packets, rejections by reason,
epsilon per peer (local eq. 7.4 and the shuffle-amplified central figure),
AUC on held-out data beside the non-private baseline, wall time and where the
report is.
"""

from __future__ import annotations

import csv
import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
import trio

from anonml._swarm import SwarmConfig
from anonml.cli import anonml_command
from anonml.protocol import FeatureSpec, RoundStatus

RELAYS = 3
AGGREGATOR_PROCESSES = 2
AGGREGATOR_START_SECONDS = 5
HOST = "127.0.0.1"


class DemoError(click.ClickException):
    """Raised when a demo process fails to start or the round does not complete; names the step and its log."""


@dataclass(frozen=True)
class DemoData:
    """Peers' raw rows (one per peer), the held-out test rows, and the task."""

    name: str
    spec: FeatureSpec
    header: tuple[str, ...]
    train_rows: list[list[str]]
    test_columns: dict[str, np.ndarray]
    test_labels: np.ndarray  # 0/1
    train_columns: dict[str, np.ndarray]
    train_labels: np.ndarray  # 0/1


# Public bounds for the breast-cancer features: ranges a clinician would give
# before seeing the data (Algorithm 1 needs "an educated guess about the
# minimum and maximum"), wider than the Wisconsin set's observed ranges.
_BREAST_CANCER_FEATURES = {
    "mean radius": (5.0, 30.0),
    "mean texture": (5.0, 40.0),
    "mean perimeter": (40.0, 200.0),
    "mean area": (100.0, 2600.0),
    "mean smoothness": (0.04, 0.18),
    "mean compactness": (0.0, 0.4),
    "mean concavity": (0.0, 0.5),
    "mean concave points": (0.0, 0.25),
    "worst radius": (5.0, 40.0),
    "worst texture": (10.0, 50.0),
    "worst perimeter": (40.0, 260.0),
    "worst area": (100.0, 4500.0),
}


def _split(n: int, test_fraction: float, seed: int, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(np.arange(n), test_size=test_fraction, random_state=seed, stratify=labels)
    return np.sort(train), np.sort(test)


def breast_cancer_data(seed: int) -> DemoData:
    """scikit-learn's Wisconsin breast cancer set (ships with sklearn; offline): 70% peers, 30% held out."""
    from sklearn.datasets import load_breast_cancer

    from anonml.protocol._features import FeatureSpec, LabelSpec, NumericFeature

    bunch = load_breast_cancer()
    names = list(bunch.feature_names)
    columns = {name.replace(" ", "_"): bunch.data[:, names.index(name)] for name in _BREAST_CANCER_FEATURES}
    # sklearn codes malignant as 0; the task predicts malignancy.
    labels = (bunch.target == 0).astype(np.int64)
    spec = FeatureSpec(
        tuple(NumericFeature(name.replace(" ", "_"), low, high) for name, (low, high) in _BREAST_CANCER_FEATURES.items()),
        LabelSpec("diagnosis", ("malignant",), ("benign",)),
    )
    train, test = _split(len(labels), 0.3, seed, labels)
    header = (*columns, "diagnosis")
    rows = [[repr(float(columns[c][i])) for c in columns] + ["malignant" if labels[i] else "benign"] for i in train]
    return DemoData(
        "breast-cancer", spec, header, rows,
        {c: v[test] for c, v in columns.items()}, labels[test],
        {c: v[train] for c, v in columns.items()}, labels[train],
    )


def adult_data(data_dir: Path) -> DemoData:
    """UCI Adult: every ``adult.data`` row is a peer; ``adult.test`` is held out."""
    from anonml.learning._adult import adult_spec
    from anonml.learning._data import load_adult

    train, test = load_adult(data_dir)
    spec = adult_spec()
    names = list(spec.names)
    header = (*names, spec.label.name)
    rows = [
        [_cell(train.columns[name][i]) for name in names] + [str(train.labels[i])]
        for i in range(train.n_rows)
    ]
    positive = set(spec.label.positive)
    return DemoData(
        "adult", spec, header, rows,
        {name: test.columns[name] for name in names}, np.isin(test.labels, list(positive)).astype(np.int64),
        {name: train.columns[name] for name in names}, np.isin(train.labels, list(positive)).astype(np.int64),
    )


def _cell(value: object) -> str:
    return repr(float(value)) if isinstance(value, (float, np.floating)) else str(value)


def free_port() -> int:
    """A port the OS says is free now (the relays' descriptors need it before they start)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Processes:
    """The demo's child processes and their log files; all stopped on exit."""

    logs: Path
    running: list[tuple[str, trio.Process]] = field(default_factory=list)

    async def run(self, name: str, *args: str) -> str:
        """Run one operator command to completion; its stdout, or DemoError naming its log."""
        log = self.logs / f"{name}.log"
        result = await trio.run_process(anonml_command(*args), capture_stdout=True, capture_stderr=True, check=False)
        log.write_bytes(result.stdout + result.stderr)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).decode(errors="replace").strip().splitlines()[-5:]
            raise DemoError(f"`anonml {' '.join(args)}` failed ({result.returncode}); see {log}:\n" + "\n".join(tail))
        return result.stdout.decode()

    async def start(self, name: str, command: Sequence[str], *, stdout: int | None = None) -> trio.Process:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
        process = await trio.lowlevel.open_process(
            list(command), stdout=stdout if stdout is not None else log, stderr=log, start_new_session=True
        )
        self.running.append((name, process))
        return process

    async def stop_all(self) -> None:
        for _, process in reversed(self.running):
            if process.returncode is None:
                process.terminate()
        with trio.move_on_after(10):
            for _, process in self.running:
                await process.wait()
        for _, process in self.running:
            if process.returncode is None:
                process.kill()


def _rss_mb(pid: int) -> float:
    """Resident memory of one process now (Linux /proc), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _max_rss_mb(who: int) -> float:
    # ru_maxrss is in KiB on Linux; for RUSAGE_CHILDREN it is the largest child.
    return resource.getrusage(who).ru_maxrss / 1024.0


@dataclass(frozen=True)
class DemoParams:
    peers: int | None
    epsilon: float
    workers: int
    seed: int
    k_p: int
    k_h: int
    k_s: int
    plan: str
    median_rounds: int
    send_window: int
    delivery_window: int
    data_send_window: int
    data_delivery_window: int
    register_seconds: int
    issue_seconds: int


def default_params(data: DemoData, peers: int, epsilon: float, workers: int, seed: int) -> DemoParams:
    """Short windows for loopback, sized to the work this 2-core machine must do.

    Breast cancer uses the thesis's split plan; Adult the one-subset plan (one
    data packet per peer), which ``anonml experiment adult --plan one --kp 12
    --ks 1 --median-peers all --median-steps 4`` scores at the same parameters:
    the round asks every peer's budget to cover a median answer, as
    ``median_peers="all"`` does, and learns with the weighted vote. Windows
    grow with the number of peers so each phase fits its work.
    """
    if data.name == "breast-cancer":
        k_p, k_h, k_s, plan, median_rounds = 4, 2, 2, "split", 3
    else:
        # One single-feature subset per partition: the experiment above gives
        # 0.860 ± 0.005 at ε_T = 2 (weighted vote, 20 trials); with 10 median
        # steps 0.863 ± 0.004, against 0.852 ± 0.011 for k_p = 8, k_s = 3.
        # Four sub-rounds of binary search resolve each median to 1/32 of its
        # public range.
        k_p, k_h, k_s, plan, median_rounds = 12, 1, 1, "one", 4
    thousands = peers / 1000.0
    # Seconds per thousand peers on this machine (2 cores shared by every
    # process), measured on the 32,561-peer Adult round with the aggregator's
    # crypto in worker processes: 1.8-2.1 to register; 4.0-4.3 for blind issuance
    # (both cores busy: ~3.8 ms of CPU per peer at the peer, mostly httpx and
    # checking the issuer's proof, ~1.5 ms of HTTP at the aggregator, ~1.9 ms
    # in its workers). Per packet ~2.7 ms at the peer to bin, perturb and make
    # the token, all as the send window opens, then ~1.8 ms to build and send
    # its Sphinx packet; ~0.4 ms at each relay; ~0.6 ms to verify. A median
    # sub-round asks one partition, all its packets at once. The windows
    # leave 20-50% slack above those figures.
    per_round = math.ceil(peers / k_p / 1000.0 * 3.0)
    return DemoParams(
        peers=peers, epsilon=epsilon, workers=workers, seed=seed, k_p=k_p, k_h=k_h, k_s=k_s, plan=plan,
        median_rounds=median_rounds,
        send_window=max(1, per_round),
        delivery_window=max(RELAYS + 1, math.ceil(per_round * 1.25)),
        # Small rounds: a few seconds more than their work, for a loaded machine.
        data_send_window=max(4, math.ceil(thousands * k_h * 3.0)),
        data_delivery_window=max(RELAYS + 1, math.ceil(thousands * k_h * 1.5)),
        register_seconds=6 + math.ceil(thousands * 2.8),
        issue_seconds=3 + math.ceil(thousands * 5.5),
    )


def write_peer_files(data: DemoData, rows: list[list[str]], work: Path, workers: int) -> list[Path]:
    """One CSV per worker process: a header row, then one row per peer."""
    paths = []
    for w in range(workers):
        path = work / "peers" / f"worker-{w}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(data.header)
            writer.writerows(rows[w::workers])
        paths.append(path)
    return paths


def write_test_file(data: DemoData, work: Path) -> Path:
    """The held-out rows as the labelled CSV ``aggregator run --test-file`` reads: the report then carries the AUC."""
    path = work / "held-out.csv"
    label = data.spec.label
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(data.header)
        for i, y in enumerate(data.test_labels):
            cells = [_cell(data.test_columns[name][i]) for name in data.spec.names]
            writer.writerow([*cells, label.positive[0] if y else label.negative[0]])
    return path


def baseline_auc(data: DemoData) -> float:
    """Non-private logistic regression on the raw features of the same training rows."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    numeric = list(data.spec.numeric_names)
    categorical = [n for n in data.spec.names if n not in numeric]

    def design(columns: dict[str, np.ndarray], fit: bool) -> np.ndarray:
        parts = [np.column_stack([columns[n].astype(np.float64) for n in numeric])]
        parts[0] = scaler.fit_transform(parts[0]) if fit else scaler.transform(parts[0])
        if categorical:
            raw = np.column_stack([columns[n].astype(str) for n in categorical])
            parts.append((encoder.fit_transform(raw) if fit else encoder.transform(raw)).toarray())
        return np.hstack(parts)

    scaler, encoder = StandardScaler(), OneHotEncoder(handle_unknown="ignore")
    model = LogisticRegression(max_iter=5000).fit(design(data.train_columns, True), data.train_labels)
    return float(roc_auc_score(data.test_labels, model.predict_proba(design(data.test_columns, False))[:, 1]))


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


async def _read_worker(process: trio.Process, progress: Progress) -> None:
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


def _phase_rows(progress: Progress, peers: int) -> list[tuple[str, str]]:
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
    if progress.errors:
        rows.append(("peer errors", f"{len(progress.errors)}: {progress.errors[-1][:80]}"))
    return rows


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(document: dict[str, Any]) -> str:
    """A small TOML writer for the round spec: top-level scalars, then one table per dict."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in document.items() if not isinstance(value, dict)]
    for key, value in document.items():
        if isinstance(value, dict):
            lines += ["", f"[{key}]"] + [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()]
    # Round-trip check: what the aggregator parses must be what was meant.
    assert tomllib.loads("\n".join(lines)) == json.loads(json.dumps(document)), "TOML writer lost information"
    return "\n".join(lines) + "\n"


async def scrape_relay(port: int) -> dict[str, float]:
    """A relay's counters from its Prometheus endpoint: ``forwarded``, ``received``, ``dropped/<reason>``."""
    import re

    import httpx

    try:
        async with httpx.AsyncClient(timeout=2.0) as client:
            text = (await client.get(f"http://{HOST}:{port}/metrics")).text
    except httpx.HTTPError:
        return {}
    metrics: dict[str, float] = {}
    for line in text.splitlines():
        found = re.fullmatch(r'anonml_relay_packets_(received|forwarded|dropped)_total(?:\{reason="([^"]+)"\})? ([0-9.e+]+)', line)
        if found:
            kind, reason, value = found.groups()
            metrics[f"dropped/{reason}" if kind == "dropped" else kind] = float(value)
    return metrics


async def _wait_for_http(url: str, deadline: float) -> None:
    import httpx

    async with httpx.AsyncClient() as client:
        while True:
            try:
                response = await client.get(url + "/v1/status")
                if response.status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if trio.current_time() > deadline:
                raise DemoError(f"the aggregator at {url} did not come up")
            await trio.sleep(0.1)


async def run_demo(data: DemoData, params: DemoParams, work: Path, console: Any, linger: float = 0.0) -> dict[str, Any]:
    """Run one complete round; returns the summary figures."""
    from anonml.display import StatusBoard
    from anonml.peer._client import AggregatorClient

    started = time.monotonic()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rows = data.train_rows[: params.peers] if params.peers else data.train_rows
    peers = len(rows)
    procs = Processes(logs)
    progress = Progress(peers=peers)
    try:
        console.print(f"[bold]1/5[/] {time.monotonic() - started:5.1f} s  starting {RELAYS} relays and the aggregator (anonml relay init / info / run, anonml aggregator init)")
        agg_dir = work / "aggregator"
        descriptors: list[dict[str, Any]] = [{} for _ in range(RELAYS)]
        metrics_ports = [free_port() for _ in range(RELAYS)]
        http_port, sink_port = free_port(), free_port()
        url = f"http://{HOST}:{http_port}"
        # The peers' workers start now and wait for the round to be served:
        # their start-up overlaps the operators' commands, so registration
        # (open from `round new` on) is not spent importing libraries.
        workers = []
        for w, path in enumerate(write_peer_files(data, rows, work, params.workers)):
            config = SwarmConfig(w, url, path, work / "peers" / f"worker-{w}.sqlite", params.seed)
            config_path = work / "peers" / f"worker-{w}.json"
            config_path.write_text(config.to_json())
            workers.append(await procs.start(
                f"worker-{w}", [sys.executable, "-m", "anonml._swarm", str(config_path)], stdout=subprocess.PIPE
            ))

        # The aggregator's operator creates its identity first and gives the
        # printed key to the relay operators, who pin it with the URL.
        await procs.run("aggregator-init", "aggregator", "init", "--data-dir", str(agg_dir))
        from anonml.aggregator import AggregatorHome

        identity = bytes(AggregatorHome(agg_dir).signing_key().verify_key).hex()

        async def init_relay(i: int) -> None:
            relay_dir = work / f"relay-{i}"
            # The round's geometry has one routing slot per relay plus the aggregator (the last hop).
            await procs.run(
                f"relay-{i}-init", "relay", "init", "--data-dir", str(relay_dir), "--listen", f"{HOST}:{free_port()}",
                "--metrics", f"{HOST}:{metrics_ports[i]}",
                # The relay forwards only to next hops a manifest signed by that identity lists.
                "--aggregator", f"{identity}@{url}",
            )
            descriptors[i] = json.loads(await procs.run(f"relay-{i}-info", "relay", "info", "--data-dir", str(relay_dir), "--json"))
            await procs.start(f"relay-{i}", anonml_command("relay", "run", "--data-dir", str(relay_dir)))

        async with trio.open_nursery() as nursery:
            for i in range(RELAYS):
                nursery.start_soon(init_relay, i)

        console.print(f"[bold]2/5[/] {time.monotonic() - started:5.1f} s  the aggregator opens the round (anonml aggregator round new / run)")
        spec_path = work / "round.toml"
        spec_path.write_text(to_toml(round_spec(data, params, peers, descriptors, http_port, sink_port)))
        # The schedule starts a few seconds after `round new`: `aggregator run` must be
        # serving before registration's window runs (on a loaded machine its start-up takes seconds).
        out = await procs.run(
            "aggregator-round-new", "aggregator", "round", "new", "--data-dir", str(agg_dir), "--spec", str(spec_path),
            "--start", f"+{AGGREGATOR_START_SECONDS}",
        )
        round_id = out.strip().splitlines()[-1]
        console.print(f"    round manifest hash (the round id): {round_id}")
        # Registration is open from `round new` on: start the aggregator and
        # the peers' workers together so their start-up overlaps.
        # Blind issuance and token verification in worker processes: the
        # aggregator's one interpreter then only serves HTTP and the sink.
        aggregator = await procs.start(
            "aggregator",
            anonml_command(
                "aggregator", "run", "--data-dir", str(agg_dir), "--round", round_id, "--linger", f"{max(30.0, linger + 5):g}",
                "--processes", str(AGGREGATOR_PROCESSES), "--test-file", str(write_test_file(data, work)),
            ),
        )
        console.print(f"[bold]3/5[/] {time.monotonic() - started:5.1f} s  {peers} peers in {params.workers} worker processes join the round")
        console.print(f"    live dashboard: {url}/dashboard")
        await _wait_for_http(url, trio.current_time() + 30)
        client = AggregatorClient(url, max_connections=2, retry_for=1.0)
        async with trio.open_nursery() as nursery:
            for process in workers:
                nursery.start_soon(_read_worker, process, progress)
            ended_at: float | None = None
            next_scrape = 0.0
            # A live table on a terminal; piped, a line whenever the phase changes and every 5 s.
            with StatusBoard(f"anonml demo — {peers} peers", stream=console.file, interval=5.0, live=console.is_terminal) as board:
                while True:
                    try:
                        progress.status = await client.status()
                    except Exception:  # noqa: BLE001 - a status poll failing must not stop the demo
                        pass
                    if trio.current_time() >= next_scrape:
                        next_scrape = trio.current_time() + 2.0
                        for i, port in enumerate(metrics_ports):
                            progress.relays[i] = await scrape_relay(port) or progress.relays.get(i, {})
                    board.update(_phase_rows(progress, peers), key=progress.status.phase if progress.status else "starting")
                    total = _rss_mb(os.getpid()) + sum(_rss_mb(p.pid) for _, p in procs.running if p.returncode is None)
                    progress.peak_rss_mb = max(progress.peak_rss_mb, total)
                    workers_done = all(p.returncode is not None for p in workers)
                    ended = progress.status is not None and progress.status.phase in ("done", "failed")
                    if aggregator.returncode is not None or ended:
                        # Peers finish before t_r; after the round nothing is left for them to do.
                        if ended_at is None:
                            ended_at = trio.current_time()
                        if workers_done or trio.current_time() - ended_at > 30:
                            break
                    await trio.sleep(0.25)
            for process in workers:
                if process.returncode is None:
                    process.terminate()
        if progress.status is None:
            raise DemoError(f"the round never started; see {logs / 'aggregator.log'}")
        await client.aclose()
        console.print(f"[bold]4/5[/] {time.monotonic() - started:5.1f} s  the round is over; the aggregator writes its report")
        # The aggregator keeps serving (--linger) so peers can read the final
        # receipt log; once the peers are done and the report is written, stop it.
        round_dir = agg_dir / "rounds" / round_id
        report_path = round_dir / "report.json"
        with trio.move_on_after(120):
            while aggregator.returncode is None and not report_path.is_file():
                await trio.sleep(0.2)
        if linger > 0 and aggregator.returncode is None:
            console.print(f"    the dashboard stays up for {linger:g} s more: {url}/dashboard")
            await trio.sleep(linger)
        if aggregator.returncode is None:
            aggregator.terminate()
            await aggregator.wait()
        report = json.loads(report_path.read_text()) if report_path.is_file() else {}
        if report:
            from anonml.aggregator._report import summarise as report_lines

            # What `anonml aggregator report --data-dir DIR ROUND` prints.
            for line in report_lines(report):
                console.print(f"    {line}")
    finally:
        await procs.stop_all()
    console.print(f"[bold]5/5[/] {time.monotonic() - started:5.1f} s  evaluating the published model on the held-out rows")
    summary = summarise(data, params, progress, report, work, time.monotonic() - started)
    summary["auc"] = held_out_auc(data, round_dir / "model.pickle")
    summary["report_path"] = str(round_dir / "report.html")
    return summary


def held_out_auc(data: DemoData, model_path: Path) -> float | None:
    """AUC of the round's published model on the held-out rows, binned with the round's medians."""
    import pickle

    from sklearn.metrics import roc_auc_score

    if not model_path.is_file():
        return None
    # The demo's own aggregator wrote this file in the demo's work directory.
    published = pickle.loads(model_path.read_bytes())
    bins = data.spec.bin_columns(data.test_columns, published["cut_points"])
    return float(roc_auc_score(data.test_labels, published["model"].decision_function(bins)))


def round_spec(data: DemoData, params: DemoParams, peers: int, relays: list[dict[str, Any]], http_port: int, sink_port: int) -> dict[str, Any]:
    """The round spec for ``anonml aggregator round new`` (durations count from that command)."""
    relay_fields = ("node_id", "host", "port", "public_key", "key_epoch")
    spec = data.spec.to_dict()
    return {
        "name": f"demo-{data.name}",
        "task": {"features": spec["features"], "label": spec["label"]},
        "learning": {"k_p": params.k_p, "k_h": params.k_h, "k_s": params.k_s, "plan": params.plan, "learner": "logreg"},
        "privacy": {"eps_total": params.epsilon, "oracle": "auto"},
        "schedule": {
            "register": params.register_seconds,
            "issue": params.issue_seconds,
            "median_rounds": params.median_rounds,
            "median_send": params.send_window,
            "median_delivery": params.delivery_window,
            "data_send": params.data_send_window,
            "data_delivery": params.data_delivery_window,
        },
        "network": {
            "relays": [{k: relay[k] for k in relay_fields} for relay in relays],
            "path_length": RELAYS,
            "http_host": HOST,
            "http_port": http_port,
            "sink_host": HOST,
            "sink_port": sink_port,
        },
        "participation": {"min_participation": max(1, peers // 2), "registration": "open"},
    }


def summarise(data: DemoData, params: DemoParams, progress: Progress, report: dict[str, Any], work: Path, seconds: float) -> dict[str, Any]:
    epsilons = [e for s in progress.summaries.values() for e in s.get("epsilon", [])]
    total = Counter[str]()
    for s in progress.summaries.values():
        for key in ("joined", "packets", "sends", "resends", "acknowledged", "missing", "unconfirmed"):
            total[key] += int(s.get(key, 0))
    status = progress.status
    counts = dict(status.counts) if status is not None else {}
    rejected = dict(status.rejected) if status is not None else {}
    return {
        "dataset": data.name,
        "peers": progress.peers,
        "registered": counts.get("registered", 0),
        "credentials": counts.get("credentials", 0),
        "joined": total["joined"],
        "packets": total["packets"],
        "sends": total["sends"],
        "resends": total["resends"],
        "receipts": total["acknowledged"],
        "missing": total["missing"],
        "unconfirmed": total["unconfirmed"],
        "accepted": counts.get("accepted", 0),
        "rejected": rejected,
        "peer_errors": progress.errors,
        "relay_drops": dict(progress.relay_drops()),
        "relay_forwarded": sum(int(m.get("forwarded", 0)) for m in progress.relays.values()),
        "epsilon_local_max": max(epsilons, default=0.0),
        "epsilon_local_mean": float(np.mean(epsilons)) if epsilons else 0.0,
        "report": report,
        "phase": status.phase if status is not None else "unknown",
        "baseline_auc": baseline_auc(data),
        "wall_seconds": seconds,
        "work_dir": str(work),
        "peak_rss_mb_demo": _max_rss_mb(resource.RUSAGE_SELF),
        "peak_rss_mb_children": _max_rss_mb(resource.RUSAGE_CHILDREN),
        "peak_rss_mb_total": progress.peak_rss_mb,
    }


def experiment_command(params: DemoParams, data_dir: Path, n_train: int) -> str:
    """The in-process ``anonml experiment`` closest to this round: its AUC is the demo's yardstick.

    Same plan, ε and weighted vote; both ask every peer's budget to cover a
    median answer (``median_peers="all"``) and run as many median steps. Not
    identical: the round's sub-round ``i`` asks partition ``i`` only, while
    the experiment deals all peers over the steps (with k_p = 12 and 4 steps,
    3 times as many answers per step), so the round's medians are noisier.
    """
    args = [
        "anonml", "experiment", "adult", "--data-dir", str(data_dir), "--epsilon", f"{params.epsilon:g}",
        "--plan", params.plan, "--kp", str(params.k_p), "--ks", str(params.k_s),
    ]
    if params.plan == "split":
        args += ["--kh", str(params.k_h)]
    args += ["--median-peers", "all", "--median-steps", str(max(params.median_rounds, 1)), "--vote", "weighted"]
    if params.peers is not None and params.peers < n_train:
        args += ["--max-train-rows", str(max(50, params.peers))]
    return " ".join(args)


def _print_summary(console: Any, summary: dict[str, Any], params: DemoParams) -> None:
    from rich.table import Table

    table = Table(title="round summary", show_header=False)
    table.add_column("what")
    table.add_column("figure", justify="right")
    sent = summary["sends"]
    accepted = summary["accepted"]
    table.add_row("outcome", summary["phase"])
    table.add_row("peers registered / answered", f"{summary['registered']} / {summary['joined']} of {summary['peers']}")
    table.add_row("packets: messages / sends (incl. resends)", f"{summary['packets']} / {sent} ({summary['resends']} resent)")
    table.add_row("accepted by the aggregator", f"{accepted} ({100.0 * accepted / max(summary['packets'], 1):.2f}% of messages)")
    table.add_row("receipts found / missing / unconfirmed", f"{summary['receipts']} / {summary['missing']} / {summary['unconfirmed']}")
    table.add_row("rejected by reason", ", ".join(f"{k}: {v}" for k, v in sorted(summary["rejected"].items())) or "none")
    table.add_row("dropped by relays", ", ".join(f"{k}: {v}" for k, v in sorted(summary["relay_drops"].items())) or "none")
    promised = (summary["report"].get("privacy") or {}).get("eps_total_local", params.epsilon)
    table.add_row("epsilon per peer, local (eq. 7.4)", f"max {summary['epsilon_local_max']:.3g}, promised {promised:.3g}")
    central = (summary["report"].get("privacy") or {}).get("central_per_survey") or {}
    if "epsilon" in central:
        # Each data report hides among its partition's n unlinkable reports
        # (Feldman-McMillan-Talwar); a peer's k_h reports compose.
        table.add_row(
            "epsilon, central (shuffle bound)",
            f"{central['epsilon']:.3g} per report (n={central['n']}, delta={central['delta']:.1e}); "
            f"{params.k_h * central['epsilon']:.3g} for a peer's {params.k_h} reports",
        )
    auc = summary.get("auc")
    table.add_row("AUC on held-out data", f"{auc:.4f}" if isinstance(auc, float) else "n/a")
    table.add_row("AUC, non-private logistic regression", f"{summary['baseline_auc']:.4f}")
    if "experiment_command" in summary:
        table.add_row("closest round without the network (compare its AUC)", summary["experiment_command"])
    table.add_row("wall time", f"{summary['wall_seconds']:.1f} s")
    table.add_row(
        "peak memory (all processes / demo / largest child)",
        f"{summary['peak_rss_mb_total']:.0f} MB / {summary['peak_rss_mb_demo']:.0f} MB / {summary['peak_rss_mb_children']:.0f} MB",
    )
    table.add_row("report", summary.get("report_path", summary["work_dir"]))
    console.print(table)


@click.command("demo")
@click.option("--peers", type=click.IntRange(min=4), default=None, help="How many peers (default: every training row).")
@click.option("--dataset", type=click.Choice(["breast-cancer", "adult"]), default="breast-cancer", show_default=True)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Directory with adult.data and adult.test (for --dataset adult).")
@click.option("--epsilon", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True, help="Total epsilon promised to each peer (eq. 7.4).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="Peer worker processes.")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None, help="Keep every process's files here (default: a new temporary directory).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Also write the summary as JSON.")
@click.option("--linger", type=click.FloatRange(0, 3600), default=0.0, help="Keep the aggregator's dashboard up this many seconds after the round.")
def demo(peers: int | None, dataset: str, data_dir: Path | None, epsilon: float, workers: int, work_dir: Path | None, seed: int, json_out: Path | None, linger: float) -> None:
    """Run one complete round on loopback: 3 relays, the aggregator, N peers."""
    from rich.console import Console

    console = Console()
    if dataset == "adult":
        if data_dir is None:
            raise click.UsageError("--dataset adult needs --data-dir (the directory with adult.data and adult.test)")
        missing = [name for name in ("adult.data", "adult.test") if not (data_dir / name).is_file()]
        if missing:
            raise click.BadParameter(
                f"{str(data_dir)!r} has no {' or '.join(missing)}: pass the directory holding UCI Adult's adult.data and "
                "adult.test (e.g. --data-dir ../shared/data/adult)", param_hint="--data-dir")
        data = adult_data(data_dir)
    else:
        data = breast_cancer_data(seed)
    n = min(peers or len(data.train_rows), len(data.train_rows))
    params = default_params(data, n, epsilon, workers, seed)
    work = work_dir or Path(tempfile.mkdtemp(prefix="anonml-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    # SIGTERM unwinds like Ctrl-C, so the demo's child processes are stopped too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    summary = trio.run(run_demo, data, params, work, console, linger)
    if dataset == "adult" and data_dir is not None:
        summary["experiment_command"] = experiment_command(params, data_dir, len(data.train_rows))
    _print_summary(console, summary, params)
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=2, default=str))
    if summary["phase"] != "done":
        raise SystemExit(3)
