"""``anonml bench netns``: the demo's round across separate network hosts, with delay and loss on every link.

The bench (root only) builds a network of Linux namespaces
(:mod:`._netns`): one for the aggregator, one per relay, one for the peers'
workers and one for the round's driver, on one bridge whose every port
carries ``tc netem`` delay and loss. It measures the round trip between the
peers' host and the aggregator's with real TCP handshakes (a listener in the
aggregator's namespace, a prober in the peers'), then runs the demo's round
(:func:`anonml.demo.run_demo`) from the driver's namespace: every process of
the round starts with ``ip netns exec`` into its role's namespace and listens
on that namespace's address only, and the planner sizes the windows with the
measured round trip (``plan_round(round_trip=)``). The namespaces and links
are removed when the bench ends, however it ends; names are unique per run,
and namespaces an earlier run left behind are removed first.

``python -m anonml.bench.netns listen|probe|round ...`` are the pieces that run
inside a namespace (the listener, the prober, the round's driver).
"""

from __future__ import annotations

import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from anonml.bench._netns import NamespacePlan, created, missing_tools, plan_namespaces, remove_stale

# TCP handshakes timed between the peers' host and the aggregator's.
PROBES = 30
# A handshake this much slower than the round trip lost its SYN or SYN-ACK (TCP retransmits after 1 s).
LOST_HANDSHAKE_SECONDS = 0.5
EXIT_OFF_CHANCE = 6
"""The round delivered, but its anonymity report is not at chance."""


def host_roles(relays: int) -> list[str]:
    """One namespace per role: the driver, the aggregator, each relay, the peers."""
    return ["ctl", "aggregator", *(f"relay-{i}" for i in range(relays)), "peers"]


@dataclass
class RoundConfig:
    """What the driver runs inside its namespace (written as JSON for ``python -m anonml.bench.netns round``)."""

    peers: int
    workers: int
    seed: int
    epsilon: float
    work: str
    summary_path: str
    aggregator_host: str
    relay_hosts: list[str]
    prefixes: dict[str, list[str]] = field(default_factory=dict)
    round_trip: float = 0.0

    @classmethod
    def for_plan(cls, plan: NamespacePlan, relays: int, round_trip: float, **settings: Any) -> RoundConfig:
        prefixes = {role: plan.exec_prefix(role) for role in ("aggregator", "peers", *(f"relay-{i}" for i in range(relays)))}
        return cls(aggregator_host=plan.host("aggregator").address,
                   relay_hosts=[plan.host(f"relay-{i}").address for i in range(relays)],
                   prefixes=prefixes, round_trip=round_trip, **settings)


def round_trips(host: str, port: int, count: int, gap: float = 0.02) -> list[float]:
    """Seconds each of ``count`` TCP handshakes with ``host:port`` took (connect returns on the SYN-ACK)."""
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        with socket.create_connection((host, port), timeout=10.0):
            seconds.append(time.perf_counter() - started)
        time.sleep(gap)
    return seconds


def summarise_round_trips(seconds: list[float]) -> dict[str, Any]:
    """Median, least and most of the handshakes, and how many lost a packet (retransmitted after a second)."""
    if not seconds:
        raise ValueError("no handshakes were timed")
    median = statistics.median(seconds)
    return {"probes": len(seconds), "median_ms": 1e3 * median, "min_ms": 1e3 * min(seconds), "max_ms": 1e3 * max(seconds),
            "retransmitted": sum(1 for s in seconds if s > median + LOST_HANDSHAKE_SECONDS)}


def measure_round_trip(plan: NamespacePlan, workdir: Path) -> dict[str, Any]:
    """Time TCP handshakes from the peers' namespace to a listener in the aggregator's."""
    from anonml.demo import free_port

    address, port = plan.host("aggregator").address, free_port()
    ready = workdir / "listener.ready"
    listener = subprocess.Popen([*plan.exec_prefix("aggregator"), sys.executable, "-m", "anonml.bench.netns", "listen",
                                 address, str(port), str(ready)])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if listener.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the TCP listener in {plan.host('aggregator').namespace} did not start")
            time.sleep(0.05)
        probe = subprocess.run([*plan.exec_prefix("peers"), sys.executable, "-m", "anonml.bench.netns", "probe",
                                address, str(port), str(PROBES)], capture_output=True, text=True, check=True)
    finally:
        listener.kill()
        listener.wait()
    return {"from": "peers", "to": "aggregator", **summarise_round_trips(json.loads(probe.stdout))}


