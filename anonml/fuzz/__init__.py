"""``anonml fuzz``: every parser that reads someone else's bytes, under a coverage-guided fuzzer.

Each target (:mod:`anonml.fuzz._targets`) runs in its own process under
atheris (:mod:`anonml.fuzz._worker`), one after the other; every input must
parse or be refused with an :class:`anonml.base.errors.AnonMLError`. The command
prints, per target, inputs run, parsed, refused, untyped errors and crashes,
and exits 1 if there is any untyped error or crash.
"""

from __future__ import annotations

from anonml.fuzz._command import TARGET_NAMES, fuzz

__all__ = ["TARGET_NAMES", "fuzz"]
