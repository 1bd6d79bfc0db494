"""Package faces that import their modules when a name is first used.

A package's ``__init__`` lists what it offers as ordinary ``from … import``
lines inside ``if TYPE_CHECKING:``: that block is what mypy and the layer
contract read, and the one list of where each name comes from. At run time
:func:`lazy_exports` reads the same block and imports a name's module only
when the name is asked for, so ``anonml relay run --help`` loads click and
the command's own module, not trio, numpy or petlib (issue 29: every
``--help`` within 5 × ``python -c pass``).
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def export_origins(init_file: str) -> dict[str, tuple[str, str]]:
    """Each name the ``if TYPE_CHECKING:`` block of ``init_file`` imports: its module and its name there."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"), filename=init_file)
    origins: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom) and statement.module and statement.level == 0:
                for alias in statement.names:
                    origins[alias.asname or alias.name] = (statement.module, alias.name)
    return origins


def lazy_exports(package: str, init_file: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose names load on first use.

    Use as ``__getattr__, __dir__ = lazy_exports(__name__, __file__)`` under
    the ``else:`` of the package's ``if TYPE_CHECKING:`` block.
    """
    origins = export_origins(init_file)

    def __getattr__(name: str) -> object:
        try:
            module_name, attribute = origins[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module_name), attribute)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(origins))

    return __getattr__, __dir__
