"""The aggregator's durable state for one round, on SQLite (the default) or PostgreSQL (DESIGN.md §10).

Registrations, invitations, the allow-list, credentials issued, the inbox of
received messages, accepted packets (unique per survey and tag digest,
DESIGN.md §6), rejections counted by reason, the receipt log, final-hop replay
tags, and published results. A frame is acknowledged on the link only after
its final Sphinx layer has verified (nothing unauthenticated is stored,
DESIGN.md §5) and :meth:`RoundStore.enqueue` has committed the message it
carries, under its replay tag; verification then moves it from the inbox to
the packets or the rejection counts in one transaction.

The SQL is written once for both engines (:mod:`aggregator._engines`), and
every rule holds the same way on both, including when several ingest workers
share one PostgreSQL store: a replay tag is taken by a unique constraint
when its message enters the inbox; a packet is accepted once per survey and
tag digest by the table's primary key (``INSERT … ON CONFLICT DO NOTHING``,
never a check-then-insert); a worker claims inbox rows before verifying them
(a claim lapses after a lease, so a killed worker's rows are taken over) and
decides them by deleting them in the commit that stores their outcome, so
a row is decided exactly once; and a survey's receipt log grows from
committed rows, its positions handed out by a per-survey counter row that
the committing transaction holds locked (dense, in commit order).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from anonml.aggregator._engines import PostgresLocation, Session, execute_each, open_engine
from anonml.aggregator._store_schema import POSTGRES_MIGRATIONS, SCHEMA
from anonml.base.errors import AnonMLError, ConfigError
from anonml.protocol import Check, RegistrationPolicy, RosterEntry, SurveyId

ROSTER_FINAL = "roster_final"
"""The meta key the round driver sets once every registration is stored and the roster frozen:
ingest workers derive the partition plan and verify only from then on."""

CLAIM_SECONDS = 30.0
"""How long a worker's claim on inbox rows lasts unless it decides them: then any worker may take them over."""


_TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "meta": ("key", "value"),
    "invitations": ("code", "used_by"),
    "allow_list": ("identity_key",),
    "registrations": ("identity_key", "invitation", "registered_at", "nonce", "signature"),
    "client_registrations": ("client", "count"),
    "credentials": ("identity_key", "partition", "response", "issued_at", "request_digest"),
    "packets": ("survey", "tag_digest", "message_hash", "report", "receipt", "accepted_at", "position", "arrived"),
    "rejections": ("reason", "count"),
    "covers": ("reason", "count"),
    "heads": ("survey", "check_index", "size", "document"),
    "replay_tags": ("tag",),
    "results": ("key", "value"),
    "inbox": ("tag", "message", "arrived", "relay"),
    "inbox_counters": ("relay", "counter", "value"),
    "log_sizes": ("survey", "size"),
    "leases": ("name", "holder", "expires"),
}
"""Every table of the current version and its columns: what :meth:`RoundStore.copy_from` moves."""


_KeyValueTable = Literal["meta", "results"]
"""The store's two tables of bytes by text key: the round's own state, and what it published."""


class BatchTaken(AnonMLError):
    """Some inbox rows of a batch were decided by another worker (its claim had lapsed): nothing was stored.

    Not a StorageError: trying the same batch again cannot succeed (its rows are gone)."""


class Registered(enum.Enum):
    """How :meth:`RoundStore.register_many` settled one registration."""

    NEW = "new"
    ALREADY = "already registered"


@dataclass(frozen=True)
class Refusal:
    """A registration the round's policy or caps refuse; ``reason`` is the 403 error text."""

    reason: str


@dataclass(frozen=True)
class IssuedCredential:
    """One credential to record, with the SHA-256 of the blinded request its response answers."""

    identity_key: bytes
    partition: int
    response: bytes
    now: int
    request_digest: bytes


