"""The aggregator's durable state for one round: SQLite in WAL mode (DESIGN.md §10).

Registrations, invitations, the allow-list, credentials issued, the inbox of
received frames, accepted packets (unique per survey and tag digest,
DESIGN.md §6), rejections counted by reason, the receipt log, final-hop replay
tags, and published results. A frame is acknowledged on the link only after
:meth:`RoundStore.enqueue` has committed it; verification then moves it from
the inbox to the packets or the rejection counts in one transaction.

One connection per store, used from the event loop and from verification
threads; a lock serialises access (SQLite connections are not thread-safe).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nacl.signing import SigningKey

from anonml.errors import AnonMLError, ConfigError
from anonml.protocol import SurveyId
from anonml.storage import (
    Database,
    Schema,
    make_private_dir,
    read_secret_file,
    write_secret_file,
)

SCHEMA = Schema(
    name="round",
    application_id=0x414E4103,  # "ANA\x03"
    version=1,
    tables="""
CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE invitations (code TEXT PRIMARY KEY, used_by BLOB);
CREATE TABLE allow_list (identity_key BLOB PRIMARY KEY);
CREATE TABLE registrations (
    identity_key BLOB PRIMARY KEY, invitation TEXT, registered_at INTEGER NOT NULL);
CREATE TABLE credentials (
    identity_key BLOB PRIMARY KEY, partition INTEGER NOT NULL, response BLOB NOT NULL,
    issued_at INTEGER NOT NULL);
CREATE TABLE packets (
    survey BLOB NOT NULL, tag_digest BLOB NOT NULL, message_hash BLOB NOT NULL,
    report BLOB NOT NULL, receipt BLOB NOT NULL, accepted_at INTEGER NOT NULL,
    PRIMARY KEY (survey, tag_digest));
