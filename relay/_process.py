"""The relay process: its listeners, its tasks, and what it reports once it serves.

:func:`serve_relay` opens the store, loads the keys and the directory last
verified, recovers held packets (:class:`relay._server.Relay`), then listens
for links (and metrics and a mirror) and runs the relay's background tasks
until cancelled.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import trio

from anonml.crypto import SphinxGeometry
from anonml.protocol import format_host_port
from anonml.transport import (
    TCP_NETWORK,
    HttpLimits,
    LinkIdentity,
    Listeners,
    Network,
    fit_connection_caps,
    holding_room,
    listening_address,
    raise_descriptor_limit,
)
from anonml.relay._clock import RelayClock, WallClock
from anonml.relay._config import RelayConfig
from anonml.relay._directory import DirectoryError, NextHopDirectory, load_directory_file
from anonml.relay._errors import RelayConfigError
from anonml.relay._keys import EpochKey, KeyRing, load_identity, load_identity_key
from anonml.relay._metrics import METRICS_CONNECTIONS, RelayCounters, log_event, serve_metrics
from anonml.relay._beacon import relay_beacon
from anonml.relay._mirror import MIRROR_LIMITS, serve_mirror
from anonml.relay._clock import uniform_from
from anonml.relay._server import Relay
from anonml.relay._store import STORE_FILE, RelayStore
from anonml.relay._trace import PacketTrace, TracingRelay

logger = logging.getLogger("anonml.relay")

# Descriptors a relay uses besides its listeners' connections (see _fit_to_descriptors).
_OWN_DESCRIPTORS = 48
# The fewest public connections a listener is worth running with.
_MIN_PUBLIC_SLOTS = 16


@dataclass(frozen=True)
class RelayStarted:
    """What :func:`serve_relay` reports once it listens.

    ``link`` and ``metrics`` are the bound ``(host, port)``s; ``keys`` the
    published epoch keys (current and next); ``counters`` and ``directory``
    (the allowed next hops; None when none is configured) are live.
    """

    link: tuple[str, int]
    metrics: tuple[str, int] | None
    node_id: bytes
    keys: tuple[EpochKey, ...]
    counters: RelayCounters
    directory: NextHopDirectory | None = None


async def _listen(address: tuple[str, int], what: str, config: RelayConfig, network: Network) -> Listeners:
    """Open a listener, or a :class:`RelayConfigError` that names the fix."""
    try:
        return await network.listen(address[0], address[1])
    except OSError as exc:
        raise _cannot_listen(address, what, config, exc) from None


def _cannot_listen(address: tuple[str, int], what: str, config: RelayConfig, exc: OSError) -> RelayConfigError:
    return RelayConfigError(
        f"cannot listen for {what} on {format_host_port(*address)}: {exc.strerror or exc}; stop the process "
        f"using it or choose another address in {str(config.data_dir / 'relay.toml')!r}"
    )


async def serve_relay(
    config: RelayConfig,
    *,
    clock: RelayClock | None = None,
    rng: np.random.Generator | None = None,
    network: Network = TCP_NETWORK,
    packet_trace: Path | None = None,
    task_status: trio.TaskStatus[RelayStarted] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the relay of ``config.data_dir`` until cancelled.

    Raises :class:`relay.RelayDataDirError` if the data directory is not
    initialised (it never creates an identity), :class:`relay.RelayConfigError`
    if the static directory file cannot be read, no directory source is
    configured while ``require_directory`` is set, or an address cannot be
    bound; :class:`~anonml.base.errors.StorageError` if the store cannot be opened.
    Reports a :class:`RelayStarted` through ``task_status`` once listening.
    ``clock`` defaults to :meth:`WallClock.anchored`; ``rng`` (a seeded numpy
    Generator, for tests) replaces the CSPRNG that draws release times.
    ``network`` carries everything it listens on, connects to and fetches
    (the round simulator passes its in-memory network). ``packet_trace``, for the
    loopback demo only, writes which packet went on for each taken in (:mod:`relay._trace`).
    """
    config, mirror_limits = _fit_to_descriptors(config)
    node_id, _ = load_identity(config.data_dir)
    identity = LinkIdentity(load_identity_key(config.data_dir))
    directory = _initial_directory(config)
    geometry = SphinxGeometry.create(max_hops=config.max_hops, packet_size=config.packet_size)
    keyring = KeyRing(config.data_dir, epoch_seconds=config.key_epoch_seconds, grace_seconds=config.key_grace_seconds)
    store = RelayStore(config.data_dir / STORE_FILE, synchronous=config.synchronous)
    counters = RelayCounters()
    trace = PacketTrace(packet_trace) if packet_trace is not None else None
    relay_class = Relay if trace is None else functools.partial(TracingRelay, trace=trace)
    try:
        relay = relay_class(
            config,
            geometry=geometry,
            keyring=keyring,
            store=store,
            clock=clock if clock is not None else WallClock.anchored(),
            uniform=uniform_from(rng),
            counters=counters,
            identity=identity,
            directory=directory,
            network=network,
        )
        relay.rotate_keys()
        if directory is not None:
            relay.load_rounds()  # before recover(): a held packet's deadline is its round phase's end
        relay.recover()
        listeners = await _listen(config.listen, "links", config, network)
        link = listening_address(listeners)
        async with trio.open_nursery() as nursery:
            relay.attach(nursery)
            metrics = None
            if config.metrics is not None:
                metrics_listeners = await _listen(config.metrics, "metrics", config, network)
                metrics = await nursery.start(serve_metrics, metrics_listeners, counters)
            nursery.start_soon(relay.run_scheduler)
            nursery.start_soon(relay.run_key_rotation)
            nursery.start_soon(relay.run_housekeeping)
            if directory is not None:
                nursery.start_soon(relay.run_directory_refresh)
            if config.mirror is not None:
                try:
                    await nursery.start(functools.partial(serve_mirror, config.mirror, config.directory_aggregators,
                                                          limits=mirror_limits, counts=counters.mirror_http,
                                                          network=network, now=relay.clock.now,
                                                          beacon=relay_beacon(config.data_dir, node_id, relay.clock.now, rng)))
                except OSError as exc:  # its address cannot be bound (nothing else fails before it starts)
                    raise _cannot_listen(config.mirror, "mirror", config, exc) from None
            nursery.start_soon(functools.partial(trio.serve_listeners, relay.handle_connection, listeners,
                                                 handler_nursery=nursery))
            published = tuple(keyring.published(relay.clock.now()))
            log_event(logger, logging.INFO, "listening", link=format_host_port(*link), node_id=node_id.hex(),
                      epoch=published[0].epoch, held=counters.held)
            task_status.started(RelayStarted(link, metrics, node_id, published, counters, directory))
    finally:
        store.close()
        if trace is not None:
            trace.close()
        log_event(logger, logging.INFO, "stopped", received=counters.received, forwarded=counters.forwarded,
                  held=counters.held)


