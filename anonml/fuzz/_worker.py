"""The fuzz targets under atheris (libFuzzer), each in its own process forked from one that imported them.

``python -m anonml.fuzz._worker WORK RUNS SEED COVERAGE HANG_SECONDS TARGET...``
imports the parsers once, then runs each TARGET in a child forked from this
process (libFuzzer runs once per process, and ends it): exactly RUNS inputs
through TARGET, starting from its valid inputs, keeping ``WORK/TARGET/TARGET.json``
up to date: inputs run, parsed, refused by type and reason, and every
untyped error with an example input. libFuzzer ends the child with C's
``exit`` (no Python ``atexit``), so the result is written every few thousand
inputs and once more at the last one, after which the child exits itself.
With COVERAGE ``1`` every anonml module is instrumented (once, here) and
coverage guides libFuzzer's mutations; with ``0`` libFuzzer mutates the
valid inputs (and what it derives from them) blind, about twenty times
faster per input here. A crash (a signal, a hang past libFuzzer's per-input
timeout or past HANG_SECONDS, memory past its limit) ends the child with
its result short of RUNS: the parent counts it. After each child this
process prints one JSON line, ``{"target": ..., "exit_status": ...}``.

One import for every target: a fresh interpreter per target spent 1.7 s
importing the stack (4 s instrumented) before its first input, most of a
short run's time.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from contextlib import suppress
from pathlib import Path
from typing import Any

import atheris

if sys.argv[4:5] == ["1"]:
    # Imported under instrumentation: coverage of every anonml module guides the fuzzer.
    with atheris.instrument_imports(include=["anonml"]):
        from anonml.base.errors import AnonMLError
        from anonml.fuzz._targets import build_targets
else:
    from anonml.base.errors import AnonMLError
    from anonml.fuzz._targets import build_targets

_WRITE_EVERY = 5000
_EXAMPLES = 3  # inputs kept per untyped error


def _refusal(exc: AnonMLError) -> str:
    """The refusal's counter name: its type, and its reason or field where it names one."""
    detail = getattr(exc, "reason", None) or getattr(exc, "field", None)
    return f"{type(exc).__name__}/{detail}" if isinstance(detail, str) and len(detail) <= 40 else type(exc).__name__


def fuzz_target(name: str, runs: int, work: Path, seed_text: str, coverage: bool) -> None:
    """Run ``runs`` inputs through target ``name``, in this process (atheris ends it)."""
    result_path = work / f"{name}.json"
    target = build_targets(work / "world")[name]
    corpus = work / f"corpus-{name}"
    corpus.mkdir(parents=True, exist_ok=True)
    for index, seed in enumerate(target.seeds):
        (corpus / f"seed-{index}").write_bytes(seed)
    started = time.monotonic()
    state: dict[str, Any] = {"target": name, "coverage_guided": coverage, "inputs": 0, "parsed": 0,
                             "refused": Counter(), "untyped": {}}

    def write() -> None:
        state["seconds"] = round(time.monotonic() - started, 1)
        partial = result_path.with_suffix(".part")
        partial.write_text(json.dumps(state, sort_keys=True))
        partial.replace(result_path)

    def one_input(data: bytes) -> None:
        state["inputs"] += 1
        try:
            target.run(data)
        except AnonMLError as exc:
            state["refused"][_refusal(exc)] += 1
        except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for: counted, kept, reported
            key = f"{type(exc).__name__}: {str(exc)[:120]}"
            entry = state["untyped"].setdefault(key, {"count": 0, "examples": []})
            entry["count"] += 1
            if len(entry["examples"]) < _EXAMPLES:
                entry["examples"].append(data[:4096].hex())
        else:
            state["parsed"] += 1
        if state["inputs"] % _WRITE_EVERY == 0:
            write()
        if state["inputs"] >= runs:
            write()
            sys.stdout.flush()
            os._exit(0)

    longest = max(len(seed) for seed in target.seeds)
    atheris.Setup(
        [sys.argv[0], f"-runs={runs + 1000}", f"-seed={seed_text}", f"-max_len={max(4096, 2 * longest)}",
         "-timeout=60", "-rss_limit_mb=3072", "-print_final_stats=0", "-keep_seed=1", str(corpus)],
        one_input,
    )
    atheris.Fuzz()


def run_in_child(name: str, runs: int, work: Path, seed_text: str, coverage: bool, hang_seconds: float) -> int:
    """Fuzz target ``name`` in a forked child, its output in ``WORK/NAME.log``; the child's exit status
    (negative: the signal that ended it; SIGKILL after ``hang_seconds``)."""
    work.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            with (work / f"{name}.log").open("wb") as log:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
            fuzz_target(name, runs, work, seed_text, coverage)
        except BaseException:  # noqa: BLE001 - the child must never return into the parent's loop
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(70)
    _RUNNING[:] = [pid]
    try:
        deadline = time.monotonic() + hang_seconds
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            time.sleep(0.05)
    finally:
        _RUNNING.clear()  # reaped: its pid may be reused, and must not be killed at the command's end


_RUNNING: list[int] = []
"""The child fuzzing now, if any (ended with this process: :func:`_end_with_the_command`)."""


def _end_with_the_command() -> None:
    """``anonml fuzz`` holds this process's stdin open and never writes to it: end-of-file means the
    command is gone, however it ended (a SIGKILLed command left this process and its child fuzzing on,
    a core busy for up to ``--hang-seconds``)."""
    sys.stdin.buffer.read()
    for pid in _RUNNING:
        with suppress(ProcessLookupError):  # it has just ended
            os.kill(pid, signal.SIGKILL)
    os._exit(1)


def main(argv: list[str]) -> None:
    work_text, runs_text, seed_text, coverage_text, hang_text, *names = argv[1:]
    threading.Thread(target=_end_with_the_command, name="end-with-the-command", daemon=True).start()
    for name in names:
        status = run_in_child(name, int(runs_text), Path(work_text) / name, seed_text, coverage_text == "1", float(hang_text))
        print(json.dumps({"target": name, "exit_status": status}), flush=True)


if __name__ == "__main__":
    main(sys.argv)
