"""Shared test fixtures."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import settings

# No per-example deadline: Hypothesis's default (200 ms) measures the machine, not the code; beside
# four CPU hogs an X25519 example took 293 ms and failed the README's test command (load 11-19).
settings.register_profile("anonml", deadline=None)
settings.load_profile("anonml")

REPO_ROOT = Path(__file__).resolve().parent.parent
ADULT_DIR = REPO_ROOT.parent / "shared" / "data" / "adult"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow and system tests first: pytest-xdist hands tests out in this order, so the
    long ones run beside the quick tests instead of after them. Tests that
    need a quiet machine last: by then the demos are over, and a worker that
    reached one early would wait idle on :func:`quiet_machine` for a demo's
    whole round.

    xdist starts each worker with a chunk of two consecutive tests
    (``--maxschedchunk 2``), so the whole-round tests go one per chunk: in
    file order both fell into one worker's first chunk and ran one after the
    other (25 minutes) while the other worker ran everything else (CI).
    """

    def rank(item: pytest.Item) -> int:
        if "quiet_machine" in getattr(item, "fixturenames", ()):
            return 2
        long = item.get_closest_marker("slow") is not None or item.get_closest_marker("system") is not None
        return 0 if long else 1

    items.sort(key=rank)
    rounds = [item for item in items if item.get_closest_marker("whole_round") is not None]
    rest = [item for item in items if item.get_closest_marker("whole_round") is None]
    dealt: list[pytest.Item] = []
    for whole_round in rounds:
        dealt += [whole_round, *rest[:1]]
        rest = rest[1:]
    items[:] = dealt + rest


@pytest.fixture
def machine_share(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Held by tests that start a demo's dozen processes: see :func:`quiet_machine`."""
    with _machine_class(tmp_path_factory, "demos", "quiet"):
        yield


@pytest.fixture
def quiet_machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Held by relay tests on real sockets, whose windows are sized from a cost
    measured at their start: they wait until no xdist worker runs a demo (a
    demo beside one took the CPU its windows were sized without, and packets
    missed them: CI, three times in a day). They run beside each other, as
    beside any other test: one waiting for another left a worker idle for
    30 s of the README's test command."""
    with _machine_class(tmp_path_factory, "quiet", "demos"):
        yield


@contextlib.contextmanager
def _machine_class(tmp_path_factory: pytest.TempPathFactory, mine: str, other: str) -> Iterator[None]:
    """Run among tests of class ``mine`` only, never beside one of class ``other``.

    Each class holds its lock file shared while its tests run. A newcomer
    passes a gate one at a time: it takes its own class's lock shared, then
    waits until nobody holds the other's (an exclusive lock it drops at
    once). The other class cannot start a test meanwhile (the gate is
    held), and whoever holds the gate holds no class lock of the other
    class, so the wait ends."""
    # The parent of a worker's base temporary directory is the run's, shared by every xdist worker.
    run_dir = tmp_path_factory.getbasetemp().parent
    with (run_dir / f"{mine}.lock").open("a") as own, (run_dir / f"{other}.lock").open("a") as theirs:
        with (run_dir / "gate.lock").open("a") as gate:
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(own, fcntl.LOCK_SH)
                fcntl.flock(theirs, fcntl.LOCK_EX)
                fcntl.flock(theirs, fcntl.LOCK_UN)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(own, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def adult_dir() -> Path:
    """The UCI Adult files beside the checkout (never copied into the repo)."""
    if not (ADULT_DIR / "adult.data").exists():
        pytest.fail(f"UCI Adult data not found at {ADULT_DIR}; tests expect ../shared beside the repo")
    return ADULT_DIR


@pytest.fixture
def relay_processes() -> Iterator[list[trio.Process]]:
    """Relay processes a test starts; every one still running is killed when the test ends."""
    processes: list[trio.Process] = []
    yield processes
    for process in processes:
        if process.returncode is None:
            process.kill()


class Tmpfs:
    """A small tmpfs standing in for a disk (issue 13's full and read-only disks): :meth:`fill`
    writes a filler file to the last byte, :meth:`free` deletes it (space returns)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        with self.filler.open("ab", buffering=0) as handle:
            for size in (65536, 4096, 512, 64, 8, 1):
                try:
                    while True:
                        handle.write(b"\0" * size)
                except OSError:
                    continue

    def free(self) -> None:
        self.filler.unlink()

    def remount_read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    """A 4 MiB tmpfs at ``tmp_path / "disk"``; mounting needs root (CI and the developers' machines
    run as root), elsewhere the test is skipped, saying so."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"a full disk needs a tmpfs mount (root): {done.stderr.strip()}")
    try:
        yield Tmpfs(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


REQUIRE_POSTGRES = "ANONML_REQUIRE_POSTGRES"
"""Set to 1 by ``.ci/run``: CI installs PostgreSQL, so a PostgreSQL test that would skip fails instead."""


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A private PostgreSQL server for this test session (``anonml.testing.private_postgres``):
    started in a temporary directory with initdb and pg_ctl, stopped and removed at the end.
    Without PostgreSQL's server binaries or the psycopg driver the test skips, saying which,
    unless ``ANONML_REQUIRE_POSTGRES=1`` (CI), where it fails."""
    from anonml.testing import PostgresUnavailable, private_postgres

    server = private_postgres()
    try:
        running = server.__enter__()
    except PostgresUnavailable as exc:
        if os.environ.get(REQUIRE_POSTGRES) == "1":
            pytest.fail(f"PostgreSQL is required here ({REQUIRE_POSTGRES}=1) but unavailable: {exc}")
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    try:
        yield running
    finally:
        server.__exit__(None, None, None)


@pytest.fixture
def store_calls_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Every read and transaction of a SQLite round store made on the main thread (a trio run's event loop), as the
    names of the functions on the stack when it began, innermost first. A spy: each call then runs as it would."""
    import sys
    import threading

    from anonml.aggregator._engines import SqliteEngine

    found: list[tuple[str, ...]] = []

    def watched(name: str) -> Any:
        real = getattr(SqliteEngine, name)

        def call(self: SqliteEngine) -> Any:
            if threading.current_thread() is threading.main_thread():
                callers, frame = [], sys._getframe(1)
                while frame is not None:
                    callers.append(frame.f_code.co_name)
                    frame = frame.f_back  # type: ignore[assignment]
                found.append(tuple(callers))
            return real(self)
        return call

    for name in ("read", "transaction"):
        monkeypatch.setattr(SqliteEngine, name, watched(name))
    return found