@dataclass(frozen=True)
class IssuedAnswer:
    """The credential answer stored for a peer, and whether a request with a given digest is the one it answered.

    Only a ``same_request`` answer is given again (a retry whose answer was
    lost: the aggregator already saw that request and sent this answer). Any
    other request is refused 409, as is any for a credential stored before
    schema version 6, which kept no digest to match.
    """

    partition: int
    response: bytes
    same_request: bool


def _issued_answer(db: Session, identity_key: bytes, request_digest: bytes) -> IssuedAnswer | None:
    row = db.execute("SELECT partition, response, request_digest FROM credentials WHERE identity_key = ?",
                     (identity_key,)).fetchone()
    if row is None:
        return None
    partition, response, stored_digest = row
    return IssuedAnswer(int(partition), bytes(response), stored_digest is not None and bytes(stored_digest) == request_digest)


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
    """One round's database: a SQLite file (a path), or a schema on a PostgreSQL server (a :class:`PostgresLocation`)."""

    def __init__(self, location: Path | PostgresLocation) -> None:
        self.location = location
        self._engine = open_engine(location, SCHEMA, POSTGRES_MIGRATIONS)
        self.engine = self._engine.dialect
        """``"sqlite"`` or ``"postgresql"``."""
        # The one count of each relay's backlog, which the sink's caps read (:meth:`relay_backlog`): rows committed
        # (refreshed from the stored counters at each claim, since other workers enqueue and decide too) and
        # messages being committed now. Kept here, beside the rows they count, so no second copy can drift.
        self.inbox_by_relay: Counter[str] = Counter()
        """Undecided inbox messages per delivering relay, as of this process's last look."""
        self.inbox_count = 0
        """Their sum, the messages waiting for verification."""
        self._entering: Counter[str] = Counter()
        """Messages per relay a caller is committing to the inbox now (:meth:`entering`)."""
        with self._engine.read() as db:
            self._read_inbox_counters(db)

    def close(self) -> None:
        self._engine.close()

    # -- metadata and results ------------------------------------------------

    def _put(self, table: _KeyValueTable, key: str, value: bytes) -> None:
        with self._engine.transaction() as db:
            db.execute(f"INSERT INTO {table} (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                       (key, value))

    def _get(self, table: _KeyValueTable, key: str) -> bytes | None:
        with self._engine.read() as db:
            row = db.execute(f"SELECT value FROM {table} WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def put_meta(self, key: str, value: bytes) -> None:
        self._put("meta", key, value)

    def get_meta(self, key: str) -> bytes | None:
        return self._get("meta", key)

    def erase_meta(self, key: str) -> None:
        """Delete ``key`` so that its bytes are gone from the store's files: on SQLite overwritten in the
        database (``secure_delete``) and the WAL checkpointed and truncated; on PostgreSQL vacuumed."""
        with self._engine.transaction() as db:
            db.execute("DELETE FROM meta WHERE key = ?", (key,))
        self._engine.scrub("meta")

    def put_meta_once(self, key: str, value: bytes) -> bytes:
        """Store ``value`` under ``key`` unless a value is stored there already; return the stored one (as
        :meth:`publish_result`, for metadata: a relay's beacon commitment, its reveal)."""
        return self._put_once("meta", key, value)

    def meta_under(self, prefix: str) -> dict[str, bytes]:
        """Every metadata key that starts with ``prefix`` (one per relay, say), with its value."""
        with self._engine.read() as db:
            rows = db.execute("SELECT key, value FROM meta WHERE substr(key, 1, length(?)) = ?", (prefix, prefix)).fetchall()
        return {key: bytes(value) for key, value in rows}

    def put_result(self, key: str, value: bytes) -> None:
        self._put("results", key, value)

    def get_result(self, key: str) -> bytes | None:
        return self._get("results", key)

    def publish_result(self, key: str, value: bytes) -> bytes:
        """Store ``value`` under ``key`` unless a value is stored there already; return the stored one.

        For what the round signs once and peers compare (thresholds, an SGD
        step's model, the medians): a second driver (one that stalled past
        its lease, beside its successor) may compute its own copy, but the
        key's uniqueness decides in one statement which is ever served, so no
        two signed versions exist; a read before the write could not.
        """
        return self._put_once("results", key, value)

    def _put_once(self, table: _KeyValueTable, key: str, value: bytes) -> bytes:
        with self._engine.transaction() as db:
            db.execute(f"INSERT INTO {table} (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING", (key, value))
            (stored,) = db.execute(f"SELECT value FROM {table} WHERE key = ?", (key,)).fetchone()
        return bytes(stored)

    # -- registration ----------------------------------------------------------

    def add_invitations(self, codes: Iterable[str]) -> None:
        with self._engine.transaction() as db:
            db.executemany("INSERT INTO invitations (code) VALUES (?) ON CONFLICT DO NOTHING", [(c,) for c in codes])

    def add_allowed(self, keys: Iterable[bytes]) -> None:
        with self._engine.transaction() as db:
            db.executemany("INSERT INTO allow_list (identity_key) VALUES (?) ON CONFLICT DO NOTHING", [(k,) for k in keys])

    def register_many(
        self, items: Sequence[Registration], policy: RegistrationPolicy, *, max_roster: int, max_per_client: int
    ) -> list[Registered | Refusal]:
        """Record registrations in one commit (one fsync for all); per item how it was settled.

        Refused: a missing, unknown or used invitation, a key not on the
        allow-list, a full roster (``max_roster``: every client must be able
        to read the roster), or, under the open policy, a client that has
        registered ``max_per_client`` identities already (a Sybil cap).
        Re-registering the same key is idempotent. Registrations are served
        by the round driver alone (one process); the roster's size is read
        inside the transaction.
        """
        outcomes: list[Registered | Refusal] = []
        with self._engine.transaction() as db:
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
                        "INSERT INTO client_registrations (client, count) VALUES (?, 1) "
                        "ON CONFLICT (client) DO UPDATE SET count = client_registrations.count + 1",
                        (item.client,),
                    )
                db.execute(
                    "INSERT INTO registrations (identity_key, invitation, registered_at, nonce, signature) VALUES (?, ?, ?, ?, ?)",
                    (key, item.invitation, item.now, item.entry.nonce, item.entry.signature),
                )
                size += 1
                outcomes.append(Registered.NEW)
        return outcomes

    def _policy_refusal(self, db: Session, item: Registration, policy: RegistrationPolicy, max_per_client: int) -> str | None:
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
        with self._engine.read() as db:
            rows = db.execute(
                "SELECT identity_key, nonce, signature FROM registrations WHERE nonce IS NOT NULL ORDER BY identity_key"
            ).fetchall()
        return [RosterEntry(bytes(k), bytes(n), bytes(s)) for k, n, s in rows]

    def roster(self) -> list[bytes]:
        with self._engine.read() as db:
            rows = db.execute("SELECT identity_key FROM registrations ORDER BY identity_key").fetchall()
        return [bytes(row[0]) for row in rows]

    def is_registered(self, identity_key: bytes) -> bool:
        with self._engine.read() as db:
            return db.execute("SELECT 1 FROM registrations WHERE identity_key = ?", (identity_key,)).fetchone() is not None

    # -- credentials -----------------------------------------------------------

    def issued_answer(self, identity_key: bytes, request_digest: bytes) -> IssuedAnswer | None:
        """The credential answer stored for this peer, if any; see :class:`IssuedAnswer` for what a retry gets."""
        with self._engine.read() as db:
            return _issued_answer(db, identity_key, request_digest)

    def record_credential(self, item: IssuedCredential) -> IssuedAnswer:
        """Record one issued credential; what this request's peer is to be answered (:meth:`record_credentials`)."""
        return self.record_credentials([item])[0]

    def record_credentials(self, items: Sequence[IssuedCredential]) -> list[IssuedAnswer]:
        """Record issued credentials in one commit, each with the digest of the blinded request it answers.

        Per item the answer stored for that peer once this commits: its own if
        it is the peer's first, else the earlier one (one credential per peer
        per round), ``same_request`` if the item was that very request again.
        """
        outcomes: list[IssuedAnswer] = []
        with self._engine.transaction() as db:
            for item in items:
                db.execute(
                    "INSERT INTO credentials (identity_key, partition, response, issued_at, request_digest) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (item.identity_key, item.partition, item.response, item.now, item.request_digest))
                answer = _issued_answer(db, item.identity_key, item.request_digest)
                assert answer is not None, "a credential row conflicts or was just inserted"
                outcomes.append(answer)
        return outcomes

    # -- the inbox: authentic messages received and durable, not yet verified ----------

    def enqueue(self, messages: Sequence[tuple[bytes, bytes]], arrived: float,
                refusals: Mapping[str, int] | None = None, relay: str = "") -> list[int | None]:
        """Make received ``(replay tag, message)`` pairs durable with their arrival time and the ``relay`` that
        delivered them (the link acknowledges after this): per pair its inbox row id, or None if its tag was
        seen before (a replay: nothing stored). The replay cache's primary key decides,
        in this commit, whichever worker the copy reached. ``refusals`` (frames refused
        at the link, by reason) are counted in the same commit."""
        with self._engine.transaction() as db:
            # Tags first (a tag seen before, or twice in this batch, returns no row), then the fresh
            # messages: two exchanges with a server for the batch, whatever its size.
            fresh = [bool(taken) for taken in execute_each(
                db, "INSERT INTO replay_tags (tag) VALUES (?) ON CONFLICT DO NOTHING RETURNING tag",
                [(tag,) for tag, _ in messages])]
            inserted = iter(execute_each(
                db, "INSERT INTO inbox (tag, message, arrived, relay) VALUES (?, ?, ?, ?) RETURNING id",
                [(tag, message, arrived, relay) for (tag, message), new in zip(messages, fresh) if new]))
            row_ids = [int(next(inserted)[0][0]) if new else None for new in fresh]
            self._count_rejections(db, refusals or {})
            stored = sum(row_id is not None for row_id in row_ids)
            self._add_to_inbox_counter(db, "entered", {relay: stored})
        self.inbox_count += stored
        self.inbox_by_relay[relay] += stored
        return row_ids

    def count_rejections(self, counts: Mapping[str, int]) -> None:
        """Add ``counts`` to the rejection counters (one commit)."""
        with self._engine.transaction() as db:
            self._count_rejections(db, counts)

    @staticmethod
    def _count_rejections(db: Session, counts: Mapping[str, int]) -> None:
        """Add ``counts`` to the rejection counters, or to the cover counters for reasons naming a cover."""
        for table, covers in (("rejections", False), ("covers", True)):
            rows = sorted((str(reason), count) for reason, count in counts.items() if count and is_cover(reason) is covers)
            if rows:
                db.executemany(
                    f"INSERT INTO {table} (reason, count) VALUES (?, ?) "
                    f"ON CONFLICT (reason) DO UPDATE SET count = {table}.count + excluded.count",
                    rows,
                )

    @staticmethod
    def _add_to_inbox_counter(db: Session, counter: Literal["entered", "decided"], rows: Mapping[str, int]) -> None:
        """Add to the inbox counter ``counter`` of each relay in ``rows``. Last in its commit, after the
        rejection counters, relays in one order: every commit takes these row locks last and in one order, so no
        two wait on each other, and holds them only to its end."""
        db.executemany(
            "INSERT INTO inbox_counters (relay, counter, value) VALUES (?, ?, ?) "
            "ON CONFLICT (relay, counter) DO UPDATE SET value = inbox_counters.value + excluded.value",
            [(relay, counter, added) for relay, added in sorted(rows.items()) if added])

    def _read_inbox_counters(self, db: Session) -> None:
        """Set :attr:`inbox_by_relay` and :attr:`inbox_count` from the stored counters (committed by every worker)."""
        rows = db.execute("SELECT relay, SUM(CASE counter WHEN 'entered' THEN value ELSE -value END) "
                          "FROM inbox_counters GROUP BY relay").fetchall()
        self.inbox_by_relay = Counter({str(relay): int(size) for relay, size in rows if size})
        self.inbox_count = self.inbox_by_relay.total()

    def claim_inbox(self, worker: str, limit: int, now: float, claim_seconds: float = CLAIM_SECONDS,
                    relay: str | None = None) -> list[tuple[int, bytes, bytes, float]]:
        """Claim for ``worker`` the oldest ``limit`` messages nobody holds (or whose claim by another
        worker lapsed ``claim_seconds`` before ``now``), as ``(id, tag, message, arrived)`` in arrival order;
        only those ``relay`` delivered, unless it is None.

        Workers sharing a store skip each other's locked rows, so two claims never overlap. A worker
        never takes back its own rows (a slow batch of its own is still in flight); it gives back
        what it will not decide (:meth:`release_claims`).
        """
        of_relay, relay_args = (" AND relay = ?", (relay,)) if relay is not None else ("", ())
        with self._engine.transaction() as db:
            rows = db.execute(
                "UPDATE inbox SET claimed_by = ?, claimed_at = ? WHERE id IN ("
                "SELECT id FROM inbox WHERE (claimed_by IS NULL OR (claimed_at < ? AND claimed_by <> ?))"
                f"{of_relay} ORDER BY id LIMIT ?{self._engine.skip_locked}) RETURNING id, tag, message, arrived",
                (worker, now, now - claim_seconds, worker, *relay_args, limit),
            ).fetchall()
            self._read_inbox_counters(db)
        return sorted((int(i), bytes(t), bytes(m), float(a)) for i, t, m, a in rows)

    def claims(self) -> dict[str, int]:
        """Undecided inbox rows per worker holding them claimed (``""``: unclaimed)."""
        with self._engine.read() as db:
            rows = db.execute("SELECT COALESCE(claimed_by, ''), COUNT(*) FROM inbox GROUP BY 1").fetchall()
        return {str(worker): int(count) for worker, count in rows}

    def release_claims(self, worker: str, ids: Sequence[int] | None = None) -> int:
        """Give back the claims ``worker`` holds on rows ``ids`` (default: all of them, as a restarted
        worker does before it claims anew); how many."""
        with self._engine.transaction() as db:
            if ids is None:
                return int(db.execute("UPDATE inbox SET claimed_by = NULL, claimed_at = NULL WHERE claimed_by = ?",
                                      (worker,)).rowcount)
            chosen = sorted(set(ids))
            return sum(
                int(db.execute("UPDATE inbox SET claimed_by = NULL, claimed_at = NULL WHERE claimed_by = ? AND id IN "
                               f"({', '.join('?' * len(chunk))})", (worker, *chunk)).rowcount)
                for chunk in (chosen[i : i + 500] for i in range(0, len(chosen), 500))
            )

    def legacy_frames(self) -> list[tuple[int, bytes, float]]:
        """Frames a store before version 4 received but had not verified, as ``(id, frame, arrived)``."""
        if not self._engine.has_table("inbox_frames_v1"):
            return []
        with self._engine.read() as db:
            rows = db.execute("SELECT id, frame, arrived FROM inbox_frames_v1 ORDER BY id").fetchall()
        return [(int(i), bytes(f), float(a)) for i, f, a in rows]

    def drop_legacy_frames(self) -> None:
        """Forget the frames of a store before version 4 once they are admitted (or refused)."""
        with self._engine.transaction() as db:
            db.execute("DROP TABLE IF EXISTS inbox_frames_v1")

    def inbox_size(self) -> int:
        return self.inbox_count

    @contextmanager
    def entering(self, relay: str, count: int) -> Iterator[None]:
        """Count ``count`` messages of ``relay`` in its backlog while the caller commits them (:meth:`enqueue`):
        a cap checked meanwhile sees them. Entered and left on one thread (the sink's event loop), as the
        caps are checked there."""
        self._entering[relay] += count
        try:
            yield
        finally:
            self._entering[relay] -= count

    def relay_backlog(self, relay: str) -> int:
        """Undecided inbox messages ``relay`` delivered, with those being committed (:meth:`entering`)."""
        return self.inbox_by_relay[relay] + self._entering[relay]

    def inbox_backlog(self) -> int:
        """Undecided inbox messages of every relay, with those being committed (:meth:`entering`)."""
        return self.inbox_count + self._entering.total()

    def inbox_pending_before(self, when: int) -> bool:
        """Whether a frame that arrived before ``when`` still awaits its verdict."""
        with self._engine.read() as db:
            return db.execute("SELECT 1 FROM inbox WHERE arrived < ? LIMIT 1", (when,)).fetchone() is not None

    def store_batch(
        self,
        packets: Sequence[VerifiedPacket],
        rejections: Sequence[str],
        now: int,
        done_inbox_ids: Sequence[int] = (),
    ) -> list[str]:
        """Store verified packets and count rejections in one transaction.

        Returns one outcome per packet: ``"accepted"``, ``"duplicate"`` (same
        survey, tag and message as a stored packet: counted once) or
        ``"double-submission"`` (same tag, another message: the first
        committed is kept, DESIGN.md §6). The packets' primary key decides,
        whichever worker stored the other copy. Duplicates and double
        submissions are counted as rejections by that reason; reasons naming a
        cover (``cover``, ``cover/...``) are counted as covers. An accepted
        packet's receipt becomes the next leaf of its survey's log as the
        commit makes it durable (DESIGN.md §5: leaves in acceptance order).

        The batch's inbox rows (``done_inbox_ids``) are deleted first: if any
        is gone (another worker decided it after this worker's claim lapsed,
        or a retried commit had in fact committed), nothing is stored and
        :class:`BatchTaken` is raised, so each message is decided once.
        """
        counted: Counter[str] = Counter(rejections)
        with self._engine.transaction() as db:
            ids = sorted(set(done_inbox_ids))
            relays = Counter(str(relay) for chunk in (ids[i : i + 500] for i in range(0, len(ids), 500)) for (relay,) in
                             db.execute(f"DELETE FROM inbox WHERE id IN ({', '.join('?' * len(chunk))}) RETURNING relay",
                                        chunk).fetchall())
            deleted = relays.total()
            if deleted != len(ids):
                raise BatchTaken(f"{len(ids) - deleted} of {len(ids)} inbox rows were decided elsewhere")
            outcomes = self._insert_packets(db, packets, now)
            counted.update(outcome for outcome in outcomes if outcome != "accepted")
            self._count_rejections(db, counted)
            self._add_to_inbox_counter(db, "decided", relays)
        self.inbox_count = max(self.inbox_count - deleted, 0)
        self.inbox_by_relay -= relays
        return outcomes

    @staticmethod
    def _insert_packets(db: Session, packets: Sequence[VerifiedPacket], now: int) -> list[str]:
        """Insert ``packets`` at the ends of their surveys' logs; per packet ``"accepted"``, ``"duplicate"`` or
        ``"double-submission"`` (see :meth:`store_batch`).

        Each survey's counter row is locked first, surveys in one order (no two workers wait on each other's
        counter rows), and stays locked until the commit: positions are dense and in commit order. Every packet
        is inserted once, at the position it takes if all of the batch is new; a packet whose key is taken
        (stored before, by any worker, or earlier in this batch) is not inserted, and only then are the later
        packets of its survey moved down to close the gap (resends are rare: a batch usually writes each row once,
        where assigning positions after the insert rewrote every row and its index entries).
        """
        surveys = [packet.survey.to_bytes() for packet in packets]
        size: dict[bytes, int] = {}
        for survey in sorted(set(surveys)):
            (stored,) = db.execute(
                "INSERT INTO log_sizes (survey, size) VALUES (?, 0) "
                "ON CONFLICT (survey) DO UPDATE SET size = log_sizes.size RETURNING size", (survey,)).fetchone()
            size[survey] = int(stored)
        tentative: list[int] = []
        following = dict(size)
        for survey in surveys:
            tentative.append(following[survey])
            following[survey] += 1
        # All the batch's inserts in one exchange with a server.
        inserted_rows = execute_each(
            db, "INSERT INTO packets (survey, tag_digest, message_hash, report, receipt, accepted_at, position, arrived) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (survey, tag_digest) DO NOTHING RETURNING tag_digest",
            [(survey, p.tag_digest, p.message_hash, p.report, p.receipt, now, position, p.arrived)
             for survey, p, position in zip(surveys, packets, tentative)])
        outcomes: list[str] = []
        moves: list[tuple[int, bytes, bytes]] = []
        for packet, survey, position, inserted in zip(packets, surveys, tentative, inserted_rows):
            if inserted:
                if position != size[survey]:
                    # Ascending: the position it moves to is free (a packet not inserted, or one moved already).
                    moves.append((size[survey], survey, packet.tag_digest))
                size[survey] += 1
                outcomes.append("accepted")
                continue
            (stored_hash,) = db.execute(
                "SELECT message_hash FROM packets WHERE survey = ? AND tag_digest = ?", (survey, packet.tag_digest)
            ).fetchone()
            outcomes.append("duplicate" if bytes(stored_hash) == packet.message_hash else "double-submission")
        if moves:
            db.executemany("UPDATE packets SET position = ? WHERE survey = ? AND tag_digest = ?", moves)
        db.executemany("UPDATE log_sizes SET size = ? WHERE survey = ?", sorted((n, survey) for survey, n in size.items()))
        return outcomes

    def accepted_count(self, survey: SurveyId) -> int:
        """Packets accepted for ``survey`` so far (its receipt log's size, committed by any worker)."""
        with self._engine.read() as db:
            row = db.execute("SELECT size FROM log_sizes WHERE survey = ?", (survey.to_bytes(),)).fetchone()
        return 0 if row is None else int(row[0])

    # -- the round driver's lease --------------------------------------------------

    def take_lease(self, name: str, holder: str, now: float, seconds: float) -> bool:
        """Take or renew lease ``name`` for ``holder`` until ``now + seconds``; False while another holds it.

        One upsert: the row changes only if it is ``holder``'s or has expired,
        so two contenders never both hold it.
        """
        with self._engine.transaction() as db:
            cursor = db.execute(
                "INSERT INTO leases (name, holder, expires) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires = excluded.expires "
                "WHERE leases.holder = excluded.holder OR leases.expires < ?",
                (name, holder, now + seconds, now),
            )
            return cursor.rowcount == 1

    def lease_holder(self, name: str, now: float) -> str | None:
        """Who holds lease ``name`` at ``now`` (None: nobody, or it expired)."""
        with self._engine.read() as db:
            row = db.execute("SELECT holder FROM leases WHERE name = ? AND expires >= ?", (name, now)).fetchone()
        return None if row is None else str(row[0])

    def reports(self, survey: SurveyId) -> list[bytes]:
        with self._engine.read() as db:
            rows = db.execute(
                "SELECT report FROM packets WHERE survey = ? ORDER BY tag_digest", (survey.to_bytes(),)
            ).fetchall()
        return [bytes(row[0]) for row in rows]

    def log_leaves(self, survey: SurveyId, size: int | None = None) -> list[bytes]:
        """The first ``size`` (default: all) receipt digests of ``survey``'s log, in acceptance order."""
        with self._engine.read() as db:
            rows = db.execute(
                "SELECT receipt FROM packets WHERE survey = ? AND position < ? ORDER BY position",
                (survey.to_bytes(), 2**62 if size is None else size),
            ).fetchall()
        return [bytes(row[0]) for row in rows]

    def receipts(self) -> dict[SurveyId, list[bytes]]:
        """Every survey's receipt log, leaves in acceptance order (the audit of ``anonml bench faults``)."""
        with self._engine.read() as db:
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
        with self._engine.transaction() as db:
            db.execute("INSERT INTO heads (survey, check_index, size, document) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                       (survey.to_bytes(), int(check), size, document))
            (stored,) = db.execute(
                "SELECT document FROM heads WHERE survey = ? AND check_index = ?", (survey.to_bytes(), int(check))
            ).fetchone()
        return bytes(stored)

    def heads(self) -> list[tuple[SurveyId, Check, int, bytes]]:
        """Every signed head recorded, as ``(survey, check, size, document)``."""
        with self._engine.read() as db:
            rows = db.execute("SELECT survey, check_index, size, document FROM heads ORDER BY survey, check_index").fetchall()
        return [(SurveyId.from_bytes(bytes(s)), Check(int(c)), int(n), bytes(d)) for s, c, n, d in rows]

    def covers(self) -> dict[str, int]:
        with self._engine.read() as db:
            rows = db.execute("SELECT reason, count FROM covers ORDER BY reason").fetchall()
        return {str(reason): int(count) for reason, count in rows}

    def counts(self) -> dict[str, int]:
        with self._engine.read() as db:
            registered = db.execute("SELECT COUNT(*) FROM registrations").fetchone()[0]
            credentials = db.execute("SELECT COUNT(*) FROM credentials").fetchone()[0]
            accepted = db.execute("SELECT COUNT(*) FROM packets").fetchone()[0]
        return {"registered": int(registered), "credentials": int(credentials), "accepted": int(accepted)}

    def accepted_by_survey(self) -> dict[SurveyId, int]:
        with self._engine.read() as db:
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
        with self._engine.read() as db:
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
        with self._engine.read() as db:
            rows = db.execute("SELECT reason, count FROM rejections ORDER BY reason").fetchall()
        return {str(reason): int(count) for reason, count in rows}

    def arrivals(self) -> list[tuple[SurveyId, bytes, float]]:
        """Every accepted packet as ``(survey, receipt digest, arrival time)``, in log order."""
        with self._engine.read() as db:
            rows = db.execute("SELECT survey, receipt, COALESCE(arrived, accepted_at) FROM packets ORDER BY survey, position").fetchall()
        return [(SurveyId.from_bytes(bytes(s)), bytes(r), float(a)) for s, r, a in rows]

    def partitions(self) -> dict[bytes, int]:
        with self._engine.read() as db:
            rows = db.execute("SELECT identity_key, partition FROM credentials").fetchall()
        return {bytes(key): int(partition) for key, partition in rows}


    # -- moving a round to another engine -------------------------------------------

    def copy_from(self, source: RoundStore) -> int:
        """Copy every row of ``source`` into this empty store, in one transaction; how many rows.

        How a round created on SQLite (``round new``) moves to PostgreSQL the
        first time ``aggregator run --store`` opens it there. Inbox rows get
        new ids in their old order; frames of a store before version 4 must
        have been admitted first (``PacketSink.admit_legacy_frames``).
        """
        if source.legacy_frames():
            raise ConfigError("the round holds frames of an older release: run it once on SQLite before moving it")
        copied = 0
        with self._engine.transaction() as target:
            if target.execute("SELECT 1 FROM meta LIMIT 1").fetchone() is not None:
                raise ConfigError(f"the round store {self._engine.where} is not empty: nothing copied")
            for table, columns in _TABLE_COLUMNS.items():
                with source._engine.read() as db:
                    rows = db.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY 1").fetchall()
                if rows:
                    target.executemany(
                        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                        [tuple(row) for row in rows])
                copied += len(rows)
        self.inbox_count = source.inbox_count
        self.inbox_by_relay = Counter(source.inbox_by_relay)
        return copied


def is_cover(reason: str) -> bool:
    """Whether an outcome reason counts a cover packet (``cover`` or ``cover/<why>``)."""
    return reason == "cover" or reason.startswith("cover/")
