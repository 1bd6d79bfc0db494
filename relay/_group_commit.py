"""Link batches that finished their checks at the same moment share one commit (one fsync).

A relay acknowledges a batch only after its packets are durable, and each
commit's fsync holds the event loop (~5-30 ms on the shared test disk). Under
issue 25's junk flood every flooding connection's batch paid its own fsync
and a peer's one-packet batch waited for theirs and then its own. Batches
that join while a commit is being prepared go into it: the first to join
lets the other ready tasks run once (a checkpoint), then commits them all in
one transaction; a failure answers every one of them as the caller decides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Group(Generic[Item, Result]):
    items: list[Item] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    error: Exception | None = None
    done: trio.Event = field(default_factory=trio.Event)


class GroupCommit(Generic[Item, Result]):
    """``commit(items)`` (synchronous: one transaction, a result per item) for whatever joined meanwhile."""

    def __init__(self, commit: Callable[[Sequence[Item]], list[Result]]) -> None:
        self._commit = commit
        self._open: _Group[Item, Result] | None = None

    async def join(self, item: Item) -> Result:
        """``item``'s result once its group committed; the commit's exception if it failed."""
        group = self._open
        leader = group is None
        if group is None:
            group = self._open = _Group()
        index = len(group.items)
        group.items.append(item)
        # Shielded: the leader waits one checkpoint and commits synchronously, and a batch cancelled
        # while its packets are being committed must still learn whether they were.
        with trio.CancelScope(shield=True):
            if leader:
                await trio.lowlevel.checkpoint()  # the other ready batches join
                self._open = None
                try:
                    group.results = self._commit(group.items)
                except Exception as exc:  # handed to every member, each answers its sender
                    group.error = exc
                group.done.set()
            else:
                await group.done.wait()
        if group.error is not None:
            raise group.error
        return group.results[index]
