"""The installed distribution's shape: one import name, one exception root."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import pkgutil
from pathlib import Path

import anonml
from anonml.errors import AnonMLError


def test_the_distribution_installs_only_the_anonml_import_name() -> None:
    owners = importlib.metadata.packages_distributions()
    ours = sorted(name for name, distributions in owners.items() if "anonml" in distributions)
    assert ours == ["anonml"]


def _modules() -> list[str]:
    # ``__main__`` modules run their command when imported.
    return [info.name for info in pkgutil.walk_packages(anonml.__path__, "anonml.") if not info.name.endswith(".__main__")]


def test_every_package_is_reached_through_anonml() -> None:
    names = set(_modules())
    for package in ("crypto", "mechanisms", "protocol", "learning", "relay", "peer", "aggregator"):
        assert f"anonml.{package}" in names


def test_every_exception_the_project_defines_derives_from_the_root() -> None:
    strays = []
    for name in _modules():
        module = importlib.import_module(name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ == name and issubclass(value, BaseException) and not issubclass(value, AnonMLError):
                strays.append(f"{name}.{value.__name__}")
    # The demo's own error is click's, so click prints it as a one-line usage error.
    assert strays == ["anonml.demo._children.ChildFailed"]


ROLE_PACKAGES = ("relay", "peer", "aggregator", "crypto", "mechanisms", "protocol", "learning")
# The primitives' benchmark times group and X25519 operations that are not part of crypto's face.
PRIVATE_IMPORTS_KEPT_ON_PURPOSE = {
    ("anonml/bench/crypto.py", "anonml.crypto._group"),
    ("anonml/bench/crypto.py", "anonml.crypto._primitives"),
}


def _private_imports(path: Path, own_package: str | None) -> list[str]:
    """``from anonml.<role>._module import ...`` lines in ``path`` that reach into another role's privates."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if len(parts) >= 3 and parts[0] == "anonml" and parts[1] in ROLE_PACKAGES and parts[2].startswith("_") and parts[1] != own_package:
                found.append(node.module)
    return found


def test_no_module_reaches_into_another_packages_private_modules() -> None:
    """Issue 10: outside its package, a package is used through its ``__init__`` (its ``__all__``)."""

    root = Path(anonml.__file__).resolve().parent.parent
    reached = []
    for package in ROLE_PACKAGES:
        for path in sorted((root / package).glob("**/*.py")):
            reached += [f"{path.relative_to(root)} imports {module}" for module in _private_imports(path, package)]
    # anonml's own modules (cli, demo, bench, testing); anonml/<role> are links to the folders above.
    for path in sorted(root.glob("anonml/**/*.py")):
        relative = path.relative_to(root)
        if path.resolve() == path:
            reached += [f"{relative} imports {module}" for module in _private_imports(path, None)
                        if (str(relative), module) not in PRIVATE_IMPORTS_KEPT_ON_PURPOSE]
    assert reached == []
