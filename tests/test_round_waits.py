"""What a round waits on besides its work (issue 26): whole simulated rounds, every role's real code on a
virtual clock, with a spy where the question is when something ran."""

from __future__ import annotations

import pytest
import trio

import anonml.aggregator._service as service
import anonml.peer._join as join
from anonml.protocol import PATH_CREDENTIAL
from anonml.simulate import SimulationConfig, simulate_round
from anonml.simulate._world import T0


def test_a_credential_request_waits_for_the_reveals_instead_of_a_refusal_and_a_retry() -> None:
    """The peers ask for their credentials when registration closes, a fraction of a second before the
    relays' reveals are in. Answered 503 then, each came back after its client's retry gap: 187 requests
    for 40 peers, the last 2.7 s after registration closed, so issuance planned a 2 s gap it rarely needed.
    Held until the partitions are derived (``CREDENTIAL_HOLD_SECONDS``), each peer asks once."""
    trace = simulate_round(SimulationConfig(peers=40))
    asked = [record for record in trace.view.http if record.method == "POST" and record.path == PATH_CREDENTIAL]
    assert trace.outcome == "done" and len(trace.peers) == 40
    assert len(asked) == 40


def test_the_learning_stack_is_imported_while_the_round_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Learning imported scikit-learn once the data phase had ended: 1.8 s of a default demo's 2.0 s between
    ``t_r`` and the report. The service imports it once issuance has closed, before the data phase."""
    warmed: list[float] = []
    monkeypatch.setattr(service, "warm_learning", lambda: warmed.append(T0 + trio.current_time()), raising=False)
    trace = simulate_round(SimulationConfig(peers=8))
    schedule = trace.manifest.manifest.schedule
    assert trace.outcome == "done"
    assert len(warmed) == 1 and schedule.t_issue_end <= warmed[0] < schedule.data.t_s


def test_a_peer_makes_its_credential_request_with_a_connection_slot_in_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's peers (one session) learn their partitions together. Each one's blinded request (group work,
    about a millisecond) was made before it waited for a slot, so trio ran every peer's before any was sent:
    in the Adult demo (16,000 peers a worker) the first credential request left 14 s after issuance opened,
    and 3,214 of 32,561 peers were still waiting when it closed. Made inside the slot, the work of at most
    ``slots`` peers comes before the first send."""
    made = join.PeerRound.issuance
    outside: list[int] = []

    def spy(run: join.PeerRound, partition: int, stored: bytes | None) -> object:
        if trio.lowlevel.current_task() not in run.session.slots.statistics().borrowers:
            outside.append(partition)
        return made(run, partition, stored)

    monkeypatch.setattr(join.PeerRound, "issuance", spy)
    trace = simulate_round(SimulationConfig(peers=8))
    assert trace.outcome == "done" and not outside
