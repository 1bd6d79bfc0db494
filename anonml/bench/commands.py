"""The ``anonml bench`` commands: options and output only.

Each command imports its benchmark's module (trio, numpy, the roles) when it
runs, so listing the benchmarks or asking one for ``--help`` loads click
alone (issue 29: every ``--help`` within 5 x ``python -c pass``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

# The relay's hold-filling abuses come last: on a relay that fails them the queue stays full (its
# clock is pinned, so nothing is released) and would fail every later scenario too.
ABUSES = ("relay-late-tags", "relay-junk-tokens", "relay-link-churn", "sink-stranger", "sink-garbage",
          "sink-colluding-relay-junk", "http-churn", "http-slow-bodies", "http-polling", "relay-hold-fill-one", "relay-hold-fill", "relay-neighbour-fill")
"""The abuse scenarios ``anonml bench abuse`` runs (:mod:`anonml.bench.abuse`)."""


@click.command("abuse")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--only", type=click.Choice(ABUSES), multiple=True, help="Run only these abuses (repeatable).")
@click.option("--nofile", type=click.IntRange(min=64), default=None,
              help="Run the relay and the aggregator with this RLIMIT_NOFILE (soft and hard).")
@click.option("--verifiers", type=click.IntRange(0, 64), default=1, show_default=True,
              help="The aggregator's worker processes for token verification, as `aggregator run --processes` "
                   "(0: a thread of the service).")
def bench_abuse(as_json: bool, only: tuple[str, ...], nofile: int | None, verifiers: int) -> None:
    """Honest delivery and p99 latency while the relay, the sink and the HTTP API are abused (floods, churn,
    idle and slow connections, filling the hold queue, a colluding relay, junk tokens), each beside the
    unloaded p99; exits 1 if one misses."""
    from anonml.bench.abuse import run_benchmark

    result = run_benchmark(only or ABUSES, nofile, verifiers)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(result["setup"])
        for entry in result["abuses"]:
            p99 = ", ".join(f"{k} {v:.1f} vs {entry['unloaded_p99_ms'][k]:.1f} ({entry['p99_x_unloaded'][k]}x)"
                            for k, v in entry["p99_ms"].items() if v is not None and entry["unloaded_p99_ms"][k])
            stamping = ", ".join(f"{k} {v:.1f}" for k, v in entry["stamping_p99_ms"].items() if v)
            verdict = "ok" if entry["meets_target"] else "MISSES " + ", ".join(entry["missed"])
            click.echo(f"{entry['abuse']:20} delivered {entry['delivered']:.1%} http {entry['http_ok']:.1%}  "
                       f"p99 ms: {p99}{f'; stamping p99 ms: {stamping}' if stamping else ''}  [{verdict}]  "
                       f"load {entry['load_average']}")
    if not result["all_meet_target"]:
        raise SystemExit(1)


@click.command(name="aggregator")
@click.option("--packets", type=click.IntRange(10, 100_000), default=400, show_default=True)
@click.option("--batch", type=click.IntRange(1, 1024), default=128, show_default=True, help="Packets per link batch.")
@click.option("--processes", type=click.IntRange(0, 64), default=2, show_default=True, help="Verification pool size (0: threads only).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_aggregator(packets: int, batch: int, processes: int, seed: int, as_json: bool) -> None:
    """Packet-sink cost per packet (final hop, token, durable store) vs X25519 and token baselines."""
    from anonml.bench.aggregator import run_bench

    figures = run_bench(packets, batch, processes, seed)
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"aggregator packet sink: {packets} packets, batches of {batch}")
    for column in ("path", "µs/packet", "packets/s", "x X25519", "x verify_token", "accepted"):
        table.add_column(column, justify="right" if column != "path" else "left")
    table.add_row("baseline: X25519 scalar mult", f"{figures['x25519_seconds'] * 1e6:.0f}", "", "1", "", "")
    table.add_row("baseline: verify_token alone", f"{figures['verify_token_seconds'] * 1e6:.0f}", "", f"{figures['verify_token_seconds'] / figures['x25519_seconds']:.1f}", "1", "")
    for key, row in figures.items():
        if key.startswith("processes="):
            table.add_row(
                f"sink, {key}", f"{row['seconds_per_packet'] * 1e6:.0f}", f"{row['packets_per_second']:.0f}",
                f"{row['x_x25519']:.1f}", f"{row['x_verify_token']:.2f}", str(row["accepted"]),
            )
    Console().print(table)


@click.command(name="anonymity")
@click.option("--peers", type=click.IntRange(100, 100_000), default=10_000, show_default=True)
@click.option("--send-window", type=click.IntRange(2, 3600), default=30, show_default=True, help="Seconds (δ).")
@click.option("--delivery-window", type=click.IntRange(8, 3600), default=60, show_default=True, help="Seconds (t_c - t_s - δ).")
@click.option("--processes", type=click.IntRange(0, 8), default=1, show_default=True, help="Token verification processes at the sink.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds identities, reports and send times (ChaCha20).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_anonymity(peers: int, send_window: int, delivery_window: int, processes: int, seed: int, as_json: bool) -> None:
    """Send-vs-arrival rank correlation and the aggregator's timing-linking accuracy through 3 real relays, vs chance."""
    from anonml.bench.anonymity import RELAYS, run_bench

    result = run_bench(peers, send_window, delivery_window, processes, seed)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    guess, base = result["aggregator_guess"], result["baseline_no_mixing"]
    click.echo(f"{result['delivered_and_accepted']}/{peers} reports accepted through {RELAYS} relays into the aggregator's sink; "
               f"send window {send_window} s, delivery window {delivery_window} s; load average "
               f"{result['load_average_before']} before, {result['load_average_after']} after")
    click.echo(f"Spearman rho(send, arrival) = {result['spearman_rho']:+.4f} (1 standard error under independence: "
               f"{result['rho_standard_error']:.4f}); without mixing: {base['spearman_rho']:+.4f}")
    click.echo(f"aggregator's guess of each sender from its full view: {100 * guess['accuracy']:.3f}% (chance "
               f"{100 * guess['chance']:.3f}%, {guess['above_chance_percentage_points']:+.3f} pp; without mixing "
               f"{100 * base['aggregator_guess']['accuracy']:.1f}%)")
    click.echo(f"sent in the first half, guessed from arrival: {100 * result['half_link_accuracy']:.2f}% (chance 50%, "
               f"1 s.e. {100 * result['half_link_standard_error']:.2f} pp; without mixing {100 * base['half_link_accuracy']:.1f}%)")


