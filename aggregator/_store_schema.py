"""The round store's schema on both engines and its history (:mod:`aggregator._store`).

SQLite's schema is a :class:`~anonml.base.storage.Schema` (its version in ``PRAGMA user_version``, a migration
per version); PostgreSQL's is the list of its migrations, applied in order by
:class:`~anonml.aggregator._engines.PostgresEngine`. A change is a new version on both engines.
"""

from __future__ import annotations

from anonml.base.storage import Schema


def _version_5_tables(*, blob: str, integer: str, real: str, row_id: str) -> str:
    """Every table of the round schema's version 5 in one engine's column types: SQLite's tables for a new store,
    and PostgreSQL's version 1 (its stores began there). Written once so the two engines cannot drift apart. A
    later version must leave this text as it is and add its change after it on both engines (SQLite's tables and
    migrations, PostgreSQL's migrations)."""
    return f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value {blob} NOT NULL);
CREATE TABLE invitations (code TEXT PRIMARY KEY, used_by {blob});
CREATE TABLE allow_list (identity_key {blob} PRIMARY KEY);
CREATE TABLE registrations (
    identity_key {blob} PRIMARY KEY, invitation TEXT, registered_at {integer} NOT NULL,
    nonce {blob}, signature {blob});
CREATE TABLE client_registrations (client TEXT PRIMARY KEY, count {integer} NOT NULL);
CREATE TABLE credentials (
    identity_key {blob} PRIMARY KEY, partition {integer} NOT NULL, response {blob} NOT NULL,
    issued_at {integer} NOT NULL);
CREATE TABLE packets (
    survey {blob} NOT NULL, tag_digest {blob} NOT NULL, message_hash {blob} NOT NULL,
    report {blob} NOT NULL, receipt {blob} NOT NULL, accepted_at {integer} NOT NULL,
    position {integer}, arrived {real},
    PRIMARY KEY (survey, tag_digest));
CREATE UNIQUE INDEX packets_log ON packets (survey, position);
CREATE TABLE rejections (reason TEXT PRIMARY KEY, count {integer} NOT NULL);
CREATE TABLE covers (reason TEXT PRIMARY KEY, count {integer} NOT NULL);
CREATE TABLE heads (
    survey {blob} NOT NULL, check_index {integer} NOT NULL, size {integer} NOT NULL, document {blob} NOT NULL,
    PRIMARY KEY (survey, check_index));
CREATE TABLE replay_tags (tag {blob} PRIMARY KEY);
CREATE TABLE results (key TEXT PRIMARY KEY, value {blob} NOT NULL);
CREATE TABLE inbox (
    id {row_id}, tag {blob} NOT NULL UNIQUE, message {blob} NOT NULL,
    arrived {real} NOT NULL, claimed_by TEXT, claimed_at {real});
CREATE TABLE log_sizes (survey {blob} PRIMARY KEY, size {integer} NOT NULL);
CREATE TABLE leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires {real} NOT NULL);
"""


# Version 6 (issue 27): each credential keeps the SHA-256 of the blinded request it answered (IssuedAnswer).
_VERSION_6 = "ALTER TABLE credentials ADD COLUMN request_digest {blob};"
# Version 7 (issue 25): each inbox row names the relay that delivered it (its node id in hex; '' unknown), so the
# verifier takes each relay's rows in fair turns and caps each relay's backlog. Rows are deleted once decided.
_VERSION_7 = "ALTER TABLE inbox ADD COLUMN relay TEXT NOT NULL DEFAULT '';\nCREATE INDEX inbox_relay ON inbox (relay, id);"
# Version 8 (issue 25's review): the inbox's rows per delivering relay kept as two running counters, rows
# ``entered`` (by enqueue) and rows ``decided`` (by store_batch), updated in the commits that insert and delete
# them: a claim reads a few counter rows instead of counting the inbox (each claim counted all of it: a deep
# inbox's drain cost its depth per claim). Two rows per relay, not one signed size: intake and verification then
# never update one row, so on PostgreSQL their commits still run side by side.
_VERSION_8 = """
CREATE TABLE inbox_counters (
    relay TEXT NOT NULL, counter TEXT NOT NULL, value {integer} NOT NULL, PRIMARY KEY (relay, counter));
