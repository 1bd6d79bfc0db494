"""What a running relay holds in memory about its held packets (the rows live in SQLite).

One object keeps the four views that must agree: the release schedule (a
heap of ``(release_at, row_id)``), the packets held per next hop (which
bounds the next hops in use and tells which forwarders are idle), recent
packets kept resident (so the scheduler need not read each one back), and
the rows delivered or dropped but not yet deleted. Intake changes it only
after its batch has committed (:meth:`add`), so a failed commit leaves
nothing to undo.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence

from anonml.relay._store import HeldPacket

Neighbour = tuple[str, int]


class Holdings:
    """The schedule, per-next-hop counts, resident copies and finished rows (module docstring)."""

    def __init__(self, *, resident_limit: int) -> None:
        self._schedule: list[tuple[float, int]] = []
        self.neighbours: Counter[Neighbour] = Counter()
        self._resident: dict[int, HeldPacket] = {}
        self._resident_limit = resident_limit
        self._finished: list[int] = []
        self.held = 0

    def restore(self, schedule: Iterable[tuple[float, int]], neighbours: Counter[Neighbour]) -> None:
        """Load what a restart found in the store (release times already re-drawn)."""
        self._schedule = list(schedule)
        heapq.heapify(self._schedule)
        self.neighbours = Counter(neighbours)
        self.held = len(self._schedule)

    def add(self, packets: Sequence[HeldPacket]) -> None:
        """Packets just committed: schedule them (and keep them resident while there is room)."""
        for packet in packets:
            heapq.heappush(self._schedule, (packet.release_at, packet.row_id))
            self.neighbours[(packet.next_host, packet.next_port)] += 1
            if len(self._resident) < self._resident_limit:
                self._resident[packet.row_id] = packet
        self.held += len(packets)

    def next_release(self) -> float | None:
        return self._schedule[0][0] if self._schedule else None

    def due(self, now: float, limit: int) -> list[int]:
        """Row ids whose release time has come, earliest first, at most ``limit``."""
        due: list[int] = []
        while self._schedule and self._schedule[0][0] <= now and len(due) < limit:
            due.append(heapq.heappop(self._schedule)[1])
        return due

    def take_resident(self, row_ids: Sequence[int]) -> tuple[list[HeldPacket], list[int]]:
        """The resident packets among ``row_ids``, and the ids that must be read from the store."""
        found: list[HeldPacket] = []
        stored_only: list[int] = []
        for row_id in row_ids:
            packet = self._resident.pop(row_id, None)
            if packet is None:
                stored_only.append(row_id)
            else:
                found.append(packet)
        return found, stored_only

    def retry(self, packet: HeldPacket, at: float) -> None:
        """Schedule ``packet`` (still held) again at ``at``."""
        heapq.heappush(self._schedule, (at, packet.row_id))
        if len(self._resident) < self._resident_limit:
            self._resident[packet.row_id] = packet

    def finish(self, neighbour: Neighbour, row_ids: Sequence[int]) -> None:
        """Packets delivered or dropped: no longer held; their rows are deleted later."""
        self._finished.extend(row_ids)
        self.held -= len(row_ids)
        remaining = self.neighbours[neighbour] - len(row_ids)
        if remaining > 0:
            self.neighbours[neighbour] = remaining
        else:
            del self.neighbours[neighbour]

    def take_finished(self) -> list[int]:
        """Rows to delete now (:meth:`return_finished` hands them back if the delete fails)."""
        finished, self._finished = self._finished, []
        return finished

    def return_finished(self, row_ids: Sequence[int]) -> None:
        self._finished.extend(row_ids)