@click.command("crypto")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--repeat", default=500, show_default=True, type=click.IntRange(min=1), help="Calls per figure.")
def bench_crypto(as_json: bool, repeat: int) -> None:
    """Sphinx and token costs, as µs and as ratios to X25519 and P-256 multiplications."""
    from rich.console import Console
    from rich.table import Table

    from anonml.bench.crypto import run_benchmark

    report = run_benchmark(repeat)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    console = Console()
    baselines = report["baselines_us"]
    console.print(
        f"baselines: X25519 mult {baselines['x25519_mult_us']:.1f} µs, P-256 mult {baselines['p256_mult_us']:.1f} µs"
    )
    table = Table(title="anonml bench crypto")
    for column in ("figure", "value", "× X25519", "× P-256", "target", "ok"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for name, entry in report["figures"].items():
        table.add_row(
            name,
            f"{entry['value']:g}",
            f"{entry['x_x25519']:g}" if "x_x25519" in entry else "",
            f"{entry['x_p256']:g}" if "x_p256" in entry else "",
            entry.get("target", ""),
            ("yes" if entry["meets_target"] else "NO") if "meets_target" in entry else "",
        )
    console.print(table)


@click.command("demo")
@click.option("--runs", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--hogs", type=click.IntRange(min=0), default=4, show_default=True, help="CPU-bound processes competing for the cores.")
@click.option("--peers", type=click.IntRange(min=4), default=None, help="Peers per demo (default: the demo's default).")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def bench_demo(runs: int, hogs: int, peers: int | None, work_dir: Path | None, as_json: bool) -> None:
    """Run `anonml demo` RUNS times with HOGS busy processes; exit codes and accepted fractions."""
    import trio

    from anonml.bench.demo import run_acceptance
    from anonml.demo import until_signalled

    work = work_dir or Path(tempfile.mkdtemp(prefix="anonml-bench-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    report = trio.run(until_signalled, run_acceptance, runs, hogs, peers, work)
    if isinstance(report, int):
        click.echo(f"stopped by signal {report}; the hogs and any demo were stopped", err=True)
        sys.exit(128 + report)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        for record in report["records"]:
            click.echo(
                f"run {record['run']}: exit {record['exit_code']}, accepted {record.get('accepted')} of "
                f"{record.get('prepared')} ({record.get('accepted_fraction')}), restarts {record.get('restarted')}, "
                f"{record['wall_seconds']} s"
            )
        click.echo(f"{report['passed']} of {runs} runs exited 0 with >= 99% accepted, with {hogs} CPU hogs")
    if report["passed"] != runs:
        sys.exit(1)


@click.command("faults")
@click.option("--peers", type=click.IntRange(min=8), default=100, show_default=True)
@click.option("--events", type=click.IntRange(min=0), default=20, show_default=True, help="Kill-and-restart events (relays and the aggregator).")
@click.option("--data-kills", type=click.IntRange(min=0), default=None,
              help="How many of the events land inside the data phase (the others before it)  [default: half]")
@click.option("--relay-down-for-good", is_flag=True,
              help="Also SIGKILL one relay in the data phase's first attempt and never start it again.")
@click.option("--downtime", type=click.FloatRange(min=0), default=1.0, show_default=True, help="Seconds a killed process stays down.")
@click.option("--drop", type=click.FloatRange(0, 1), default=0.05, show_default=True, help="Share of connections on every link black-holed.")
@click.option("--reset", type=click.FloatRange(0, 1), default=0.05, show_default=True, help="Share of connections on every link reset mid-stream.")
@click.option("--delay", type=click.FloatRange(min=0), default=0.2, show_default=True, help="Largest delay per chunk on every link (s).")
@click.option("--max-lost-share", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Exit non-zero when more than this share of the prepared messages is lost.")
@click.option("--ingest-workers", type=click.IntRange(0, 16), default=0, show_default=True,
              help="`aggregator worker` processes beside the driver, listed in the manifest; each a kill target.")
@click.option("--kill-workers-only", is_flag=True, help="Every kill is an ingest worker's (needs --ingest-workers).")
@click.option("--store", type=click.Choice(["sqlite", "postgresql"]), default="sqlite", show_default=True,
              help="The round's store: its SQLite file, or a private PostgreSQL server the bench starts (initdb).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--work-dir", type=click.Path(path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def bench_faults(peers: int, events: int, data_kills: int | None, relay_down_for_good: bool, downtime: float, drop: float,
                 reset: float, delay: float, max_lost_share: float, ingest_workers: int, kill_workers_only: bool, store: str,
                 seed: int, work_dir: Path | None, as_json: bool) -> None:
    """A round under SIGKILLed relays and aggregator and lossy links; audits every message.

    Exits 1 when a message was counted twice, accepted though no peer
    prepared it, or lost after its peer saw its receipt, when a peer stopped
    with an error, or when more than --max-lost-share of the prepared
    messages were lost.
    """
    import trio

    from anonml.bench._proxy import LinkFaults
    from anonml.bench.faults import FaultPlan, failures, run_faults
    from anonml.demo import until_signalled
    from anonml.testing import private_postgres
    from rich.console import Console

    if drop + reset > 1:
        raise click.UsageError("--drop and --reset are shares of connections: together at most 1")
    data_kills = events // 2 if data_kills is None else data_kills
    if data_kills > events:
        raise click.BadParameter(f"{data_kills} of {events} events", param_hint="--data-kills")
    if kill_workers_only and not ingest_workers:
        raise click.UsageError("--kill-workers-only needs --ingest-workers: there is no worker to kill")
    console = Console(stderr=True, quiet=as_json)
    work = work_dir or Path(tempfile.mkdtemp(prefix="anonml-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        store_url = stack.enter_context(private_postgres()).create_database("faults") if store == "postgresql" else None
        plan = FaultPlan(events, seed, downtime, LinkFaults(drop=drop, reset=reset, delay=delay), data_kills=data_kills,
                         relay_for_good=relay_down_for_good, ingest_workers=ingest_workers, kill_workers_only=kill_workers_only,
                         store_url=store_url)
        result = trio.run(until_signalled, run_faults, peers, plan, work, console)
    if isinstance(result, int):
        click.echo(f"stopped by signal {result}; every child process was stopped; files in {work}", err=True)
        raise SystemExit(128 + result)
    problems = failures(result, max_lost_share)
    result["failures"] = problems
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        found = result["audit"]
        click.echo(f"{result['peers']} peers, {result['relays']} relays (paths of {result['path_length']}), "
                   f"{len(result['kills'])} kills ({result['kills_in_data_phase']} in the data phase by its schedule, "
                   f"{result['kills_seen_in_data_phase']} came while the aggregator said data), links {result['links']}, restarts {len(result['restarts'])}")
        for_good = [kill for kill in result["kills"] if kill["outcome"] == "killed for good"]
        if for_good:
            click.echo(f"killed for good: {for_good}")
        click.echo(f"prepared {found['prepared']}, accepted {found['accepted']} ({100 * result['accepted_fraction']:.2f}%), "
                   f"lost {found['lost']} ({100 * result['lost_fraction']:.2f}%), counted twice {found['counted_twice']}, "
                   f"accepted but prepared by no peer {found['unknown_accepted']}")
        click.echo(f"lost by kind {found['lost_by_kind']}, by reason {found['lost_by_reason']}")
        click.echo(f"round reported: {result['round']}; peers reported: {result['peers_reported']}")
        click.echo(f"relay drops {result['relay_drops']}; proxies {result['proxies']}")
        click.echo(f"store {result['store']}, {result['ingest_workers']} ingest workers; packets each sink took "
                   f"(the driver's first): {result['sink_deliveries']}")
        click.echo(f"work directory: {result['work_dir']}")
        click.echo("FAILED: " + "; ".join(problems) if problems else "passed: nothing lost beyond the allowed share, nothing counted twice")
    if problems:
        raise SystemExit(1)


@click.command("round")
@click.option("--peers", type=click.IntRange(min=8), default=1000, show_default=True, help="Synthetic peers in the round.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="Peer worker processes.")
@click.option("--epsilon", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Draws the synthetic peers (and the round's seed).")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None, help="Keep every process's files here.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def bench_round(peers: int, workers: int, epsilon: float, seed: int, work_dir: Path | None, as_json: bool) -> None:
    """One real round of PEERS synthetic peers on loopback: wall time per phase; per role CPU per accepted
    report beside its cryptographic floor measured in the same run, and peak memory. Exits non-zero if the
    round fails or accepts under 99% of the prepared messages (the demo's exit codes)."""
    import trio
    from rich.console import Console

    from anonml.bench.round import report_lines, run_round_bench
    from anonml.demo import until_signalled

    work = work_dir or Path(tempfile.mkdtemp(prefix="anonml-bench-round-"))
    work.mkdir(parents=True, exist_ok=True)
    # The round's progress goes to stderr: stdout carries the figures (or the JSON) alone.
    result = trio.run(until_signalled, run_round_bench, peers, workers, seed, epsilon, work, Console(stderr=True))
    if isinstance(result, int):
        click.echo(f"stopped by signal {result}; every child process was stopped; files in {work}", err=True)
        sys.exit(128 + result)
    click.echo(json.dumps(result, indent=2) if as_json else "\n".join(report_lines(result)))
    if result["exit_code"]:
        sys.exit(result["exit_code"])


@click.command("netns")
@click.option("--peers", type=click.IntRange(min=8), default=None, help="How many peers (default: every training row, 398).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="Peer worker processes.")
@click.option("--delay-ms", type=click.FloatRange(min=0), default=25.0, show_default=True,
              help="netem delay on every link, each way: a round trip between two hosts is twice this.")
@click.option("--loss", type=click.FloatRange(0, 100), default=1.0, show_default=True, help="netem loss on every link, each way (%).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--work-dir", type=click.Path(path_type=Path), default=None, help="Keep every process's files here.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def bench_netns(peers: int | None, workers: int, delay_ms: float, loss: float, seed: int, work_dir: Path | None,
                as_json: bool) -> None:
    """The demo's round with the aggregator, each relay and the peers in their own network namespaces (root only).

    Every link carries `tc netem delay DELAY loss LOSS`; the round trip is measured with TCP handshakes before
    the round, and the planner sizes the windows with it. Exits as the demo does (3 failed, 4 under 99%
    accepted or a message counted twice, 5 degraded), 6 when the aggregator's timing guess or rho(send,
    arrival) is more than 3 standard errors off chance, 128 + N when signal N stopped it. The namespaces are
    removed on the way out.
    """
    from rich.console import Console

    from anonml.bench.netns import run_netns, verdict

    console = Console(stderr=True, quiet=as_json)
    work = work_dir or Path(tempfile.mkdtemp(prefix="anonml-netns-"))
    work.mkdir(parents=True, exist_ok=True)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signum)

    # SIGTERM, like Ctrl-C, unwinds through the namespaces' removal (while the round runs, both go to its driver).
    signal.signal(signal.SIGTERM, interrupt)
    try:
        result = run_netns(peers, workers, seed, delay_ms, loss, work, lambda text: console.print(text, markup=False))
    except RuntimeError as error:
        raise click.ClickException(str(error)) from error
    except KeyboardInterrupt as stop:
        signum = int(stop.args[0]) if stop.args else signal.SIGINT
        click.echo(f"stopped by signal {signum} while the network was built; its namespaces were removed", err=True)
        raise SystemExit(128 + signum) from None
    if result.get("interrupted") is not None:
        click.echo(f"stopped by signal {result['interrupted']}; every process and namespace was removed; files in {work}", err=True)
        raise SystemExit(128 + int(result["interrupted"]))
    code, problems = verdict(result)
    result.update(exit_code=code, failures=problems)
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
    else:
        for line in netns_lines(result):
            click.echo(line)
    if code:
        raise SystemExit(code)


def netns_lines(result: dict[str, Any]) -> list[str]:
    """The figures of ``anonml bench netns``, one line each."""
    rtt = result["round_trip"]
    lines = [result["network"],
             f"measured round trip peers -> aggregator, {rtt['probes']} TCP handshakes: median {rtt['median_ms']:.1f} ms "
             f"(min {rtt['min_ms']:.1f}, max {rtt['max_ms']:.1f}; {rtt['retransmitted']} retransmitted)"]
    summary = result.get("summary")
    if summary is not None:
        audit = summary["audit"]
        share = audit["accepted"] / audit["prepared"] if audit["prepared"] else 1.0
        lines.append(f"outcome {summary['phase']}: accepted {audit['accepted']} of {audit['prepared']} messages "
                     f"({100 * share:.2f}%; {summary['sends']} sends, {summary['resends']} resent, {summary['covers']} covers); "
                     f"lost {audit['lost']} {audit['lost_by_reason']}, counted twice {audit['counted_twice']}")
        anonymity = summary.get("anonymity") or {}
        if "aggregator_guess" in anonymity:
            guess = anonymity["aggregator_guess"]
            lines.append(f"aggregator's timing guess: {100 * guess['accuracy']:.2f}% right over {guess['messages']} messages, "
                         f"chance {100 * guess['chance']:.2f}% (1 s.e. {100 * guess['standard_error_at_chance']:.2f} pp); "
                         f"rho(send, arrival) {anonymity['spearman_rho']:+.3f} (1 s.e. {anonymity['rho_standard_error']:.3f})")
        lines.append(f"round {summary['wall_seconds']:.0f} s, windows planned with the measured round trip; "
                     f"report {summary.get('report_path', '')}")
    lines.append(f"bench {result['wall_seconds']} s in all; files in {result['work_dir']}")
    lines.append("FAILED: " + "; ".join(result["failures"]) if result["failures"] else
                 "passed: >= 99% accepted, nothing counted twice, anonymity report at chance")
    return lines


@click.command(name="ingest")
@click.option("--packets", type=click.IntRange(10, 100_000), default=1500, show_default=True)
@click.option("--kills", type=click.IntRange(0, 100), default=0, show_default=True,
              help="Also run this many PostgreSQL rounds with two workers, killing one (SIGKILL) at a random moment of each.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--processes", type=click.IntRange(0, 64), default=1, show_default=True,
              help="Token verification processes per worker (0: in a thread of the worker, one process per worker).")
@click.option("--one-session", is_flag=True,
              help="Start the workers in the bench's own session, not each in its own: on Linux they then share one "
                   "session's CPU share (autogroup) on a machine shared with other jobs.")
@click.option("--pairs", type=click.IntRange(1, 50), default=1, show_default=True,
              help="Run PostgreSQL with 1 worker and with 2 this many times, alternating which goes first; "
                   "the ratio printed is the median of the pairs'.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_ingest(packets: int, kills: int, seed: int, processes: int, one_session: bool, pairs: int, as_json: bool) -> None:
    """Accepted reports/s through ingest workers: SQLite 1 worker, PostgreSQL 1 and 2; SIGKILL audits."""
    from anonml.bench.ingest import run_bench

    figures = run_bench(packets, seed, kills, processes, own_sessions=not one_session, pairs=pairs)
    if as_json:
        click.echo(json.dumps(figures, indent=2))
    else:
        click.echo(f"{figures['frames']} frames; load average {figures['load_average'][0]:.2f} on {figures['cpus']} CPUs; "
                   f"workers {'each in a session of its own' if figures['own_sessions'] else 'in the bench session'}, "
                   f"{figures['processes']} verification processes each")
        for name, run in figures["runs"].items():
            click.echo(f"  {name:24} {run['accepted_per_second']:8.0f} accepted/s  ({run['accepted']} in {run['seconds']:.2f} s; "
                       f"lost {run['lost']}, doubled {run['doubled']}; CPU ms per report: workers "
                       f"{run['worker_cpu_ms_per_report']:.3f}, their verifiers {run['verifier_cpu_ms_per_report']:.3f}, "
                       f"server {run['server_cpu_ms_per_report']:.3f})")
        for index, pair in enumerate(figures["pairs"][1:], start=2):
            one, two = pair["postgresql, 1 worker"], pair["postgresql, 2 workers"]
            click.echo(f"  pair {index}{' (2 workers first)' if index % 2 == 0 else ''}: 1 worker "
                       f"{one['accepted_per_second']:.0f}/s, 2 workers {two['accepted_per_second']:.0f}/s: x{pair['ratio']:.2f}")
        ratios = [f"{pair['ratio']:.2f}" for pair in figures["pairs"]]
        median_of = f" (median of {len(ratios)} pairs: {', '.join(ratios)})" if len(ratios) > 1 else ""
        click.echo(f"  PostgreSQL 2 workers / 1 worker: x{figures['ratio_pg2_to_pg1']:.2f}{median_of}; "
                   f"PostgreSQL / SQLite with 1 worker: x{figures['ratio_pg1_to_sqlite1']:.2f}; "
                   f"2 workers / 1 if CPU alone limited them: at most x{figures['cpu_bound_ratio_ceiling']:.2f}")
        for index, run in enumerate(figures["kills"]):
            click.echo(f"  kill {index + 1}: worker killed after {run['killed_after_seconds']:.2f} s holding {run['claimed_at_kill']} "
                       f"claimed rows, {run['resent']} resent; "
                       f"accepted {run['accepted']}, lost {run['lost']}, doubled {run['doubled']}, "
                       f"never acknowledged {run['unacknowledged']}; rejected {run['rejected']}")
    paired = [run for pair in figures["pairs"] for run in (pair["postgresql, 1 worker"], pair["postgresql, 2 workers"])]
    bad = [run for run in [*figures["runs"].values(), *paired, *figures["kills"]] if run["lost"] or run["doubled"]]
    if bad:
        raise SystemExit(1)


@click.command("mechanisms")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON instead of tables.")
@click.option("--n", "n", default=10_000, show_default=True, help="Reports per histogram in the error table.")
@click.option("--reps", default=20, show_default=True, help="Repetitions per (m, epsilon, oracle).")
@click.option("--seed", default=20240601, show_default=True, help="Seed of the numpy generator.")
@click.option("--scale-n", default=100_000, show_default=True, help="Reports per domain size in the scale table (m up to 1e6).")
def bench_mechanisms(as_json: bool, n: int, reps: int, seed: int, scale_n: int) -> None:
    """Histogram error of every frequency oracle (empirical vs exact), what
    `auto` picks, and time and peak memory of every oracle up to m = 1e6."""
    from rich.console import Console

    from anonml.bench.mechanisms import auto_vs_pq, error_table, render, scale

    if n < 1 or reps < 1 or scale_n < 1:
        raise click.BadParameter(f"n, reps and scale-n must be >= 1, got {n!r}, {reps!r}, {scale_n!r}")
    rows = error_table(n, reps, seed)
    speed = scale(scale_n, seed + 1)
    if as_json:
        click.echo(
            json.dumps(
                {"n": n, "reps": reps, "seed": seed, "errors": rows, "auto_vs_pq": auto_vs_pq(rows), "scale_n": scale_n, "scale": speed},
                indent=2,
            )
        )
        return
    console = Console()
    if not console.is_terminal:
        # Piped output would otherwise be wrapped at 80 columns.
        console = Console(width=160)
    render(console, n, reps, rows, speed, scale_n)


@click.command("relay")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--packets", default=3000, show_default=True, type=click.IntRange(min=1),
              help="Packets sent through the cascade.")
@click.option("--synchronous", type=click.Choice(["FULL", "NORMAL"]), default="FULL", show_default=True,
              help="The relays' SQLite synchronous mode (FULL survives power loss).")
@click.option("--repeat", default=500, show_default=True, type=click.IntRange(min=10),
              help="Calls per isolated crypto figure.")
def bench_relay(as_json: bool, packets: int, synchronous: str, repeat: int) -> None:
    """Packets/s through 3 relays on loopback with zero-length windows, and where the time goes."""
    from anonml.bench.relay import RELAYS, SEND_BATCH, run_benchmark

    if packets < SEND_BATCH:
        raise click.BadParameter(f"at least {SEND_BATCH} (one send batch)", param_hint="--packets")
    result = run_benchmark(packets, synchronous, repeat)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(result["setup"])
    verdict = "meets" if result["meets_target"] else "MISSES"
    click.echo(f"end to end: {result['packets_per_second']:.0f} packets/s ({result['delivered']}/{result['packets']} "
               f"in {result['elapsed_s']} s; {verdict} the {result['target_packets_per_second']:.0f}/s target)")
    click.echo(f"baseline: one X25519 multiplication {result['baseline_x25519_us']} µs")
    click.echo(f"isolated process_packet (bench crypto): {result['isolated_process_hop_us']} µs per hop "
               f"= {result['isolated_process_hop_x_x25519']} x X25519; final hop {result['isolated_process_final_us']} µs")
    click.echo(f"sink (final layer, in run): {result['sink_process_us']} CPU µs per packet")
    click.echo(f"CPU per packet, all 4 processes: {result['cpu_us_per_packet_all_processes']} µs "
               f"(driver incl. sink and sender {result['driver_cpu_us_per_packet']} µs) -> CPU-bound capacity "
               f"{result['cpu_bound_capacity_packets_per_second']:.0f} packets/s on {os.cpu_count()} idle cores")
    if result["floor_sphinx_cpu_us_per_packet"] is not None:
        click.echo(f"floor, Sphinx unwrapping only ({RELAYS} hops + final, isolated): "
                   f"{result['floor_sphinx_cpu_us_per_packet']} CPU µs per packet -> {result['floor_packets_per_second']:.0f} "
                   f"packets/s on {os.cpu_count()} idle cores; the cascade costs {result['cpu_x_floor']} x the floor")
    click.echo("per relay, CPU µs per packet: process = intake (Sphinx + SQLite writes) + rest (link I/O, "
               "scheduler, forwarding)")
    for figures in result["per_relay"]:
        click.echo(f"  relay {figures['relay']}: {figures['cpu_us']:6.1f} = {figures['intake_cpu_us']:6.1f} + "
                   f"{figures['forward_link_cpu_us']:6.1f}   (received {figures['received']}, "
                   f"forwarded {figures['forwarded']})")
    split = result["intake_split_cpu_us"]
    click.echo(f"intake split, same run, measured apart (CPU µs per packet): Sphinx {split['sphinx_us']} | "
               f"replay tag {split['replay_tag_us']} | held insert {split['held_insert_us']} | "
               f"commit {split['commit_us']} (one per 64 packets)")
