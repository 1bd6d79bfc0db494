"""The round store's two engines behind one interface: SQLite (embedded, the default) and PostgreSQL.

:class:`~anonml.aggregator._store.RoundStore` writes its SQL once, in the
dialect both engines share (``INSERT … ON CONFLICT``, ``RETURNING``, ``?``
placeholders) and opens transactions and reads through an :class:`Engine`:

- :class:`SqliteEngine`: one file through :class:`anonml.base.storage.Database`
  (WAL, ``synchronous=FULL``, versions in ``PRAGMA user_version``), one
  connection under one lock, ``BEGIN IMMEDIATE``: transactions never overlap.
- :class:`PostgresEngine`: a database named by a ``postgresql://`` URL, each
  round in its own schema. Several processes share it (ingest workers,
  DESIGN.md §10), so transactions overlap and every rule that must hold
  across them is a constraint or a row lock, never a check-then-insert.
  Commits are durable (``synchronous_commit`` stays on). Versions live in the
  schema's ``schema_version`` table: each migration is applied once, in
  order, under an advisory lock so two processes opening one round at once
  do not both apply it. Connection failures, deadlocks and serialization
  failures become :class:`~anonml.base.errors.StorageError` (retried like a
  full disk); the caller's own errors (an IntegrityError) pass unchanged.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from anonml.base.errors import ConfigError, StorageError
from anonml.base.storage import Database, Schema, split_statements

if TYPE_CHECKING:
    import psycopg


class Cursor(Protocol):
    """What a statement returns on either engine."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Session(Protocol):
    """A transaction or a read: statements in the shared dialect."""

    def execute(self, sql: str, parameters: Sequence[object] = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> Any: ...


class Engine(Protocol):
    """One round's database on one engine."""

    dialect: str
    where: str
    """What error messages name: the file, or the server and schema (never a password)."""

    def transaction(self) -> Any:
        """A context manager yielding a :class:`Session`: atomic and durable, rolled back on any error."""

    def read(self) -> Any:
        """A context manager yielding a :class:`Session` that sees committed data."""

    def has_table(self, name: str) -> bool: ...

    def scrub(self, table: str) -> None:
        """Make rows deleted from ``table`` unreadable in the files (after erasing a secret)."""

    def close(self) -> None: ...


class SqliteEngine:
    """A round in one SQLite file (the embedded default)."""

    dialect = "sqlite"
    skip_locked = ""

    def __init__(self, path: Path, schema: Schema) -> None:
        self.path = path
        self.where = str(path)
        # Durable (a commit is on disk before the link acknowledges, DESIGN.md
        # §10) and private: the file holds the issuer's secret key and the seed.
        self._database = Database(path, schema, private=True)
        with self._database.read() as db:
            # Deleted content is overwritten, not left in free pages (the issuer key, :meth:`scrub`).
            db.execute("PRAGMA secure_delete = ON")

    def transaction(self) -> Any:
        return self._database.transaction()

    def read(self) -> Any:
        return self._database.read()

    def has_table(self, name: str) -> bool:
        with self._database.read() as db:
            return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None

    def scrub(self, table: str) -> None:
        # ``secure_delete`` overwrote the page in the database; the WAL held its old image.
        with self._database.read() as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self._database.close()


@dataclass(frozen=True)
class PostgresLocation:
    """A round's store on PostgreSQL: the server's database URL and the round's schema in it."""

    url: str
    schema: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"postgres(ql)?://\S+", self.url):
            raise ConfigError(f"a PostgreSQL store is named by a postgresql:// URL, got {redact(self.url)!r}")
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", self.schema):
            raise ValueError(f"not a schema name: {self.schema!r}")


def redact(url: str) -> str:
    """``url`` without its password (error messages and logs name the server, never the secret)."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


class _PostgresSession:
    """psycopg's connection with ``?`` placeholders (the shared dialect) turned into ``%s``."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def execute(self, sql: str, parameters: Sequence[object] = ()) -> Cursor:
        return self._connection.execute(_placeholders(sql), tuple(parameters))

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> Any:
        cursor = self._connection.cursor()
        cursor.executemany(_placeholders(sql), [tuple(row) for row in rows])
        return cursor

    def execute_each(self, sql: str, rows: Sequence[Sequence[object]]) -> list[list[Any]]:
        # psycopg sends the whole batch in pipeline mode: one exchange with the server, not one per row.
        if not rows:
            return []
        cursor = self._connection.cursor()
        cursor.executemany(_placeholders(sql), [tuple(row) for row in rows], returning=True)
        results = [cursor.fetchall()]
        while cursor.nextset():
            results.append(cursor.fetchall())
        return results


def execute_each(db: Session, sql: str, rows: Sequence[Sequence[object]]) -> list[list[Any]]:
    """Run ``sql`` (with a ``RETURNING`` clause) once per parameter row, in order, in ``db``'s transaction;
    per row the rows it returned.

    On PostgreSQL the statements travel together, one exchange with the server for the batch rather than a
    round trip per row (a round trip is a context switch to the backend and back, and on a loaded host a wait
    for the CPU each way); on SQLite, in the process, a statement costs no round trip and they run one by one.
    """
    if isinstance(db, _PostgresSession):
        return db.execute_each(sql, rows)
    return [db.execute(sql, row).fetchall() for row in rows]


