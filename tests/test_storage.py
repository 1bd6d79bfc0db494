"""anonml.base.storage: versioned SQLite stores and key files."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from anonml.base.errors import (
    AnonMLError,
    ConfigError,
    InputError,
    StorageError,
    TransportError,
)
from anonml.base.storage import (
    Database,
    Schema,
    make_private_dir,
    read_secret_file,
    replace_file,
    write_secret_file,
)

V1 = Schema("test", 0x7E57_0001, 1, "CREATE TABLE items (name TEXT PRIMARY KEY)")
V2 = Schema(
    "test", 0x7E57_0001, 2, "CREATE TABLE items (name TEXT PRIMARY KEY, size INTEGER NOT NULL DEFAULT 0)",
    migrations={1: "ALTER TABLE items ADD COLUMN size INTEGER NOT NULL DEFAULT 0"},
)


def test_a_new_file_gets_the_current_tables_and_version(tmp_path: Path) -> None:
    database = Database(tmp_path / "s.sqlite", V2)
    with database.transaction() as db:
        db.execute("INSERT INTO items VALUES ('a', 3)")
    with database.read() as db:
        assert db.execute("SELECT name, size FROM items").fetchall() == [("a", 3)]
        assert db.execute("PRAGMA user_version").fetchone() == (2,)
        assert db.execute("PRAGMA application_id").fetchone() == (V2.application_id,)


def test_an_older_file_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    old = Database(tmp_path / "s.sqlite", V1)
    with old.transaction() as db:
        db.execute("INSERT INTO items VALUES ('kept')")
    old.close()
    with Database(tmp_path / "s.sqlite", V2).read() as db:
        assert db.execute("SELECT name, size FROM items").fetchall() == [("kept", 0)]
        assert db.execute("PRAGMA user_version").fetchone() == (2,)


def test_a_newer_file_or_another_kind_of_store_is_refused(tmp_path: Path) -> None:
    Database(tmp_path / "s.sqlite", V2).close()
    with pytest.raises(StorageError, match="newer than this release's 1: upgrade anonml"):
        Database(tmp_path / "s.sqlite", V1)
    other = Schema("peer", 0x7E57_0002, 1, "CREATE TABLE x (y)")
    with pytest.raises(StorageError, match="is not a peer store"):
        Database(tmp_path / "s.sqlite", other)


def test_an_unversioned_file_is_adopted_only_when_the_schema_says_so(tmp_path: Path) -> None:
    legacy = sqlite3.connect(tmp_path / "legacy.sqlite")
    legacy.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
    legacy.execute("INSERT INTO items VALUES ('old')")
    legacy.commit()
    legacy.close()
    with pytest.raises(StorageError, match="no schema version"):
        Database(tmp_path / "legacy.sqlite", V1)
    adopting = Schema(V2.name, V2.application_id, 2, V2.tables, V2.migrations, unversioned=1)
    with Database(tmp_path / "legacy.sqlite", adopting).read() as db:
        assert db.execute("SELECT name, size FROM items").fetchall() == [("old", 0)]


def test_a_schema_without_a_migration_path_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="no migration"):
        Schema("test", 1, 3, "CREATE TABLE t (x)", migrations={1: "SELECT 1"})


def test_a_full_disk_raises_the_real_error_and_leaves_no_transaction_open(tmp_path: Path) -> None:
    database = Database(tmp_path / "s.sqlite", V1)
    with database.read() as db:
        (pages,) = db.execute("PRAGMA page_count").fetchone()
        # Cap the file at its current size: the next growth fails as a full disk does.
        db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StorageError, match="full") as raised:
        with database.transaction() as db:
            db.executemany("INSERT INTO items VALUES (?)", [(f"{i:04d}" * 50,) for i in range(500)])
    # Not SQLite's "cannot rollback - no transaction is active", which a
    # second ROLLBACK after SQLite's own would have raised instead.
    assert "rollback" not in str(raised.value)
    with database.read() as db:
        assert db.execute("SELECT COUNT(*) FROM items").fetchone() == (0,)
        db.execute("PRAGMA max_page_count = 1000000")
    with database.transaction() as db:
        db.execute("INSERT INTO items VALUES ('after')")


def test_the_callers_own_errors_pass_unchanged_and_roll_back(tmp_path: Path) -> None:
    database = Database(tmp_path / "s.sqlite", V1)
    with database.transaction() as db:
        db.execute("INSERT INTO items VALUES ('a')")
    with pytest.raises(sqlite3.IntegrityError):
        with database.transaction() as db:
            db.execute("INSERT INTO items VALUES ('b')")
            db.execute("INSERT INTO items VALUES ('a')")
    with database.read() as db:
        assert db.execute("SELECT name FROM items").fetchall() == [("a",)]


def test_a_store_that_cannot_be_opened_says_which_and_why(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="cannot open the test store"):
        Database(tmp_path / "missing-dir" / "s.sqlite", V1)
    (tmp_path / "junk.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StorageError, match="junk.sqlite"):
        Database(tmp_path / "junk.sqlite", V1)


def test_a_private_store_and_its_wal_files_are_owner_only(tmp_path: Path) -> None:
    database = Database(tmp_path / "s.sqlite", V1, private=True)
    with database.transaction() as db:
        db.execute("INSERT INTO items VALUES ('secret')")
    files = [tmp_path / "s.sqlite", tmp_path / "s.sqlite-wal", tmp_path / "s.sqlite-shm"]
    assert all(path.exists() for path in files)
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_secret_files_are_written_once_and_read_only_when_private(tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    write_secret_file(key, b"\x01" * 32)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        write_secret_file(key, b"\x02" * 32)
    assert read_secret_file(key, what="the test key") == b"\x01" * 32
    os.chmod(key, 0o640)
    with pytest.raises(ConfigError, match=r"open to other users \(mode 0640\); run `chmod 600"):
        read_secret_file(key, what="the test key")
    with pytest.raises(ConfigError, match="does not exist"):
        read_secret_file(tmp_path / "none.key", what="the test key")
    big = tmp_path / "big.key"
    write_secret_file(big, b"x" * 100)
    with pytest.raises(ConfigError, match="100 bytes, more than 32"):
        read_secret_file(big, what="the test key", max_bytes=32)
    os.symlink(big, tmp_path / "link.key")
    with pytest.raises(ConfigError, match="cannot read"):
        read_secret_file(tmp_path / "link.key", what="the test key")
    make_private_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700


def test_every_branch_is_an_anonml_error_and_only_input_is_a_value_error() -> None:
    for branch in (InputError, TransportError, ConfigError, StorageError):
        assert issubclass(branch, AnonMLError)
    assert issubclass(InputError, ValueError)
    assert not any(issubclass(b, ValueError) for b in (TransportError, ConfigError, StorageError))


def test_a_replaced_file_is_never_seen_half_written(tmp_path: Path) -> None:
    # A reader polls for the file the way the demo waits for report.json while
    # the file is written over and over. A plain write_text truncates, then
    # writes, so the reader catches it empty or cut short.
    path = tmp_path / "report.json"
    whole = "x" * 2_000_000
    lengths: list[int] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            if path.is_file():
                lengths.append(len(path.read_text()))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(500):
            replace_file(path, whole)
            if len(lengths) >= 50:
                break
    finally:
        done.set()
        reader.join()
    assert len(lengths) >= 50 and set(lengths) == {len(whole)}
    assert not path.with_name("report.json.part").exists()


def test_a_schema_page_size_applies_to_a_new_file_and_an_existing_file_keeps_its_own(tmp_path: Path) -> None:
    Database(tmp_path / "old.sqlite", V1).close()
    wide = Schema("test", 0x7E57_0001, 1, V1.tables, page_size=8192)
    for name, expected in (("new.sqlite", 8192), ("old.sqlite", 4096)):
        database = Database(tmp_path / name, wide)
        with database.read() as db:
            assert db.execute("PRAGMA page_size").fetchone() == (expected,), name
        database.close()


def test_reads_in_a_snapshot_see_one_state_of_the_file(tmp_path: Path) -> None:
    """The relay's intake looks a slice's replay tags up in one read transaction: what another connection
    commits meanwhile is not seen inside it, and is seen after it."""
    path = tmp_path / "s.sqlite"
    reader, writer = Database(path, V1), Database(path, V1)
    with reader.snapshot() as db:
        assert db.execute("SELECT count(*) FROM items").fetchone() == (0,)
        with writer.transaction() as other:
            other.execute("INSERT INTO items VALUES ('a')")
        assert db.execute("SELECT count(*) FROM items").fetchone() == (0,)
    with reader.read() as db:
        assert db.execute("SELECT count(*) FROM items").fetchone() == (1,)
