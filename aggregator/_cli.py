"""``anonml aggregator``: init, round new, rounds, run, report.

Rounds are named by their id (the manifest hash, 64 hex digits) or any
unique prefix of it (the 16 digits every command prints); ``rounds`` lists
them with their status.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from anonml.aggregator._spec_example import ROUND_SPEC_EXAMPLE
from anonml.base.display import duration, local_time
from anonml.base.errors import ConfigError
from anonml.base.process import freeze_startup_heap
from anonml.base.storage import lock_data_dir, write_secret_file

if TYPE_CHECKING:
    import trio

    from anonml.aggregator._round import RoundState
    from anonml.aggregator._home import AggregatorHome

# The aggregator's own modules are imported by the commands that use them, so
# `anonml aggregator round new --help` loads click alone (issue 29).

EXIT_MIN_PARTICIPATION = 3
"""``run``'s exit code when the round failed: minimum participation missed, or a short survey with ``on_shortfall = "fail"``."""

EXIT_DEGRADED = 4
"""``run``'s exit code when the round learnt and published a model although a survey fell short (status ``degraded``)."""

SHORT_ID = 16
"""Hex digits of a round id that commands print (any unique prefix names the round)."""

_data_dir = click.option(
    "--data-dir", required=True, type=click.Path(file_okay=False, path_type=Path), help="The aggregator's data directory."
)


_store_option = click.option(
    "--store", envvar="ANONML_AGGREGATOR_STORE", default=None, metavar="URL",
    help="Run the round on PostgreSQL: a postgresql:// URL (or set ANONML_AGGREGATOR_STORE, which keeps a password "
         "out of the process list). The round's SQLite store is copied there the first time. Default: SQLite.")


_max_inbox_per_relay_option = click.option(
    "--max-inbox-per-relay", type=click.IntRange(min=1), default=None, metavar="N",
    help="Undecided messages one delivering relay may have in the round's inbox; past it the sink answers that relay "
         "alone BUSY. Default: an equal share of the whole inbox's cap among the manifest's relays.")


@click.group()
def aggregator() -> None:
    """Run rounds: announce, register peers, issue credentials, collect, learn."""


@aggregator.command()
@_data_dir
def init(data_dir: Path) -> None:
    """Create the Ed25519 identity and the X25519 final-hop key (never overwrites)."""
    import os

    from anonml.aggregator._home import AggregatorHome
    from anonml.crypto import generate_keypair

    home = AggregatorHome(data_dir)
    if home.identity_path.exists() or home.final_hop_path.exists():
        raise click.ClickException(f"{data_dir} already holds an aggregator identity; refusing to overwrite it")
    home.initialise(os.urandom(32), generate_keypair()[0])
    identity = bytes(home.signing_key().verify_key)
    click.echo(f"aggregator identity {identity.hex()} in {data_dir}")
    click.echo(f"next: give relay operators `--aggregator {identity.hex()}@http://HOST:PORT`, then "
               f"`anonml aggregator round new --data-dir {data_dir} --spec round.toml`", err=True)


def _existing_home(data_dir: Path) -> AggregatorHome:
    """The aggregator's home, or a message naming the command that creates it."""
    from anonml.aggregator._home import AggregatorHome

    home = AggregatorHome(data_dir)
    if not data_dir.is_dir():
        raise ConfigError(f"no aggregator data directory {str(data_dir)!r}: create one with `anonml aggregator init --data-dir {data_dir}`")
    if not home.identity_path.exists():
        raise ConfigError(f"{str(data_dir)!r} holds no aggregator identity: run `anonml aggregator init --data-dir {data_dir}` first")
    return home


def _created(home: AggregatorHome, round_id: str) -> int:
    """When ``round new`` made the round (recorded in its database, which listing does not change)."""
    from anonml.aggregator._setup import round_created
    from anonml.aggregator._store import RoundStore

    store = RoundStore(home.root / "rounds" / round_id / "round.sqlite")
    try:
        return round_created(store)
    finally:
        store.close()