CREATE TABLE rejections (reason TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE replay_tags (tag BLOB PRIMARY KEY);
CREATE TABLE results (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, frame BLOB NOT NULL, arrived INTEGER NOT NULL);
""",
    # Rounds from before stores were versioned wrote these same tables.
    unversioned=1,
)


class RegistrationRefused(AnonMLError):
    """Raised by :meth:`RoundStore.register` with ``reason`` (used as the 4xx error text)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class VerifiedPacket:
    """A packet whose token verified: what :meth:`RoundStore.store_batch` records."""

    survey: SurveyId
    tag_digest: bytes
    message_hash: bytes
    report: bytes
    receipt: bytes


class RoundStore:
    """One round's SQLite database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.registrations_version = 0
        """Bumped on every new registration (lets readers cache the roster)."""
        self.packets_version = 0
        """Bumped whenever a packet is accepted (lets readers cache the receipt log)."""
        # Durable (a commit is on disk before the link acknowledges, DESIGN.md
        # §10) and private: the file holds the issuer's secret key and the seed.
        self._database = Database(path, SCHEMA, private=True)
        with self._database.read() as db:
            self.inbox_count = int(db.execute("SELECT COUNT(*) FROM inbox").fetchone()[0])
            """Frames waiting for verification (kept in memory: the sink checks it per batch)."""

    def close(self) -> None:
        self._database.close()

    # -- metadata and results ------------------------------------------------

    def put_meta(self, key: str, value: bytes) -> None:
        with self._database.transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def get_meta(self, key: str) -> bytes | None:
        with self._database.read() as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def put_result(self, key: str, value: bytes) -> None:
        with self._database.transaction() as db:
            db.execute("INSERT OR REPLACE INTO results VALUES (?, ?)", (key, value))

    def get_result(self, key: str) -> bytes | None:
        with self._database.read() as db:
            row = db.execute("SELECT value FROM results WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    # -- registration ----------------------------------------------------------

    def add_invitations(self, codes: Iterable[str]) -> None:
        with self._database.transaction() as db:
            db.executemany("INSERT OR IGNORE INTO invitations (code) VALUES (?)", [(c,) for c in codes])

    def add_allowed(self, keys: Iterable[bytes]) -> None:
        with self._database.transaction() as db:
            db.executemany("INSERT OR IGNORE INTO allow_list VALUES (?)", [(k,) for k in keys])

    def register(self, identity_key: bytes, invitation: str | None, policy: str, now: int) -> bool:
        """Record a registration; True if new, False if this key was already registered.

        Raises RegistrationRefused for a missing, unknown or used invitation, or
        a key not on the allow-list. Re-registering the same key is idempotent.
        """
        (outcome,) = self.register_many([(identity_key, invitation, now)], policy)
        if isinstance(outcome, str):
            raise RegistrationRefused(outcome)
        return outcome

    def register_many(self, items: Sequence[tuple[bytes, str | None, int]], policy: str) -> list[bool | str]:
        """Record ``(identity_key, invitation, now)`` registrations in one commit (one fsync for all).

        Per item: True (registered now), False (already registered) or the
        refusal reason (the policy's checks, as in :meth:`register`).
        """
        outcomes: list[bool | str] = []
        with self._database.transaction() as db:
            for identity_key, invitation, now in items:
                if db.execute("SELECT 1 FROM registrations WHERE identity_key = ?", (identity_key,)).fetchone():
                    outcomes.append(False)
                    continue
                refusal = self._policy_refusal(db, identity_key, invitation, policy)
                if refusal is not None:
                    outcomes.append(refusal)
                    continue
                if policy == "invitation":
                    db.execute("UPDATE invitations SET used_by = ? WHERE code = ?", (identity_key, invitation))
                db.execute("INSERT INTO registrations VALUES (?, ?, ?)", (identity_key, invitation, now))
                outcomes.append(True)
        self.registrations_version += sum(1 for outcome in outcomes if outcome is True)
        return outcomes

    def _policy_refusal(self, db: sqlite3.Connection, identity_key: bytes, invitation: str | None, policy: str) -> str | None:
        if policy == "invitation":
            if invitation is None:
                return "an invitation code is required"
            row = db.execute("SELECT used_by FROM invitations WHERE code = ?", (invitation,)).fetchone()
            if row is None:
                return "unknown invitation code"
            if row[0] is not None:
                return "invitation code already used"
        elif policy == "allow-list":
            if not db.execute("SELECT 1 FROM allow_list WHERE identity_key = ?", (identity_key,)).fetchone():
                return "identity key is not on the allow-list"
        return None

    def roster(self) -> list[bytes]:
        with self._database.read() as db:
            rows = db.execute("SELECT identity_key FROM registrations ORDER BY identity_key").fetchall()
        return [bytes(row[0]) for row in rows]

    def is_registered(self, identity_key: bytes) -> bool:
        with self._database.read() as db:
            return db.execute("SELECT 1 FROM registrations WHERE identity_key = ?", (identity_key,)).fetchone() is not None

    # -- credentials -----------------------------------------------------------

    def credential_issued(self, identity_key: bytes) -> bool:
        with self._database.read() as db:
            return db.execute("SELECT 1 FROM credentials WHERE identity_key = ?", (identity_key,)).fetchone() is not None

    def record_credential(self, identity_key: bytes, partition: int, response: bytes, now: int) -> bool:
        """Record an issued credential; False if this peer already had one (nothing stored)."""
        return self.record_credentials([(identity_key, partition, response, now)])[0]

    def record_credentials(self, items: Sequence[tuple[bytes, int, bytes, int]]) -> list[bool]:
        """Record ``(identity_key, partition, response, now)`` credentials in one commit.

        Per item False if that peer already had one (the first stays: one credential per peer per round).
        """
        outcomes: list[bool] = []
        with self._database.transaction() as db:
            for item in items:
                cursor = db.execute("INSERT OR IGNORE INTO credentials VALUES (?, ?, ?, ?)", item)
                outcomes.append(cursor.rowcount == 1)
        return outcomes

    # -- packets ----------------------------------------------------------------

    def replay_seen(self, tag: bytes) -> bool:
        """Whether ``tag`` is in the final hop's replay cache (tags are added by :meth:`store_batch`)."""
        with self._database.read() as db:
            return db.execute("SELECT 1 FROM replay_tags WHERE tag = ?", (tag,)).fetchone() is not None

    # -- the inbox: frames received and durable, not yet verified ---------------------

    def enqueue(self, frames: Sequence[bytes], arrived: int) -> None:
        """Make received frames durable with their arrival time (the link acknowledges after this)."""
        with self._database.transaction() as db:
            db.executemany("INSERT INTO inbox (frame, arrived) VALUES (?, ?)", [(f, arrived) for f in frames])
        self.inbox_count += len(frames)

    def inbox_batch(self, limit: int, after: int = 0) -> list[tuple[int, bytes, int]]:
        """The oldest ``limit`` unverified frames with ids above ``after``, as ``(id, frame, arrived)``."""
        with self._database.read() as db:
            rows = db.execute(
                "SELECT id, frame, arrived FROM inbox WHERE id > ? ORDER BY id LIMIT ?", (after, limit)
            ).fetchall()
        return [(int(i), bytes(f), int(a)) for i, f, a in rows]

    def inbox_size(self) -> int:
        return self.inbox_count

    def inbox_pending_before(self, when: int) -> bool:
        """Whether a frame that arrived before ``when`` still awaits its verdict."""
        with self._database.read() as db:
            return db.execute("SELECT 1 FROM inbox WHERE arrived < ? LIMIT 1", (when,)).fetchone() is not None

    def store_batch(
        self,
        packets: Sequence[VerifiedPacket],
        rejections: Sequence[str],
        now: int,
        replay_tags: Sequence[bytes] = (),
        done_inbox_ids: Sequence[int] = (),
    ) -> list[str]:
        """Store verified packets and count rejections in one transaction.

        Returns one outcome per packet: ``"accepted"``, ``"duplicate"`` (same
        survey, tag and message as a stored packet: counted once) or
        ``"double-submission"`` (same tag, another message: the first is kept,
        DESIGN.md §6). Duplicates and double submissions are counted as
        rejections by that reason.
        """
        outcomes: list[str] = []
        counted: dict[str, int] = {}
        for reason in rejections:
            counted[reason] = counted.get(reason, 0) + 1
        with self._database.transaction() as db:
            for packet in packets:
                survey = packet.survey.to_bytes()
                row = db.execute(
                    "SELECT message_hash FROM packets WHERE survey = ? AND tag_digest = ?", (survey, packet.tag_digest)
                ).fetchone()
                if row is None:
                    db.execute(
                        "INSERT INTO packets VALUES (?, ?, ?, ?, ?, ?)",
                        (survey, packet.tag_digest, packet.message_hash, packet.report, packet.receipt, now),
                    )
                    outcomes.append("accepted")
                    continue
                outcome = "duplicate" if bytes(row[0]) == packet.message_hash else "double-submission"
                outcomes.append(outcome)
                counted[outcome] = counted.get(outcome, 0) + 1
            # The inbox rows go in the same transaction: each frame is decided exactly once.
            deleted = db.executemany("DELETE FROM inbox WHERE id = ?", [(i,) for i in done_inbox_ids]).rowcount
            # Replay tags commit with the batch: one fsync per batch, not per packet.
            db.executemany("INSERT OR IGNORE INTO replay_tags VALUES (?)", [(t,) for t in replay_tags])
            db.executemany(
                "INSERT INTO rejections VALUES (?, ?) ON CONFLICT(reason) DO UPDATE SET count = count + excluded.count",
                sorted(counted.items()),
            )
        self.inbox_count -= max(deleted, 0)
        self.packets_version += outcomes.count("accepted")
        return outcomes

    def reports(self, survey: SurveyId) -> list[bytes]:
        with self._database.read() as db:
            rows = db.execute(
                "SELECT report FROM packets WHERE survey = ? ORDER BY tag_digest", (survey.to_bytes(),)
            ).fetchall()
        return [bytes(row[0]) for row in rows]

    def receipts(self) -> dict[SurveyId, list[bytes]]:
        with self._database.read() as db:
            rows = db.execute("SELECT survey, receipt FROM packets ORDER BY survey, receipt").fetchall()
        log: dict[SurveyId, list[bytes]] = {}
        for survey, receipt in rows:
            log.setdefault(SurveyId.from_bytes(bytes(survey)), []).append(bytes(receipt))
        return log

    def counts(self) -> dict[str, int]:
        with self._database.read() as db:
            registered = db.execute("SELECT COUNT(*) FROM registrations").fetchone()[0]
            credentials = db.execute("SELECT COUNT(*) FROM credentials").fetchone()[0]
            accepted = db.execute("SELECT COUNT(*) FROM packets").fetchone()[0]
        return {"registered": int(registered), "credentials": int(credentials), "accepted": int(accepted)}

    def accepted_by_survey(self) -> dict[SurveyId, int]:
        with self._database.read() as db:
            rows = db.execute("SELECT survey, COUNT(*) FROM packets GROUP BY survey").fetchall()
        return {SurveyId.from_bytes(bytes(survey)): int(count) for survey, count in rows}

    def timeline(self, bucket_seconds: int) -> dict[str, list[tuple[int, int]]]:
        """Counts per ``bucket_seconds`` of time: ``registered``, ``credentials``, and one entry per survey.

        Each list holds ``(bucket start, count)`` for the buckets with any
        event (the dashboard draws the cumulative curves); survey keys are
        ``SurveyId.to_bytes().hex()``.
        """
        bucket = max(1, int(bucket_seconds))
        timeline: dict[str, list[tuple[int, int]]] = {}
        with self._database.read() as db:
            for key, table, column in (("registered", "registrations", "registered_at"), ("credentials", "credentials", "issued_at")):
                rows = db.execute(f"SELECT {column} / ? * ?, COUNT(*) FROM {table} GROUP BY 1 ORDER BY 1", (bucket, bucket)).fetchall()
                timeline[key] = [(int(t), int(n)) for t, n in rows]
            rows = db.execute(
                "SELECT survey, accepted_at / ? * ?, COUNT(*) FROM packets GROUP BY 1, 2 ORDER BY 1, 2", (bucket, bucket)
            ).fetchall()
        for survey, t, n in rows:
            timeline.setdefault(bytes(survey).hex(), []).append((int(t), int(n)))
        return timeline

    def rejections(self) -> dict[str, int]:
        with self._database.read() as db:
            rows = db.execute("SELECT reason, count FROM rejections ORDER BY reason").fetchall()
        return {str(reason): int(count) for reason, count in rows}

    def partitions(self) -> dict[bytes, int]:
        with self._database.read() as db:
            rows = db.execute("SELECT identity_key, partition FROM credentials").fetchall()
        return {bytes(key): int(partition) for key, partition in rows}


class AggregatorHome:
    """The aggregator's data directory (owner-only).

    ``identity.key`` (Ed25519 seed) and ``final_hop.key`` (X25519 private key)
    are created once by ``anonml aggregator init``; each round lives in
    ``rounds/<round_id hex>/`` with its SQLite database and report files.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def identity_path(self) -> Path:
        return self.root / "identity.key"

    @property
    def final_hop_path(self) -> Path:
        return self.root / "final_hop.key"

    def initialise(self, identity_seed: bytes, final_hop_private: bytes) -> None:
        """Write both keys; refuses to overwrite an existing identity (FileExistsError)."""
        make_private_dir(self.root)
        for path, secret in ((self.identity_path, identity_seed), (self.final_hop_path, final_hop_private)):
            write_secret_file(path, secret)

    def signing_key(self) -> SigningKey:
        """The aggregator's Ed25519 identity: it signs manifests and rosters; relays pin its public half."""
        return SigningKey(self.read_key(self.identity_path))

    def read_key(self, path: Path) -> bytes:
        """A 32-byte key file of this home; ConfigError (naming the fix) if it is missing, open to others or malformed."""
        if not path.exists():
            raise ConfigError(f"{str(path)!r} is missing: run `anonml aggregator init --data-dir {self.root}` first")
        data = read_secret_file(path, what="the aggregator key", max_bytes=32)
        if len(data) != 32:
            raise ConfigError(f"{str(path)!r} holds {len(data)} bytes, expected 32")
        return data

    def round_dir(self, round_id: bytes) -> Path:
        return self.root / "rounds" / round_id.hex()

    def rounds(self) -> list[str]:
        base = self.root / "rounds"
        return sorted(p.name for p in base.iterdir()) if base.is_dir() else []
