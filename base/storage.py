"""Every store's SQLite database, opened, versioned and written one way; and key files.

A store (the relay's held packets, the peer's ledger, a round's database)
declares its tables once as a :class:`Schema` and opens them through
:class:`Database`:

- WAL mode, ``synchronous=FULL`` unless the store opts out: a commit is on
  disk before anything is acknowledged (DESIGN.md §10);
- ``PRAGMA application_id`` names the kind of store and ``PRAGMA
  user_version`` its schema version: a new file gets the current tables, an
  older one is migrated step by step inside one transaction, and a file of
  another kind or of a newer release is refused with a one-line error
  instead of being met silently by ``CREATE TABLE IF NOT EXISTS``;
- :meth:`Database.transaction` is the only way to write: ``BEGIN IMMEDIATE``,
  ``COMMIT`` on success, and a ``ROLLBACK`` only while a transaction is still
  open (SQLite rolls back by itself on some errors; a second ROLLBACK would
  raise and hide the real error);
- SQLite's I/O failures (disk full, read-only, not a database) become
  :class:`~anonml.base.errors.StorageError` naming the file.

A file that another process may read while it is being written (a round's
report, the demo's spec) is written by :func:`replace_file`: whole under a
temporary name, then renamed into place, so a reader sees the old file or
the new one, never half of it.

Key files are written and read by :func:`write_secret_file` and
:func:`read_secret_file` only: created 0600 with ``O_EXCL`` and fsynced, read
only if they are regular files of this user that nobody else can read.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import stat
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from anonml.base.errors import ConfigError, StorageError

__all__ = ["Database", "Schema", "lock_data_dir", "split_statements", "make_private_dir", "read_secret_file", "replace_file", "write_secret_file"]

LOCK_FILE = ".lock"


@dataclass(frozen=True)
class Schema:
    """One store's tables at its current version, and how older files reach it.

    ``application_id`` tells the kinds of store apart (a relay refuses to
    open a peer's file). ``migrations[v]`` is the SQL that takes a database
    from version ``v`` to ``v + 1``. ``unversioned`` is the version a file
    written before stores were versioned (``user_version`` 0, tables present)
    is taken to be, or None to refuse such files. ``page_size``: SQLite's
    page size for a file created new (None: SQLite's default, 4096); an
    existing file keeps the size it was created with.
    """

    name: str
    application_id: int
    version: int
    tables: str
    migrations: Mapping[int, str] = field(default_factory=dict)
    unversioned: int | None = None
    page_size: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.application_id < 2**31:
            raise ValueError(f"application_id must be a positive 32-bit integer, got {self.application_id!r}")
        if self.version < 1:
            raise ValueError(f"version must be >= 1, got {self.version!r}")
        oldest = min([*self.migrations, self.version, *([self.unversioned] if self.unversioned is not None else [])])
        missing = [v for v in range(max(oldest, 1), self.version) if v not in self.migrations]
        if missing:
            raise ValueError(f"schema {self.name!r} has no migration from version(s) {missing!r}")


def _is_io_failure(exc: sqlite3.Error) -> bool:
    """SQLite errors that come from the disk or the file, not from the caller's SQL."""
    return isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError


class Database:
    """One SQLite file with a versioned :class:`Schema`; every access holds one lock.

    The connection is shared by the event loop and worker threads (SQLite
    connections are not thread-safe; the lock serialises them). ``durable``
    False trades durability against a machine crash for speed (commits still
    survive a crash of the process). ``private`` creates the file 0600, and
    SQLite gives its ``-wal`` and ``-shm`` files the same mode.
    """

    def __init__(self, path: Path, schema: Schema, *, durable: bool = True, private: bool = False) -> None:
        self.path = path
        self.schema = schema
        # Reentrant: a store may read through :meth:`read` inside its own transaction.
        self._lock = threading.RLock()
        try:
            if private:
                _create_private(path)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StorageError(f"cannot open the {schema.name} store {str(path)!r}: {exc}") from None
        try:
            if schema.page_size is not None:  # before WAL mode: SQLite applies it only to a file with no pages yet
                self._db.execute(f"PRAGMA page_size={int(schema.page_size)}")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._upgrade()
        except sqlite3.Error as exc:
            self._db.close()
            raise StorageError(f"cannot open the {schema.name} store {str(path)!r}: {exc}") from None
        except StorageError:
            self._db.close()
            raise

    def _upgrade(self) -> None:
        """Create the tables of a new file, or migrate an older one (one transaction)."""
        schema = self.schema
        with self.transaction() as db:
            (application_id,) = db.execute("PRAGMA application_id").fetchone()
            (version,) = db.execute("PRAGMA user_version").fetchone()
            (tables,) = db.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'").fetchone()
            if application_id not in (0, schema.application_id):
                raise StorageError(f"{str(self.path)!r} is not a {schema.name} store (application id {application_id:#x})")
            if version == 0 and tables > 0:
                if schema.unversioned is None:
                    raise StorageError(f"{str(self.path)!r} holds tables but no schema version; it is not a {schema.name} store")
                version = schema.unversioned
            if version > schema.version:
                raise StorageError(
                    f"the {schema.name} store {str(self.path)!r} has schema version {version}, newer than this "
                    f"release's {schema.version}: upgrade anonml"
                )
            if version == 0:
                for statement in split_statements(schema.tables):
                    db.execute(statement)
            else:
                for step in range(version, schema.version):
                    for statement in split_statements(schema.migrations[step]):
                        db.execute(statement)
            db.execute(f"PRAGMA application_id = {schema.application_id}")
            db.execute(f"PRAGMA user_version = {schema.version}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic, durable unit: ``BEGIN IMMEDIATE`` … ``COMMIT``; rolled back on any error.

        SQLite's I/O failures are raised as :class:`StorageError`; errors of
        the caller's own (an IntegrityError it expects, a bug) pass unchanged.
        """
        with self._lock, self._failures(roll_back=True):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._rollback()
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The connection for reads outside a transaction (each statement sees committed data)."""
        with self._lock, self._failures(roll_back=False):
            yield self._db

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """One read transaction for several reads (``BEGIN`` … ``COMMIT``, nothing written): they share
        one snapshot and one acquisition of SQLite's WAL read lock rather than one per statement. Run no
        writes in it, and nothing that waits: another writer's commit would not be seen until it ends."""
        with self._lock, self._failures(roll_back=True):
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                if self._db.in_transaction:
                    self._db.execute("COMMIT")

    @contextmanager
    def _failures(self, *, roll_back: bool) -> Iterator[None]:
        """SQLite's I/O failures inside, raised as :class:`StorageError` (after rolling back what is open if
        ``roll_back``); errors of the caller's own (an IntegrityError it expects, a bug) pass unchanged."""
        try:
            yield
        except sqlite3.Error as exc:
            if not _is_io_failure(exc):
                raise
            if roll_back:
                self._rollback()
            raise StorageError(f"the {self.schema.name} store {str(self.path)!r} failed: {exc}") from exc

    def _rollback(self) -> None:
        # SQLite has already rolled back after some errors (a full disk during
        # COMMIT): only roll back what is still open, and never let a failing
        # ROLLBACK replace the error that caused it.
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def close(self) -> None:
        with self._lock:
            self._db.close()


def split_statements(script: str) -> list[str]:
    """The statements of a DDL script, one per ``;`` (the schemas hold no ``;`` inside a statement)."""
    return [part.strip() for part in script.split(";") if part.strip()]


def _create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (SQLite then gives its ``-wal`` and
    ``-shm`` files that mode); an existing one, and its ``-wal`` and ``-shm``, are made 0600 (a store
    written before stores were private was 0644, issue 13)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for companion in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            if companion.exists() and stat.S_IMODE(companion.stat().st_mode) & 0o077:
                os.chmod(companion, 0o600)
        return
    os.close(descriptor)


@contextmanager
def lock_data_dir(path: Path, *, command: str) -> Iterator[None]:
    """Hold an exclusive lock on data directory ``path`` while ``command`` runs in it.

    One ``relay run``, ``peer join`` or ``aggregator run`` per directory:
    two would share one SQLite store and one set of keys (two relays would
    forward the same held packets; two aggregators would both answer for
    one round). The lock is ``flock`` on ``path/.lock``: the kernel drops it
    when the process dies, however it dies, so a crash never leaves the
    directory locked. Raises :class:`ConfigError` naming the process that
    holds it when another one does.
    """
    lock_path = path / LOCK_FILE
    try:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot lock the data directory {str(path)!r}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 64, 0).decode(errors="replace").strip() or "another process"
            raise ConfigError(
                f"{str(path)!r} is in use by {holder}: only one `{command}` may use a data directory; "
                f"stop that one first (or use another --data-dir)"
            ) from None
        try:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, f"pid {os.getpid()} (`{command}`)\n".encode(), 0)
        except OSError:
            pass  # a full disk: the lock holds without the note; the store will say what is wrong
        yield
    finally:
        os.close(descriptor)


def make_private_dir(path: Path) -> None:
    """Create directory ``path`` (and missing parents) readable by its owner only (0700)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole: a reader polling for the file never sees it half-written."""
    partial = path.with_name(path.name + ".part")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def write_secret_file(path: Path, secret: bytes) -> None:
    """Create ``path`` readable by its owner only (0600) and write ``secret`` durably.

    Raises FileExistsError if ``path`` exists: ``O_EXCL`` makes the check and
    the creation one step, so two concurrent ``init`` runs cannot both believe
    they created the key (DESIGN.md §7: keys are never silently replaced).
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(secret)
        while view:
            view = view[os.write(descriptor, view) :]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_secret_file(path: Path, *, what: str, max_bytes: int = 64 * 1024) -> bytes:
    """The contents of key file ``path``, after checking nobody else could have read or replaced it.

    Raises :class:`ConfigError` naming ``what`` and the fix when the file is
    missing, not a regular file, not this user's, readable or writable by
    group or others, or larger than ``max_bytes``.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise ConfigError(f"{what} {str(path)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{what} {str(path)!r} is not a regular file")
        if info.st_uid != os.getuid():
            raise ConfigError(f"{what} {str(path)!r} belongs to another user (uid {info.st_uid})")
        if info.st_mode & 0o077:
            raise ConfigError(
                f"{what} {str(path)!r} is open to other users (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"run `chmod 600 {path}` if you trust its contents"
            )
        if info.st_size > max_bytes:
            raise ConfigError(f"{what} {str(path)!r} is {info.st_size} bytes, more than {max_bytes}")
        chunks = []
        while chunk := os.read(descriptor, max_bytes + 1):
            chunks.append(chunk)
        return b"".join(chunks)[: max_bytes + 1]
    finally:
        os.close(descriptor)
