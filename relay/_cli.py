"""``anonml relay init / info / run``: what a relay operator types (DESIGN.md §7)."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click

from anonml.crypto import DEFAULT_MAX_HOPS, DEFAULT_PACKET_SIZE
from anonml.base.errors import AnonMLError, ConfigError, StorageError, explain
from anonml.base.process import freeze_startup_heap
from anonml.base.storage import lock_data_dir, write_secret_file

if TYPE_CHECKING:
    from anonml.relay._config import PinnedAggregator, RelayConfig
    from anonml.relay._metrics import RelayCounters

# The relay's own modules (and trio, the server, the keys) are imported by the
# commands that use them, so `anonml relay run --help` loads click alone (issue 29).

logger = logging.getLogger("anonml.relay")

_DATA_DIR = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="The relay's data directory (keys, config, held packets).",
)


@click.group("relay", context_settings={"help_option_names": ["-h", "--help"]})
def relay() -> None:
    """Run a mix relay: hold Sphinx packets and release them inside their windows."""


def _pinned_aggregators(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[PinnedAggregator, ...]:
    from anonml.relay._config import PinnedAggregator
    from anonml.relay._errors import RelayConfigError

    try:
        return tuple(PinnedAggregator.parse(value) for value in values)
    except RelayConfigError as exc:
        raise click.BadParameter(str(exc)) from None


_AGGREGATOR = click.option(
    "--aggregator", "aggregators", multiple=True, metavar="IDENTITY@URL", callback=_pinned_aggregators,
    help="An aggregator this relay serves (repeatable): its Ed25519 identity key as 64 hex digits (printed by "
         "`anonml aggregator init`), '@', its base URL. Its round manifest, if signed by that key, lists the "
         "only next hops the relay forwards to.",
)


def _address(value: str, what: str) -> tuple[str, int]:
    from anonml.relay._config import parse_host_port
    from anonml.relay._errors import RelayConfigError

    try:
        return parse_host_port(value, what=what)
    except RelayConfigError as exc:
        raise click.BadParameter(str(exc)) from None


@relay.command()
@_DATA_DIR
@click.option("--listen", required=True, help="IP:PORT the link server binds, e.g. 127.0.0.1:9000.")
@click.option("--advertise", default=None, help="IP:PORT other nodes use (default: --listen).")
@click.option("--metrics", default=None,
              help="Prometheus endpoint: PORT (on 127.0.0.1) or IP:PORT (default: off).")
@click.option("--mirror", default=None,
              help="Mirror of the pinned aggregators' signed documents for peers: IP:PORT (default: off).")
@click.option("--max-hops", default=DEFAULT_MAX_HOPS, show_default=True, type=click.IntRange(1, 32), help="Geometry: routing slots.")
@click.option("--packet-size", default=DEFAULT_PACKET_SIZE, show_default=True, type=click.IntRange(1), help="Geometry: bytes.")
@_AGGREGATOR
@click.option("--directory-file", default=None, metavar="PATH",
              help="Static next-hop directory JSON (relative to the data directory), instead of or beside "
                   "--aggregator.")
@click.option("--source-shares", default=64, show_default=True, type=click.IntRange(1),
              help="One IP address may hold 1/N of the held packets (1: the whole queue, for peers behind one address).")
@click.option("--prefix-shares", default=32, show_default=True, type=click.IntRange(1),
              help="One /24 may hold 1/N of the held packets (at most --source-shares).")
def init(data_dir: Path, listen: str, advertise: str | None, metrics: str | None, mirror: str | None, max_hops: int,
         packet_size: int, aggregators: tuple[PinnedAggregator, ...], directory_file: str | None,
         source_shares: int, prefix_shares: int) -> None:
    """Create the relay's identity key and a commented config (never overwrites)."""
    from anonml.relay._config import CONFIG_FILE, RelayConfig, render_config
    from anonml.relay._keys import IDENTITY_FILE, KeyRing, create_identity

    if (data_dir / IDENTITY_FILE).exists() or (data_dir / CONFIG_FILE).exists():
        raise click.ClickException(f"{str(data_dir)!r} is already initialised; refusing to overwrite it")
    try:
        config = RelayConfig(
            data_dir=data_dir,
            listen=_address(listen, "--listen"),
            advertise=_address(advertise, "--advertise") if advertise else None,
            metrics=_address(f"127.0.0.1:{metrics}" if metrics.isdigit() else metrics, "--metrics")
            if metrics else None,
            mirror=_address(mirror, "--mirror") if mirror else None,
            max_hops=max_hops,
            packet_size=packet_size,
            directory_aggregators=aggregators,
            directory_file=directory_file,
            source_shares=source_shares,
            prefix_shares=prefix_shares,
        )
        create_identity(data_dir)
    except (ConfigError, StorageError) as exc:
        raise click.ClickException(str(exc)) from None
    if not config.has_directory:
        # `run` would refuse to start: say so now, with the fix (issue 15).
        click.echo(
            "warning: no next-hop directory: `anonml relay run` refuses to start until this relay knows the "
            "aggregator it serves; pass `--aggregator IDENTITY@URL` to `relay run` (or to `relay init`), or set "
            f"[directory] in {data_dir / CONFIG_FILE}",
            err=True,
        )
    write_secret_file(data_dir / CONFIG_FILE, render_config(config).encode())
    KeyRing(data_dir, epoch_seconds=config.key_epoch_seconds, grace_seconds=config.key_grace_seconds).rotate(
        time.time()
    )
    click.echo(f"initialised relay in {data_dir} (config {data_dir / CONFIG_FILE}); see `anonml relay info`")


