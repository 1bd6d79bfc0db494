"""The relay: a mix node that holds Sphinx packets and re-times them inside
published release windows (DESIGN.md §7).

``serve_relay(config)`` runs one; ``anonml relay init / info / run`` is the
operator's interface (:mod:`relay._cli`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    from anonml.relay._clock import PinnedClock, RelayClock, WallClock
    from anonml.relay._config import (
        CONFIG_FILE,
        PinnedAggregator,
        RelayConfig,
        load_config,
        parse_host_port,
        render_config,
    )
    from anonml.relay._descriptor import relay_descriptor
    from anonml.relay._directory import (
        DirectoryEntry,
        DirectoryError,
        NextHopDirectory,
        entries_from_manifest,
        fetch_manifest,
        load_directory_file,
        parse_directory_file,
        render_directory_file,
    )
    from anonml.relay._errors import RelayConfigError, RelayDataDirError
    from anonml.relay._keys import EpochKey, KeyRing, create_identity, load_identity, load_identity_key
    from anonml.relay._metrics import DropReason, LateIntake, RelayCounters, parse_metrics, render_prometheus
    from anonml.relay._mirror import DUE_POLL_SECONDS, serve_mirror
    from anonml.relay._store import STORE_FILE, HeldPacket, RelayStore
    # The role's click group (``anonml relay ...``), which ``anonml.cli`` mounts.
    from anonml.relay._cli import relay as command
    from anonml.relay._process import RelayStarted, serve_relay
    from anonml.relay._server import INTAKE_SLICE
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)


__all__ = [
    "command",
    "CONFIG_FILE",
    "STORE_FILE",
    "DUE_POLL_SECONDS",
    "INTAKE_SLICE",
    "DirectoryEntry",
    "DirectoryError",
    "DropReason",
    "EpochKey",
    "HeldPacket",
    "KeyRing",
    "LateIntake",
    "NextHopDirectory",
    "PinnedAggregator",
    "PinnedClock",
    "RelayClock",
    "RelayConfig",
    "RelayConfigError",
    "RelayCounters",
    "RelayDataDirError",
    "RelayStarted",
    "RelayStore",
    "WallClock",
    "create_identity",
    "entries_from_manifest",
    "fetch_manifest",
    "load_config",
    "load_directory_file",
    "load_identity",
    "load_identity_key",
    "parse_directory_file",
    "parse_metrics",
    "parse_host_port",
    "relay_descriptor",
    "render_config",
    "render_directory_file",
    "render_prometheus",
    "serve_mirror",
    "serve_relay",
]
