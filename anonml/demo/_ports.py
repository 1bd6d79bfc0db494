"""Ports for servers whose address is published before they start.

A relay's address goes into the signed round manifest, and so do the
aggregator's HTTP and sink addresses, before those processes run; they
cannot bind port 0 and tell us afterwards. Binding port 0 here and closing
the socket is racy: the kernel hands out that same ephemeral range to every
outgoing connection on the machine (every test and peer of every engineer),
and one of them can take the port before the server binds it.
:func:`free_port` therefore picks outside the ephemeral range, where the
kernel never allocates on its own, and checks the port binds now. It never
hands out a port twice in one process: a port given to a server that has
not bound it yet still binds for the probe (a test's two relays were given
the same port that way, and the second could not listen).
Servers run in process bind port 0 and read their bound address instead.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

HOST = "127.0.0.1"
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below this are well-known and commonly configured service ports.
_LOWEST = 10_000
# Every port free_port returned in this process.
_HANDED_OUT: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux default 32768-60999 if it cannot be read)."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = HOST, rng: random.Random | None = None) -> int:
    """A port that binds now and that the kernel will not hand to an outgoing connection."""
    rng = rng or random.SystemRandom()
    low, high = ephemeral_range()
    candidates = [(_LOWEST, low - 1), (high + 1, 65535)]
    spans = [(a, b) for a, b in candidates if b >= a]
    for _ in range(1000):
        start, end = rng.choice(spans)
        port = rng.randint(start, end)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise OSError(f"no free port on {host} outside the ephemeral range {low}-{high}")
