"""The installed distribution's shape: one import name, one exception root."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import pkgutil
import re
import subprocess
import tomllib
from pathlib import Path

import anonml
from anonml.base.errors import AnonMLError
from import_graph import import_arrows, mermaid, package_folders


def test_the_distribution_installs_only_the_anonml_import_name() -> None:
    owners = importlib.metadata.packages_distributions()
    ours = sorted(name for name, distributions in owners.items() if "anonml" in distributions)
    assert ours == ["anonml"]


ROOT = Path(anonml.__file__).resolve().parent.parent
# The package names the distribution installs, each mapped to a real folder (pyproject.toml).
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
FOLDERS: dict[str, str] = SETUPTOOLS["package-dir"]


def _modules() -> list[str]:
    """Every module of every installed package (``__main__`` modules run their command when imported)."""
    names = set()
    for package in SETUPTOOLS["packages"]:
        module = importlib.import_module(package)
        names.add(package)
        names |= {info.name for info in pkgutil.walk_packages(module.__path__, package + ".")}
    return sorted(name for name in names if not name.endswith(".__main__"))


def test_every_package_is_a_real_folder_reached_through_anonml() -> None:
    names = set(_modules())
    for package in ("base", "crypto", "mechanisms", "protocol", "transport", "learning", "relay", "peer", "aggregator"):
        assert f"anonml.{package}" in names
        folder = ROOT / FOLDERS[f"anonml.{package}"]
        assert Path(importlib.import_module(f"anonml.{package}").__file__ or "").resolve().parent == folder


def test_the_tree_has_no_symbolic_links() -> None:
    """Tools that read files (import graphs, coverage, packagers) see every package where it is."""
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert [line.split("\t")[1] for line in tracked.splitlines() if line.startswith("120000")] == []


def test_the_layer_contract_names_every_package() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    named = {name.strip() for contract in contracts for layer in contract["layers"] for name in layer.replace(":", "|").split("|")}
    top_level = {name for name in SETUPTOOLS["packages"] if name != "anonml"} | {"anonml.cli"}
    assert top_level - named == set()


def test_every_exception_the_project_defines_derives_from_the_root() -> None:
    strays = []
    for name in _modules():
        module = importlib.import_module(name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ == name and issubclass(value, BaseException) and not issubclass(value, AnonMLError):
                strays.append(f"{name}.{value.__name__}")
    # The demo's own error is click's, so click prints it as a one-line usage error.
    assert strays == ["anonml.demo._children.ChildFailed"]


# The primitives' benchmark times group and X25519 operations that are not part of crypto's face.
PRIVATE_IMPORTS_KEPT_ON_PURPOSE = {
    ("anonml/bench/crypto.py", "anonml.crypto._group"),
    ("anonml/bench/crypto.py", "anonml.crypto._primitives"),
}


def _package_of(module: str) -> str:
    """``anonml.relay`` for ``anonml.relay._server``; ``anonml.demo`` for ``anonml.demo._run``."""
    return ".".join(module.split(".")[:2])


def _private_imports(path: Path, own_package: str) -> list[str]:
    """``from anonml.<package>._module import ...`` lines in ``path`` that reach into another package's privates."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            private = any(part.startswith("_") for part in parts[2:])
            if parts[0] == "anonml" and private and _package_of(node.module) != own_package:
                found.append(node.module)
    return found


def test_no_module_reaches_into_another_packages_private_modules() -> None:
    """Outside its package, a package is used through its ``__init__`` (its ``__all__``): the roles,
    the ground floor, and the top floor's command, demo, benchmarks and fuzzers alike."""
    reached = []
    for name in _modules():
        path = Path(importlib.import_module(name).__file__ or "")
        relative = str(path.relative_to(ROOT))
        reached += [f"{relative} imports {module}" for module in _private_imports(path, _package_of(name))
                    if (relative, module) not in PRIVATE_IMPORTS_KEPT_ON_PURPOSE]
    assert reached == []


MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100
MAX_POSITIONAL_ARGUMENTS = 8


def _limit_breaches() -> set[tuple[str, str, str]]:
    """``(file, what, detail)`` for every file over 800 lines, function over 100 lines and call passing more than
    8 positional arguments (a ``*list`` of cells or argv words counts as one) in the source tree."""
    breaches = set()
    for folder in sorted(set(FOLDERS.values())):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name, text = str(path.relative_to(ROOT)), path.read_text()
            if text.count("\n") > MAX_FILE_LINES:
                breaches.add((name, "file", f"{text.count(chr(10))} lines"))
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        breaches.add((name, f"function {node.name}", f"{length} lines"))
                elif isinstance(node, ast.Call):
                    positional = [argument for argument in node.args if not isinstance(argument, ast.Starred)]
                    if len(positional) > MAX_POSITIONAL_ARGUMENTS:
                        breaches.add((name, f"call {ast.unparse(node.func)}", f"line {node.lineno}: {len(positional)} positional"))
    return breaches


def test_no_file_function_or_positional_call_is_over_its_limit() -> None:
    """Issue 29: no file over 800 lines, no function over 100, no call with more than 8 positional arguments."""
    assert sorted(_limit_breaches()) == []


def _readme_layout() -> str:
    """The README's "Layout" section."""
    readme = (ROOT / "README.md").read_text()
    return readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]


def test_the_readmes_import_graph_is_the_one_the_files_draw() -> None:
    """Issue 29: the graph in the README is redrawn from every file's imports, so a new arrow fails here
    until the README shows it."""
    block = re.search(r"```mermaid\n(.*?)\n```", _readme_layout(), re.DOTALL)
    assert block is not None, "the README's Layout section has no mermaid block"
    assert block.group(1) == mermaid(ROOT), "the README's import graph is stale: python tests/import_graph.py"


def test_the_readmes_layout_table_lists_each_package_above_what_imports_it() -> None:
    """The table's rows go from the ground up: a package imports only packages on rows above it."""
    rows = re.findall(r"^\| `[^`]+/` \| `([^`]+)` \|", _readme_layout(), re.MULTILINE)
    assert sorted(rows) == sorted(package_folders(ROOT))
    row = {package: number for number, package in enumerate(rows)}
    assert sorted((source, target) for source, target in import_arrows(ROOT) if row[target] > row[source]) == []