def resolve_round(home: AggregatorHome, text: str | None) -> str:
    """The full id of the round ``text`` names (a unique prefix of its id); the newest round if None."""
    rounds = home.rounds()
    if not rounds:
        raise ConfigError(f"no rounds in {str(home.root)!r} yet: create one with `anonml aggregator round new --data-dir {home.root} --spec round.toml`")
    if text is None:
        return max(rounds, key=lambda r: (_created(home, r), r))
    wanted = text.strip().lower().rstrip("…")
    matches = [r for r in rounds if r.startswith(wanted)] if wanted else []
    if len(matches) == 1:
        return matches[0]
    listing = f"`anonml aggregator rounds --data-dir {home.root}` lists them"
    if not matches:
        raise ConfigError(f"no round {text!r} in {str(home.root)!r}: {listing}")
    raise ConfigError(f"{text!r} names {len(matches)} rounds ({', '.join(m[:SHORT_ID] for m in matches)}): give more digits; {listing}")


@aggregator.group(name="round")
def round_group() -> None:
    """Create rounds."""


def _parse_start(value: str | None, now: int) -> int | None:
    """``--start``: ``+90s``/``+10m``/``+2h``, an ISO date-time (local time without an offset), or None."""
    import datetime
    import re

    if value is None:
        return None
    relative = re.fullmatch(r"\+(\d{1,7})([smh]?)", value.strip())
    if relative:
        return now + int(relative.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[relative.group(2)]
    try:
        moment = datetime.datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: use +SECONDS, +MINUTESm, +HOURSh or a date-time such as 2026-12-01T09:00", param_hint="--start") from None
    return int((moment if moment.tzinfo is not None else moment.astimezone()).timestamp())


# "\b" keeps click from rewrapping each paragraph of the example.
@round_group.command(name="new", epilog="Example spec:\n\n\b\n" + ROUND_SPEC_EXAMPLE.replace("\n\n", "\n\n\b\n"))
@_data_dir
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--start", default=None, metavar="WHEN",
              help="When the round's schedule starts (registration closes `register` seconds later): +SECONDS, +10m, "
                   "+1h, or a date-time (local unless it has an offset). Default: the spec's [schedule] start, else now.")
def round_new(data_dir: Path, spec_path: Path, start: str | None) -> None:
    """Validate SPEC, create the round (issuer key, seed commitment, signed manifest) and print its id."""
    from anonml.aggregator._setup import create_round
    from anonml.aggregator._spec import RoundSpecError, plan_by_simulation, read_round_spec
    from anonml.protocol import smallest_anonymity_set

    def planner(*args: Any) -> Any:
        click.echo(f"plan = \"auto\": simulating the round's candidate plans for {args[1]} peers (can take minutes)", err=True)
        return plan_by_simulation(*args)

    try:
        spec = read_round_spec(spec_path.read_bytes(), base_dir=spec_path.parent, planner=planner)
    except RoundSpecError as exc:
        raise click.ClickException(f"{spec_path}: {exc}") from None
    home = _existing_home(data_dir)
    now = int(time.time())
    begins = _parse_start(start, now) or spec.schedule.start or now
    if begins < now - 1:
        raise click.ClickException(
            f"the schedule starts at {local_time(begins)}, {duration(now - begins)} ago, so registration would already "
            f"be {'closed' if begins + spec.schedule.register <= now else 'partly over'}: set a later [schedule] start "
            f"in {spec_path}, or pass --start +10m"
        )
    state, codes = create_round(home, spec, now=begins)
    directory = home.round_dir(state.round_id)
    if codes:
        # Each code admits one registration: a secret, owner-only like the keys.
        write_secret_file(directory / "invitations.txt", "".join(f"{code}\n" for code in codes).encode())
        click.echo(f"{len(codes)} invitation codes in {directory / 'invitations.txt'}", err=True)
    schedule = state.manifest.schedule
    round_id = state.round_id.hex()
    click.echo(f"round {spec.name!r} ({round_id[:SHORT_ID]}) created", err=True)
    if spec.planned is not None:
        click.echo(f"  the planner chose {spec.planned.label()}, vote {spec.planned.combiner} "
                   f"(simulated AUC {spec.planned.simulated_auc:.3f})", err=True)
    manifest = state.manifest
    smallest = smallest_anonymity_set(manifest.min_participation, manifest.k_p, manifest.comparison_pool, manifest.median_rounds)
    click.echo(f"  at its minimum participation ({manifest.min_participation} peers) the smallest survey holds {smallest}; "
               f"the signed minimum anonymity set is {manifest.min_anonymity_set}", err=True)
    click.echo(f"  registration closes {local_time(schedule.t_register_end)} (in {duration(schedule.t_register_end - now)}); "
               f"data delivery ends {local_time(schedule.end)}", err=True)
    click.echo(f"  peers can register only while the aggregator serves it: start "
               f"`anonml aggregator run --data-dir {data_dir} --round {round_id[:SHORT_ID]}` before registration closes", err=True)
    click.echo(round_id)


