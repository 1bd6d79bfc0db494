"""A bounded memory of pure results, for work a process repeats on identical input.

One process may run many peers (the demo, the round simulator): each checks
the same signed documents, byte for byte, that every other one checks. When
the check is a pure function of those bytes, a repeat may answer from here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class PureCache(Generic[K, V]):
    """Results of a pure function by their whole input, least recently used first out.

    At most ``max_entries`` entries, whose weights (the caller's measure,
    e.g. the bytes of the input) add up to at most ``max_weight``; an entry
    heavier than that is not kept. Thread-safe (the aggregator checks
    signatures in worker threads too).
    """

    def __init__(self, max_entries: int, max_weight: int | None = None) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries={max_entries!r}: keep at least one entry")
        self._max_entries = max_entries
        self._max_weight = max_weight
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The kept result for ``key``, or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V, weight: int = 0) -> None:
        """Keep ``value`` as the result for ``key``, dropping the least recently used beyond the bounds."""
        if self._max_weight is not None and weight > self._max_weight:
            return
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._weight -= previous[1]
            self._entries[key] = (value, weight)
            self._weight += weight
            while len(self._entries) > self._max_entries or (self._max_weight is not None and self._weight > self._max_weight):
                _, (_, dropped) = self._entries.popitem(last=False)
                self._weight -= dropped
