"""The installed distribution's shape: one import name, one exception root."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import pkgutil

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
