"""Processes: how a service settles once started, and how to start the ``anonml`` command as a child."""

from __future__ import annotations

import gc
import multiprocessing.connection
import os
import sys
import threading


def freeze_startup_heap() -> None:
    """Hide every object allocated so far from the cyclic garbage collector, for good.

    A service's start-up heap (numpy, scikit-learn, the round's state) lives as
    long as the process, yet each collection of the oldest generation walked
    all of it: pauses of 44–63 ms in the aggregator's process during
    `anonml bench abuse`, with the packet sink and the HTTP API silent
    throughout (the outliers of every probe's p99). Once frozen, a collection
    walks only what was allocated since.

    It also makes the youngest generation's collections rarer (every
    ``_YOUNG_COLLECTION_THRESHOLD`` net new objects, was 700). A service's
    objects are nearly all freed by reference counting (its connections'
    cycles are broken as they end: ``transport._http``), so frequent
    collections found little and each walked every live connection: under
    issue 25's http-slow-bodies churn (460 connections a second, before
    refused connections were held: ``ConnectionGate.turn_away``) the
    aggregator spent 12% of its loop in them, with pauses of 20 ms (the
    middle generation) and 100 ms (the oldest) every 2 s; with this
    threshold no collection ran in the 8 s of the abuse, and the probes'
    p99 through that process fell from 20x to 6-13x the unloaded one.
    (With the churn held, a collection of either threshold still pauses
    the loop 30-140 ms now and then, and no difference shows.)

    Call it once per service process, after start-up (``aggregator run``,
    ``relay run``), never in a process that keeps running other work: cycles
    among frozen objects are never collected.
    """
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(_YOUNG_COLLECTION_THRESHOLD, middle, oldest)


# Tracked objects allocated (net of those freed) between collections of the youngest generation: a
# collection then walks at most this many (23-88 ms measured in the aggregator under bench abuse on the
# 2-core machine), and their garbage waits at most as long.
_YOUNG_COLLECTION_THRESHOLD = 50_000


def anonml_command(*args: str) -> list[str]:
    """The argv that runs this same ``anonml`` (this interpreter, this install) as a child process.

    It names the command's module as text, not as an import, so the packages
    below the command (the demo, the benchmarks) start it without importing it.
    """
    return [sys.executable, "-c", "import sys; from anonml.cli import main; sys.exit(main())", *args]


def exit_with_parent() -> None:
    """In a ``multiprocessing`` child (a pool's ``initializer``): end this process when its parent ends,
    however it ends.

    A parent killed with SIGKILL shuts no pool down, and a pool worker's task
    queue never reads end-of-file (every worker holds its write end): the
    worker waited on it for ever (an ``aggregator run``'s verification
    worker, holding the issuer key). The parent's sentinel
    (``multiprocessing.parent_process``) is the read end of a pipe only the
    parent writes to: it becomes readable when the parent is gone."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    threading.Thread(target=_exit_once_readable, args=(parent.sentinel,), name="exit-with-parent", daemon=True).start()


def _exit_once_readable(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)