def round_status(home: AggregatorHome, round_id: str, now: int) -> dict[str, Any]:
    """What ``rounds`` shows of one round: name, status, times, counts (read without the keys)."""
    from anonml.aggregator._setup import round_created
    from anonml.aggregator._store import RoundStore
    from anonml.protocol import SignedManifest, phase_at

    store = RoundStore(home.root / "rounds" / round_id / "round.sqlite")
    try:
        manifest_json = store.get_meta("manifest")
        outcome = store.get_result("outcome")
        counts = store.counts()
        created = round_created(store)
    finally:
        store.close()
    if manifest_json is None:
        return {"round_id": round_id, "name": "?", "status": "incomplete", "counts": counts, "created": created}
    manifest = SignedManifest.from_json(manifest_json).manifest
    schedule = manifest.schedule
    if outcome is not None:
        status = json.loads(outcome)["phase"]
    elif registration_missed(schedule.t_register_end, now, counts.get("registered", 0)):
        status = "never served: registration closed with no peer (make a new round)"
    elif counts.get("registered", 0) == 0:
        status = "waiting: start `aggregator run` before registration closes"
    else:
        phase, _ = phase_at(schedule, now)
        status = f"{phase}: running, or stopped (`aggregator run` resumes it)"
    return {
        "round_id": round_id, "name": manifest.name, "status": status, "counts": counts, "created": created,
        "registration_closes": schedule.t_register_end, "ends": schedule.end,
    }


@aggregator.command()
@_data_dir
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def rounds(data_dir: Path, as_json: bool) -> None:
    """List the rounds in DATA_DIR with their status and short ids (any unique prefix names a round)."""
    home = _existing_home(data_dir)
    now = int(time.time())
    listed = sorted((round_status(home, r, now) for r in home.rounds()), key=lambda item: (item["created"], item["round_id"]))
    if as_json:
        click.echo(json.dumps(listed, indent=2))
        return
    if not listed:
        click.echo(f"no rounds yet: create one with `anonml aggregator round new --data-dir {data_dir} --spec round.toml`")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    for column in ("id", "name", "status", "registered", "accepted", "registration closes", "ends"):
        table.add_column(column)
    for item in listed:
        counts = item["counts"]
        table.add_row(
            item["round_id"][:SHORT_ID], item["name"], item["status"], str(counts.get("registered", 0)),
            str(counts.get("accepted", 0)),
            local_time(item["registration_closes"]) if "registration_closes" in item else "",
            local_time(item["ends"]) if "ends" in item else "",
        )
    Console(width=160).print(table)


# Every peer reads its partition's final receipt log at t_r, polling at most 2 s apart until it is signed
# (peer._client.retry_delay), then compares it with the relays' mirrors. Served no longer than the round, a peer
# that asked a moment late found the port closed and ended unconfirmed (tests/test_readme_walk.py, once
# learning no longer spent 2 s importing scikit-learn after t_r).
FINAL_LOG_SECONDS = 10.0


