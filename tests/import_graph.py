"""The import graph between the installed packages, drawn from the files (issue 29).

Every ``.py`` file of every folder ``pyproject.toml`` maps to a package is
parsed with :mod:`ast`; each ``import anonml.x…`` or ``from anonml.x… import``
(at module level, inside a function or under ``if TYPE_CHECKING:``) is an
arrow from the file's package to ``anonml.x``. The packages mapped to folders
of their own (``base/``, ``relay/``, …) are one node each; everything in the
``anonml/`` folder (the command, the demo, the benchmarks, …) is the top
floor's one node. The README's "Layout" section carries :func:`mermaid` of
this tree and ``tests/test_package.py`` checks it is the same; to redraw it
run ``python tests/import_graph.py``.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_FLOOR = "anonml"


def package_folders(root: Path = ROOT) -> dict[str, Path]:
    """Each graph node (``anonml.relay``, …, and ``anonml`` for the top floor) and the folder it is read from."""
    folders = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {package: root / folder for package, folder in folders.items()}


def _node_of(module: str, nodes: set[str]) -> str | None:
    """``anonml.relay`` for ``anonml.relay._server``; the top floor for ``anonml.demo._run`` and for ``anonml``
    itself; ``None`` outside the project."""
    parts = module.split(".")
    if parts[0] != TOP_FLOOR:
        return None
    package = ".".join(parts[:2])
    return package if package in nodes else TOP_FLOOR


def _imported_modules(tree: ast.AST) -> list[str]:
    """The absolute module names ``tree`` imports (``from anonml import relay`` names ``anonml.relay``).
    Relative imports stay inside their own package and draw no arrow."""
    modules = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == TOP_FLOOR:
                modules += [f"{TOP_FLOOR}.{alias.name}" for alias in node.names]
            else:
                modules.append(node.module)
    return modules


def import_arrows(root: Path = ROOT) -> set[tuple[str, str]]:
    """``(importer, imported)`` for every pair of distinct nodes where a file of the first imports the second."""
    folders = package_folders(root)
    nodes = set(folders)
    arrows = set()
    for package, folder in folders.items():
        for path in folder.rglob("*.py"):
            for module in _imported_modules(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                target = _node_of(module, nodes)
                if target is not None and target != package:
                    arrows.add((package, target))
    return arrows


def _height(node: str, arrows: set[tuple[str, str]], seen: tuple[str, ...] = ()) -> int:
    """The longest chain of arrows from ``node`` down to a package that imports none (a cycle stops the count)."""
    below = [target for source, target in arrows if source == node and target not in seen]
    return 1 + max((_height(target, arrows, seen + (node,)) for target in below), default=-1)


def mermaid(root: Path = ROOT) -> str:
    """A Mermaid ``graph TD`` block of :func:`import_arrows`: one line per node, from the highest (the longest
    chain of imports below it) down, then one line per importer naming what it imports in the same order."""
    arrows = import_arrows(root)
    folders = package_folders(root)
    top_floor = sorted(path.stem for path in folders[TOP_FLOOR].iterdir() if not path.name.startswith(("_", "."))
                       and (path.suffix == ".py" or (path / "__init__.py").exists()))
    order = sorted(folders, key=lambda node: (-_height(node, arrows), node))

    def name(node: str) -> str:
        return node.removeprefix(f"{TOP_FLOOR}.")

    lines = ["graph TD", f'    {TOP_FLOOR}["{TOP_FLOOR}: {", ".join(top_floor)}"]']
    lines += [f'    {name(node)}["{node}"]' for node in order if node != TOP_FLOOR]
    for source in order:
        imported = [name(target) for target in order if (source, target) in arrows]
        if imported:
            lines.append(f"    {name(source)} --> {' & '.join(imported)}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(f"```mermaid\n{mermaid()}\n```")
