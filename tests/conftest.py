"""Shared test fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

REPO_ROOT = Path(__file__).resolve().parent.parent
ADULT_DIR = REPO_ROOT.parent / "shared" / "data" / "adult"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first: pytest-xdist hands tests out in this order, so the
    long rounds run beside the quick tests instead of after them."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def adult_dir() -> Path:
    """The UCI Adult files beside the checkout (never copied into the repo)."""
    if not (ADULT_DIR / "adult.data").exists():
        pytest.fail(f"UCI Adult data not found at {ADULT_DIR}; tests expect ../shared beside the repo")
    return ADULT_DIR


@pytest.fixture
def relay_processes() -> Iterator[list[trio.Process]]:
    """Relay processes a test starts; every one still running is killed when the test ends."""
    processes: list[trio.Process] = []
    yield processes
    for process in processes:
        if process.returncode is None:
            process.kill()
