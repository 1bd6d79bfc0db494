"""The aggregator's durable state for one round: SQLite in WAL mode (DESIGN.md §10).

Registrations, invitations, the allow-list, credentials issued, the inbox of
received messages, accepted packets (unique per survey and tag digest,
DESIGN.md §6), rejections counted by reason, the receipt log, final-hop replay
tags, and published results. A frame is acknowledged on the link only after
its final Sphinx layer has verified (nothing unauthenticated is stored,
DESIGN.md §5) and :meth:`RoundStore.enqueue` has committed the message it
carries, under its replay tag; verification then moves it from the inbox to
the packets or the rejection counts in one transaction.

One connection per store, used from the event loop and from verification
threads; a lock serialises access (SQLite connections are not thread-safe).
"""

from __future__ import annotations

import enum
import sqlite3
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nacl.signing import SigningKey

from anonml.base.errors import ConfigError
from anonml.protocol import Check, RegistrationPolicy, RosterEntry, SurveyId
from anonml.base.storage import (
    Database,
    Schema,
    make_private_dir,
    read_secret_file,
    write_secret_file,
)

SCHEMA = Schema(
    name="round",
    application_id=0x414E4103,  # "ANA\x03"
    version=4,
    tables="""
CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE invitations (code TEXT PRIMARY KEY, used_by BLOB);
CREATE TABLE allow_list (identity_key BLOB PRIMARY KEY);
CREATE TABLE registrations (
    identity_key BLOB PRIMARY KEY, invitation TEXT, registered_at INTEGER NOT NULL,
    nonce BLOB, signature BLOB);
CREATE TABLE client_registrations (client TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE credentials (
    identity_key BLOB PRIMARY KEY, partition INTEGER NOT NULL, response BLOB NOT NULL,
    issued_at INTEGER NOT NULL);
CREATE TABLE packets (
    survey BLOB NOT NULL, tag_digest BLOB NOT NULL, message_hash BLOB NOT NULL,
    report BLOB NOT NULL, receipt BLOB NOT NULL, accepted_at INTEGER NOT NULL,
    position INTEGER, arrived REAL,
    PRIMARY KEY (survey, tag_digest));
CREATE UNIQUE INDEX packets_log ON packets (survey, position);
CREATE TABLE rejections (reason TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE covers (reason TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE heads (
    survey BLOB NOT NULL, check_index INTEGER NOT NULL, size INTEGER NOT NULL, document BLOB NOT NULL,
    PRIMARY KEY (survey, check_index));
CREATE TABLE replay_tags (tag BLOB PRIMARY KEY);
CREATE TABLE results (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, tag BLOB NOT NULL UNIQUE, message BLOB NOT NULL,
    arrived REAL NOT NULL);
""",
    migrations={
        # Version 2 (issue 12): roster entries carry the peer's nonce and
        # signature; accepted packets their place in their survey's receipt
        # log; signed tree heads; covers; registrations per client.
        1: """
ALTER TABLE registrations ADD COLUMN nonce BLOB;
ALTER TABLE registrations ADD COLUMN signature BLOB;
CREATE TABLE client_registrations (client TEXT PRIMARY KEY, count INTEGER NOT NULL);
ALTER TABLE packets ADD COLUMN position INTEGER;
CREATE UNIQUE INDEX packets_log ON packets (survey, position);
CREATE TABLE covers (reason TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE heads (
    survey BLOB NOT NULL, check_index INTEGER NOT NULL, size INTEGER NOT NULL, document BLOB NOT NULL,
    PRIMARY KEY (survey, check_index));
""",
        # Version 3 (issue 12, the anonymity report): each accepted packet's
        # arrival time to the sub-second, as an aggregator that logs every
        # arrival would have it (the inbox's INTEGER column holds REAL values as they are).
        2: "ALTER TABLE packets ADD COLUMN arrived REAL;",
        # Version 4 (issue 13): version 3 stored raw frames before any check.
        # Frames waiting then are kept aside and opened (or refused) when the
        # round's sink starts (PacketSink.admit_legacy_frames), in arrival order.
        3: """
ALTER TABLE inbox RENAME TO inbox_frames_v1;
CREATE TABLE inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, tag BLOB NOT NULL UNIQUE, message BLOB NOT NULL,
    arrived REAL NOT NULL)
""",
    },
    # Rounds from before stores were versioned wrote the version-1 tables.
    unversioned=1,
)


class Registered(enum.Enum):
    """How :meth:`RoundStore.register_many` settled one registration."""

    NEW = "new"
    ALREADY = "already registered"


