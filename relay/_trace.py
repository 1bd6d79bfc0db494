"""A per-packet timing trace for the loopback demo's anonymity analysis: never on in a real relay.

An honest relay keeps no record tying a packet it took in to the packet it
sent on: it deletes each row once the next hop acknowledges it. The demo,
which plays every peer, relay and the aggregator on one machine, needs
exactly that record to tell which stage of a path carries a correlation
between send and arrival times (``anonml.demo._trace``). ``anonml relay run
--trace-packets FILE`` (a hidden option the demo passes) runs a
:class:`TracingRelay`, which appends one JSON line per event:

* ``{"in": H(frame), "out": H(packet), "taken_in": t, "release_at": t, "window_start": t, "window_end": t}``
  when a packet is accepted: ``H`` is SHA-256, ``frame`` what came in and
  ``packet`` what goes to the next hop (the next hop's ``in``), ``taken_in``
  the wall time its link batch was read, ``release_at`` the drawn release time,
  the window that of this hop;
* ``{"out": H(packet), "forwarded": t, "to": "host:port"}`` when the next hop (at that address: one of a
  packet sink's, if it has ingest workers) acknowledged it.

Written by a relay whose operator is an adversary, this is nothing it could
not record anyway (it sees every frame and its own release times); written
to an honest relay's disk it would link its inputs to its outputs for anyone
who reads the file, which is why only the demo turns it on. A batch whose
commit fails is answered BUSY and resent: its packets then appear twice
with the same hashes, and a reader keeps the last intake.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from anonml.crypto import ForwardPacket, ReleaseWindow
from anonml.protocol import format_host_port
from anonml.relay._keys import EpochKey
from anonml.relay._server import Relay, _Batch
from anonml.relay._store import HeldPacket
from anonml.transport import AckStatus

logger = logging.getLogger("anonml.relay")


class PacketTrace:
    """An append-only JSON-lines file of intake and forwarding events (module docstring)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", encoding="utf-8", buffering=1)

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def taken_in(self, frame: bytes, packet: bytes, taken_in: float, release_at: float, window: ReleaseWindow) -> None:
        self._write({"in": hashlib.sha256(frame).hexdigest(), "out": hashlib.sha256(packet).hexdigest(),
                     "taken_in": taken_in, "release_at": release_at,
                     "window_start": float(window.start), "window_end": float(window.end)})

    def forwarded(self, packet: bytes, at: float, to: tuple[str, int]) -> None:
        self._write({"out": hashlib.sha256(packet).hexdigest(), "forwarded": at, "to": format_host_port(*to)})

    def close(self) -> None:
        self._file.close()


class TracingRelay(Relay):
    """A :class:`relay.Relay` that writes a :class:`PacketTrace` of what it takes in and forwards."""

    def __init__(self, *args: Any, trace: PacketTrace, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace = trace
        self._window: ReleaseWindow | None = None  # the hop window of the packet being taken in
        logger.warning("event=packet-trace-on detail=%s", "this relay records which packet it sent on for each it took "
                       "in (the demo's anonymity analysis); never run a real relay so")

    def _check_route(self, result: ForwardPacket, batch: _Batch) -> AckStatus:
        self._window = result.window  # the row keeps only its end
        return super()._check_route(result, batch)

    def _intake(self, frame: bytes, batch: _Batch, keys: Sequence[EpochKey]) -> AckStatus:
        self._window = None
        status = super()._intake(frame, batch, keys)
        if status is AckStatus.ACCEPTED and self._window is not None:
            release_at, _, _, _, packet = batch.rows[-1]
            self.trace.taken_in(frame, packet, batch.now, release_at, self._window)
        return status

    def _settle(self, neighbour: tuple[str, int], batch: list[HeldPacket], statuses: list[AckStatus | None]) -> None:
        now = self.clock.now()
        for packet, status in zip(batch, statuses):
            if status is AckStatus.ACCEPTED:
                self.trace.forwarded(packet.packet, now, neighbour)
        super()._settle(neighbour, batch, statuses)
