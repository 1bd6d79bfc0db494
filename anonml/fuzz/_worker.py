"""One fuzz target under atheris (libFuzzer), in its own process.

``python -m anonml.fuzz._worker TARGET RUNS RESULT WORK SEED COVERAGE`` runs exactly
RUNS inputs through TARGET, starting from its valid inputs, and keeps RESULT
(JSON) up to date: inputs run, parsed, refused by type and reason, and every
untyped error with an example input. libFuzzer ends the process with C's
``exit`` (no Python ``atexit``), so the result is written every few thousand
inputs and once more at the last one, after which the worker exits itself.
With COVERAGE ``1`` every anonml module is instrumented and coverage guides
libFuzzer's mutations; with ``0`` libFuzzer mutates the valid inputs (and what
it derives from them) blind, about twenty times faster per input here.
A crash (a signal, a hang past libFuzzer's per-input timeout, memory past
its limit) ends the process with RESULT short of RUNS: the parent counts it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import atheris

if sys.argv[6:7] == ["1"]:
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


def main(argv: list[str]) -> None:
    name, runs_text, result_text, work_text, seed_text = argv[1:6]
    runs, result_path, work = int(runs_text), Path(result_text), Path(work_text)
    target = build_targets(work / "world")[name]
    corpus = work / f"corpus-{name}"
    corpus.mkdir(parents=True, exist_ok=True)
    for index, seed in enumerate(target.seeds):
        (corpus / f"seed-{index}").write_bytes(seed)
    started = time.monotonic()
    state: dict[str, Any] = {"target": name, "coverage_guided": argv[6] == "1", "inputs": 0, "parsed": 0,
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


if __name__ == "__main__":
    main(sys.argv)