@dataclass(frozen=True)
class Refusal:
    """A registration the round's policy or caps refuse; ``reason`` is the 403 error text."""

    reason: str


@dataclass(frozen=True)
class Registration:
    """One registration to record: the signed roster entry, its invitation code, the client it came from, when."""

    entry: RosterEntry
    invitation: str | None
    client: str
    now: int


@dataclass(frozen=True)
class VerifiedPacket:
    """A packet whose token verified: what :meth:`RoundStore.store_batch` records."""

    survey: SurveyId
    tag_digest: bytes
    message_hash: bytes
    report: bytes
    receipt: bytes
    arrived: float = 0.0
    """When its frame reached the sink (UTC seconds)."""


class RoundStore:
    """One round's SQLite database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Durable (a commit is on disk before the link acknowledges, DESIGN.md
        # §10) and private: the file holds the issuer's secret key and the seed.
        self._database = Database(path, SCHEMA, private=True)
        with self._database.read() as db:
            # Deleted content is overwritten, not left in free pages: the issuer key is erased
            # when the round ends (:meth:`erase_meta`).
            db.execute("PRAGMA secure_delete = ON")
            self.inbox_count = int(db.execute("SELECT COUNT(*) FROM inbox").fetchone()[0])
            """Frames waiting for verification (kept in memory: the sink checks it per batch)."""
            rows = db.execute("SELECT survey, COUNT(*) FROM packets GROUP BY survey").fetchall()
        self._log_sizes: dict[bytes, int] = {bytes(survey): int(count) for survey, count in rows}
        """Leaves per survey's receipt log: the next accepted packet's position."""

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

    def erase_meta(self, key: str) -> None:
        """Delete ``key`` so that its bytes are gone from the file: overwritten in the database
        (``secure_delete``) and the WAL, which held the page's old image, checkpointed and truncated."""
        with self._database.transaction() as db:
            db.execute("DELETE FROM meta WHERE key = ?", (key,))
        with self._database.read() as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

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

    def register_many(
        self, items: Sequence[Registration], policy: RegistrationPolicy, *, max_roster: int, max_per_client: int
    ) -> list[Registered | Refusal]:
        """Record registrations in one commit (one fsync for all); per item how it was settled.

        Refused: a missing, unknown or used invitation, a key not on the
        allow-list, a full roster (``max_roster``: every client must be able
        to read the roster), or, under the open policy, a client that has
        registered ``max_per_client`` identities already (a Sybil cap).
        Re-registering the same key is idempotent.
        """
        outcomes: list[Registered | Refusal] = []
        with self._database.transaction() as db:
            (size,) = db.execute("SELECT COUNT(*) FROM registrations").fetchone()
            for item in items:
                key = item.entry.identity_key
                if db.execute("SELECT 1 FROM registrations WHERE identity_key = ?", (key,)).fetchone():
                    outcomes.append(Registered.ALREADY)
                    continue
                refusal = self._policy_refusal(db, item, policy, max_per_client)
                if refusal is None and size >= max_roster:
                    refusal = f"the roster is full ({max_roster} identities)"
                if refusal is not None:
                    outcomes.append(Refusal(refusal))
                    continue
                if policy is RegistrationPolicy.INVITATION:
                    db.execute("UPDATE invitations SET used_by = ? WHERE code = ?", (key, item.invitation))
                elif policy is RegistrationPolicy.OPEN:
                    db.execute(
                        "INSERT INTO client_registrations VALUES (?, 1) ON CONFLICT(client) DO UPDATE SET count = count + 1",
                        (item.client,),
                    )
                db.execute(
                    "INSERT INTO registrations VALUES (?, ?, ?, ?, ?)",
                    (key, item.invitation, item.now, item.entry.nonce, item.entry.signature),
                )
                size += 1
                outcomes.append(Registered.NEW)
        return outcomes

    def _policy_refusal(self, db: sqlite3.Connection, item: Registration, policy: RegistrationPolicy, max_per_client: int) -> str | None:
        if policy is RegistrationPolicy.INVITATION:
            if item.invitation is None:
                return "an invitation code is required"
            row = db.execute("SELECT used_by FROM invitations WHERE code = ?", (item.invitation,)).fetchone()
            if row is None:
                return "unknown invitation code"
            if row[0] is not None:
                return "invitation code already used"
        elif policy is RegistrationPolicy.ALLOW_LIST:
            if not db.execute("SELECT 1 FROM allow_list WHERE identity_key = ?", (item.entry.identity_key,)).fetchone():
                return "identity key is not on the allow-list"
        else:
            row = db.execute("SELECT count FROM client_registrations WHERE client = ?", (item.client,)).fetchone()
            if row is not None and row[0] >= max_per_client:
                return f"this client has registered {row[0]} identities, the most the round admits from one client"
        return None

    def roster_entries(self) -> list[RosterEntry]:
        """Every registration as a signed roster entry, in key order."""
        with self._database.read() as db:
            rows = db.execute(
                "SELECT identity_key, nonce, signature FROM registrations WHERE nonce IS NOT NULL ORDER BY identity_key"
            ).fetchall()
        return [RosterEntry(bytes(k), bytes(n), bytes(s)) for k, n, s in rows]

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

    # -- the inbox: authentic messages received and durable, not yet verified ----------

    def enqueue(self, messages: Sequence[tuple[bytes, bytes]], arrived: float,
                refusals: Mapping[str, int] | None = None) -> list[int | None]:
        """Make received ``(replay tag, message)`` pairs durable with their arrival time (the
        link acknowledges after this): per pair its inbox row id, or None if its tag was
        seen before (a replay: nothing stored). ``refusals`` (frames refused at the link,
        by reason) are counted in the same commit."""
        row_ids: list[int | None] = []
        with self._database.transaction() as db:
            for tag, message in messages:
                if db.execute("SELECT 1 FROM replay_tags WHERE tag = ?", (tag,)).fetchone() is not None:
                    row_ids.append(None)
                    continue
                cursor = db.execute("INSERT OR IGNORE INTO inbox (tag, message, arrived) VALUES (?, ?, ?)",
                                    (tag, message, arrived))
                row_ids.append(cursor.lastrowid if cursor.rowcount == 1 else None)
            self._count_rejections(db, refusals or {})
        self.inbox_count += sum(row_id is not None for row_id in row_ids)
        return row_ids

    def count_rejections(self, counts: Mapping[str, int]) -> None:
        """Add ``counts`` to the rejection counters (one commit)."""
        with self._database.transaction() as db:
            self._count_rejections(db, counts)

    @staticmethod
    def _count_rejections(db: sqlite3.Connection, counts: Mapping[str, int]) -> None:
        """Add ``counts`` to the rejection counters, or to the cover counters for reasons naming a cover."""
        for table, covers in (("rejections", False), ("covers", True)):
            db.executemany(
                f"INSERT INTO {table} VALUES (?, ?) ON CONFLICT(reason) DO UPDATE SET count = count + excluded.count",
                sorted((str(reason), count) for reason, count in counts.items() if count and is_cover(reason) is covers),
            )

    def inbox_batch(self, limit: int, after: int = 0) -> list[tuple[int, bytes, bytes, float]]:
        """The oldest ``limit`` unverified messages with ids above ``after``, as ``(id, tag, message, arrived)``."""
        with self._database.read() as db:
            rows = db.execute(
                "SELECT id, tag, message, arrived FROM inbox WHERE id > ? ORDER BY id LIMIT ?", (after, limit)
            ).fetchall()
        return [(int(i), bytes(t), bytes(m), float(a)) for i, t, m, a in rows]

    def legacy_frames(self) -> list[tuple[int, bytes, float]]:
        """Frames a store before version 4 received but had not verified, as ``(id, frame, arrived)``."""
        with self._database.read() as db:
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'inbox_frames_v1'").fetchone() is None:
                return []
            rows = db.execute("SELECT id, frame, arrived FROM inbox_frames_v1 ORDER BY id").fetchall()
        return [(int(i), bytes(f), float(a)) for i, f, a in rows]

    def drop_legacy_frames(self) -> None:
        """Forget the frames of a store before version 4 once they are admitted (or refused)."""
        with self._database.transaction() as db:
            db.execute("DROP TABLE IF EXISTS inbox_frames_v1")

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
        rejections by that reason; reasons naming a cover (``cover``,
        ``cover/...``) are counted as covers. An accepted packet's receipt
        becomes the next leaf of its survey's log as the commit makes it
        durable (DESIGN.md §5: leaves in acceptance order).
        """
        outcomes: list[str] = []
        counted: Counter[str] = Counter(rejections)
        sizes = dict(self._log_sizes)
        with self._database.transaction() as db:
            for packet in packets:
                survey = packet.survey.to_bytes()
                row = db.execute(
                    "SELECT message_hash FROM packets WHERE survey = ? AND tag_digest = ?", (survey, packet.tag_digest)
                ).fetchone()
                if row is None:
                    position = sizes.get(survey, 0)
                    sizes[survey] = position + 1
                    db.execute(
                        "INSERT INTO packets VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (survey, packet.tag_digest, packet.message_hash, packet.report, packet.receipt, now, position,
                         packet.arrived),
                    )
                    outcomes.append("accepted")
                    continue
                outcome = "duplicate" if bytes(row[0]) == packet.message_hash else "double-submission"
                outcomes.append(outcome)
                counted[outcome] += 1
            # The inbox rows go in the same transaction: each frame is decided exactly once.
            deleted = db.executemany("DELETE FROM inbox WHERE id = ?", [(i,) for i in done_inbox_ids]).rowcount
            # Replay tags commit with the batch: one fsync per batch, not per packet.
            db.executemany("INSERT OR IGNORE INTO replay_tags VALUES (?)", [(t,) for t in replay_tags])
            self._count_rejections(db, counted)
        self._log_sizes = sizes
        self.inbox_count -= max(deleted, 0)
        return outcomes

    def accepted_count(self, survey: SurveyId) -> int:
        """Packets accepted for ``survey`` so far (its receipt log's size)."""
        return self._log_sizes.get(survey.to_bytes(), 0)

    def reports(self, survey: SurveyId) -> list[bytes]:
        with self._database.read() as db:
            rows = db.execute(
                "SELECT report FROM packets WHERE survey = ? ORDER BY tag_digest", (survey.to_bytes(),)
            ).fetchall()
        return [bytes(row[0]) for row in rows]

    def log_leaves(self, survey: SurveyId, size: int | None = None) -> list[bytes]:
        """The first ``size`` (default: all) receipt digests of ``survey``'s log, in acceptance order."""
        with self._database.read() as db:
            rows = db.execute(
                "SELECT receipt FROM packets WHERE survey = ? AND position < ? ORDER BY position",
                (survey.to_bytes(), 2**62 if size is None else size),
            ).fetchall()
        return [bytes(row[0]) for row in rows]

    def receipts(self) -> dict[SurveyId, list[bytes]]:
        """Every survey's receipt log, leaves in acceptance order (the audit of ``anonml bench faults``)."""
        with self._database.read() as db:
            rows = db.execute("SELECT survey, receipt FROM packets ORDER BY survey, position").fetchall()
        log: dict[SurveyId, list[bytes]] = {}
        for survey, receipt in rows:
            log.setdefault(SurveyId.from_bytes(bytes(survey)), []).append(bytes(receipt))
        return log

    def put_head(self, survey: SurveyId, check: Check, size: int, document: bytes) -> bytes:
        """Record the signed head of ``survey`` at ``check`` unless one is recorded; the recorded one.

        Exactly one head per survey per check (DESIGN.md §5): a restarted
        aggregator serves the head it signed before, never a second one.
        """
        with self._database.transaction() as db:
            db.execute("INSERT OR IGNORE INTO heads VALUES (?, ?, ?, ?)", (survey.to_bytes(), int(check), size, document))
            (stored,) = db.execute(
                "SELECT document FROM heads WHERE survey = ? AND check_index = ?", (survey.to_bytes(), int(check))
            ).fetchone()
        return bytes(stored)

    def heads(self) -> list[tuple[SurveyId, Check, int, bytes]]:
        """Every signed head recorded, as ``(survey, check, size, document)``."""
        with self._database.read() as db:
            rows = db.execute("SELECT survey, check_index, size, document FROM heads ORDER BY survey, check_index").fetchall()
        return [(SurveyId.from_bytes(bytes(s)), Check(int(c)), int(n), bytes(d)) for s, c, n, d in rows]

    def covers(self) -> dict[str, int]:
        with self._database.read() as db:
            rows = db.execute("SELECT reason, count FROM covers ORDER BY reason").fetchall()
        return {str(reason): int(count) for reason, count in rows}

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

    def arrivals(self) -> list[tuple[SurveyId, bytes, float]]:
        """Every accepted packet as ``(survey, receipt digest, arrival time)``, in log order."""
        with self._database.read() as db:
            rows = db.execute("SELECT survey, receipt, COALESCE(arrived, accepted_at) FROM packets ORDER BY survey, position").fetchall()
        return [(SurveyId.from_bytes(bytes(s)), bytes(r), float(a)) for s, r, a in rows]

    def partitions(self) -> dict[bytes, int]:
        with self._database.read() as db:
            rows = db.execute("SELECT identity_key, partition FROM credentials").fetchall()
        return {bytes(key): int(partition) for key, partition in rows}


def is_cover(reason: str) -> bool:
    """Whether an outcome reason counts a cover packet (``cover`` or ``cover/<why>``)."""
    return reason == "cover" or reason.startswith("cover/")


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