@aggregator.command()
@_data_dir
@click.option("--round", "round_id", default=None, help="Round id or a unique prefix of it (default: the newest round).")
@click.option("--test-file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Labelled held-out file to measure utility on: CSV with a header naming the features and the label, or UCI Adult format.")
@click.option("--linger", type=click.FloatRange(min=0), default=FINAL_LOG_SECONDS, show_default=True,
              help="Keep serving this many seconds after the round ends (its peers read the final receipt log then).")
@click.option("--processes", type=click.IntRange(0, 64), default=1, show_default=True,
              help="Worker processes for blind issuance and token verification, at a lower CPU priority than the "
                   "service (0: in a thread of the service).")
@_store_option
@click.option("--sink-port", type=click.IntRange(1, 65535), default=None,
              help="Take packets at this port instead of the manifest's (something in front forwards the manifest's port here).")
@_max_inbox_per_relay_option
def run(data_dir: Path, round_id: str | None, test_file: Path | None, linger: float, processes: int, store: str | None,
        sink_port: int | None, max_inbox_per_relay: int | None) -> None:
    """Serve the round through all its phases, then learn and write the report.

    While it runs, its live dashboard is at http://HOST:PORT/dashboard.
    """
    import trio

    from anonml.aggregator._progress import watch_round
    from anonml.aggregator._report import learn
    from anonml.aggregator._round import RoundState
    from anonml.aggregator._service import AggregatorConfig, serve_aggregator
    from anonml.aggregator._setup import open_round
    from anonml.aggregator._sink import InboxLimits

    inbox = InboxLimits(max_per_relay=max_inbox_per_relay)
    home = _existing_home(data_dir)
    chosen = resolve_round(home, round_id)
    lock = lock_data_dir(data_dir, command="anonml aggregator run")
    lock.__enter__()  # held until this process exits (the kernel releases it however it ends)
    state = open_round(home, chosen, store_url=store)
    directory = home.round_dir(state.round_id)
    manifest = state.manifest
    _refuse_missed_registration(state, data_dir)
    import httpx

    url = httpx.URL(manifest.aggregator_url)

    def on_learn(s: RoundState) -> dict[str, Any]:
        report = learn(s, directory, test_file=test_file)
        return {"report": str(directory / "report.json"), "accepted": report["counts"]["accepted"]}

    ended: list[str] = []  # the outcome, once the round ended and its summary was printed

    def on_end(outcome: str) -> None:
        _print_outcome(state, directory, outcome)  # before the linger, not after it
        ended.append(outcome)
        if linger > 0:
            click.echo(f"the round is over; its dashboard stays up {duration(linger)} (--linger); SIGINT or SIGTERM ends it now",
                       err=True)

    config = AggregatorConfig(
        state, http_host=url.host, http_port=url.port or 80, sink_host=manifest.aggregator_hop.host,
        sink_port=sink_port or manifest.aggregator_hop.port, worker_processes=processes, linger=linger,
        on_learn=on_learn, on_end=on_end, inbox_limits=inbox,
    )

    stopped_by: list[str] = []

    async def main() -> str:
        # SIGTERM and SIGINT cancel the service, so its worker processes are shut down with it
        # (issue 14: killed by the default SIGTERM action, the workers and the resource tracker lived on).
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    async for signum in signals:
                        stopped_by.append(signal.Signals(signum).name)
                        nursery.cancel_scope.cancel()

                async def serve_then_stop(task_status: trio.TaskStatus[Any]) -> None:
                    await serve_aggregator(config, task_status=task_status)
                    nursery.cancel_scope.cancel()  # the round is over: stop watching it

                nursery.start_soon(stop_on_signal)
                if state.store.engine == "postgresql":
                    # One driver per round: wait for the lease, and stop if another process takes it.
                    await nursery.start(_hold_driver_lease, state, nursery.cancel_scope, stopped_by)
                addresses = await nursery.start(serve_then_stop)
                click.echo(f"round {manifest.name!r} ({state.round_id.hex()[:SHORT_ID]}) serving {addresses.http_url}, "
                           f"packet sink {addresses.sink[0]}:{addresses.sink[1]}", err=True)
                click.echo(f"  live dashboard: {addresses.http_url}/dashboard", err=True)
                nursery.start_soon(watch_round, state)
        return state.outcome() or "failed"

    freeze_startup_heap()
    try:
        outcome = trio.run(main)
    except (KeyboardInterrupt, BaseExceptionGroup, OSError) as exc:
        group = exc if isinstance(exc, BaseExceptionGroup) else BaseExceptionGroup("run", [exc])
        if group.subgroup(KeyboardInterrupt) is not None:
            click.echo(f"interrupted; `anonml aggregator run --data-dir {data_dir} --round {chosen[:SHORT_ID]}` resumes the round", err=True)
            sys.exit(130)
        address_errors = group.subgroup(OSError)
        if address_errors is None:
            raise
        raise click.ClickException(_address_problem(_first_leaf(address_errors), manifest.aggregator_url)) from None
    if stopped_by and not ended:
        click.echo(f"stopped ({stopped_by[0]}); `anonml aggregator run --data-dir {data_dir} --round "
                   f"{chosen[:SHORT_ID]}` resumes the round", err=True)
        sys.exit(130 if stopped_by[0] == "SIGINT" else 143)
    if stopped_by:
        click.echo(f"stopped ({stopped_by[0]}) while lingering after the round ended ({ended[0]})", err=True)
    sys.exit({"failed": EXIT_MIN_PARTICIPATION, "degraded": EXIT_DEGRADED}.get(outcome, 0))


