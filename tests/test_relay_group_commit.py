"""Link batches ready at the same moment share one commit (relay/_group_commit.py; issue 25): under a
flood each flooding connection's batch paid its own fsync on the event loop, and a peer's batch waited
for theirs before paying its own."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import trio
import trio.testing

from anonml.base.errors import StorageError
from anonml.crypto import ReleaseWindow
from anonml.relay import WallClock
from anonml.transport import AckStatus
from test_relay_windows import T0, Harness


async def _offer_at_once(harness: Harness, count: int) -> list[list[AckStatus]]:
    """One in-window packet from each of ``count`` networks, their batches ready together."""
    window = ReleaseWindow(T0 + 10, T0 + 20)
    results: list[list[AckStatus]] = [[] for _ in range(count)]

    async def offer(index: int) -> None:
        results[index] = await harness.relay.on_packets([harness.packet(index, window)], f"127.{index + 1}.0.1")

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(offer, index)
    return results


async def test_batches_ready_together_are_committed_in_one_transaction(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = Harness(tmp_path, WallClock.starting_at(T0))
    commits: list[int] = []
    original = harness.store.transaction

    def counted() -> AbstractContextManager[None]:
        commits.append(1)
        return original()

    monkeypatch.setattr(harness.store, "transaction", counted)
    assert await _offer_at_once(harness, 8) == [[AckStatus.ACCEPTED]] * 8
    # Their slices take fair turns, so they finish a few at a time: 5 transactions measured (8 before,
    # one per batch).
    assert len(commits) < 8
    assert harness.relay.holdings.held == 8 and harness.relay.counters.accepted == 8
    assert sorted(harness.store.neighbours().values()) == [8]


async def test_a_failing_group_commit_answers_every_batch_in_it_busy_and_holds_nothing(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = Harness(tmp_path, WallClock.starting_at(T0))

    def failing() -> AbstractContextManager[None]:
        raise StorageError("disk full")

    monkeypatch.setattr(harness.store, "transaction", failing)
    assert await _offer_at_once(harness, 4) == [[AckStatus.BUSY]] * 4
    counters = harness.relay.counters
    assert harness.relay.holdings.held == 0 and counters.store_failing and counters.dropped["store-error"] == 4
    # Shares were given back: each network may still hold its full share.
    assert all(harness.relay.shares.refusal(f"127.{index + 1}.0.1") is None for index in range(4))
