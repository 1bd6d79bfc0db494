"""The peer's SQLite store (DESIGN.md §10): registrations, credential, privacy
ledger and the packets it has sent.

One store may hold several identities (the demo runs many peers per worker
process over one database); every row is keyed by the identity's public key.
A spend is committed *before* its packet leaves (issue 6), and a packet's exact
content is kept so a missing receipt is answered by resending the same bytes
over another path, which the aggregator counts once (DESIGN.md §5, §6).
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from anonml.base.errors import StorageError
from anonml.mechanisms import Release, ReleaseKind
from anonml.base.storage import Database, Schema

# Proofs of equivocation (issue 12): two signed documents that contradict each other.
_EQUIVOCATIONS = """
CREATE TABLE equivocations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    peer TEXT NOT NULL,
    round_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    first BLOB NOT NULL,
    second BLOB NOT NULL,
    detected_at REAL NOT NULL
);
"""

# The peer's own settings (issue 11): its lifetime privacy budget.
_SETTINGS = """
CREATE TABLE settings (
    name TEXT PRIMARY KEY,
    value REAL NOT NULL
);
"""

DEFAULT_LIFETIME_EPSILON = 10.0
"""The record-level ε a store's identities may spend over all rounds until
their owner sets another (``anonml peer budget``): five rounds at the demo's ε_T = 2."""

SCHEMA = Schema(
    name="peer",
    application_id=0x414E5002,  # "ANP\x02"
    version=6,
    tables="""
CREATE TABLE registrations (
    peer TEXT NOT NULL,
    aggregator TEXT NOT NULL,
    round_name TEXT NOT NULL,
    round_id TEXT NOT NULL,
    registered_at REAL NOT NULL,
    partition INTEGER,
    credential BLOB,
    manifest BLOB,
    issuance BLOB,
    PRIMARY KEY (peer, aggregator, round_name)
);
CREATE TABLE spends (
    peer TEXT NOT NULL,
    round_id TEXT NOT NULL,
    survey TEXT NOT NULL,
    features TEXT NOT NULL,
    label INTEGER NOT NULL,
    epsilon REAL NOT NULL,
    recorded_at REAL NOT NULL,
    kind TEXT,
    PRIMARY KEY (peer, survey)
);
CREATE TABLE packets (
    peer TEXT NOT NULL,
    survey TEXT NOT NULL,
    round_id TEXT NOT NULL,
    message BLOB NOT NULL,
    receipt TEXT NOT NULL,
    sends INTEGER NOT NULL DEFAULT 0,
    acknowledged INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (peer, survey)
);
"""
    + _EQUIVOCATIONS
    + _SETTINGS,
    migrations={
        # Version 2 (issue 12): proofs of equivocation, two signed documents that contradict each other.
        1: """
ALTER TABLE registrations ADD COLUMN manifest BLOB;
"""
        + _EQUIVOCATIONS,
        # Version 3 (issue 11): the lifetime budget; until it is set, the default applies.
        2: _SETTINGS,
        # Version 4 (issue 28): a release of another kind than a median answer or a subset report.
        3: "ALTER TABLE spends ADD COLUMN kind TEXT;",
        # Version 5 (issue 27): the blinded credential request in progress (its secret and blinding seed),
        # so a retry after a crash sends the same request and the aggregator replays its stored answer.
        4: "ALTER TABLE registrations ADD COLUMN issuance BLOB;",
        # Version 6 (issue 28): an SGD round's gradient report, stored until now as a subset report (label set,
        # no kind), becomes a gradient release. It is the only labelled spend on a median survey (a median
        # answer carries no label): the survey id's kind byte (``protocol.SurveyId``: 16 bytes of domain,
        # 32 of round id, then the kind, 1 = median) is hex digits 97-98. The ε stays as it was.
        5: f"UPDATE spends SET kind = '{ReleaseKind.GRADIENT}' WHERE kind IS NULL AND label = 1 AND substr(survey, 97, 2) = '01';",
    },
    # Peers from before stores were versioned wrote the version-1 tables.
    unversioned=1,
)


class StoreError(StorageError):
    """Raised by :class:`PeerStore` when the database cannot be opened or a
    record contradicts one already stored (a second spend or packet for the
    same survey, a different manifest for a round already joined)."""


@dataclass(frozen=True)
class Registration:
    """What a peer remembers of one round it registered for.

    ``round_id`` is the hash of the manifest it registered under (DESIGN.md §4).
    """

    round_id: bytes
    aggregator: str
    round_name: str
    partition: int | None
    credential: bytes | None
    issuance: bytes | None = None
    """The credential request being made (``PeerRound.issuance``) until the credential is stored."""