async def _hold_driver_lease(state: RoundState, scope: trio.CancelScope, stopped_by: list[str],
                             task_status: trio.TaskStatus[None]) -> None:
    """Hold the round's driver lease (PostgreSQL: one driver per round); cancel ``scope`` if another process takes it."""
    import os
    import socket

    from anonml.aggregator._ingest import LeaseLost, hold_lease

    try:
        await hold_lease(state.store, f"{socket.gethostname()}:{os.getpid()}", task_status=task_status)
    except LeaseLost as exc:
        click.echo(f"stopping: {exc}", err=True)
        stopped_by.append("lease lost")
        scope.cancel()


def _print_outcome(state: Any, directory: Path, outcome: str) -> None:
    """The round's summary (and the failed round's report), printed when the round ends."""
    from anonml.aggregator._dashboard import dashboard_data
    from anonml.aggregator._report import summarise, write_report

    detail = json.loads(state.store.get_result("outcome") or b"{}")
    if outcome == "failed":
        report = {"round_id": state.round_id.hex(), "name": state.manifest.name, "status": "failed", **detail,
                  "rejected": state.store.rejections()}
        write_report(report, directory, dashboard_data(state, None, report))
        click.echo(f"round FAILED: {detail.get('reason', 'unknown')}", err=True)
        return
    for line in summarise(json.loads((directory / "report.json").read_text())):
        click.echo(line)
    click.echo(f"report: {directory / 'report.html'}")
    if outcome == "degraded":
        click.echo(f"round DEGRADED: {detail.get('reason', 'a survey fell short')}", err=True)


@aggregator.command()
@_data_dir
@click.option("--round", "round_id", default=None, help="Round id or a unique prefix of it (default: the newest round).")
@_store_option
@click.option("--name", required=True, help="This worker's name, unique among the round's workers (a restart reuses it).")
@click.option("--host", default=None, help="Address to take packets at (default: the manifest's sink host).")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="Port (0: a free one, printed).")
@click.option("--processes", type=click.IntRange(0, 64), default=1, show_default=True,
              help="Token verification processes, at a lower CPU priority (0: a thread).")
@click.option("--claim-seconds", type=click.FloatRange(0.5, 3600), default=30.0, show_default=True,
              help="How long inbox rows this worker claimed stay its own if it stops deciding them (then others take them).")
