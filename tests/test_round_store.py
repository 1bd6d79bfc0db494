"""The round store's contract, on both engines: SQLite (the default) and PostgreSQL (a private server).

Every rule the aggregator relies on holds the same way on both, including
between two store objects on one database (two ingest workers): a replay tag
is taken once, a survey's report is accepted once by the packets' primary
key, each inbox row is decided once, and the receipt log is dense and built
from committed rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anonml.aggregator import BatchTaken, PostgresLocation, RoundStore, VerifiedPacket
from anonml.aggregator._beacon import store_commitment, stored_commitments, stored_reveals
from anonml.aggregator._store import IssuedAnswer, IssuedCredential
from anonml.aggregator._store_schema import POSTGRES_MIGRATIONS, SCHEMA
from anonml.protocol import RelayEntry, SurveyId

ROUND = hashlib.sha256(b"round").digest()
_schemas = itertools.count()

Opener = Callable[[], RoundStore]


@pytest.fixture(params=["sqlite", "postgresql"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens one round's store (each call a new store object on the same database: another worker)."""
    if request.param == "sqlite":
        location: Path | PostgresLocation = tmp_path / "round.sqlite"
    else:
        server = request.getfixturevalue("postgres_server")
        location = PostgresLocation(server.url, f"test_{next(_schemas)}_{tmp_path.name[-12:].lower()}"
                                    .replace("-", "_"))
    opened: list[RoundStore] = []

    def opener() -> RoundStore:
        opened.append(RoundStore(location))
        return opened[-1]

    yield opener
    for store in opened:
        store.close()


def packet(survey: SurveyId, n: int, message: bytes = b"m") -> VerifiedPacket:
    tag = hashlib.sha256(b"tag%d" % n).digest()
    return VerifiedPacket(survey, tag, hashlib.sha256(message).digest(), b"report%d" % n,
                          hashlib.sha256(b"receipt%d" % n).digest(), arrived=1000.5 + n)


SURVEY = SurveyId.data(ROUND, 0, 0)
OTHER = SurveyId.data(ROUND, 1, 0)


def test_a_new_store_is_at_the_current_version_and_reopening_applies_nothing_twice(open_store: Opener) -> None:
    store = open_store()
    store.put_meta("k", b"v")
    again = open_store()
    assert again.get_meta("k") == b"v"
    if store.engine == "postgresql":
        engine: Any = again._engine
        assert engine.schema_versions() == list(range(1, len(POSTGRES_MIGRATIONS) + 1))
    else:
        with again._engine.read() as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA.version


def test_a_sqlite_store_of_version_4_is_migrated_keeping_its_log_and_replay_tags(tmp_path: Path) -> None:
    path = tmp_path / "round.sqlite"
    store = RoundStore(path)
    store.store_batch([packet(SURVEY, 0), packet(SURVEY, 1)], [], 1000)
    [waiting] = store.enqueue([(b"t" * 32, b"waiting")], 1001.0)
    assert waiting is not None
    store.close()
    # Back to version 4's layout: no claims, counter rows, leases; the inbox's tag not yet a replay tag.
    db = sqlite3.connect(path)
    db.executescript("""
        ALTER TABLE inbox DROP COLUMN claimed_by; ALTER TABLE inbox DROP COLUMN claimed_at;
        DROP TABLE log_sizes; DROP TABLE leases; DELETE FROM replay_tags;
        ALTER TABLE credentials DROP COLUMN request_digest;
        DROP INDEX inbox_relay; ALTER TABLE inbox DROP COLUMN relay; DROP TABLE inbox_counters;
        PRAGMA user_version = 4;""")
    db.close()
    store = RoundStore(path)
    assert store.accepted_count(SURVEY) == 2
    assert store.enqueue([(b"t" * 32, b"waiting")], 1002.0) == [None]  # still a replay
    assert store.store_batch([packet(SURVEY, 2)], [], 1003) == ["accepted"]
    assert store.log_leaves(SURVEY) == [packet(SURVEY, n).receipt for n in range(3)]
    store.close()


