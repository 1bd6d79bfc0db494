"""The relay's durable state: held packets, replay tags and the last verified
round manifests, in SQLite (WAL).

DESIGN.md §10: a packet is acknowledged only after it is durable. The relay
stores each accepted packet (already re-encrypted for the next hop, so it
reveals nothing the wire did not) together with its release time in one
transaction per link batch (group commit), and only then sends the acks. The
replay tag is written in the same transaction, so a crash can never keep a
tag without its packet or the reverse.

Replay tags are kept until their packet's window ends (DESIGN.md §5: "kept
until its window ends"), not until the key epoch rotates: a packet can only
be accepted inside its window, so an expired tag protects nothing, and
expiring tags with their window bounds the cache by the traffic of
``max_hold_seconds`` instead of a week's (issue 13: late packets used to fill
the cache until rotation).

The manifests are the relay's directory as last verified (issue 13: a
restarted relay forwards at once instead of refusing until its first fetch);
they are re-verified against the pinned identity when loaded.

Calls are synchronous and run on the trio thread: one indexed insert costs a
few microseconds, far below the Sphinx work per packet, and one commit per
batch amortises the fsync (``synchronous=FULL``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anonml.base.storage import Database, Schema

STORE_FILE = "relay.sqlite3"

# What version 2 has after its replay_tags table: the tags' expiry index (version 1 had none) and the
# manifests table, created the same way in a new store and by the migration from version 1.
_EXPIRY_INDEX_AND_MANIFESTS = """
CREATE INDEX replay_tags_expiry ON replay_tags (expires_at);
CREATE TABLE manifests (
    round_id BLOB PRIMARY KEY,
    source TEXT NOT NULL,
    signed BLOB NOT NULL,
    ends_at REAL NOT NULL
);
"""

SCHEMA = Schema(
    name="relay",
    application_id=0x414E5201,  # "ANR\x01"
    version=2,
    # A held row is a 2,048-byte packet and ~50 bytes more: one per 4 KiB page (two do not fit), three per
    # 8 KiB page, so a batch's commit and its later delete write about half the pages (fewer WAL writes);
    # measured apart, 128-packet batches: insert and commit 16 -> 11, delete and commit 8.5 -> 5.5 CPU us a packet.
    page_size=8192,
    tables="""
CREATE TABLE held (
    id INTEGER PRIMARY KEY,
    release_at REAL NOT NULL,
    window_end REAL NOT NULL,
    next_host TEXT NOT NULL,
    next_port INTEGER NOT NULL,
    packet BLOB NOT NULL
);
CREATE TABLE replay_tags (tag BLOB PRIMARY KEY, expires_at REAL NOT NULL) WITHOUT ROWID;
"""
    + _EXPIRY_INDEX_AND_MANIFESTS,
    migrations={
        # Version 1 kept tags per key epoch until the key was erased (at most
        # an epoch plus its grace: 8 days by default): keep each that long.
        1: """
CREATE TABLE replay_tags_v2 (tag BLOB PRIMARY KEY, expires_at REAL NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO replay_tags_v2 SELECT tag, CAST(strftime('%s', 'now') AS REAL) + 691200 FROM replay_tags;
DROP TABLE replay_tags;
ALTER TABLE replay_tags_v2 RENAME TO replay_tags;
"""
        + _EXPIRY_INDEX_AND_MANIFESTS,
    },
    # Relays from before stores were versioned wrote version 1's tables.
    unversioned=1,
)


@dataclass(frozen=True)
class StoredManifest:
    """A round manifest as the relay last verified it: ``source`` is the aggregator URL."""

    round_id: bytes
    source: str
    signed: bytes
    ends_at: float


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
        self._snapshot: sqlite3.Connection | None = None
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
            if self._snapshot is not None:
                return list(self._snapshot.execute(sql, parameters).fetchall())
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

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Run the reads inside in one read transaction (relay intake: a slice's replay-tag lookups).

        Nothing may be written inside, and the caller must not wait (no ``await``) inside: a commit by
        another task would not be seen until it ends. Inside a write transaction it adds nothing."""
        if self._tx is not None or self._snapshot is not None:
            yield
            return
        with self._database.snapshot() as db:  # its reads count in busy_seconds one by one (_query)
            self._snapshot = db
            try:
                yield
            finally:
                self._snapshot = None

    def tag_seen(self, tag: bytes) -> bool:
        """Whether ``tag`` is in the replay cache (an unexpired packet carried it)."""
        return bool(self._query("SELECT 1 FROM replay_tags WHERE tag = ?", (tag,)))

    def record_tags(self, rows: Sequence[tuple[bytes, float]]) -> None:
        """Record ``(tag, expires_at)`` rows in the open transaction."""
        self._write("INSERT OR IGNORE INTO replay_tags (tag, expires_at) VALUES (?, ?)", rows)

    def tag_count(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM replay_tags")[0][0])

    def expire_tags(self, now: float) -> int:
        """Forget tags whose window has ended (one transaction); how many."""
        with self.transaction():
            return self._write("DELETE FROM replay_tags WHERE expires_at < ?", [(now,)])

    def save_manifest(self, manifest: StoredManifest) -> None:
        with self.transaction():
            self._write("INSERT OR REPLACE INTO manifests (round_id, source, signed, ends_at) VALUES (?, ?, ?, ?)",
                        [(manifest.round_id, manifest.source, manifest.signed, manifest.ends_at)])

    def manifests(self) -> list[StoredManifest]:
        rows = self._query("SELECT round_id, source, signed, ends_at FROM manifests ORDER BY ends_at")
        return [StoredManifest(bytes(r), str(s), bytes(b), float(e)) for r, s, b, e in rows]

    def forget_manifests(self, round_ids: Sequence[bytes]) -> None:
        if round_ids:
            with self.transaction():
                self._write("DELETE FROM manifests WHERE round_id = ?", [(r,) for r in round_ids])

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
