"""Issue 12's attacks on the protocol around the cryptography, one test each, without sockets where none are needed:
Sybil and roster caps, partitions nobody can choose after the commitment, and snapshots that no request rebuilds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from nacl.signing import SigningKey

from anonml.aggregator._round import ApiRefused, RoundState
from anonml.aggregator._service import AggregatorConfig, serve_aggregator
from anonml.aggregator._setup import create_round
from anonml.aggregator._spec import RoundSpecError, parse_round_spec
from anonml.aggregator._home import AggregatorHome
from anonml.aggregator._store import VerifiedPacket
from anonml.crypto import generate_keypair
from anonml.protocol import (
    MAX_RESPONSE_BYTES,
    MAX_ROSTER,
    MAX_ROSTER_ENTRY_JSON,
    Check,
    PartitionPlan,
    RegisterRequest,
    RosterResponse,
    SurveyId,
    partition_seed,
    receipt_digest,
    roster_root,
)
from anonml.testing import SettableClock, SimulatedPeer
from test_aggregator import spec_document

T0 = 1_800_000_000


document = spec_document  # test_aggregator's round, with these participation settings


def make_round(tmp_path: Path, **participation: Any) -> tuple[RoundState, SettableClock]:
    home = AggregatorHome(tmp_path / "agg")
    home.initialise(bytes(range(32)), generate_keypair()[0])
    state, _ = create_round(home, parse_round_spec(document(**participation)), now=T0)
    clock = SettableClock(T0 + 1)
    state.clock = clock
    return state, clock


def test_open_registration_is_for_demos_and_tests_only() -> None:
    with pytest.raises(RoundSpecError) as info:
        parse_round_spec(document(registration="open", purpose="production"))
    assert info.value.field == "participation.registration"
    assert parse_round_spec(document(registration="open", purpose="demo")).participation.registration == "open"


def test_one_client_cannot_register_more_identities_than_the_sybil_cap(tmp_path: Path) -> None:
    # issue 12 attack 5: `open` registration accepted 3 identities from one client.
    state, _ = make_round(tmp_path, registration="open", purpose="test", max_per_client=2)
    assert SimulatedPeer(state, b"\x01" * 32).register(client="10.0.0.7")
    assert SimulatedPeer(state, b"\x02" * 32).register(client="10.0.0.7")
    with pytest.raises(ApiRefused) as refused:
        SimulatedPeer(state, b"\x03" * 32).register(client="10.0.0.7")
    assert refused.value.status == 403 and "most the round admits from one client" in refused.value.reason
    assert SimulatedPeer(state, b"\x03" * 32).register(client="10.0.0.8")  # another client is another person
    # re-registering a key already on the roster costs no slot and is not refused
    assert not SimulatedPeer(state, b"\x01" * 32).register(client="10.0.0.7")
    assert state.store.counts()["registered"] == 3


def test_the_roster_stays_within_every_clients_size_limit(tmp_path: Path) -> None:
    # issue 12 attack 5: ~1M roster entries broke every peer's roster fetch.
    assert MAX_ROSTER * MAX_ROSTER_ENTRY_JSON + 4096 < MAX_RESPONSE_BYTES
    with pytest.raises(RoundSpecError):
        parse_round_spec(document(registration="open", purpose="test", max_roster=MAX_ROSTER + 1))
    state, clock = make_round(tmp_path, registration="open", purpose="test", max_per_client=100, max_roster=3)
    for i in range(1, 4):
        assert SimulatedPeer(state, bytes([i]) * 32).register()
    with pytest.raises(ApiRefused) as refused:
        SimulatedPeer(state, b"\x09" * 32).register()
    assert "roster is full" in refused.value.reason
    # the widest entry the parser accepts is what the bound above counts
    clock.now = state.manifest.schedule.t_register_end
    state.prepare()
    body = state.roster().to_json()
    entries = json.loads(body)["entries"]
    assert max(len(json.dumps(entry, separators=(",", ":"))) for entry in entries) <= MAX_ROSTER_ENTRY_JSON


def test_partitions_depend_on_every_registrations_fresh_nonce_so_nobody_can_choose_them_at_commitment_time(tmp_path: Path) -> None:
    # issue 12 attack 4: the aggregator drew the seed alone, knowing the peers' long-term keys; a seed
    # placing a target with chosen colluders took 161 tries. Now the seed is committed in the signed
    # manifest before registration and partitions follow H(seed ‖ roster root): the root covers each
    # peer's fresh nonce, unknown when the aggregator committed.
    state, clock = make_round(tmp_path, registration="open", purpose="test", max_per_client=100)
    keys = [SigningKey(bytes([i]) * 32) for i in range(1, 9)]
    requests = [RegisterRequest.create(key, state.round_id) for key in keys]
    for request in requests:
        state.register(request)
    clock.now = state.manifest.schedule.t_register_end
    state.prepare()
    assert state.plan is not None
    head_root = roster_root(state.store.roster_entries())
    assert state.plan.seed == partition_seed(state.secrets.seed, head_root) != state.secrets.seed
    # The same keys and the same committed seed with other fresh nonces give another partition seed,
    # so the assignment of known keys cannot be computed (or ground) when the seed is committed.
    again = [RegisterRequest.create(key, state.round_id).entry for key in keys]
    other = PartitionPlan.derive(state.manifest, state.spec, [e.identity_key for e in sorted(again, key=lambda e: e.identity_key)],
                                 state.secrets.seed, roster_root(sorted(again, key=lambda e: e.identity_key)))
    assert other.seed != state.plan.seed
    # A peer recomputes the same plan from the signed roster alone, and the reveal opens the commitment.
    roster = RosterResponse.from_json(state.roster().to_json())
    head = roster.verify(state.manifest.identity_key, state.round_id)
    assert head.seed is not None
    peer_view = PartitionPlan.derive(state.manifest, state.spec, roster.keys, head.seed, head.root)
    assert peer_view.partition_of == state.plan.partition_of and peer_view.subsets == state.plan.subsets
    from anonml.protocol import check_seed

    assert check_seed(head.seed, state.manifest.seed_commitment)
    assert not check_seed(bytes(32), state.manifest.seed_commitment)


async def test_requests_are_served_from_snapshots_and_never_rebuild_the_log(tmp_path: Path, nursery: trio.Nursery) -> None:
    # issue 13: the receipt log was rebuilt per request on the event loop (2.06 s at 100k packets);
    # two pollers took the manifest GET from 5 ms to 1,126 ms. Now nothing a GET serves reads the store.
    state, clock = make_round(tmp_path, registration="open", purpose="test", max_per_client=100)
    for i in range(1, 5):
        SimulatedPeer(state, bytes([i]) * 32).register()
    clock.now = state.manifest.schedule.t_register_end
    state.prepare()
    survey = SurveyId.data(state.round_id, 0, 0)
    packets = [
        VerifiedPacket(survey, i.to_bytes(32, "big"), bytes(32), b"\x00", receipt_digest(i.to_bytes(32, "big")))
        for i in range(20_000)
    ]
    state.store.store_batch(packets, [], T0)
    state.publish_heads(state.manifest.schedule.data, Check.FIRST)
    addresses = await nursery.start(serve_aggregator, AggregatorConfig(state))
    await trio.sleep(1.0)  # the phase driver's start-up work is done; it now waits for t_c
    reads: list[str] = []
    store = state.store
    for name in ("log_leaves", "heads", "counts", "rejections", "covers", "roster_entries", "get_result"):
        original = getattr(store, name)

        def counting(*args: Any, __name: str = name, __original: Any = original, **kwargs: Any) -> Any:
            reads.append(__name)
            return __original(*args, **kwargs)

        setattr(store, name, counting)
    async with httpx.AsyncClient(base_url=addresses.http_url) as client:
        for _ in range(20):
            for path in ("/v1/receipts/data/0/0", "/v1/heads", "/v1/roster", "/v1/roster/head", "/v1/manifest"):
                response = await client.get(path)
                assert response.status_code == 200, path
        # the status snapshot is rebuilt on its own schedule (once a second, in a thread), not per request
        started = len(reads)
        with trio.move_on_after(0.5):
            for _ in range(50):
                assert (await client.get("/v1/status")).status_code == 200
    assert "log_leaves" not in reads and "roster_entries" not in reads, reads
    # at most the timed refreshes of the status ran while 50 status requests were served
    assert reads[started:].count("counts") <= math.ceil(0.5 / 1.0) + 1
    nursery.cancel_scope.cancel()
