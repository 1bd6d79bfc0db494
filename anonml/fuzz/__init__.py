"""``anonml fuzz``: every parser that reads someone else's bytes, under a coverage-guided fuzzer.

Each target (:mod:`anonml.fuzz._targets`) runs in its own process under
atheris (:mod:`anonml.fuzz._worker`), one after the other; every input must
parse or be refused with an :class:`anonml.base.errors.AnonMLError`. The command
prints, per target, inputs run, parsed, refused, untyped errors and crashes,
and exits 1 if there is any untyped error or crash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    from anonml.fuzz._command import TARGET_NAMES, fuzz
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = ["TARGET_NAMES", "fuzz"]
