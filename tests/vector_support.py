"""Shared by the known-answer tests: where the pinned vectors live and how to
load the script that generated them (STYLE.md 11: vectors beside their
generator; the tests regenerate them with the generator's own code)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

VECTORS_DIR = Path(__file__).resolve().parent / "vectors"


def load_generator(name: str) -> ModuleType:
    """Import ``tests/vectors/{name}.py`` (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location(name, VECTORS_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_vectors(file_name: str) -> Any:
    """The parsed JSON of a pinned vector file."""
    return json.loads((VECTORS_DIR / file_name).read_text())
