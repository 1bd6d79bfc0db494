"""Peers whose clocks are off (``SimulationConfig.clock_skew``): the target's runs slow by the skew, every other
peer's is off by a seeded draw within it. A slow clock makes a peer send late, and a first relay refuses a packet
whose window has opened; a few seconds are absorbed by the first hop's guard and the peer's retries, more cost
reports. Neither marks one: a report is accepted among its window's, or lost."""

from __future__ import annotations

from collections import Counter

from anonml.peer import PeerEvent
from anonml.simulate import SimulationConfig, simulate_round
from anonml.simulate._property import StrategyVerdict, score_trial


def _round(skew: float, seed: int) -> tuple[Counter[PeerEvent], Counter[PeerEvent], int, StrategyVerdict]:
    """Everyone's events, the target's, the reports accepted, and the verdict on the target."""
    config = SimulationConfig(peers=16, seed=seed, clock_skew=skew)
    trace = simulate_round(config)
    target = seed % config.peers
    offsets = [peer.clock_offset for peer in trace.peers]
    assert offsets[target] == -skew and all(abs(offset) <= skew for offset in offsets)
    everyone: Counter[PeerEvent] = Counter(e for peer in trace.peers if peer.result for e in peer.result.events)
    result = trace.peers[target].result
    assert result is not None
    return everyone, Counter(result.events), len(trace.arrivals), StrategyVerdict("clock-skew", [score_trial(trace, target)])


def test_clocks_a_few_seconds_off_lose_nothing() -> None:
    """3 s slow: some first sends fall after their relay's window opened and are refused; the peers retry
    over other paths in time, and every report is accepted (16 peers, 2 surveys each)."""
    everyone, target, accepted, verdict = _round(3.0, seed=2)
    assert everyone[PeerEvent.FIRST_HOP_FAILED] > 0 and target[PeerEvent.FIRST_HOP_FAILED] > 0
    assert accepted == 32 and PeerEvent.MISSING not in everyone
    assert target[PeerEvent.ACKNOWLEDGED] == 2 and verdict.holds


def test_a_clock_ten_seconds_slow_loses_its_reports_and_names_them_missing() -> None:
    """10 s slow: the target's sends are refused in both windows; its log names both reports missing, and
    with nothing of it accepted there is nothing to link (the property holds vacuously: no report scored)."""
    everyone, target, accepted, verdict = _round(10.0, seed=0)
    assert target[PeerEvent.MISSING] == 2 and target[PeerEvent.ACKNOWLEDGED] == 0
    assert verdict.trials[0].reports == 0 and verdict.holds
    assert accepted < 32 and everyone[PeerEvent.MISSING] == 32 - accepted
