"""Shared by the Sphinx tests: a path of fresh hops, each named by its key."""

from __future__ import annotations

import os
from collections.abc import Callable

from anonml.crypto import (
    NodeAddress,
    PathHop,
    ReleaseWindow,
    generate_keypair,
    node_id_of,
)


def keyed_path(
    count: int,
    address: Callable[[int], NodeAddress],
    window: Callable[[int], ReleaseWindow],
    *,
    rng_bytes: Callable[[int], bytes] = os.urandom,
) -> tuple[list[tuple[bytes, bytes]], list[PathHop]]:
    """``count`` fresh key pairs and the path through them: hop ``i`` has
    ``node_id_of(public key)``, ``address(i)`` and ``window(i)``."""
    keys = [generate_keypair(rng_bytes=rng_bytes) for _ in range(count)]
    path = [PathHop(node_id_of(public), address(index), public, window(index)) for index, (_, public) in enumerate(keys)]
    return keys, path
