"""The first hop's guard (``protocol.first_hop_guard``, issue 24): a relay draws a packet's release
in ``[max(now, a), b]``, so the first relay's window opens a guard after the send window closes, and a
packet that reaches its first relay within the guard is released independently of when it was sent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from anonml.protocol import (
    Attempt,
    InvalidSchedule,
    PhaseTimes,
    RoundSchedule,
    SurveyId,
    acceptance_window,
    first_hop_guard,
    hop_slice,
    hop_windows,
    shortest_delivery,
)
from anonml.relay import LateIntake, WallClock
from anonml.transport import AckStatus
from test_relay_windows import Harness, rho_bound

T0 = 1_800_000_000
ROUND_ID = bytes(range(32))
SURVEY = SurveyId.data(ROUND_ID, 0, 0)


def data_phase(send: int, delivery: int, start: int = T0 + 100) -> RoundSchedule:
    """A round whose data phase sends for ``send`` s and delivers for ``delivery`` s (both attempts)."""
    t_c = start + send + delivery
    phase = PhaseTimes(start, send, t_c, t_c + 2, send, t_c + 2 + send + delivery)
    return RoundSchedule(t_register_end=T0 + 10, t_issue_end=T0 + 20, median=(), data=phase)


@given(send=st.integers(1, 10**5), delivery=st.integers(3, 10**6), n_relays=st.integers(1, 16),
       attempt=st.sampled_from(Attempt))
def test_every_relay_window_opens_after_the_guard_and_they_tile_the_delivery_window(
    send: int, delivery: int, n_relays: int, attempt: Attempt
) -> None:
    schedule = data_phase(send, delivery)
    if delivery < n_relays + 2:
        with pytest.raises(InvalidSchedule, match="guard"):
            hop_windows(schedule, SURVEY, n_relays, attempt)
        return
    windows = hop_windows(schedule, SURVEY, n_relays, attempt)
    start, end = schedule.data.delivery_window(attempt)
    relays, aggregator = windows[:-1], windows[-1]
    guard, length = first_hop_guard(delivery, n_relays), hop_slice(delivery, n_relays)
    # The guard: at least a second and a quarter of a relay's window, and no longer than one.
    assert 1 <= guard and length // 4 <= guard <= length
    assert relays[0].start == start + guard
    # Equal adjacent slices of at least a second; the slack slice after the last is no shorter.
    assert all(w.end - w.start == length >= 1 for w in relays)
    assert all(earlier.end == later.start for earlier, later in zip(relays, relays[1:]))
    assert end - relays[-1].end >= length
    assert (aggregator.start, aggregator.end) == acceptance_window(schedule, SURVEY) == (schedule.data.send_end, schedule.data.t_r)


@given(slice_seconds=st.integers(1, 10**5), n_relays=st.integers(1, 16))
def test_shortest_delivery_is_the_shortest_window_with_slices_that_long(slice_seconds: int, n_relays: int) -> None:
    delivery = shortest_delivery(slice_seconds, n_relays)
    assert hop_slice(delivery, n_relays) >= slice_seconds > hop_slice(delivery - 1, n_relays)


async def test_a_first_relay_that_takes_packets_in_within_the_guard_releases_them_independently_of_their_send(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The demo's shape (2 s send window, 1 s slices, 3 relays) with a first relay whose intake lags
    every send by 0.9 s. Without the guard its window opened at the send window's end: the later half
    of the sends was taken in after it and released in what was left of it (rho +0.44 in 50 draws)."""
    n, lag = 400, 0.9
    schedule = data_phase(send=2, delivery=shortest_delivery(1, 3))
    first = hop_windows(schedule, SURVEY, 3)[0]  # opens a second (the guard) after the send window's end
    clock = WallClock.starting_at(T0)
    harness = Harness(tmp_path, clock)
    sent = np.sort(np.random.default_rng(7).uniform(schedule.data.t_s, schedule.data.send_end, n))
    packets = [harness.packet(i, first) for i in range(n)]
    async with trio.open_nursery() as nursery:
        harness.start(nursery)
        for index, (at, packet) in enumerate(zip(sent, packets)):
            await trio.sleep_until(clock.to_trio(at + lag))
            assert await harness.relay.on_packets([packet], f"10.0.{index // 250}.{index % 250 + 1}") == [AckStatus.ACCEPTED]
        await trio.sleep_until(clock.to_trio(first.end + 1))
        nursery.cancel_scope.cancel()
    released = {index: at for at, index in harness.sent}
    assert sorted(released) == list(range(n))
    times = np.array([released[i] for i in range(n)])
    assert first.start <= times.min() and times.max() <= first.end
    assert abs(stats.spearmanr(sent, times).statistic) < rho_bound(n)
    # Every packet was held from before its window opened.
    assert harness.relay.counters.late_intake == LateIntake()

