"""Peers whose clocks are off (``SimulationConfig.clock_skew``): the target's runs slow by the skew, every other
peer's is off by a seeded draw within it. A slow clock makes a peer send late, and a first relay refuses a packet
whose window has opened. Within ``protocol.MAX_CLOCK_ERROR`` the first hop's guard and the peer's retries absorb
it; beyond, the peer stops before its credential (``clock-off``), its clock checked against the relay mirrors'
(each mirror answer carries its relay's clock, ``protocol.CLOCK_HEADER``). Before that check, a clock 4 s slow
lost reports in the simulator (README, "Peers' clocks")."""

from __future__ import annotations

from collections import Counter

import pytest

from anonml.peer import JoinRefused, PeerEvent, RefusalReason
from anonml.peer._session import check_clock
from anonml.protocol import MAX_CLOCK_ERROR
from anonml.simulate import SimulationConfig, simulate_round
from anonml.simulate._clocks import LyingMirrorClocks
from anonml.simulate._property import StrategyVerdict, score_trial
from anonml.simulate._world import RoundTrace, peer_ip


def _round(skew: float, seed: int) -> tuple[RoundTrace, Counter[PeerEvent], StrategyVerdict]:
    """The round, everyone's events, and the verdict on the target."""
    config = SimulationConfig(peers=16, seed=seed, clock_skew=skew)
    trace = simulate_round(config)
    target = seed % config.peers
    offsets = [peer.clock_offset for peer in trace.peers]
    assert offsets[target] == -skew and all(abs(offset) <= skew for offset in offsets)
    everyone: Counter[PeerEvent] = Counter(e for peer in trace.peers if peer.result for e in peer.result.events)
    return trace, everyone, StrategyVerdict("clock-skew", [score_trial(trace, target)])


def test_clocks_within_the_tolerance_lose_nothing() -> None:
    """1.8 s: some first sends fall after their relay's window opened and are refused; the peers retry over
    other paths in time, and every report is accepted (16 peers, 2 surveys each)."""
    trace, everyone, verdict = _round(1.8, seed=1)
    assert everyone[PeerEvent.FIRST_HOP_FAILED] > 0 and not any(peer.refused for peer in trace.peers)
    assert len(trace.arrivals) == 32 and PeerEvent.MISSING not in everyone and verdict.holds


def test_a_clock_beyond_the_tolerance_stops_its_peer_before_its_credential() -> None:
    """3 s: the target (3 s slow) and every peer off by more than the tolerance stop with `clock-off` before their
    credential, having sent nothing; the others' reports are all accepted."""
    trace, everyone, verdict = _round(3.0, seed=0)
    stopped = {peer.index for peer in trace.peers if peer.refused is not None}
    assert stopped == {peer.index for peer in trace.peers if abs(peer.clock_offset) > MAX_CLOCK_ERROR}
    assert all(trace.peers[i].refused.reason == RefusalReason.CLOCK_OFF for i in stopped)  # type: ignore[union-attr]
    assert "s behind the clocks of" in str(trace.peers[0].refused)
    assert verdict.trials[0].detected == RefusalReason.CLOCK_OFF and verdict.holds
    assert not any(trace.senders.get(receipt) in stopped for _, receipt, _ in trace.arrivals)
    assert len(trace.arrivals) == 2 * (len(trace.peers) - len(stopped)) and PeerEvent.MISSING not in everyone


def test_a_minority_of_mirrors_can_neither_force_the_refusal_nor_hide_it() -> None:
    check_clock([])  # no mirror told its clock: nothing to go by
    check_clock([0.1, -0.2, 100.0, 100.0])  # two colluding relays of four claim the peer is slow
    for offsets, side in (([0.1, 30.0, 31.0], "behind"), ([-5.0, -6.0, 0.0], "ahead of")):
        with pytest.raises(JoinRefused, match=side) as refused:
            check_clock(offsets)
        assert refused.value.reason == RefusalReason.CLOCK_OFF


def test_mirrors_answering_404_with_a_false_clock_count_once_however_often_they_are_asked() -> None:
    """Two colluding mirrors of five answer the target's manifest requests 404, each stating a clock 100 s ahead,
    while the route to one honest mirror is down for 10 s after registration ends: the target polls for a
    quorum and asks the two again and again. Counted once each they are two of four clocks, and the target
    goes on; counted at every answer (the code before 5b4f79d) they outvoted the honest mirrors and it
    stopped with `clock-off`."""
    config = SimulationConfig(peers=8, relays=5, seed=0)
    adversary = LyingMirrorClocks([peer_ip(0)])
    trace = simulate_round(config, adversary)
    assert adversary.refused > 0 and adversary.lies >= 3 * 2  # asked at least three times each
    assert not any(peer.refused for peer in trace.peers) and len(trace.arrivals) == 2 * config.peers
    assert StrategyVerdict(adversary.name, [score_trial(trace, 0)]).holds