@dataclass(frozen=True)
class Spend:
    """One release recorded in the ledger: which survey, which features (and
    whether the label), at what epsilon (a round's releases sum to the peer's record-level epsilon).
    ``kind`` names a release that is neither a median answer nor a subset report (a model); a
    release carried by several packets is recorded once, under its first survey."""

    survey: bytes
    features: tuple[str, ...]
    label: bool
    epsilon: float
    kind: ReleaseKind | None = None

    def releases(self) -> list[Release]:
        """What this spend adds to the peer's ledger: a median answer is one comparison bit per feature
        at ``epsilon`` each, a subset report (or a release of ``kind``) one release at ``epsilon``."""
        if self.kind is not None:
            return [Release.about(self.kind, self.features, self.epsilon)]
        if self.label:
            return [Release.subset(self.features, self.epsilon)]
        return [Release.comparison(feature, self.epsilon) for feature in self.features]


@dataclass(frozen=True)
class StoredPacket:
    """The end-to-end message sent for one survey, and the receipt that acknowledges it."""

    survey: bytes
    message: bytes
    receipt: bytes
    sends: int
    acknowledged: bool


@dataclass(frozen=True)
class EquivocationProof:
    """Two documents signed by one aggregator identity that cannot both be true (DESIGN.md §5)."""

    round_id: bytes
    kind: str
    first: bytes
    second: bytes


