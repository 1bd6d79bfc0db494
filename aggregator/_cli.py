"""``anonml aggregator``: init, round new, run, report."""

from __future__ import annotations

import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import click

from anonml.aggregator._spec import ROUND_SPEC_EXAMPLE
from anonml.aggregator._store import AggregatorHome
from anonml.errors import ConfigError, StorageError

EXIT_MIN_PARTICIPATION = 3
"""``run``'s exit code when the round missed its minimum participation."""

_data_dir = click.option(
    "--data-dir", required=True, type=click.Path(file_okay=False, path_type=Path), help="The aggregator's data directory."
)


@click.group()
def aggregator() -> None:
    """Run rounds: announce, register peers, issue credentials, collect, learn."""


@aggregator.command()
@_data_dir
def init(data_dir: Path) -> None:
    """Create the Ed25519 identity and the X25519 final-hop key (never overwrites)."""
    import os

    from anonml.crypto import generate_keypair

    home = AggregatorHome(data_dir)
    if home.identity_path.exists() or home.final_hop_path.exists():
        raise click.ClickException(f"{data_dir} already holds an aggregator identity; refusing to overwrite it")
    home.initialise(os.urandom(32), generate_keypair()[0])
    identity = bytes(home.signing_key().verify_key)
    click.echo(f"aggregator identity {identity.hex()} in {data_dir}")


@aggregator.group(name="round")
def round_group() -> None:
    """Create rounds."""


# "\b" keeps click from rewrapping each paragraph of the example.
@round_group.command(name="new", epilog="Example spec:\n\n\b\n" + ROUND_SPEC_EXAMPLE.replace("\n\n", "\n\n\b\n"))
@_data_dir
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path))
def round_new(data_dir: Path, spec_path: Path) -> None:
    """Validate SPEC, create the round (issuer key, seed commitment, signed manifest) and print its id."""
    from anonml.aggregator._setup import create_round
    from anonml.aggregator._spec import RoundSpecError, parse_round_spec

    try:
        document = tomllib.loads(spec_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{spec_path}: not valid TOML: {exc}") from None
    try:
        spec = parse_round_spec(document)
    except RoundSpecError as exc:
        raise click.ClickException(f"{spec_path}: {exc}") from None
    home = AggregatorHome(data_dir)
    try:
        state, codes = create_round(home, spec, now=int(time.time()))
    except (FileNotFoundError, ConfigError, StorageError) as exc:
        raise click.ClickException(str(exc)) from None
    directory = home.round_dir(state.round_id)
    if codes:
        (directory / "invitations.txt").write_text("".join(f"{code}\n" for code in codes))
        click.echo(f"{len(codes)} invitation codes in {directory / 'invitations.txt'}", err=True)
    schedule = state.manifest.schedule
    click.echo(f"registration closes at {schedule.t_register_end}, data delivery ends at {schedule.end}", err=True)
    click.echo(state.round_id.hex())


def _latest_round(home: AggregatorHome) -> str:
    rounds = home.rounds()
    if not rounds:
        raise click.ClickException(f"no rounds in {home.root}; create one with `anonml aggregator round new`")
    return max(rounds, key=lambda r: (home.root / "rounds" / r).stat().st_mtime)


@aggregator.command()
@_data_dir
@click.option("--round", "round_id", default=None, help="Round id (default: the newest round).")
@click.option("--test-file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Labelled held-out file to measure utility on: CSV with a header naming the features and the label, or UCI Adult format.")
@click.option("--linger", type=float, default=0.0, help="Keep serving this many seconds after the round ends.")
@click.option("--processes", type=click.IntRange(0, 64), default=0,
              help="Worker processes for blind issuance and token verification (0: in a thread of the service).")
def run(data_dir: Path, round_id: str | None, test_file: Path | None, linger: float, processes: int) -> None:
    """Serve the round through all its phases, then learn and write the report."""
    import trio

    from anonml.aggregator._report import learn, summarise, write_report
    from anonml.aggregator._round import RoundState
    from anonml.aggregator._service import AggregatorConfig, serve_aggregator
    from anonml.aggregator._setup import open_round

    home = AggregatorHome(data_dir)
    chosen = round_id or _latest_round(home)
    try:
        state = open_round(home, chosen)
    except (FileNotFoundError, ValueError, ConfigError, StorageError) as exc:
        raise click.ClickException(str(exc)) from None
    directory = home.round_dir(state.round_id)
    manifest = state.manifest
    host, port = manifest.aggregator_url.removeprefix("http://").rsplit(":", 1)

    def on_learn(s: RoundState) -> dict[str, Any]:
        report = learn(s, directory, test_file=test_file)
        return {"report": str(directory / "report.json"), "accepted": report["counts"]["accepted"]}

    config = AggregatorConfig(
        state, http_host=host, http_port=int(port), sink_host=manifest.aggregator_hop.host,
        sink_port=manifest.aggregator_hop.port, worker_processes=processes, linger=linger,
        on_learn=on_learn,
    )

    async def main() -> str:
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(serve_aggregator, config)
            click.echo(f"round {state.round_id.hex()[:16]}… serving {addresses.http_url}, packet sink {addresses.sink}", err=True)
        return state.outcome() or "failed"

    try:
        outcome = trio.run(main)
    except (KeyboardInterrupt, OSError, BaseExceptionGroup) as exc:
        # trio wraps failures of the serving tasks in exception groups.
        group = exc if isinstance(exc, BaseExceptionGroup) else BaseExceptionGroup("run", [exc])
        if group.subgroup(KeyboardInterrupt) is not None:
            click.echo(f"interrupted; `anonml aggregator run --data-dir {data_dir} --round {chosen}` resumes the round", err=True)
            sys.exit(130)
        address_errors = group.subgroup(OSError)
        if address_errors is None:
            raise
        raise click.ClickException(f"cannot serve the round: {address_errors.exceptions[0]}") from None
    if outcome == "failed":
        detail = json.loads(state.store.get_result("outcome") or b"{}")
        report = {"round_id": state.round_id.hex(), "name": manifest.name, "status": "failed", **detail,
                  "rejected": state.store.rejections()}
        write_report(report, directory)
        click.echo(f"round FAILED: {detail.get('reason', 'unknown')}", err=True)
        sys.exit(EXIT_MIN_PARTICIPATION)
    report_json = json.loads((directory / "report.json").read_text())
    for line in summarise(report_json):
        click.echo(line)
    click.echo(f"report: {directory / 'report.html'}")


@aggregator.command()
@_data_dir
@click.argument("round_id")
def report(data_dir: Path, round_id: str) -> None:
    """Summarise ROUND's report on the terminal (report.json and report.html are in its directory)."""
    from anonml.aggregator._report import summarise

    directory = AggregatorHome(data_dir).root / "rounds" / round_id
    path = directory / "report.json"
    if not path.is_file():
        raise click.ClickException(f"no report for round {round_id!r} (has it finished?)")
    for line in summarise(json.loads(path.read_text())):
        click.echo(line)
    click.echo(f"report: {directory / 'report.html'}")