def run_driver(command: list[str]) -> tuple[int, int | None]:
    """Run the round's driver to its end; its exit code, and the signal (SIGINT, SIGTERM) passed on to it.

    The driver runs in a session of its own, so a Ctrl-C on the terminal reaches this process alone; it passes
    the first signal on and waits while the driver stops the round's processes."""
    driver = subprocess.Popen(command, start_new_session=True)
    forwarded: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if not forwarded:
            forwarded.append(signum)
            driver.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return driver.wait(), (forwarded[0] if forwarded else None)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def run_netns(peers: int | None, workers: int, seed: int, delay_ms: float, loss_percent: float, work: Path,
              log: Any) -> dict[str, Any]:
    """Build the namespaces, measure the round trip, run the round; the figures (``interrupted`` set if a
    signal stopped it). ``log(text)`` reports each step."""
    from anonml.demo import RELAYS, breast_cancer_data

    reason = missing_tools()
    if reason is not None:
        raise RuntimeError(f"cannot build network namespaces here: {reason}")
    removed, busy = remove_stale()
    if removed or busy:
        log(f"earlier runs' namespaces (their process gone): removed {removed}; still running, kept {busy}")
    data_rows = len(breast_cancer_data(seed).train_rows)
    count = min(peers or data_rows, data_rows)
    plan = plan_namespaces(host_roles(RELAYS), delay_ms, loss_percent)
    result: dict[str, Any] = {"namespaces": plan.namespaces, "peers": count, "delay_ms": delay_ms,
                              "loss_percent": loss_percent, "work_dir": str(work)}
    started = time.monotonic()
    with created(plan, seed) as links:
        result.update(links=links, network=plan.describe(links))
        log(result["network"])
        result["round_trip"] = measure_round_trip(plan, work)
        log(f"TCP handshakes peers -> aggregator: {json.dumps(result['round_trip'])}")
        summary_path = work / "summary.json"
        config = RoundConfig.for_plan(plan, RELAYS, result["round_trip"]["median_ms"] / 1e3, peers=count, workers=workers,
                                      seed=seed, epsilon=2.0, work=str(work / "round"), summary_path=str(summary_path))
        config_path = work / "round-config.json"
        config_path.write_text(json.dumps(asdict(config), indent=2))
        code, interrupted = run_driver([*plan.exec_prefix("ctl"), sys.executable, "-m", "anonml.bench.netns", "round",
                                        str(config_path)])
        result.update(driver_exit=code, interrupted=interrupted)
        if summary_path.is_file():
            result["summary"] = json.loads(summary_path.read_text())
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    return result


def verdict(result: dict[str, Any]) -> tuple[int, list[str]]:
    """The exit code and why: the demo's (done, >= 99% accepted, nothing counted twice), then the anonymity report
    at chance (:func:`anonml.demo.anonymity_problems`)."""
    from anonml.demo import anonymity_problems, exit_code

    summary = result.get("summary")
    if summary is None:
        return 3, [f"the round's driver ended ({result.get('driver_exit')}) without a summary"]
    code = exit_code(summary)
    if code:
        return code, [f"the round ended {summary['phase']} with {summary['audit']['accepted']} of "
                      f"{summary['audit']['prepared']} messages accepted (the demo's exit code {code})"]
    problems = anonymity_problems(summary.get("anonymity") or {})
    return (EXIT_OFF_CHANCE, problems) if problems else (0, [])


def _drive_round(config_path: Path) -> int:
    """The driver: the demo's round with every role in its namespace; writes the summary, returns its exit code."""
    import trio
    from functools import partial
    from rich.console import Console

    from anonml.demo import Network, breast_cancer_data, run_demo, until_signalled

    config = RoundConfig(**json.loads(config_path.read_text()))
    work = Path(config.work)
    work.mkdir(parents=True, exist_ok=True)
    network = Network(aggregator_host=config.aggregator_host, relay_hosts=config.relay_hosts, prefixes=config.prefixes,
                      round_trip=config.round_trip)
    data = breast_cancer_data(config.seed)
    outcome = trio.run(until_signalled, partial(run_demo, data, peers=config.peers, epsilon=config.epsilon,
                                                workers=config.workers, seed=config.seed, work=work,
                                                console=Console(stderr=True), network=network))
    if isinstance(outcome, int):
        return 128 + outcome
    summary, _ = outcome
    Path(config.summary_path).write_text(json.dumps(summary, indent=2, default=str))
    return 0


def main(argv: list[str]) -> int:
    """``listen ADDRESS PORT READY_FILE`` | ``probe ADDRESS PORT COUNT`` | ``round CONFIG``."""
    if argv[:1] == ["listen"] and len(argv) == 4:
        with socket.create_server((argv[1], int(argv[2])), backlog=128) as server:
            Path(argv[3]).touch()
            # The kernel completes each handshake from the backlog; the prober closes its connections unread.
            while True:
                connection, _ = server.accept()
                connection.close()
    if argv[:1] == ["probe"] and len(argv) == 4:
        print(json.dumps(round_trips(argv[1], int(argv[2]), int(argv[3]))))
        return 0
    if argv[:1] == ["round"] and len(argv) == 2:
        return _drive_round(Path(argv[1]))
    print(f"usage: python -m anonml.bench.netns listen ADDRESS PORT READY | probe ADDRESS PORT COUNT | round CONFIG; "
          f"got {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