class PeerStore:
    """A peer's SQLite database in WAL mode.

    ``durable=True`` (the CLI) syncs every commit to disk; the demo, which runs
    thousands of peers in one process, may pass ``False``: commits then survive
    a crash of the process but not of the machine.
    """

    def __init__(self, path: Path, *, durable: bool = True) -> None:
        # private: the file holds this peer's credentials and what it sent.
        self._database = Database(path, SCHEMA, durable=durable, private=True)

    def close(self) -> None:
        self._database.close()

    def _write(self, sql: str, parameters: tuple[object, ...]) -> None:
        with self._database.transaction() as db:
            db.execute(sql, parameters)

    # -- registrations ---------------------------------------------------

    def registration(self, peer: bytes, round_id: bytes) -> Registration | None:
        with self._database.read() as db:
            row = db.execute(
                "SELECT aggregator, round_name, partition, credential, issuance FROM registrations WHERE peer=? AND round_id=?",
                (peer.hex(), round_id.hex()),
            ).fetchone()
        if row is None:
            return None
        return Registration(round_id, row[0], row[1], row[2], row[3], row[4])

    def remember_manifest(self, peer: bytes, aggregator: str, round_name: str, round_id: bytes, manifest: bytes = b"") -> bytes | None:
        """Record the manifest (by its hash, the round id) a peer registers under.

        A round is what one aggregator calls ``round_name``; if it later serves
        a manifest with another hash under that name the peer refuses it
        (DESIGN.md §4: "a peer refuses a round whose manifest hash differs
        from the one it registered under"). Returns None, or the signed
        manifest first remembered when ``round_id`` differs from it (the
        caller keeps both as a proof of equivocation).
        """
        with self._database.transaction() as db:
            row = db.execute(
                "SELECT round_id, manifest FROM registrations WHERE peer=? AND aggregator=? AND round_name=?",
                (peer.hex(), aggregator, round_name),
            ).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO registrations (peer, aggregator, round_name, round_id, registered_at, manifest)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (peer.hex(), aggregator, round_name, round_id.hex(), time.time(), manifest),
                )
            elif row[0] != round_id.hex():
                return bytes(row[1] or b"")
        return None

    def set_partition(self, peer: bytes, round_id: bytes, partition: int) -> None:
        self._write(
            "UPDATE registrations SET partition=? WHERE peer=? AND round_id=?", (partition, peer.hex(), round_id.hex())
        )

    def set_issuance(self, peer: bytes, round_id: bytes, issuance: bytes) -> None:
        """Keep the credential request about to be sent (durable before it is)."""
        self._write("UPDATE registrations SET issuance=? WHERE peer=? AND round_id=?", (issuance, peer.hex(), round_id.hex()))

    def set_credential(self, peer: bytes, round_id: bytes, credential: bytes) -> None:
        """Store the credential; the request that obtained it is no longer needed and goes."""
        self._write(
            "UPDATE registrations SET credential=?, issuance=NULL WHERE peer=? AND round_id=?",
            (credential, peer.hex(), round_id.hex()),
        )

    # -- ledger ----------------------------------------------------------

    def spends(self, peer: bytes, round_id: bytes | None = None) -> list[Spend]:
        """Every release recorded for ``peer`` (in one round, or in all)."""
        query = "SELECT survey, features, label, epsilon, kind FROM spends WHERE peer=?"
        args: tuple[str, ...] = (peer.hex(),)
        if round_id is not None:
            query += " AND round_id=?"
            args += (round_id.hex(),)
        with self._database.read() as db:
            rows = db.execute(query + " ORDER BY recorded_at, survey", args).fetchall()
        return [Spend(bytes.fromhex(r[0]), tuple(json.loads(r[1])), bool(r[2]), r[3], None if r[4] is None else ReleaseKind(r[4]))
                for r in rows]

    def lifetime_epsilon(self) -> float:
        """The most record-level ε each identity of this store may spend over all its rounds."""
        with self._database.read() as db:
            row = db.execute("SELECT value FROM settings WHERE name='lifetime_epsilon'").fetchone()
        return DEFAULT_LIFETIME_EPSILON if row is None else float(row[0])

    def set_lifetime_epsilon(self, epsilon: float) -> None:
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"a lifetime epsilon must be a positive number, got {epsilon!r}")
        self._write("INSERT OR REPLACE INTO settings (name, value) VALUES ('lifetime_epsilon', ?)", (float(epsilon),))

    def record_spend(self, peer: bytes, round_id: bytes, spend: Spend, packet: tuple[bytes, bytes] | None = None, *,
                     further: Sequence[tuple[bytes, bytes, bytes]] = ()) -> None:
        """Commit one release to the ledger and, in the same transaction, the
        packet that carries it (``(message, receipt)``) and the ``further``
        packets carrying the rest of the same release to other surveys
        (``(survey, message, receipt)`` each: a model cut into blocks); a
        survey is spent on, and has a packet, at most once.

        One transaction because a peer killed between the two commits held a
        release that no stored packet carried: resumed, it could neither send
        that packet nor answer the survey again (CI: a `peer join` SIGKILLed
        at that moment and run again exited "the ledger already holds a
        release").
        """
        try:
            with self._database.transaction() as db:
                db.execute(
                    "INSERT INTO spends (peer, round_id, survey, features, label, epsilon, recorded_at, kind)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        peer.hex(),
                        round_id.hex(),
                        spend.survey.hex(),
                        json.dumps(list(spend.features)),
                        int(spend.label),
                        spend.epsilon,
                        time.time(),
                        None if spend.kind is None else str(spend.kind),
                    ),
                )
                carried = ([] if packet is None else [(spend.survey, *packet)]) + list(further)
                for survey, message, receipt in carried:
                    db.execute(
                        "INSERT INTO packets (peer, survey, round_id, message, receipt) VALUES (?, ?, ?, ?, ?)",
                        (peer.hex(), survey.hex(), round_id.hex(), message, receipt.hex()),
                    )
        except sqlite3.IntegrityError:
            raise StoreError(f"the ledger already holds a release, or a packet, for survey {spend.survey.hex()!r} "
                             f"or a survey carrying the rest of it") from None

    # -- packets ---------------------------------------------------------

    def packet(self, peer: bytes, survey: bytes) -> StoredPacket | None:
        with self._database.read() as db:
            row = db.execute(
                "SELECT message, receipt, sends, acknowledged FROM packets WHERE peer=? AND survey=?",
                (peer.hex(), survey.hex()),
            ).fetchone()
        if row is None:
            return None
        return StoredPacket(survey, row[0], bytes.fromhex(row[1]), row[2], bool(row[3]))

    def packets(self, round_id: bytes) -> list[tuple[bytes, StoredPacket]]:
        """Every packet any identity of this store prepared for ``round_id``, with that identity's key."""
        with self._database.read() as db:
            rows = db.execute(
                "SELECT peer, survey, message, receipt, sends, acknowledged FROM packets WHERE round_id=? ORDER BY peer, survey",
                (round_id.hex(),),
            ).fetchall()
        return [
            (bytes.fromhex(r[0]), StoredPacket(bytes.fromhex(r[1]), r[2], bytes.fromhex(r[3]), r[4], bool(r[5])))
            for r in rows
        ]

    def count_send(self, peer: bytes, survey: bytes) -> None:
        self._write("UPDATE packets SET sends=sends+1 WHERE peer=? AND survey=?", (peer.hex(), survey.hex()))

    # -- equivocation ------------------------------------------------------

    def record_equivocation(self, peer: bytes, proof: EquivocationProof) -> None:
        """Keep both signed documents: anyone can check the signatures and see the contradiction."""
        self._write(
            "INSERT INTO equivocations (peer, round_id, kind, first, second, detected_at) VALUES (?, ?, ?, ?, ?, ?)",
            (peer.hex(), proof.round_id.hex(), proof.kind, proof.first, proof.second, time.time()),
        )

    def equivocations(self, peer: bytes) -> list[EquivocationProof]:
        with self._database.read() as db:
            rows = db.execute(
                "SELECT round_id, kind, first, second FROM equivocations WHERE peer=? ORDER BY id", (peer.hex(),)
            ).fetchall()
        return [EquivocationProof(bytes.fromhex(r[0]), r[1], r[2], r[3]) for r in rows]

    def acknowledge(self, peer: bytes, survey: bytes) -> None:
        self._write("UPDATE packets SET acknowledged=1 WHERE peer=? AND survey=?", (peer.hex(), survey.hex()))
