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

STORE_FILE = "relay.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS held (
    id INTEGER PRIMARY KEY,
    release_at REAL NOT NULL,
    window_end REAL NOT NULL,
    next_host TEXT NOT NULL,
    next_port INTEGER NOT NULL,
    packet BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS replay_tags (
    epoch INTEGER NOT NULL,
    tag BLOB NOT NULL,
    PRIMARY KEY (epoch, tag)
) WITHOUT ROWID;
"""


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
        # isolation_level=None: we issue BEGIN/COMMIT ourselves (group commit).
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.executescript(_SCHEMA)
        self._in_transaction = False
        # Ids of held rows are assigned here so a batch's rows go in with one
        # executemany rather than an INSERT per row; ids only need to be
        # unique, and a rolled-back batch merely skips some.
        (last_id,) = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM held").fetchone()
        self._next_held_id = int(last_id) + 1
        # Wall seconds spent inside SQLite (fsync waits included), for the
        # relay's "where the time goes" figures.
        self.busy_seconds = 0.0

    def _execute(self, sql: str, parameters: tuple[object, ...] = ()) -> sqlite3.Cursor:
        started = time.perf_counter()
        try:
            return self._db.execute(sql, parameters)
        finally:
            self.busy_seconds += time.perf_counter() - started

    def _execute_many(self, sql: str, rows: Sequence[tuple[object, ...]]) -> None:
        started = time.perf_counter()
        try:
            self._db.executemany(sql, rows)
        finally:
            self.busy_seconds += time.perf_counter() - started

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic, durable unit: committed on exit, rolled back on error."""
        self._execute("BEGIN IMMEDIATE")
        self._in_transaction = True
        try:
            yield
        except BaseException:
            self._execute("ROLLBACK")
            raise
        else:
            self._execute("COMMIT")
        finally:
            self._in_transaction = False

    def _require_transaction(self) -> None:
        if not self._in_transaction:
            raise RuntimeError("RelayStore write outside a transaction")

    def record_tag(self, epoch: int, tag: bytes) -> bool:
        """Record ``tag`` for ``epoch``; False if it was already there (a replay)."""
        self._require_transaction()
        cursor = self._execute("INSERT OR IGNORE INTO replay_tags (epoch, tag) VALUES (?, ?)", (epoch, tag))
        return cursor.rowcount == 1

    def tag_counts(self) -> dict[int, int]:
        return dict(self._db.execute("SELECT epoch, COUNT(*) FROM replay_tags GROUP BY epoch").fetchall())

    def erase_epochs(self, epochs: Iterable[int]) -> None:
        """Erase the replay tags of ``epochs`` (their keys are gone)."""
        with self.transaction():
            self._execute_many("DELETE FROM replay_tags WHERE epoch = ?", [(e,) for e in epochs])

    def insert_held(self, rows: Sequence[tuple[float, float, str, int, bytes]]) -> list[int]:
        """Store ``(release_at, window_end, next_host, next_port, packet)`` rows; their ids in order."""
        self._require_transaction()
        first = self._next_held_id
        self._next_held_id += len(rows)
        self._execute_many(
            "INSERT INTO held (id, release_at, window_end, next_host, next_port, packet) VALUES (?, ?, ?, ?, ?, ?)",
            [(first + offset, *row) for offset, row in enumerate(rows)],
        )
        return list(range(first, first + len(rows)))

    def schedule(self) -> list[tuple[float, int, float]]:
        """``(release_at, row_id, window_end)`` of every held packet."""
        rows = self._db.execute("SELECT release_at, id, window_end FROM held").fetchall()
        return [(float(r), int(i), float(e)) for r, i, e in rows]

    def neighbours(self) -> dict[tuple[str, int], int]:
        """Held packets per next hop."""
        rows = self._db.execute("SELECT next_host, next_port, COUNT(*) FROM held GROUP BY next_host, next_port")
        return {(str(h), int(p)): int(n) for h, p, n in rows.fetchall()}

    def load(self, row_ids: Sequence[int]) -> list[HeldPacket]:
        """The held packets with these ids (missing ids are skipped)."""
        found: list[HeldPacket] = []
        # SQLite limits bound parameters per statement; 500 is far below it.
        for offset in range(0, len(row_ids), 500):
            chunk = row_ids[offset : offset + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._execute(
                f"SELECT id, release_at, window_end, next_host, next_port, packet FROM held WHERE id IN ({marks})",
                tuple(chunk),
            ).fetchall()
            found.extend(HeldPacket(int(i), float(r), float(e), str(h), int(p), bytes(b)) for i, r, e, h, p, b in rows)
        return found

    def delete(self, row_ids: Sequence[int]) -> None:
        """Forget delivered or dropped packets (in the open transaction, else in one of its own)."""
        if not row_ids:
            return
        if self._in_transaction:
            self._execute_many("DELETE FROM held WHERE id = ?", [(i,) for i in row_ids])
        else:
            with self.transaction():
                self._execute_many("DELETE FROM held WHERE id = ?", [(i,) for i in row_ids])

    def reschedule(self, updates: Sequence[tuple[int, float]]) -> None:
        """Set new release times ``(row_id, release_at)`` (one transaction)."""
        if updates:
            with self.transaction():
                self._execute_many("UPDATE held SET release_at = ? WHERE id = ?", [(t, i) for i, t in updates])

    def close(self) -> None:
        self._db.close()