PEER = b"p" * 32
ASKED = hashlib.sha256(b"blinded request").digest()
ASKED_AGAIN = hashlib.sha256(b"another blinded request").digest()


def test_a_credential_answer_is_given_again_only_for_the_request_it_answered(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    first = IssuedAnswer(partition=1, response=b"answer", same_request=True)
    assert one.issued_answer(PEER, ASKED) is None
    assert one.record_credential(IssuedCredential(PEER, 1, b"answer", 1000, ASKED)) == first
    # The same request retried (its answer lost) finds the stored answer, from any worker.
    assert two.issued_answer(PEER, ASKED) == first
    # Issued again at once (two identical requests in one batch, or in two workers' batches): the first answer stays.
    assert two.record_credentials([IssuedCredential(PEER, 1, b"answer, second proof", 1001, ASKED),
                                   IssuedCredential(PEER, 1, b"a second credential", 1001, ASKED_AGAIN)]) == [
        first, IssuedAnswer(1, b"answer", same_request=False)]
    assert two.issued_answer(PEER, ASKED_AGAIN) == IssuedAnswer(1, b"answer", same_request=False)
    assert one.counts()["credentials"] == 1


def test_a_sqlite_store_of_version_5_keeps_its_credentials_whose_retries_stay_refused(tmp_path: Path) -> None:
    path = tmp_path / "round.sqlite"
    RoundStore(path).close()
    db = sqlite3.connect(path)
    db.executescript("ALTER TABLE credentials DROP COLUMN request_digest; DROP INDEX inbox_relay; DROP TABLE inbox_counters; "
                     "ALTER TABLE inbox DROP COLUMN relay; PRAGMA user_version = 5;")
    db.execute("INSERT INTO credentials (identity_key, partition, response, issued_at) VALUES (?, 0, ?, 1000)", (PEER, b"old"))
    db.commit()
    db.close()
    store = RoundStore(path)
    # Version 5 kept no request digest: nothing to match, so any retry is refused as it was then.
    assert store.issued_answer(PEER, ASKED) == IssuedAnswer(0, b"old", same_request=False)
    other = b"q" * 32
    assert store.record_credential(IssuedCredential(other, 1, b"new", 1001, ASKED)).same_request
    assert store.issued_answer(other, ASKED) == IssuedAnswer(1, b"new", same_request=True)
    store.close()


RELEASED_POSTGRES_VERSION_1 = "cbaf1aff0a108d748e5e0a97ce7a3130bafb8f0a37b7fc7d8a34fd34bdb9c083"
"""SHA-256 of PostgreSQL's migration 1 as released (6e3e20f, unchanged up to 7ae5ab0^ where version 2 came):
what every PostgreSQL store of schema version 1 in the field was made of."""


def test_a_postgresql_store_of_version_1_is_migrated_and_replays_an_issuance(postgres_server: Any) -> None:
    """Stores made before credentials kept their request's digest (schema version 1) gain the column on opening,
    once, however many workers open the round at once, keep their rows, and serve an identical request again."""
    from anonml.aggregator._engines import PostgresEngine

    assert hashlib.sha256(POSTGRES_MIGRATIONS[0].encode()).hexdigest() == RELEASED_POSTGRES_VERSION_1
    location = PostgresLocation(postgres_server.url, "test_from_version_1")
    # What the release before version 2 did on opening a new round: the engine with migration 1 alone.
    old = PostgresEngine(location, POSTGRES_MIGRATIONS[:1])
    with old.transaction() as db:
        db.execute("INSERT INTO credentials (identity_key, partition, response, issued_at) VALUES (?, 0, ?, 1000)",
                   (PEER, b"old"))
        db.execute("INSERT INTO inbox (tag, message, arrived) VALUES (?, ?, 1000.5)", (b"t" * 32, b"waiting"))
    assert old.schema_versions() == [1]
    old.close()

    # Two workers open the round at once: one migrates, the other waits for it and applies nothing twice.
    opened: list[RoundStore] = []
    threads = [threading.Thread(target=lambda: opened.append(RoundStore(location))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(opened) == 2
    one, two = opened
    try:
        engine: Any = one._engine
        assert engine.schema_versions() == list(range(1, len(POSTGRES_MIGRATIONS) + 1))  # each applied once
        with one._engine.read() as db:
            columns = {str(name) for (name,) in db.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = ? AND table_name = ?",
                (location.schema, "credentials")).fetchall()}
        assert "request_digest" in columns
        assert one.inbox_size() == 1
        # Version 1 kept no request digest: a retry for that credential stays refused, as it was then.
        assert one.issued_answer(PEER, ASKED) == IssuedAnswer(0, b"old", same_request=False)
        # Issued after the migration: the identical request replayed gets its stored answer, from either worker.
        newer = b"q" * 32
        answer = IssuedAnswer(1, b"new", same_request=True)
        assert one.record_credential(IssuedCredential(newer, 1, b"new", 1001, ASKED)) == answer
        assert two.record_credential(IssuedCredential(newer, 1, b"new, second proof", 1002, ASKED)) == answer
        assert two.issued_answer(newer, ASKED) == answer
        assert two.issued_answer(newer, ASKED_AGAIN) == IssuedAnswer(1, b"new", same_request=False)
        assert one.counts()["credentials"] == 2
    finally:
        for store in opened:
            store.close()


def test_each_report_is_accepted_once_and_the_log_is_dense_in_commit_order(open_store: Opener) -> None:
    store = open_store()
    first = [packet(SURVEY, 0), packet(OTHER, 1), packet(SURVEY, 2)]
    assert store.store_batch(first, ["expired"], 1000) == ["accepted"] * 3
    resent = [packet(SURVEY, 2), packet(SURVEY, 0, b"another message"), packet(SURVEY, 3)]
    assert store.store_batch(resent, [], 1001) == ["duplicate", "double-submission", "accepted"]
    assert store.accepted_count(SURVEY) == 3 and store.accepted_count(OTHER) == 1
    assert store.log_leaves(SURVEY) == [packet(SURVEY, n).receipt for n in (0, 2, 3)]
    assert store.log_leaves(SURVEY, 2) == [packet(SURVEY, n).receipt for n in (0, 2)]
    assert store.rejections() == {"double-submission": 1, "duplicate": 1, "expired": 1}
    assert store.counts()["accepted"] == 4
    assert store.reports(OTHER) == [b"report1"]
    assert [a for _, _, a in store.arrivals()] == [1000.5, 1002.5, 1003.5, 1001.5]


def test_a_replay_tag_is_taken_once_whichever_worker_the_copy_reaches(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    [row] = one.enqueue([(b"a" * 32, b"x")], 1000.0, {"bad-packet": 2, "cover/expired": 1})
    assert row is not None
    assert two.enqueue([(b"a" * 32, b"x"), (b"b" * 32, b"y")], 1000.0)[0] is None
    assert one.rejections() == {"bad-packet": 2} and one.covers() == {"cover/expired": 1}


def test_claims_never_overlap_a_lapsed_claim_is_taken_over_and_each_row_is_decided_once(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    ids = one.enqueue([(bytes([n]) * 32, b"m%d" % n) for n in range(6)], 1000.0)
    mine = one.claim_inbox("one", 4, now=2000.0)
    theirs = two.claim_inbox("two", 4, now=2000.0)
    assert [r[0] for r in mine] == ids[:4] and [r[0] for r in theirs] == ids[4:]
    assert two.claim_inbox("two", 4, now=2001.0) == []  # nothing free while the claims hold
    # "one" stalls past its claim: "two" takes its rows over and decides them first.
    taken = two.claim_inbox("two", 4, now=2000.0 + 31)
    assert [r[0] for r in taken] == ids[:4]
    assert two.store_batch([packet(SURVEY, 0)], ["expired"] * 3, 2031, done_inbox_ids=[r[0] for r in taken]) == ["accepted"]
    with pytest.raises(BatchTaken):
        one.store_batch([packet(SURVEY, 0)], ["expired"] * 3, 2032, done_inbox_ids=[r[0] for r in mine])
    assert one.counts()["accepted"] == 1 and one.rejections() == {"expired": 3}
    assert one.release_claims("two") == 2  # a restarted "two" gets its remaining rows back at once
    assert [r[0] for r in one.claim_inbox("one", 10, now=2033.0)] == ids[4:]
    assert one.inbox_size() == 2
    # A worker never takes back its own rows (a slow batch still in flight), however old; another does.
    assert one.claim_inbox("one", 10, now=2100.0) == []
    assert [r[0] for r in two.claim_inbox("two", 10, now=2100.0)] == ids[4:]


def test_each_relays_rows_are_claimed_apart_and_its_backlog_counted(open_store: Opener) -> None:
    """Issue 25: the sink verifies each delivering relay's rows in turn and caps each relay's backlog."""
    one = open_store()
    junk = one.enqueue([(bytes([n]) * 32, b"junk") for n in range(5)], 1000.0, relay="aa")
    honest = one.enqueue([(bytes([100 + n]) * 32, b"honest") for n in range(2)], 1001.0, relay="bb")
    assert one.inbox_by_relay == {"aa": 5, "bb": 2}
    two = open_store()
    assert two.inbox_by_relay == {"aa": 5, "bb": 2}  # counted from the table by another worker
    # The later relay's rows are claimed before the earlier one's backlog drains, and only its own.
    assert [r[0] for r in two.claim_inbox("two", 10, now=2000.0, relay="bb")] == honest
    assert [r[0] for r in two.claim_inbox("two", 3, now=2000.0, relay="aa")] == junk[:3]
    assert two.store_batch([], ["bad-token/bad-proof"] * 3, 2000, done_inbox_ids=junk[:3]) == []
    assert two.inbox_by_relay == {"aa": 2, "bb": 2}
    one.claim_inbox("one", 10, now=2000.0, relay="aa")  # counted again at a claim of the relay's rows
    assert one.inbox_by_relay["aa"] == 2 and one.inbox_size() == 4


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_store_of_the_version_before_the_inbox_counters_counts_its_waiting_rows_per_relay(
        engine: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """SQLite's version 7 and PostgreSQL's version 3 counted the inbox at each claim; opened now, a store gains its
    counters from the rows it holds, once, and claims and decisions keep them right from there."""
    location: Path | PostgresLocation
    if engine == "postgresql":
        from anonml.aggregator._engines import PostgresEngine

        location = PostgresLocation(request.getfixturevalue("postgres_server").url, "test_from_version_3")
        # What the release with version 3 made of a new round: the engine with migrations 1 to 3 alone.
        old = PostgresEngine(location, POSTGRES_MIGRATIONS[:3])
        with old.transaction() as db:
            db.executemany("INSERT INTO inbox (tag, message, arrived, relay) VALUES (?, ?, 1000.5, ?)",
                           [(bytes([n]) * 32, b"waiting", "aa" if n < 3 else "bb") for n in range(5)])
        assert old.schema_versions() == [1, 2, 3]
        old.close()
    else:
        location = tmp_path / "round.sqlite"
        RoundStore(location).close()
        with contextlib.closing(sqlite3.connect(location)) as db:  # back to version 7's tables
            db.executemany("INSERT INTO inbox (tag, message, arrived, relay) VALUES (?, ?, 1000.5, ?)",
                           [(bytes([n]) * 32, b"waiting", "aa" if n < 3 else "bb") for n in range(5)])
            db.executescript("DROP TABLE inbox_counters; PRAGMA user_version = 7;")
    one, two = RoundStore(location), RoundStore(location)
    assert one.inbox_by_relay == {"aa": 3, "bb": 2} and one.inbox_size() == 5
    taken = one.claim_inbox("one", 2, now=2000.0, relay="aa")
    one.store_batch([], ["expired"] * 2, 2000, done_inbox_ids=[r[0] for r in taken])
    two.enqueue([(b"z" * 32, b"new")], 2001.0, relay="bb")
    two.claim_inbox("two", 1, now=2002.0, relay="cc")  # nothing of "cc", but it reads every relay's counters
    assert two.inbox_by_relay == {"aa": 1, "bb": 3} and two.inbox_size() == 4
    engine: Any = two._engine
    if isinstance(location, PostgresLocation):
        assert engine.schema_versions() == list(range(1, len(POSTGRES_MIGRATIONS) + 1))
    else:
        with two._engine.read() as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA.version
    one.close()
    two.close()


def test_a_claims_cost_does_not_grow_with_the_inbox(tmp_path: Path) -> None:
    """Issue 25's review: each claim counted the whole inbox and its relay's rows, so draining a deep inbox cost its
    depth per claim. Measured in SQLite's virtual machine instructions (not time: the machine is shared)."""
    store = RoundStore(tmp_path / "round.sqlite")
    connection: sqlite3.Connection = store._engine._database._db  # type: ignore[union-attr]
    tags = (hashlib.sha256(b"%d" % n).digest() for n in itertools.count())

    def instructions_of_a_claim() -> int:
        ticks = [0]

        def tick() -> int:
            ticks[0] += 1
            return 0  # go on

        connection.set_progress_handler(tick, 10)  # called every 10 instructions
        try:
            assert len(store.claim_inbox("w", 4, now=2000.0, relay="aa")) == 4
        finally:
            connection.set_progress_handler(None, 0)
        return 10 * ticks[0]

    store.enqueue([(next(tags), b"m") for _ in range(8)], 1000.0, relay="aa")
    shallow = instructions_of_a_claim()
    for relay in ("aa", "bb"):
        for _ in range(10):
            store.enqueue([(next(tags), b"m") for _ in range(1000)], 1000.0, relay=relay)
    deep = instructions_of_a_claim()
    assert store.inbox_size() == 20_008
    assert deep < 2 * shallow, (shallow, deep)
    store.close()


def test_a_relays_backlog_counts_the_messages_being_committed(open_store: Opener) -> None:
    """The sink's caps read one count (RoundStore.relay_backlog): rows committed and messages in a commit now."""
    store = open_store()
    store.enqueue([(b"a" * 32, b"m")], 1000.0, relay="aa")
    with store.entering("aa", 3):
        assert store.relay_backlog("aa") == 4 and store.relay_backlog("bb") == 0 and store.inbox_backlog() == 4
        store.enqueue([(b"b" * 32, b"m"), (b"c" * 32, b"m")], 1000.0, relay="aa")
    assert store.relay_backlog("aa") == 3 and store.inbox_backlog() == store.inbox_size() == 3


def test_two_workers_storing_at_once_accept_each_report_once_with_a_dense_log(open_store: Opener) -> None:
    """Two store objects (two workers) commit overlapping batches from threads at once."""
    stores = [open_store(), open_store()]
    batches = [[packet(SURVEY if n % 3 else OTHER, n) for n in range(start, start + 60)] for start in (0, 30)]
    outcomes: list[list[str]] = [[], []]

    def work(index: int) -> None:
        for offset in range(0, 60, 10):
            outcomes[index] += stores[index].store_batch(batches[index][offset : offset + 10], [], 1000)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flat = outcomes[0] + outcomes[1]
    assert flat.count("accepted") == 90 and flat.count("duplicate") == 30
    store = stores[0]
    assert store.counts()["accepted"] == 90 and store.rejections() == {"duplicate": 30}
    logs = store.receipts()
    assert sum(map(len, logs.values())) == 90
    for survey, leaves in logs.items():
        assert len(set(leaves)) == len(leaves) == store.accepted_count(survey)
    with store._engine.read() as db:
        positions = db.execute("SELECT survey, position FROM packets ORDER BY survey, position").fetchall()
    by_survey: dict[bytes, list[int]] = {}
    for survey, position in positions:
        by_survey.setdefault(bytes(survey), []).append(int(position))
    assert all(found == list(range(len(found))) for found in by_survey.values())


def test_a_lease_has_one_holder_until_it_expires(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    assert one.take_lease("driver", "a", now=100.0, seconds=10)
    assert not two.take_lease("driver", "b", now=105.0, seconds=10)
    assert one.take_lease("driver", "a", now=108.0, seconds=10)  # renewed
    assert two.lease_holder("driver", now=117.0) == "a"
    assert two.take_lease("driver", "b", now=118.5, seconds=10)  # expired: taken over
    assert not one.take_lease("driver", "a", now=119.0, seconds=10)
    assert one.lease_holder("driver", now=119.0) == "b"


def test_a_signed_result_is_published_once_whichever_driver_writes_first(open_store: Opener) -> None:
    """Two drivers (one stalled past its lease, its successor) each publish their own thresholds: the first
    committed is the one both serve, and racing publishers all get the bytes that are stored."""
    one, two = open_store(), open_store()
    assert one.publish_result("thresholds/0", b"first") == b"first"
    assert two.publish_result("thresholds/0", b"second") == b"first"
    assert one.get_result("thresholds/0") == two.get_result("thresholds/0") == b"first"
    stores = [open_store() for _ in range(4)]
    for attempt in range(5):
        start = threading.Barrier(len(stores))
        returned: list[bytes] = [b""] * len(stores)

        def publish(index: int) -> None:
            start.wait()
            returned[index] = stores[index].publish_result(f"medians/{attempt}", f"driver {index}".encode())

        threads = [threading.Thread(target=publish, args=(i,)) for i in range(len(stores))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(returned)) == 1 and returned[0] == one.get_result(f"medians/{attempt}")


def test_each_relays_beacon_value_is_stored_once_and_racing_drivers_lose_none(open_store: Opener) -> None:
    """A stalled driver beside its successor: each stores the commitments it fetched as they come. Every relay's
    first commitment is kept whoever stores it, a later one is ignored (a read-modify-write of one key for all
    relays lost some), and a reveal likewise."""
    stores = [open_store() for _ in range(4)]
    relays = [bytes([n]) * 32 for n in range(24)]
    start = threading.Barrier(len(stores))

    def collect(index: int) -> None:
        start.wait()
        for node_id in relays[index::len(stores)] + relays[:3]:  # its share, and three every driver stores
            store_commitment(stores[index], node_id, node_id[:1] * 32 if node_id in relays[index::len(stores)]
                             else bytes([index + 100]) * 32)

    threads = [threading.Thread(target=collect, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entries = tuple(RelayEntry(node_id, "127.0.0.1", 9000 + n, bytes(32), 0) for n, node_id in enumerate(relays))
    stored = stored_commitments(stores[0], entries)
    assert [c.node_id for c in stored] == relays  # none lost, in the relays' order
    assert all(c.commitment == c.node_id[:1] * 32 for c in stored[3:])
    others = {bytes([index + 100]) * 32 for index in range(len(stores))}
    assert all(c.commitment in others | {c.node_id[:1] * 32} for c in stored[:3])  # whichever racing driver stored first
    assert stores[1].put_meta_once("beacon/reveal/" + relays[0].hex(), b"00") == b"00"
    assert stores[2].put_meta_once("beacon/reveal/" + relays[0].hex(), b"11") == b"00"
    assert stored_reveals(stores[3]) == {relays[0]: b"\x00"}


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_store_of_the_version_before_per_relay_beacon_keys_splits_them(
        engine: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """SQLite's version 8 and PostgreSQL's version 4 kept all commitments (and all reveals) as one JSON object
    of hex strings; opened now, each relay's value is under its own key and reads back the same."""
    old_layout = {"beacon/commitments": {"aa" * 32: "01" * 32, "bb" * 32: "02" * 32},
                  "beacon/reveals": {"aa" * 32: "03" * 16}}
    rows = [(key, json.dumps(value).encode()) for key, value in old_layout.items()]
    location: Path | PostgresLocation
    if engine == "postgresql":
        from anonml.aggregator._engines import PostgresEngine

        location = PostgresLocation(request.getfixturevalue("postgres_server").url, "test_from_version_4")
        old = PostgresEngine(location, POSTGRES_MIGRATIONS[:4])
        with old.transaction() as db:
            db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", rows)
        old.close()
    else:
        location = tmp_path / "round.sqlite"
        RoundStore(location).close()
        with contextlib.closing(sqlite3.connect(location)) as db:
            db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", rows)
            db.execute("PRAGMA user_version = 8")
            db.commit()
    store = RoundStore(location)
    assert store.get_meta("beacon/commitments") is None and store.get_meta("beacon/reveals") is None
    assert store.meta_under("beacon/commitment/") == {
        "beacon/commitment/" + "aa" * 32: b"01" * 32, "beacon/commitment/" + "bb" * 32: b"02" * 32}
    assert stored_reveals(store) == {bytes.fromhex("aa" * 32): bytes.fromhex("03" * 16)}
    store.close()


def test_an_erased_secret_is_gone_from_the_table(open_store: Opener) -> None:
    store = open_store()
    store.put_meta("issuer_key", b"secret" * 4)
    store.put_result("outcome", b"done")
    store.erase_meta("issuer_key")
    assert store.get_meta("issuer_key") is None and store.get_result("outcome") == b"done"


def test_the_move_to_postgresql_copies_every_table_and_column_of_the_current_schema(tmp_path: Path) -> None:
    """`RoundStore.copy_from` lists what it moves: a table or column a migration adds must be listed too,
    or moving a round would silently leave it behind. Only the inbox's own bookkeeping stays: its rows get
    new ids on the server and no worker holds a claim there yet."""
    from anonml.aggregator._store import _TABLE_COLUMNS

    RoundStore(tmp_path / "round.sqlite").close()
    db = sqlite3.connect(tmp_path / "round.sqlite")
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} - {"sqlite_sequence"}
    columns = {table: {row[1] for row in db.execute(f"PRAGMA table_info({table})")} for table in tables}
    db.close()
    assert tables == set(_TABLE_COLUMNS)
    left_behind = {table: columns[table] - set(listed) for table, listed in _TABLE_COLUMNS.items() if columns[table] - set(listed)}
    assert left_behind == {"inbox": {"id", "claimed_by", "claimed_at"}}


def test_a_batch_repeating_a_tag_or_a_report_stores_it_once(open_store: Opener) -> None:
    """The batch's statements travel together on PostgreSQL; a copy later in the same batch is still judged
    against the first, as when each row went alone."""
    store = open_store()
    first, second, again = store.enqueue([(b"c" * 32, b"x"), (b"d" * 32, b"y"), (b"c" * 32, b"z")], 1000.0)
    assert first is not None and second is not None and again is None and first < second
    batch = [packet(SURVEY, 0), packet(SURVEY, 1), packet(SURVEY, 0), packet(SURVEY, 1, b"another message")]
    assert store.store_batch(batch, [], 1000) == ["accepted", "accepted", "duplicate", "double-submission"]
    assert store.log_leaves(SURVEY) == [packet(SURVEY, n).receipt for n in (0, 1)]


class TurnCountingProxy:
    """A loopback TCP proxy to a server that counts turns: each time a client sends again after the server
    answered it, one round trip the client waited for."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.turns = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            answered = [True]
            threading.Thread(target=self._pump, args=(client, upstream, answered, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, answered, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answered: list[bool], from_client: bool) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    # Noted before forwarding: the client cannot react to an answer before it is counted.
                    if from_client and answered[0]:
                        self.turns += 1
                    answered[0] = not from_client
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()


def test_on_postgresql_a_batch_costs_a_few_round_trips_not_one_per_message(postgres_server: Any) -> None:
    """A round trip per row made a batch of 128 cost 256 waits for the server (each a context switch each
    way, and on a loaded host a wait for a CPU): the workers sat idle and the server's CPU per report tripled."""
    proxy = TurnCountingProxy(postgres_server.port)
    url = postgres_server.url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
    store = RoundStore(PostgresLocation(url, "test_round_trips"))
    try:
        store.enqueue([(b"warm" + bytes(28), b"m")], 1000.0)  # a connection in the pool, its statements prepared
        before = proxy.turns
        ids = store.enqueue([(hashlib.sha256(b"%d" % n).digest(), b"message %d" % n) for n in range(200)], 1000.0)
        enqueue_turns = proxy.turns - before
        before = proxy.turns
        outcomes = store.store_batch([packet(SURVEY, n) for n in range(200)], [], 1000, done_inbox_ids=ids)
        store_turns = proxy.turns - before
    finally:
        store.close()
        proxy.close()
    assert None not in ids and outcomes == ["accepted"] * 200
    assert enqueue_turns <= 12, enqueue_turns
    assert store_turns <= 12, store_turns


def test_on_postgresql_a_batch_without_resends_writes_each_packet_row_once(open_store: Opener) -> None:
    """Giving packets their log positions after inserting them rewrote every row (and its index entries):
    a second row version per report on the server. A version written in place keeps the heap's item
    numbers dense: each page's last item number equals the rows it holds."""
    store = open_store()
    if store.engine != "postgresql":
        pytest.skip("row versions are PostgreSQL's")
    assert store.store_batch([packet(SURVEY if n % 2 else OTHER, n) for n in range(200)], [], 1000) == ["accepted"] * 200
    with store._engine.read() as db:
        pages = db.execute(
            "SELECT COUNT(*), MAX((ctid::text::point)[1]) FROM packets GROUP BY (ctid::text::point)[0]").fetchall()
    assert sum(int(rows) for rows, _ in pages) == 200
    assert all(int(rows) == int(last) for rows, last in pages), pages
    assert store.log_leaves(SURVEY) == [packet(SURVEY, n).receipt for n in range(1, 200, 2)]


def test_on_postgresql_a_claim_rewrites_each_row_on_its_own_page(open_store: Opener) -> None:
    """A claim sets two columns of each row it takes. On full pages each new row version went to another page,
    with an entry in each of the inbox's indexes (the server's largest statement per report); pages filled to
    half keep it beside the old version, touching no index. Row versions are PostgreSQL's."""
    store = open_store()
    if store.engine != "postgresql":
        pytest.skip("row versions are PostgreSQL's")
    message = bytes(range(256)) * 8  # a Sphinx message's 2,048 bytes

    def pages() -> dict[int, str]:
        with store._engine.read() as db:
            rows = db.execute("SELECT id, (ctid::text::point)[0] FROM inbox").fetchall()
        return {int(row_id): str(page) for row_id, page in rows}

    ids = store.enqueue([(hashlib.sha256(b"%d" % n).digest(), message) for n in range(400)], 1000.0, relay="aa")
    before = pages()
    assert len(set(before.values())) > 1  # the rows fill several pages
    claimed = [row[0] for row in store.claim_inbox("w", 400, now=2000.0, relay="aa")]
    assert claimed == ids
    assert pages() == before
