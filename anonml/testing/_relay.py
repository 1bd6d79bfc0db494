"""A relay data directory set up for a loopback test or benchmark, the way
``anonml relay init`` would, without the command's process."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from anonml.crypto import SphinxGeometry
from anonml.relay import (
    CONFIG_FILE,
    DirectoryEntry,
    KeyRing,
    RelayConfig,
    RelayDataDirError,
    create_identity,
    render_config,
    render_directory_file,
)

DIRECTORY_FILE = "directory.json"
"""Where :func:`loopback_relay` writes the static directory of the next hops."""


def loopback_relay(
    data_dir: Path, geometry: SphinxGeometry, *, next_hops: Sequence[DirectoryEntry] | None = None, **settings: Any
) -> RelayConfig:
    """A relay in ``data_dir`` for ``geometry``'s packets, listening on a free loopback port.

    Creates the identity unless ``data_dir`` already holds one (a test
    restarting a relay keeps its keys), writes a static directory listing
    ``next_hops`` when given, and writes the config where ``anonml relay run``
    reads it (a child process started on ``data_dir`` serves the same relay).
    ``settings`` are further :class:`RelayConfig` fields.
    """
    with contextlib.suppress(RelayDataDirError):  # raised when an identity is there: keep it
        create_identity(data_dir)
    if next_hops is not None:
        (data_dir / DIRECTORY_FILE).write_text(render_directory_file(next_hops))
        settings = {"directory_file": DIRECTORY_FILE} | settings
    config = RelayConfig(data_dir=data_dir, listen=("127.0.0.1", 0), max_hops=geometry.max_hops,
                         packet_size=geometry.packet_size, **settings)
    (data_dir / CONFIG_FILE).write_text(render_config(config))
    return config


def relay_keyring(config: RelayConfig) -> KeyRing:
    """The epoch keys of ``config``'s relay, with its epoch and grace lengths."""
    return KeyRing(config.data_dir, epoch_seconds=config.key_epoch_seconds, grace_seconds=config.key_grace_seconds)