INSERT INTO inbox_counters (relay, counter, value) SELECT relay, 'entered', COUNT(*) FROM inbox GROUP BY relay;
"""

# Version 9 (issue 27's review): each relay's beacon commitment and reveal under a key of its own, written once
# (aggregator._beacon), instead of one JSON object per kind that every store rewrote whole. The values stay the
# hex of the bytes. The old keys are split and removed. The two engines' JSON functions differ, so the text does.
_BEACON_KINDS = (("beacon/commitments", "beacon/commitment/"), ("beacon/reveals", "beacon/reveal/"))
_SQLITE_VERSION_9 = "".join(f"""
INSERT OR IGNORE INTO meta (key, value)
    SELECT '{prefix}' || item.key, CAST(item.value AS BLOB) FROM meta, json_each(CAST(meta.value AS TEXT)) AS item
    WHERE meta.key = '{old}';
DELETE FROM meta WHERE key = '{old}';""" for old, prefix in _BEACON_KINDS)
_POSTGRES_VERSION_5 = "".join(f"""
INSERT INTO meta (key, value)
    SELECT '{prefix}' || item.key, convert_to(item.value, 'UTF8')
    FROM meta, jsonb_each_text(convert_from(meta.value, 'UTF8')::jsonb) AS item WHERE meta.key = '{old}'
    ON CONFLICT (key) DO NOTHING;
DELETE FROM meta WHERE key = '{old}';""" for old, prefix in _BEACON_KINDS)

# PostgreSQL's version 6 (issue 27's scale-out ratio): a claim rewrites each inbox row it takes. On full pages
# every new row version went to another page with an entry in each of the inbox's three indexes: the server's
# largest statement, 44 µs per report (its next, the inbox's insert: 24). Pages filled to half leave
# room for it beside the old version (a heap-only update: no index touched; claimed_by and claimed_at are in
# no index). The inbox's unique tag index goes: the replay cache's primary key already decides, in the same
# commit, which copy of a tag enters the inbox (RoundStore.enqueue), and nothing looks rows up by tag.
# Measured with pg_stat_statements (1 worker, 8,000 reports): the claim 44 -> 17 µs per report, the insert 24 -> 21.
_POSTGRES_VERSION_6 = "ALTER TABLE inbox SET (fillfactor = 50);\nALTER TABLE inbox DROP CONSTRAINT inbox_tag_key;"

SCHEMA = Schema(
    name="round",
    application_id=0x414E4103,  # "ANA\x03"
    version=9,
    tables=_version_5_tables(blob="BLOB", integer="INTEGER", real="REAL", row_id="INTEGER PRIMARY KEY AUTOINCREMENT")
    + _VERSION_6.format(blob="BLOB") + "\n" + _VERSION_7 + "\n" + _VERSION_8.format(integer="INTEGER"),
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
        # Version 5 (issue 27): the rules several ingest workers share. Inbox
        # rows are claimed before verification; each survey's log size is a
        # counter row; a message's replay tag is taken when it enters the inbox;
        # the round driver holds a lease.
        4: """
ALTER TABLE inbox ADD COLUMN claimed_by TEXT;
ALTER TABLE inbox ADD COLUMN claimed_at REAL;
CREATE TABLE log_sizes (survey BLOB PRIMARY KEY, size INTEGER NOT NULL);
INSERT INTO log_sizes SELECT survey, COUNT(*) FROM packets GROUP BY survey;
INSERT OR IGNORE INTO replay_tags SELECT tag FROM inbox;
CREATE TABLE leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires REAL NOT NULL)
""",
        5: _VERSION_6.format(blob="BLOB"),
        6: _VERSION_7,
        7: _VERSION_8.format(integer="INTEGER"),
        8: _SQLITE_VERSION_9,
    },
    # Rounds from before stores were versioned wrote the version-1 tables.
    unversioned=1,
)

POSTGRES_MIGRATIONS: tuple[str, ...] = (
    # Version 1: the tables of SQLite's version 5 (PostgreSQL stores began there).
    _version_5_tables(
        blob="BYTEA", integer="BIGINT", real="DOUBLE PRECISION", row_id="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
    ),
    # Version 2: SQLite's version 6.
    _VERSION_6.format(blob="BYTEA"),
    # Version 3: SQLite's version 7.
    _VERSION_7,
    # Version 4: SQLite's version 8.
    _VERSION_8.format(integer="BIGINT"),
    # Version 5: SQLite's version 9.
    _POSTGRES_VERSION_5,
    # Version 6: PostgreSQL's alone (SQLite has one writer and no row versions to spare).
    _POSTGRES_VERSION_6,
)
"""The PostgreSQL schema's history: entry ``i`` takes a round's schema from version ``i`` to ``i + 1``."""
