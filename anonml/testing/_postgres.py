"""A private PostgreSQL server in a temporary directory, for tests and benchmarks.

Debian's server binaries (``initdb``, ``pg_ctl``) start a cluster of this
process's own: no system instance, nothing shared with another test run. The
server refuses to run as root, so when this process is root the cluster
belongs to an unprivileged account (``postgres`` when the package created it,
else ``nobody``) and both commands run as that account through ``runuser``.
It listens on a free loopback port (and a socket in its own directory) and
trusts local connections: it lives as long as the tests and holds test data only.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from anonml.base.errors import ConfigError

SERVER_DIRS = (Path("/usr/lib/postgresql/15/bin"), Path("/usr/lib/postgresql/16/bin"), Path("/usr/lib/postgresql/17/bin"))
"""Where Debian installs the server binaries (``initdb`` is not on PATH there)."""


class PostgresUnavailable(ConfigError):
    """No PostgreSQL server binaries on this machine, or the driver is not installed: says which."""


@dataclass(frozen=True)
class PostgresServer:
    """A running private server: ``url`` names its ``anonml`` database."""

    url: str
    data_dir: Path
    port: int

    def database_url(self, name: str) -> str:
        """The URL of another database on this server (create it with :meth:`create_database`)."""
        return self.url.rsplit("/", 1)[0] + "/" + name

    def create_database(self, name: str) -> str:
        """Create database ``name`` (a fresh one per test keeps tests apart); its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.database_url(name)

    def postmaster_pid(self) -> int:
        """The server's main process (``postmaster.pid``'s first line): its backends and background processes are its children."""
        return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])


def server_binaries() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``; PostgresUnavailable naming what is missing."""
    try:
        import psycopg  # noqa: F401  (the driver the stores use)
    except ImportError:
        raise PostgresUnavailable("the psycopg driver is not installed (pip install -e '.[pg]')") from None
    candidates = [*SERVER_DIRS]
    on_path = shutil.which("initdb")
    if on_path is not None:
        candidates.insert(0, Path(on_path).resolve().parent)
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    raise PostgresUnavailable("PostgreSQL's server binaries (initdb, pg_ctl) are not installed: apt-get install postgresql")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_account() -> str | None:
    """The unprivileged account the server runs as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise PostgresUnavailable("running as root and no unprivileged account (postgres, nobody) to run the server as")


@contextmanager
def private_postgres(*, start_timeout: int = 60) -> Iterator[PostgresServer]:
    """Start a private server in a fresh temporary directory; stop it and remove the directory after."""
    binaries = server_binaries()
    account = _server_account()
    as_account = ["runuser", "-u", account, "--"] if account is not None else []
    root = Path(tempfile.mkdtemp(prefix="anonml-pg-"))
    data_dir = root / "data"
    try:
        if account is not None:
            record = pwd.getpwnam(account)
            os.chown(root, record.pw_uid, record.pw_gid)
        os.chmod(root, 0o700)
        port = _free_port()
        _setup_step([*as_account, str(binaries / "initdb"), "-D", str(data_dir), "-U", "anonml", "--auth=trust",
                     "--encoding=UTF8", "--no-sync"])
        options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} -c max_connections=60"
        _setup_step([*as_account, str(binaries / "pg_ctl"), "-D", str(data_dir), "-o", options, "-l", str(root / "server.log"),
                     "-w", "-t", str(start_timeout), "start"])
        try:
            server = PostgresServer(f"postgresql://anonml@127.0.0.1:{port}/postgres", data_dir, port)
            server.create_database("anonml")
            yield PostgresServer(server.database_url("anonml"), data_dir, port)
        finally:
            subprocess.run([*as_account, str(binaries / "pg_ctl"), "-D", str(data_dir), "-m", "immediate", "-w", "stop"],
                           capture_output=True, text=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _setup_step(command: list[str]) -> None:
    """Run one step of starting the server; PostgresUnavailable with its error output if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        program = next(part for part in command if part.startswith("/"))
        raise PostgresUnavailable(f"{program} failed: {(done.stderr or done.stdout).strip()[-400:]}")
