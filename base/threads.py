"""Blocking work off the event loop, and the one switch that keeps it on the loop for the simulator.

Services run SQLite commits, token verification and learning in worker
threads (``trio.to_thread.run_sync``) so the event loop keeps serving while
they run. Under trio's ``MockClock`` with autojump, virtual time jumps to the
next deadline whenever every task is blocked, and a task waiting on a thread
is blocked: a 50 ms commit in a thread moved virtual time by 1,000 s when
measured, far past any window's end, and by an amount that depends on the
machine. Inside :func:`blocking_work_inline` (the round simulator) the same
calls run on the event loop instead, so virtual time advances only when the
protocol waits. One code path; the thread only where real time runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar, TypeVarTuple, Unpack

import trio

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# Tasks inherit the context of the task that spawned them, so setting this at
# the top of a trio run covers every task of that run and no other run.
_INLINE: ContextVar[bool] = ContextVar("anonml_blocking_work_inline", default=False)


async def run_blocking(function: Callable[[Unpack[Ts]], T], *args: Unpack[Ts]) -> T:
    """``function(*args)`` in a worker thread (on the event loop inside :func:`blocking_work_inline`)."""
    if _INLINE.get():
        await trio.lowlevel.checkpoint()
        return function(*args)
    return await trio.to_thread.run_sync(function, *args)


async def run_timed_work(seconds: float, function: Callable[[Unpack[Ts]], T], *args: Unpack[Ts]) -> T:
    """``function(*args)`` in a worker thread, for work whose wall time the protocol depends on: ``seconds`` is
    what it takes on the machine the protocol is sized for. Inside :func:`blocking_work_inline` it runs on the
    event loop and then sleeps ``seconds`` on the (virtual) clock, so the simulator's round sees the work take
    that time, the same in every run; inline alone it would take none, and in a thread under autojump the
    clock would jump to whatever deadline came next."""
    if not (isinstance(seconds, (int, float)) and 0 <= seconds < float("inf")):
        raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
    if _INLINE.get():
        result = function(*args)
        await trio.sleep(seconds)
        return result
    return await trio.to_thread.run_sync(function, *args)


@contextmanager
def blocking_work_inline() -> Iterator[None]:
    """Run every :func:`run_blocking` call of the tasks started inside this block on the event loop."""
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)