def _fit_to_descriptors(config: RelayConfig) -> tuple[RelayConfig, HttpLimits]:
    """``config`` and the mirror's HTTP limits with their connection caps inside the open-file limit
    (raised to the hard limit first); :class:`transport.DescriptorLimitError` when even the minimums
    do not fit (:mod:`transport._descriptors`)."""
    wanted = {"link": config.max_connections}
    # A link keeps its reserved neighbour slots and at least as many public ones.
    minimum = {"link": 2 * config.neighbour_connections or _MIN_PUBLIC_SLOTS}
    if config.mirror is not None:
        wanted["mirror"], minimum["mirror"] = MIRROR_LIMITS.max_connections, _MIN_PUBLIC_SLOTS
    # The store (SQLite and its journal), the listeners, one forwarding link per next hop, the
    # metrics endpoint's connections (and the refused ones it holds), directory and mirror fetches,
    # logs: descriptors of its own.
    reserve = _OWN_DESCRIPTORS + config.max_neighbours + METRICS_CONNECTIONS + holding_room(METRICS_CONNECTIONS)
    caps = fit_connection_caps(wanted, minimum, reserve=reserve, limit=raise_descriptor_limit(), server="relay")
    link = min(config.max_connections, caps["link"])
    fitted = replace(config, max_connections=link, max_connections_per_source=min(config.max_connections_per_source, link))
    mirror = caps.get("mirror", MIRROR_LIMITS.max_connections)
    mirror_limits = replace(MIRROR_LIMITS, max_connections=mirror,
                            max_connections_per_source=min(MIRROR_LIMITS.max_connections_per_source, mirror))
    if link < config.max_connections or mirror < MIRROR_LIMITS.max_connections:
        log_event(logger, logging.WARNING, "connections-capped-by-descriptor-limit", link=link, mirror=mirror,
                  limit=raise_descriptor_limit())
    return fitted, mirror_limits


def _initial_directory(config: RelayConfig) -> NextHopDirectory | None:
    """The directory at start: the static file read now (an error is fatal:
    the operator named it); stored manifests are loaded by ``Relay.load_rounds``
    and aggregators fetched by ``run_directory_refresh``."""
    if not config.has_directory:
        if config.require_directory:
            raise RelayConfigError(
                f"no next-hop directory in {str(config.data_dir / 'relay.toml')!r}: name the aggregator this relay "
                "serves with `anonml relay run --aggregator IDENTITY@URL` (or [directory] aggregators = "
                '[{ url = "...", identity = "..." }] in that file), or a static [directory] file'
            )
        log_event(logger, logging.WARNING, "no-directory-insecure",
                  detail="no [directory] source configured: forwarding to ANY address a packet names "
                         "(an open forwarder); configure aggregators or a directory file")
        return None
    directory = NextHopDirectory()
    path = config.directory_path
    if path is not None:
        try:
            directory.replace_source(str(path), load_directory_file(path))
        except DirectoryError as exc:
            raise RelayConfigError(str(exc)) from None
    return directory
