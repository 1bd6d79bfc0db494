"""The bounded memory of pure results (``base.memo.PureCache``): what it keeps, and what it drops first."""

from __future__ import annotations

import pytest

from anonml.base.memo import PureCache


def test_the_least_recently_used_entry_goes_first_when_the_count_is_reached() -> None:
    cache: PureCache[str, int] = PureCache(max_entries=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    assert len(cache) == 2


def test_weights_bound_the_total_and_an_entry_heavier_than_the_bound_is_not_kept() -> None:
    cache: PureCache[bytes, str] = PureCache(max_entries=100, max_weight=10)
    cache.put(b"x" * 6, "six", 6)
    cache.put(b"y" * 4, "four", 4)
    cache.put(b"z" * 11, "eleven", 11)
    assert cache.get(b"z" * 11) is None
    assert len(cache) == 2
    cache.put(b"w" * 5, "five", 5)  # 6 + 4 + 5 > 10: the oldest goes
    assert (cache.get(b"x" * 6), cache.get(b"y" * 4), cache.get(b"w" * 5)) == (None, "four", "five")
    cache.put(b"y" * 4, "four again", 4)  # replacing an entry does not count its weight twice
    assert (cache.get(b"y" * 4), cache.get(b"w" * 5)) == ("four again", "five")


def test_a_cache_that_keeps_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        PureCache(max_entries=0)
