"""Support for tests and benchmarks (like ``trio.testing``): stand-ins that no
production path uses.

:class:`SimulatedPeer` drives a round as a peer would, without the peer client;
:class:`SettableClock` is a UTC clock a test sets by hand (where sockets rule
out trio's MockClock); :class:`FinalHopSink` is a recording final hop for the
relay tests and benchmark; :func:`seconds_for` sizes a real-seconds hop window
from the packet cost measured when it is drawn, and :func:`drawn_in_time`
draws again with more slack when the machine slowed down meanwhile;
:func:`loopback_relay` sets up a relay's data directory on loopback and
:func:`relay_keyring` opens its epoch keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    from anonml.testing._peer import SettableClock, SimulatedPeer, enrol
    from anonml.testing._relay import DIRECTORY_FILE, loopback_relay, relay_keyring
    from anonml.testing._schedule import drawn_in_time, packet_seconds, seconds_for, window_seconds
    from anonml.testing._sink import Arrival, FinalHopSink
    from anonml.testing._postgres import PostgresServer, PostgresUnavailable, private_postgres
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "DIRECTORY_FILE",
    "Arrival",
    "FinalHopSink",
    "SettableClock",
    "SimulatedPeer",
    "drawn_in_time",
    "enrol",
    "loopback_relay",
    "packet_seconds",
    "relay_keyring",
    "seconds_for",
    "window_seconds",
    "PostgresServer",
    "PostgresUnavailable",
    "private_postgres",
]