def _placeholders(sql: str) -> str:
    # The store's SQL holds no literal ``?`` or ``%``: every ``?`` is a parameter.
    return sql.replace("?", "%s")


class PostgresEngine:
    """A round in its own schema of a PostgreSQL database, shared by every process of the round.

    ``migrations`` is the schema's history: entry ``i`` takes it from version
    ``i`` to ``i + 1``. A small pool of connections (one per thread at a time)
    lets intake and verification commit side by side.
    """

    dialect = "postgresql"
    skip_locked = " FOR UPDATE SKIP LOCKED"

    def __init__(self, location: PostgresLocation, migrations: Sequence[str], *, pool_size: int = 4,
                 connect_timeout: int = 10) -> None:
        try:
            import psycopg
        except ImportError:
            raise ConfigError("a PostgreSQL store needs the psycopg driver: pip install 'anonml[pg]'") from None
        self._psycopg = psycopg
        self.location = location
        self.where = f"{redact(location.url)} (schema {location.schema})"
        self._connect_timeout = connect_timeout
        self._idle: queue.LifoQueue[psycopg.Connection[Any]] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(pool_size)
        self._closed = False
        self._migrate(migrations)

    # -- connections --------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            connection = self._psycopg.connect(self.location.url, autocommit=True, connect_timeout=self._connect_timeout)
        except self._psycopg.Error as exc:
            raise StorageError(f"cannot open the round store {self.where}: {_first_line(exc)}") from None
        connection.execute(f"SET search_path TO {self.location.schema}")
        return connection

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self._closed:
            raise StorageError(f"the round store {self.where} is closed")
        with self._slots:
            try:
                connection = self._idle.get_nowait()
            except queue.Empty:
                connection = self._connect()
            try:
                yield connection
            finally:
                if connection.closed or connection.broken or self._closed:
                    connection.close()
                else:
                    self._idle.put(connection)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        psycopg = self._psycopg
        with self._connection() as connection:
            try:
                with connection.transaction():
                    yield _PostgresSession(connection)
            except psycopg.IntegrityError:
                raise
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # The server went away, a deadlock, a serialization failure: nothing
                # of the transaction committed, and trying again may succeed.
                raise StorageError(f"the round store {self.where} failed: {_first_line(exc)}") from exc

    @contextmanager
    def read(self) -> Iterator[Session]:
        psycopg = self._psycopg
        with self._connection() as connection:
            try:
                yield _PostgresSession(connection)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                raise StorageError(f"the round store {self.where} failed: {_first_line(exc)}") from exc

    # -- schema -------------------------------------------------------------------

    def _migrate(self, migrations: Sequence[str]) -> None:
        """Bring the round's schema to ``len(migrations)``: each missing migration once, in order."""
        schema = self.location.schema
        with self._connection() as connection:
            try:
                with connection.transaction():
                    # One process migrates at a time (a lock on the schema's name, held to the commit).
                    connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"anonml/{schema}",))
                    connection.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
                    connection.execute(f"SET LOCAL search_path TO {schema}")
                    connection.execute(
                        "CREATE TABLE IF NOT EXISTS schema_version ("
                        "version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
                    row = connection.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
                    current = int(row[0]) if row is not None else 0
                    if current > len(migrations):
                        raise StorageError(
                            f"the round store {self.where} has schema version {current}, newer than this "
                            f"release's {len(migrations)}: upgrade anonml")
                    for version in range(current, len(migrations)):
                        for statement in split_statements(migrations[version]):
                            connection.execute(statement)
                        connection.execute("INSERT INTO schema_version (version) VALUES (%s)", (version + 1,))
            except self._psycopg.Error as exc:
                raise StorageError(f"cannot open the round store {self.where}: {_first_line(exc)}") from None

    def schema_versions(self) -> list[int]:
        """Every migration applied, in order (each once)."""
        with self.read() as db:
            return [int(row[0]) for row in db.execute("SELECT version FROM schema_version ORDER BY version").fetchall()]

    def has_table(self, name: str) -> bool:
        with self.read() as db:
            row = db.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
                             (self.location.schema, name)).fetchone()
        return row is not None

    def scrub(self, table: str) -> None:
        # VACUUM frees the deleted row versions for reuse (outside a transaction: autocommit);
        # the server's WAL keeps their image until its segments are recycled.
        with self._connection() as connection:
            connection.execute(f"VACUUM {table}")

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


def open_engine(location: Path | PostgresLocation, sqlite_schema: Schema, postgres_migrations: Sequence[str]) -> SqliteEngine | PostgresEngine:
    """The engine for ``location``: a file path is SQLite, a :class:`PostgresLocation` PostgreSQL."""
    if isinstance(location, PostgresLocation):
        return PostgresEngine(location, postgres_migrations)
    return SqliteEngine(location, sqlite_schema)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]

