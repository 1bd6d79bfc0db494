"""The demo's child processes: started, restarted when they die, all stopped at the end.

Each child runs in its own session and process group, so one signal to the
group reaches everything it started too (the aggregator's issuer worker
processes and multiprocessing's resource tracker); a sweep with psutil
afterwards catches any descendant that left the group. :func:`open_children`
stops every child when its block ends, however it ends (an error, a
cancellation, SIGINT, SIGTERM or SIGHUP to the demo), so no process outlives it; if
the demo itself is killed (SIGKILL runs no clean-up), its reaper process
(``_reaper``) ends the groups instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import click
import psutil
import trio

from anonml.base.process import anonml_command

T = TypeVar("T")

# How long a child has to exit after SIGTERM before it is killed.
STOP_GRACE_SECONDS = 10.0
RESTART_DELAY = 0.5
"""Seconds between a restartable child's exit (noticed at once: its process is awaited) and its new start."""


class ChildFailed(click.ClickException):
    """A demo process could not be started, or failed; names the step and its log."""


def _never_done(returncode: int) -> bool:
    return False


@dataclass
class Child:
    """One supervised process: what runs it, its log, and how often it started.

    ``done(returncode)`` says whether an exit is the child's normal end (it is
    then not restarted); ``restart`` says whether any other exit restarts it.
    """

    name: str
    command: list[str]
    log: Path
    restart: bool
    done: Callable[[int], bool] = _never_done
    capture_stdout: bool = False
    process: trio.Process | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)
    """Return codes of every exit so far (negative: killed by that signal)."""
    running: trio.Event = field(default_factory=trio.Event)
    """Set while a process of this child runs; replaced on each exit."""
    finished: bool = False
    """It ended for good: its normal end, a failure not restarted, or a stop."""
    stopping: bool = False
    """It is being stopped on purpose: its exit is not restarted."""

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)

    @property
    def pid(self) -> int | None:
        process = self.process
        return process.pid if process is not None and process.returncode is None else None


class Children:
    """The running children of one demo (or benchmark); see :func:`open_children`."""

    def __init__(self, nursery: trio.Nursery, logs: Path, reaper: int, *, restart_delay: float, max_restarts: int,
                 on_restart: Callable[[Child, int], None] | None = None) -> None:
        self._nursery = nursery
        self._reaper = reaper
        """The write end of the reaper's stdin (see ``_reaper``)."""
        self.logs = logs
        self.restart_delay = restart_delay
        self.max_restarts = max_restarts
        self.on_restart = on_restart
        self.children: list[Child] = []

    async def run(self, name: str, args: Sequence[str]) -> str:
        """Run one ``anonml`` operator command (``args``: the words after ``anonml``) to completion; its stdout, or
        ChildFailed naming its log."""
        log = self.logs / f"{name}.log"
        result = await trio.run_process(anonml_command(*args), capture_stdout=True, capture_stderr=True, check=False)
        log.write_bytes(result.stdout + result.stderr)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).decode(errors="replace").strip().splitlines()[-5:]
            raise ChildFailed(f"`anonml {' '.join(args)}` failed ({result.returncode}); see {log}:\n" + "\n".join(tail))
        return result.stdout.decode()

    async def start(self, name: str, command: Sequence[str], *, restart: bool = False,
                    done: Callable[[int], bool] = _never_done, capture_stdout: bool = False) -> Child:
        """Start ``command``; with ``restart`` it is started again whenever it exits other than by ``done``."""
        child = Child(name, list(command), self.logs / f"{name}.log", restart, done, capture_stdout)
        self.children.append(child)
        await self._spawn(child)
        self._nursery.start_soon(self._watch, child)
        return child

    async def _spawn(self, child: Child) -> None:
        with child.log.open("ab") as log:
            if child.starts:
                log.write(f"\n--- restart {child.starts} after exit {child.exits[-1]} ---\n".encode())
            # The child keeps its own copy of the log descriptor.
            child.process = await trio.lowlevel.open_process(
                child.command, stdout=subprocess.PIPE if child.capture_stdout else log, stderr=log,
                start_new_session=True,
            )
        self._tell_reaper(f"+{child.process.pid}")
        child.starts += 1
        child.running.set()

    async def _watch(self, child: Child) -> None:
        while True:
            process = child.process
            assert process is not None
            returncode = await process.wait()
            child.exits.append(returncode)
            child.running = trio.Event()
            # Whatever it started goes with it: a restarted aggregator must not
            # find its predecessor's issuer workers still running.
            _signal_group(process.pid, signal.SIGKILL)
            self._tell_reaper(f"-{process.pid}")
            if child.stopping or not child.restart or child.done(returncode) or child.restarts >= self.max_restarts:
                child.finished = True
                return
            if self.on_restart is not None:
                self.on_restart(child, returncode)
            await trio.sleep(self.restart_delay)
            if child.stopping:
                child.finished = True
                return
            await self._spawn(child)

    def _tell_reaper(self, line: str) -> None:
        # One short line is written whole (under PIPE_BUF) and the reaper reads
        # all the time; if the reaper has died, the demo goes on without it.
        with suppress(BrokenPipeError):
            os.write(self._reaper, f"{line}\n".encode())

    def kill(self, child: Child, signum: int = signal.SIGKILL) -> bool:
        """Send ``signum`` to the child's whole process group now; False if it was not running."""
        pid = child.pid
        if pid is None:
            return False
        _signal_group(pid, signum)
        return True

    def stop(self, child: Child, signum: int = signal.SIGTERM) -> None:
        """Stop ``child`` for good: it is not restarted after this signal."""
        child.stopping = True
        self.kill(child, signum)

    def pids(self) -> list[int]:
        """Every live process of the children, their descendants included."""
        found: list[int] = []
        for child in self.children:
            pid = child.pid
            if pid is None:
                continue
            with suppress(psutil.Error):
                found.append(pid)
                found.extend(p.pid for p in psutil.Process(pid).children(recursive=True))
        return found

    def cpu_seconds(self) -> dict[tuple[str, int], float]:
        """CPU seconds (user and system) used so far by each live child process, its descendants included,
        keyed by the child's name and process id (a restarted child is a new key)."""
        used: dict[tuple[str, int], float] = {}
        for child in self.children:
            pid = child.pid
            if pid is None:
                continue
            with suppress(psutil.Error):
                process = psutil.Process(pid)
                total = 0.0
                for one in (process, *process.children(recursive=True)):
                    with suppress(psutil.Error):
                        times = one.cpu_times()
                        total += times.user + times.system
                used[(child.name, pid)] = total
        return used

    async def until_quiet(self, share: float, timeout: float, interval: float = 0.5) -> float:
        """Wait until the children together use under ``share`` of one core over ``interval`` seconds
        (their start-up is over), at most ``timeout`` seconds; the seconds waited."""
        started = trio.current_time()
        before = self.cpu_seconds()
        while trio.current_time() - started < timeout:
            await trio.sleep(interval)
            after = self.cpu_seconds()
            # A child that started or restarted meanwhile counts from its first sample.
            used = sum(seconds - before.get(key, 0.0) for key, seconds in after.items())
            if used < share * interval:
                break
            before = after
        return trio.current_time() - started

    async def stop_all(self) -> None:
        """SIGTERM every child's process group, SIGKILL what is left after the grace period, then sweep."""
        for child in self.children:
            child.stopping = True
        descendants: list[psutil.Process] = []
        for pid in self.pids():
            with suppress(psutil.Error):
                descendants.append(psutil.Process(pid))
        live = [child for child in self.children if child.pid is not None]
        for child in live:
            self.kill(child, signal.SIGTERM)
        with trio.move_on_after(STOP_GRACE_SECONDS):
            for child in live:
                assert child.process is not None
                await child.process.wait()
        for child in live:
            self.kill(child, signal.SIGKILL)
            assert child.process is not None
            await child.process.wait()
        # Anything that left its group (or outlived its leader) is still on the list.
        for process in descendants:
            with suppress(psutil.Error):
                process.kill()
        with trio.move_on_after(STOP_GRACE_SECONDS):
            while any(map(still_running, descendants)):
                await trio.sleep(0.01)


