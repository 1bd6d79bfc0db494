"""The relay's durable state: held packets and replay tags, in SQLite (WAL).

DESIGN.md §10: a packet is acknowledged only after it is durable. The relay
stores each accepted packet (already re-encrypted for the next hop, so it
reveals nothing the wire did not) together with its release time in one
transaction per link batch (group commit), and only then sends the acks. The
replay tag is written in the same transaction, so a crash can never keep a
tag without its packet or the reverse.

Calls are synchronous and run on the trio thread: one indexed insert costs a
few microseconds, far below the Sphinx work per packet, and one commit per
batch amortises the fsync (``synchronous=FULL``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anonml.storage import Database, Schema

STORE_FILE = "relay.sqlite3"

SCHEMA = Schema(
    name="relay",
    application_id=0x414E5201,  # "ANR\x01"
    version=1,
    tables="""
CREATE TABLE held (
    id INTEGER PRIMARY KEY,
    release_at REAL NOT NULL,
    window_end REAL NOT NULL,
    next_host TEXT NOT NULL,
    next_port INTEGER NOT NULL,
    packet BLOB NOT NULL
);
CREATE TABLE replay_tags (
    epoch INTEGER NOT NULL,
    tag BLOB NOT NULL,
    PRIMARY KEY (epoch, tag)
) WITHOUT ROWID;
""",
    # Relays from before stores were versioned wrote these same tables.
    unversioned=1,
)


@dataclass(frozen=True)
class HeldPacket:
    """A packet waiting for (or in) release, as stored."""

    row_id: int
    release_at: float
    window_end: float
    next_host: str
    next_port: int
    packet: bytes


class RelayStore:
    """One SQLite database holding the relay's held packets and replay tags."""

    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")
        self._database = Database(path, SCHEMA, durable=synchronous == "FULL", private=True)
        self._tx: sqlite3.Connection | None = None
        # Ids of held rows are assigned here so a batch's rows go in with one
        # executemany rather than an INSERT per row; ids only need to be
        # unique, and a rolled-back batch merely skips some.
        with self._database.read() as db:
            (last_id,) = db.execute("SELECT COALESCE(MAX(id), 0) FROM held").fetchone()
        self._next_held_id = int(last_id) + 1
        # Wall seconds spent inside SQLite (fsync waits included), for the
        # relay's "where the time goes" figures.
        self.busy_seconds = 0.0

    def _query(self, sql: str, parameters: tuple[object, ...] = ()) -> list[Any]:
        started = time.perf_counter()
        try:
            if self._tx is not None:
                return list(self._tx.execute(sql, parameters).fetchall())
            with self._database.read() as db:
                return list(db.execute(sql, parameters).fetchall())
        finally:
            self.busy_seconds += time.perf_counter() - started

    def _write(self, sql: str, rows: Sequence[tuple[object, ...]]) -> int:
        """Run ``sql`` for each row in the open transaction; the number of rows changed."""
        if self._tx is None:
            raise RuntimeError("RelayStore write outside a transaction")
        started = time.perf_counter()
        try:
            return self._tx.executemany(sql, rows).rowcount
        finally:
            self.busy_seconds += time.perf_counter() - started

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic, durable unit: committed on exit, rolled back on error (StorageError on I/O failure)."""
        started = time.perf_counter()
        try:
            with self._database.transaction() as db:
                self._tx = db
                try:
                    yield
                finally:
                    self._tx = None
        finally:
            # Whole transactions (the commit's fsync included) count as store time.
            self.busy_seconds += time.perf_counter() - started

    def record_tag(self, epoch: int, tag: bytes) -> bool:
        """Record ``tag`` for ``epoch``; False if it was already there (a replay)."""
        return self._write("INSERT OR IGNORE INTO replay_tags (epoch, tag) VALUES (?, ?)", [(epoch, tag)]) == 1

    def tag_counts(self) -> dict[int, int]:
        return {int(e): int(n) for e, n in self._query("SELECT epoch, COUNT(*) FROM replay_tags GROUP BY epoch")}

    def erase_epochs(self, epochs: Iterable[int]) -> None:
        """Erase the replay tags of ``epochs`` (their keys are gone)."""
        with self.transaction():
            self._write("DELETE FROM replay_tags WHERE epoch = ?", [(e,) for e in epochs])

    def insert_held(self, rows: Sequence[tuple[float, float, str, int, bytes]]) -> list[int]:
        """Store ``(release_at, window_end, next_host, next_port, packet)`` rows; their ids in order."""
        first = self._next_held_id
        self._next_held_id += len(rows)
        self._write(
            "INSERT INTO held (id, release_at, window_end, next_host, next_port, packet) VALUES (?, ?, ?, ?, ?, ?)",
            [(first + offset, *row) for offset, row in enumerate(rows)],
        )
        return list(range(first, first + len(rows)))

    def schedule(self) -> list[tuple[float, int, float]]:
        """``(release_at, row_id, window_end)`` of every held packet."""
        rows = self._query("SELECT release_at, id, window_end FROM held")
        return [(float(r), int(i), float(e)) for r, i, e in rows]

    def neighbours(self) -> dict[tuple[str, int], int]:
        """Held packets per next hop."""
        rows = self._query("SELECT next_host, next_port, COUNT(*) FROM held GROUP BY next_host, next_port")
        return {(str(h), int(p)): int(n) for h, p, n in rows}

    def load(self, row_ids: Sequence[int]) -> list[HeldPacket]:
        """The held packets with these ids (missing ids are skipped)."""
        found: list[HeldPacket] = []
        # SQLite limits bound parameters per statement; 500 is far below it.
        for offset in range(0, len(row_ids), 500):
            chunk = row_ids[offset : offset + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._query(
                f"SELECT id, release_at, window_end, next_host, next_port, packet FROM held WHERE id IN ({marks})",
                tuple(chunk),
            )
            found.extend(HeldPacket(int(i), float(r), float(e), str(h), int(p), bytes(b)) for i, r, e, h, p, b in rows)
        return found

    def delete(self, row_ids: Sequence[int]) -> None:
        """Forget delivered or dropped packets (in the open transaction, else in one of its own)."""
        if not row_ids:
            return
        if self._tx is not None:
            self._write("DELETE FROM held WHERE id = ?", [(i,) for i in row_ids])
        else:
            with self.transaction():
                self._write("DELETE FROM held WHERE id = ?", [(i,) for i in row_ids])

    def reschedule(self, updates: Sequence[tuple[int, float]]) -> None:
        """Set new release times ``(row_id, release_at)`` (one transaction)."""
        if updates:
            with self.transaction():
                self._write("UPDATE held SET release_at = ? WHERE id = ?", [(t, i) for i, t in updates])

    def close(self) -> None:
        self._database.close()