@relay.command()
@_DATA_DIR
@click.option("--json", "as_json", is_flag=True, help="Print the descriptor as JSON.")
def info(data_dir: Path, as_json: bool) -> None:
    """Print the descriptor an aggregator needs: id, address, public key, key epoch."""
    from anonml.relay._config import load_config
    from anonml.relay._descriptor import relay_descriptor

    try:
        config = load_config(data_dir)
        descriptor = relay_descriptor(config, time.time())
    except (ConfigError, StorageError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(descriptor, indent=2, sort_keys=True))
    else:
        for key in ("node_id", "address", "key_epoch", "public_key", "identity_public_key"):
            click.echo(f"{key:20} {descriptor[key]}")
        for key in descriptor["keys"]:
            click.echo(f"{'epoch ' + str(key['epoch']):20} {key['public_key']}  [{key['valid_from']}, "
                       f"{key['valid_until']})")
        geometry = descriptor["geometry"]
        click.echo(f"{'geometry':20} {geometry['max_hops']} hops, {geometry['packet_size']} bytes, "
                   f"hash {geometry['hash']}")
        click.echo(f"{'directory':20} {_directory_summary(config)}")
    if descriptor["public_key"] is None:
        click.echo("warning: no key for the current epoch yet; `anonml relay run` creates it", err=True)


def _directory_summary(config: RelayConfig) -> str:
    sources = [f"aggregator {a.url} (identity {a.identity.hex()})" for a in config.directory_aggregators]
    if config.directory_path is not None:
        sources.append(f"file {config.directory_path}")
    if sources:
        return "forwards only to next hops from: " + ", ".join(sources)
    if config.require_directory:
        return "NONE configured: `run` refuses to start (set [directory] in the config)"
    return "NONE configured: forwards to ANY address (insecure; set [directory] in the config)"


def relay_heartbeat(counters: RelayCounters) -> str:
    """What ``relay run`` says each minute: packets held, taken in, forwarded and dropped since it started."""
    dropped = sum(counters.dropped.values())
    return (f"relay alive: holding {counters.held} packet(s); since start received {counters.received}, "
            f"forwarded {counters.forwarded}, dropped {dropped}; {counters.connections_open} link connection(s) open")


async def _run_until_signalled(config: RelayConfig, packet_trace: Path | None) -> None:
    import trio

    from anonml.base.heartbeat import heartbeat
    from anonml.relay._metrics import log_event
    from anonml.relay._process import serve_relay

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            started = await nursery.start(partial(serve_relay, config, packet_trace=packet_trace))
            nursery.start_soon(heartbeat, partial(relay_heartbeat, started.counters), logger.info)
            async for signum in signals:
                log_event(logger, logging.INFO, "shutdown", signal=signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


@relay.command()
@_DATA_DIR
@_AGGREGATOR
# Hidden: the loopback demo's anonymity analysis only (relay._trace says why a real relay must not keep it).
@click.option("--trace-packets", type=click.Path(dir_okay=False, path_type=Path), default=None, hidden=True)
def run(data_dir: Path, aggregators: tuple[PinnedAggregator, ...], trace_packets: Path | None) -> None:
    """Serve until SIGINT/SIGTERM; held packets stay durable across restarts."""
    import trio

    from anonml.relay._config import load_config

    try:
        config = load_config(data_dir)
        extra = tuple(a for a in aggregators if a not in config.directory_aggregators)
        config = replace(config, directory_aggregators=config.directory_aggregators + extra)
    except (ConfigError, StorageError) as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(
        level=config.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        with lock_data_dir(data_dir, command="anonml relay run"):
            freeze_startup_heap()
            trio.run(_run_until_signalled, config, trace_packets)
    except (AnonMLError, OSError, BaseExceptionGroup) as exc:
        # One line also under `python -m anonml.relay`, which the root command's handler does not wrap.
        message = explain(exc)
        if message is None:
            raise
        raise click.ClickException(message) from None
