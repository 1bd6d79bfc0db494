"""The relay descriptor: what an aggregator's directory needs (DESIGN.md §4).

``anonml relay info`` prints it; it holds the node id, the advertised address,
the Sphinx public key of the current key epoch (and the next one, published
ahead), the key that verifies its signed beacon statements, the epoch
parameters, and the geometry the relay accepts.
"""

from __future__ import annotations

from typing import Any

from anonml.crypto import SphinxGeometry
from anonml.protocol import format_host_port
from anonml.relay._config import RelayConfig
from anonml.relay._beacon import beacon_signing_key
from anonml.relay._keys import KeyRing, load_identity, load_identity_key


def relay_descriptor(config: RelayConfig, now: float) -> dict[str, Any]:
    """The descriptor at wall time ``now``; ``public_key`` is None if the
    current epoch's key does not exist yet (``anonml relay run`` creates it)."""
    node_id, identity_public = load_identity(config.data_dir)
    keyring = KeyRing(config.data_dir, epoch_seconds=config.key_epoch_seconds, grace_seconds=config.key_grace_seconds)
    published = keyring.published(now)
    current_epoch = keyring.epoch_of(now)
    current = next((k for k in published if k.epoch == current_epoch), None)
    geometry = SphinxGeometry.create(max_hops=config.max_hops, packet_size=config.packet_size)
    host, port = config.advertised
    return {
        "node_id": node_id.hex(),
        "address": format_host_port(host, port),
        "host": host,
        "port": port,
        "mirror_port": config.mirror[1] if config.mirror is not None else None,
        "identity_public_key": identity_public.hex(),
        "beacon_key": bytes(beacon_signing_key(load_identity_key(config.data_dir)).verify_key).hex(),
        "key_epoch": current_epoch,
        "public_key": current.public_key.hex() if current is not None else None,
        "key_epoch_seconds": config.key_epoch_seconds,
        "key_grace_seconds": config.key_grace_seconds,
        "keys": [
            {
                "epoch": key.epoch,
                "public_key": key.public_key.hex(),
                "valid_from": key.valid_from,
                "valid_until": key.valid_until,
            }
            for key in published
        ],
        "geometry": {
            "max_hops": geometry.max_hops,
            "packet_size": geometry.packet_size,
            "hash": geometry.canonical_hash().hex(),
        },
    }