@_max_inbox_per_relay_option
def worker(data_dir: Path, round_id: str | None, store: str | None, name: str, host: str | None, port: int,
           processes: int, claim_seconds: float, max_inbox_per_relay: int | None) -> None:
    """Take and verify a round's packets beside `aggregator run`, sharing its store (--store: PostgreSQL).

    Relays spread their deliveries over the sink addresses the manifest lists (network.sink_workers) and
    move what one fails to take to the others; a worker killed at any moment loses nothing and counts nothing twice.
    Workers on one SQLite file follow the same rules but take turns at its write lock.
    """
    import trio

    from anonml.aggregator._ingest import serve_ingest
    from anonml.aggregator._setup import open_round
    from anonml.aggregator._sink import InboxLimits

    inbox = InboxLimits(max_per_relay=max_inbox_per_relay)
    home = _existing_home(data_dir)
    chosen = resolve_round(home, round_id)
    state = open_round(home, chosen, store_url=store)
    bind = host or state.manifest.aggregator_hop.host

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                address = await nursery.start(lambda task_status: serve_ingest(
                    state, host=bind, port=port, worker=name, processes=processes, claim_seconds=claim_seconds,
                    inbox=inbox, task_status=task_status))
                click.echo(f"worker {name} of round {chosen[:SHORT_ID]} taking packets at {address[0]}:{address[1]}", err=True)
                if (address[0], address[1]) not in state.manifest.aggregator_hop.endpoints:
                    click.echo("note: the manifest does not list this address (network.sink_workers in the round's "
                               "spec): relays deliver here only if it is reached at one that it lists", err=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel()

    freeze_startup_heap()
    try:
        trio.run(main)
    finally:
        state.store.close()


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception inside ``group`` that is not itself a group (trio nests them per nursery)."""
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _address_problem(error: BaseException, url: str) -> str:
    """A bind failure in words, with the fix."""
    import errno

    text = str(error)
    if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
        return (f"cannot serve the round: an address it needs is in use ({text}); stop the process holding it "
                f"(another `anonml aggregator run`?) or create a round whose spec sets other network.http_port / "
                f"network.sink_port (this one serves {url})")
    return f"cannot serve the round: {text}; check network.http_host and network.sink_host in the round spec"


def registration_missed(registration_closes: int, now: float, registered: int) -> bool:
    """Whether registration closed before any peer registered: such a round can only fail, and `run` refuses it."""
    return now >= registration_closes and registered == 0


def _refuse_missed_registration(state: Any, data_dir: Path) -> None:
    """A round whose registration closed before it was ever served can only fail: say so, and what to do."""
    schedule = state.manifest.schedule
    now = state.now()
    if state.outcome() is None and registration_missed(schedule.t_register_end, now, state.store.counts()["registered"]):
        raise click.ClickException(
            f"registration for this round closed at {local_time(schedule.t_register_end)} ({duration(now - schedule.t_register_end)} "
            f"ago) before any peer registered, so it can only fail: create a new round with "
            f"`anonml aggregator round new --data-dir {data_dir} --spec SPEC --start +5m` and start `aggregator run` "
            "right after (registration is open only while the aggregator serves the round)"
        )


@aggregator.command()
@_data_dir
@click.argument("round_id", required=False)
def report(data_dir: Path, round_id: str | None) -> None:
    """Summarise ROUND's report (a unique prefix of its id; default: the newest round).

    report.json and report.html (the dashboard page, with every figure explained) are in its directory.
    """
    from anonml.aggregator._report import summarise

    home = _existing_home(data_dir)
    chosen = resolve_round(home, round_id)
    directory = home.root / "rounds" / chosen
    path = directory / "report.json"
    if not path.is_file():
        status = round_status(home, chosen, int(time.time()))
        raise click.ClickException(
            f"round {chosen[:SHORT_ID]} has no report yet (status: {status['status']}): its report is written when "
            f"`anonml aggregator run --data-dir {data_dir} --round {chosen[:SHORT_ID]}` finishes it"
        )
    for line in summarise(json.loads(path.read_text())):
        click.echo(line)
    click.echo(f"report: {directory / 'report.html'}")