def still_running(process: psutil.Process) -> bool:
    """Whether ``process`` still runs. A zombie has exited: an orphan stays one until whatever adopted it reaps
    it (PID 1 here took 1.5 s, which ``psutil.wait_procs`` waited out at every demo's end), holding only its pid."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_group(pid: int, signum: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


@asynccontextmanager
async def open_children(logs: Path, *, restart_delay: float = RESTART_DELAY, max_restarts: int = 20,
                        on_restart: Callable[[Child, int], None] | None = None) -> AsyncIterator[Children]:
    """Children that are all stopped when the block ends, however it ends."""
    logs.mkdir(parents=True, exist_ok=True)
    # Only this process holds the write end (os.pipe's ends are not inherited), so the reaper reads
    # end-of-file when it ends or closes it.
    reaper_stdin, tell_reaper = os.pipe()
    try:
        with (logs / "reaper.log").open("ab") as log:
            # In its own session: a Ctrl-C at the terminal stops the demo, which then stops its children.
            reaper = await trio.lowlevel.open_process([sys.executable, "-m", "anonml.demo._reaper", str(STOP_GRACE_SECONDS)],
                                                      stdin=reaper_stdin, stdout=log, stderr=log, start_new_session=True)
    except BaseException:
        os.close(tell_reaper)
        raise
    finally:
        os.close(reaper_stdin)
    try:
        async with trio.open_nursery() as nursery:
            children = Children(nursery, logs, tell_reaper, restart_delay=restart_delay, max_restarts=max_restarts,
                                on_restart=on_restart)
            try:
                yield children
            finally:
                with trio.CancelScope(shield=True):
                    await children.stop_all()
                nursery.cancel_scope.cancel()
    finally:
        os.close(tell_reaper)
        with trio.CancelScope(shield=True):
            await reaper.wait()


def resident_mb(pids: Sequence[int]) -> float:
    """Resident memory of these processes together now (0 for any that is gone)."""
    total = 0
    for pid in pids:
        with suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20


async def until_signalled(function: Callable[..., Awaitable[T]], *args: object) -> T | int:
    """``await function(*args)``, or the number of the signal (SIGINT, SIGTERM or SIGHUP) that cancelled it first.

    Each cancels ``function``; the children it opened with :func:`open_children`
    are stopped on the way out. SIGHUP is the terminal closing: without it the
    demo died at once and left its children to the reaper, unsummarised.
    """
    outcome: list[T | int] = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    outcome.append(int(signum))
                    nursery.cancel_scope.cancel()
                    return

            async def run() -> None:
                outcome.append(await function(*args))
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            nursery.start_soon(run)
    return outcome[0]
