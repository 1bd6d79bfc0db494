"""The aggregator: HTTP API over loopback, the packet sink with real Sphinx packets
and real tokens, and the phase driver under trio's MockClock."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import trio
import trio.testing
from nacl.signing import SigningKey

from anonml.aggregator._report import summarise
from anonml.aggregator._round import RoundState
from anonml.aggregator._service import (
    AggregatorConfig,
    BoundAddresses,
    drive_round,
    serve_aggregator,
)
from anonml.aggregator._setup import create_round
from anonml.aggregator._spec import RoundSpecError, parse_round_spec
from anonml.aggregator._home import AggregatorHome
from anonml.aggregator._workers import IssuerWorkers
from anonml.crypto import (
    CredentialSecret,
    IssuerPublicKey,
    JobRefused,
    begin_issuance,
    finish_issuance,
    generate_keypair,
)
from anonml.protocol import (
    CredentialRequest,
    Check,
    ReceiptSegment,
    RegisterRequest,
    RosterEntry,
    RosterResponse,
    SignedDocument,
    SurveyId,
    SurveyMessage,
)
from anonml.transport import HttpLimits, LinkClient, LinkIdentity
from anonml.testing import SettableClock, SimulatedPeer

T0 = 1_800_000_000


# The relays' identity keys: their node ids are in the manifest, and the sink takes packets only from them.
RELAY_IDENTITIES = [LinkIdentity(bytes([0x70 + i]) * 32) for i in range(2)]


def spec_document(**participation: Any) -> dict[str, Any]:
    relays = []
    for i, identity in enumerate(RELAY_IDENTITIES):
        _, public = generate_keypair()
        relays.append({"node_id": identity.node_id.hex(), "host": "127.0.0.1", "port": 9000 + i, "public_key": public.hex(), "key_epoch": 1})
    return {
        "name": "test-round",
        "task": {
            "features": [
                {"name": "colour", "type": "categorical", "categories": ["red", "green", "blue"]},
                {"name": "shape", "type": "categorical", "categories": ["round", "square"]},
            ],
            "label": {"name": "y", "positive": ["1"], "negative": ["0"]},
        },
        "learning": {"k_p": 2, "k_h": 1, "k_s": 1, "plan": "split", "learner": "logreg"},
        "privacy": {"eps_total": 2.0, "oracle": "grr"},
        "schedule": {"register": 100, "issue": 100, "median_send": 10, "median_delivery": 20, "data_send": 50, "data_delivery": 60},
        "network": {"relays": relays, "path_length": 2, "http_host": "127.0.0.1", "http_port": 8080, "sink_host": "127.0.0.1", "sink_port": 8081},
        "participation": {"min_participation": 2, "registration": "open", "purpose": "test", "max_per_client": 1000,
                          "min_anonymity_set": 1, **participation},
    }


def with_median(document: dict[str, Any], median_rounds: int = 1) -> dict[str, Any]:
    """``document`` with a numeric feature and ``median_rounds`` median sub-rounds."""
    document["task"]["features"].append({"name": "size", "type": "numeric", "low": 0, "high": 10})
    document["schedule"]["median_rounds"] = median_rounds
    return document


def make_round(
    tmp_path: Path, clock: Any, document: dict[str, Any] | None = None, **participation: Any
) -> tuple[RoundState, list[str]]:
    """A round created at T0 from ``document`` (default ``spec_document(**participation)``), read on ``clock``."""
    home = AggregatorHome(tmp_path / "agg")
    home.initialise(bytes(range(32)), generate_keypair()[0])
    state, codes = create_round(home, parse_round_spec(document or spec_document(**participation)), now=T0)
    state.clock = clock
    return state, codes


@pytest.fixture
async def served(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[tuple[RoundState, BoundAddresses, SettableClock]]:
    clock = SettableClock(T0 + 1)
    state, _ = make_round(tmp_path, clock)
    addresses = await nursery.start(serve_aggregator, AggregatorConfig(state))
    yield state, addresses, clock
    nursery.cancel_scope.cancel()


async def roster_frozen(state: RoundState) -> None:
    """Wait for the driver's roster freeze, which runs in a thread (under MockClock only milliseconds pass)."""
    while state.plan is None:
        await trio.sleep(0.001)


async def enrolled(state: RoundState, peers: list[SimulatedPeer]) -> None:
    """Register ``peers``, wait until registration has closed and the roster is frozen, then give each its credential."""
    for peer in peers:
        peer.register()
    await trio.sleep(state.manifest.schedule.t_register_end + 1 - state.now())
    await roster_frozen(state)
    for peer in peers:
        peer.obtain_credential()


async def post(url: str, path: str, body: bytes) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url) as client:
        return await client.post(path, content=body, headers={"content-type": "application/json"})


async def get(url: str, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url) as client:
        return await client.get(path)


async def test_manifest_and_registration(served: Any) -> None:
    state, addresses, clock = served
    response = await get(addresses.http_url, "/v1/manifest")
    assert response.status_code == 200
    assert bytes.fromhex(response.json()["round_id"]) == state.round_id
    peer = SigningKey(b"\x01" * 32)
    good = RegisterRequest.create(peer, state.round_id)
    assert (await post(addresses.http_url, "/v1/register", good.to_json())).json() == {"registered": True}
    # Idempotent for the same key.
    assert (await post(addresses.http_url, "/v1/register", good.to_json())).status_code == 200
    other = bytes(SigningKey(b"\x02" * 32).verify_key)
    forged = RegisterRequest(RosterEntry(other, good.entry.nonce, good.entry.signature), None, state.round_id)
    response = await post(addresses.http_url, "/v1/register", forged.to_json())
    assert response.status_code == 403 and "signature" in response.json()["error"]
    late = RegisterRequest.create(SigningKey(b"\x03" * 32), state.round_id)
    clock.now = state.manifest.schedule.t_register_end
    response = await post(addresses.http_url, "/v1/register", late.to_json())
    assert response.status_code == 403 and "closed" in response.json()["error"]
    # Neither the roster nor the seed is public until the driver has stored every admitted registration.
    assert (await get(addresses.http_url, "/v1/roster")).status_code == 404
    state.prepare()  # what the driver does at t_register_end (its clock here is a SettableClock)
    roster = RosterResponse.from_json((await get(addresses.http_url, "/v1/roster")).content)
    head = roster.verify(bytes(state.secrets.signing_key.verify_key), state.round_id)
    assert roster.keys == (bytes(peer.verify_key),) and head.seed is not None
    assert roster.entries[0] == good.entry  # the first registration's own signed entry
    mirrored = SignedDocument.from_json((await get(addresses.http_url, "/v1/roster/head")).content, max_bytes=4096)
    assert mirrored.same_as(roster.head)


async def test_registration_is_answered_while_the_worker_pool_is_still_starting(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: the aggregator's worker processes took 4.5 s to start at load 12, and registration, answered only
    after that, closed before any peer heard back. Here they take until the test ends."""
    pool_started = threading.Event()
    monkeypatch.setattr(IssuerWorkers, "warm", lambda workers: pool_started.wait(timeout=20))
    state, _ = make_round(tmp_path, SettableClock(T0 + 1))
    peer = SigningKey(b"\x01" * 32)
    try:
        with trio.fail_after(10):
            addresses = await nursery.start(serve_aggregator, AggregatorConfig(state))
            response = await post(addresses.http_url, "/v1/register", RegisterRequest.create(peer, state.round_id).to_json())
        assert response.json() == {"registered": True}
        assert not pool_started.is_set()
        assert state.store.roster() == [bytes(peer.verify_key)]
    finally:
        pool_started.set()
        nursery.cancel_scope.cancel()


async def test_bad_input_gets_a_4xx_with_a_reason(served: Any) -> None:
    state, addresses, _ = served
    for body in (b"not json", b"[]", b'{"identity_key": 5}', b"{" * 5000, "\u00e9".encode("latin-1")):
        response = await post(addresses.http_url, "/v1/register", body)
        assert 400 <= response.status_code < 500, body[:20]
        assert response.json()["error"]
    response = await post(addresses.http_url, "/v1/register", b"{" + b" " * 20_000 + b"}")
    assert response.status_code == 413
    assert (await get(addresses.http_url, "/v1/nothing")).status_code == 404
    assert (await get(addresses.http_url, "/v1/median/abc")).status_code == 404
    assert (await get(addresses.http_url, "/v1/medians")).status_code == 404
    # The service still answers after all of that.
    assert (await get(addresses.http_url, "/v1/status")).json()["body"]["phase"] == "registration"


def test_invitation_and_allow_list(tmp_path: Path) -> None:
    clock = SettableClock(T0 + 1)
    state, codes = make_round(tmp_path / "inv", clock, registration="invitation", invitations=2)
    from anonml.aggregator._round import ApiRefused

    a, b = SigningKey(b"\x01" * 32), SigningKey(b"\x02" * 32)
    assert state.register(RegisterRequest.create(a, state.round_id, codes[0]))
    with pytest.raises(ApiRefused, match="already used"):
        state.register(RegisterRequest.create(b, state.round_id, codes[0]))
    with pytest.raises(ApiRefused, match="unknown invitation"):
        state.register(RegisterRequest.create(b, state.round_id, "nope"))
    allowed = SigningKey(b"\x05" * 32)
    state2, _ = make_round(tmp_path / "allow", clock, registration="allow-list", allow_list=[bytes(allowed.verify_key).hex()])
    assert state2.register(RegisterRequest.create(allowed, state2.round_id))
    with pytest.raises(ApiRefused, match="allow-list"):
        state2.register(RegisterRequest.create(b, state2.round_id))


def test_round_spec_names_the_bad_field() -> None:
    for path, value, field in (
        (("learning", "k_p"), 0, "learning.k_p"),
        (("learning", "vote"), "majority", "learning.vote"),
        (("privacy", "eps_total"), "lots", "privacy.eps_total"),
        (("network", "path_length"), 5, "network.path_length"),
        (("participation", "registration"), "vip", "participation.registration"),
        (("schedule", "data_delivery"), 1, "schedule.data_delivery"),
    ):
        document = spec_document()
        document[path[0]][path[1]] = value
        with pytest.raises(RoundSpecError) as info:
            parse_round_spec(document)
        assert info.value.field == field


def test_a_spec_with_plan_auto_makes_the_round_on_the_planners_choice(tmp_path: Path) -> None:
    """``plan = "auto"``: the planner simulates the plans a round runs (every peer answering the median
    search, at least one partition per sub-round) for ``expected_peers`` and chooses k_p, k_h, k_s, the
    vote and the cut points; the round's manifest is built from that choice, at exactly the promised ε_T,
    and the round keeps the choice for its report."""
    document = with_median(spec_document(), median_rounds=2)
    document["learning"] = {"plan": "auto", "learner": "logreg", "expected_peers": 400}
    spec = parse_round_spec(document)
    choice = spec.planned
    assert choice is not None and choice.simulated_auc is not None and 0.5 < choice.simulated_auc <= 1.0
    assert choice.median_steps == 2 and choice.oracle == "grr"
    # Either every peer answers the search (a partition per sub-round) or a reserved pool does.
    assert (choice.median_peers, spec.learning.comparison_pool) == ("reserved", choice.comparison_pool) or (
        choice.median_peers == "all" and choice.k_p >= 2 and spec.learning.comparison_pool == 0)
    assert (spec.learning.k_p, spec.learning.k_h, spec.learning.k_s, spec.learning.plan, spec.learning.vote) == (choice.k_p, choice.k_h, choice.k_s, choice.kind, choice.combiner)
    assert spec.task.features.feature("size").n_bins == choice.quantiles + 1
    assert parse_round_spec(with_median(spec_document(), median_rounds=2) | {"learning": document["learning"]}).planned == choice
    home = AggregatorHome(tmp_path / "agg")
    home.initialise(bytes(range(32)), generate_keypair()[0])
    state, _ = create_round(home, spec, now=T0)
    manifest = state.manifest
    assert (manifest.k_p, manifest.k_h, manifest.k_s, manifest.plan, manifest.vote) == (choice.k_p, choice.k_h, choice.k_s, choice.kind, choice.combiner)
    assert manifest.eps_total == pytest.approx(2.0)
    assert manifest.comparison_pool == round(spec.learning.comparison_pool * 1000)
    assert json.loads(state.store.get_meta("planned") or b"null") == choice.to_dict()
    # `anonml aggregator report` says where the plan came from.
    (line,) = [line for line in summarise({"planned": choice.to_dict()}) if line.startswith("plan chosen by the planner")]
    assert f"k_p {choice.k_p}," in line and f"vote {choice.combiner}" in line


def test_a_comparison_pool_is_the_one_plans_default_and_refused_where_it_cannot_work() -> None:
    """With a pool the median search is the pool's, at the full ε_T: a median share is meaningless, a
    task without a numeric feature has no search, and the planner chooses the pool itself."""
    pooled = {"k_p": 2, "k_h": 1, "k_s": 1, "plan": "split", "learner": "logreg", "comparison_pool": 0.2}
    for document, field in (
        (with_median(spec_document()) | {"learning": pooled, "privacy": {"eps_total": 2.0, "oracle": "grr", "median_share": 0.3}}, "privacy.median_share"),
        (spec_document() | {"learning": pooled}, "learning.comparison_pool"),
        (with_median(spec_document()) | {"learning": {"plan": "auto", "learner": "logreg", "comparison_pool": 0.2}}, "learning.comparison_pool"),
        (with_median(spec_document()) | {"learning": pooled | {"comparison_pool": 1.0}}, "learning.comparison_pool"),
    ):
        with pytest.raises(RoundSpecError) as refused:
            parse_round_spec(document)
        assert refused.value.field == field, refused.value
    # Its sub-rounds need no data partition of their own: four of them with k_p = 2.
    spec = parse_round_spec(with_median(spec_document(), median_rounds=4) | {"learning": pooled})
    assert (spec.learning.comparison_pool, spec.schedule.median_rounds, spec.learning.k_p) == (0.2, 4, 2)
    # The "one" plan's default is one release per peer at the full ε_T, as in the experiments; 0 asks every peer.
    one = {"k_p": 3, "k_h": 1, "k_s": 1, "plan": "one", "learner": "logreg"}
    assert parse_round_spec(with_median(spec_document()) | {"learning": one}).learning.comparison_pool == 0.1
    every = with_median(spec_document()) | {"learning": one | {"comparison_pool": 0}}
    every["privacy"]["median_share"] = 0.3
    assert parse_round_spec(every).learning.comparison_pool == 0.0
    assert parse_round_spec(spec_document() | {"learning": one}).learning.comparison_pool == 0.0  # no numeric feature, no search
    assert parse_round_spec(with_median(spec_document())).learning.comparison_pool == 0.0  # the split plan


def test_plan_auto_refuses_what_the_planner_chooses_and_says_when_no_plan_fits() -> None:
    auto = {"plan": "auto", "learner": "logreg"}
    for learning, task, field in (
        ({**auto, "k_p": 2}, {}, "learning.k_p"),
        ({**auto, "vote": "soft"}, {}, "learning.vote"),
        (auto, {"quantiles": 2}, "task.quantiles"),
        ({"k_p": 2, "k_h": 1, "k_s": 1, "plan": "split", "learner": "logreg", "expected_peers": 400}, {}, "learning.expected_peers"),
        # 10 peers leave no partition of the 20 the planner requires.
        ({**auto, "expected_peers": 10}, {}, "learning.plan"),
    ):
        document = with_median(spec_document(), median_rounds=2)
        document["learning"] = learning
        document["task"].update(task)
        with pytest.raises(RoundSpecError) as refused:
            parse_round_spec(document)
        assert refused.value.field == field, refused.value
    # The planner's own reason reaches the operator.
    assert "no satisfiable plan for n=10" in str(refused.value), refused.value


def Peer(state: RoundState, seed: int) -> SimulatedPeer:  # noqa: N802 - reads like the class it builds
    return SimulatedPeer(state, bytes([seed]) * 32)


def registered_peers(state: RoundState, clock: SettableClock, count: int = 4) -> list[SimulatedPeer]:
    """``count`` peers registered, the clock at the registration deadline, and the
    roster and seed prepared as the phase driver would, ready for credentials."""
    peers = [Peer(state, i) for i in range(1, count + 1)]
    for peer in peers:
        peer.register()
    clock.now = state.manifest.schedule.t_register_end
    state.prepare()
    return peers


def credentialed_peers(state: RoundState, clock: SettableClock) -> list[SimulatedPeer]:
    """Four registered peers, each holding its credential (issuance is open on ``clock``)."""
    peers = registered_peers(state, clock)
    for peer in peers:
        peer.obtain_credential()
    return peers


async def verified(state: RoundState, rejected: int = 0) -> None:
    """Wait until the sink's background verifier has decided every received message (and at
    least ``rejected`` rejections, some counted at intake, are stored)."""
    with trio.fail_after(30):
        while state.store.inbox_size() or sum(state.store.rejections().values()) < rejected:
            await trio.sleep(0.02)


def relay_client(sink: tuple[str, int], state: RoundState, relay: int = 0) -> LinkClient:
    """A last-hop relay's link to the sink (authenticated with a relay key the manifest lists)."""
    geometry = state.geometry
    return LinkClient(*sink, packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash(),
                      identity=RELAY_IDENTITIES[relay], expect_node_id=state.manifest.aggregator_hop.node_id)


def deliver(state: RoundState, frames: list[bytes]) -> None:
    """What the sink does with frames it receives now: final layer checked, messages stored."""
    from anonml.aggregator._verify import Delivered, open_frames

    opened = [item for item in open_frames(state, frames) if isinstance(item, Delivered)]
    state.store.enqueue([(d.tag, d.message) for d in opened], state.now())


async def test_packet_sink_accepts_and_rejects_by_reason(served: Any) -> None:
    state, addresses, clock = served
    peers = credentialed_peers(state, clock)
    by_partition: dict[int, list[Peer]] = {}
    for peer in peers:
        by_partition.setdefault(peer.partition, []).append(peer)
    assert sorted(len(v) for v in by_partition.values()) == [2, 2]
    data = state.manifest.schedule.data
    clock.now = data.t_s + data.delta + 1
    rng = np.random.default_rng(1)

    def report(partition: int, value: int) -> bytes:
        oracle = state.data_oracle(partition, 0)
        return oracle.encode_report(oracle.privatize(np.array([value]), rng)[0])

    a, b = by_partition[0]
    c = by_partition[1][0]
    own = SurveyId.data(state.round_id, 0, 0)
    report_a = report(0, 1)
    other_report = next(r for r in (report(0, v % 12) for v in range(100)) if r != report_a)
    good = a.packet(own, report_a)
    outsider = Peer(state, 9)  # never registered: a credential from another issuer key
    from anonml.crypto import IssuerSecretKey, issue_credential

    rogue_key = IssuerSecretKey.generate()
    rogue_request, rogue_state = begin_issuance(rogue_key.public_key(), outsider.secret, 0)
    rogue_credential = finish_issuance(rogue_state, issue_credential(rogue_key, rogue_request.to_bytes(), 0).to_bytes())
    frames = {
        "accepted": good,
        "replay": good,
        "wrong-partition": c.packet(own, report(0, 1)),
        "unregistered": outsider.packet_carrying(
            own, outsider.message(own, report(0, 0), credential=rogue_credential, public=rogue_key.public_key())),
        "forged": b.packet_carrying(own, b.message(own, report(0, 0), tamper=True)),
        # The same report again in a fresh packet with a fresh token: a duplicate delivery.
        "duplicate": a.packet(own, report_a),
        # The same peer and survey, another report: a double submission; the first is kept.
        "double-submission": a.packet(own, other_report),
        "bad-packet": bytes(len(good)),
        "unknown-survey": b.packet(SurveyId.data(bytes(32), 0, 0), report(0, 1)),
    }
    client = relay_client(addresses.sink, state)
    statuses = []
    for name, frame in frames.items():
        statuses.append((name, (await client.send_batch([frame], give_up_at=trio.current_time() + 20))[0]))
    await client.aclose()
    await verified(state, rejected=8)
    rejected = state.store.rejections()
    counts = state.store.counts()
    # Accepted once; the duplicate delivery (same report, fresh token and packet) counted once.
    assert counts["accepted"] == 1, (statuses, rejected)
    assert rejected.get("replay") == 1
    assert rejected.get("wrong-partition") == 1
    assert rejected.get("bad-token/wrong-kid") == 1, rejected
    assert sum(v for k, v in rejected.items() if k.startswith("bad-token/")) == 2, rejected
    assert rejected.get("bad-packet") == 1
    assert rejected.get("unknown-survey") == 1
    assert rejected.get("outside-window") is None
    assert rejected.get("duplicate") == 1
    assert rejected.get("double-submission") == 1
    from anonml.aggregator import REJECTION_REASONS

    assert set(rejected) <= set(REJECTION_REASONS), rejected
    # Every frame was durable before its acknowledgement. A frame whose final layer fails, or a
    # replay of one stored, is refused at the link and never stored (DESIGN.md §5); which check
    # failed is not sent back (STYLE.md 8), and later verdicts are not sent at all.
    refused_at_link = {"replay", "bad-packet"}
    assert [status.name for _, status in statuses] == [
        "REJECTED" if name in refused_at_link else "ACCEPTED" for name in frames
    ]
    # The first check's signed heads (what the driver does at t_c): one receipt in the partition's log.
    state.publish_heads(data, Check.FIRST)
    body = (await get(addresses.http_url, f"/v1/receipts/data/{own.partition}/0")).content
    segment = ReceiptSegment.from_json(body)
    heads = segment.verify(state.manifest.identity_key, state.round_id, Check.FIRST)
    assert heads[own].size == 1 and len(segment.leaves[own]) == 1
    assert (await get(addresses.http_url, f"/v1/receipts/data/{own.partition}/1")).status_code == 404
    # Outside the window: refused and counted.
    clock.now = data.t_r  # the window is [t_s + δ, t_r): t_r itself is late
    late = b.packet(own, report(0, 1))
    client = relay_client(addresses.sink, state)
    await client.send_batch([late], give_up_at=trio.current_time() + 20)
    await client.aclose()
    await verified(state)
    assert state.store.rejections().get("outside-window") == 1


async def test_minimum_participation_ends_the_round_clearly(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    # Socket-free: drive_round only waits on the injected clock.
    state, _ = make_round(tmp_path, lambda: T0 + trio.current_time())
    Peer(state, 1).register()
    outcome = await drive_round(state)
    assert outcome == "failed"
    assert "minimum participation" in json.loads(state.store.get_result("outcome") or b"{}")["reason"]
    assert state.status(state.now()).phase == "failed"
    assert trio.current_time() == pytest.approx(state.manifest.schedule.t_register_end - T0)


async def test_phases_advance_by_the_schedule(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    # No peer sends a report here: the per-survey minimum is off (0) so only the phases are judged.
    state, _ = make_round(tmp_path, lambda: T0 + trio.current_time(), min_reports_per_survey=0)
    peers = [Peer(state, i) for i in range(1, 5)]
    for peer in peers:
        peer.register()
    seen: list[str] = []

    async def issue_when_open() -> None:
        await trio.sleep(state.manifest.schedule.t_register_end - T0 + 1)
        await roster_frozen(state)
        seen.append(state.status(state.now()).phase)
        for peer in peers:
            peer.obtain_credential()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(issue_when_open)
        learned: list[int] = []
        outcome = await drive_round(state, lambda s: learned.append(s.learning_started_at) or {"ok": True})
    assert outcome == "done" and learned == [state.manifest.schedule.data.t_r]
    assert seen == ["issuance"]
    assert state.status(state.now()).phase == "done"
    assert trio.current_time() == pytest.approx(state.manifest.schedule.data.t_r - T0)


@pytest.mark.parametrize("vote", [None, "naive-bayes"])
async def test_full_round_in_process_learns_and_reports(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, vote: str | None
) -> None:
    from anonml.aggregator._report import learn
    from anonml.aggregator._verify import process_batch
    from anonml.protocol import MedianThresholds, encode_median_report

    document = with_median(spec_document())
    if vote is not None:
        document["learning"]["vote"] = vote
    state, _ = make_round(tmp_path, lambda: T0 + trio.current_time(), document)
    assert state.manifest.vote == (vote or "weighted")
    schedule = state.manifest.schedule
    peers = [Peer(state, i) for i in range(1, 13)]
    rng = np.random.default_rng(3)

    async def sleep_until(t: int) -> None:
        await trio.sleep(max(0, t - state.now()))

    async def all_peers() -> None:
        await enrolled(state, peers)
        median = schedule.median[0]
        thresholds = state.thresholds(0)
        assert isinstance(thresholds, MedianThresholds) and thresholds.thresholds == ((5.0,),)
        await sleep_until(median.t_s + median.delta + 1)
        # One sub-round: every partition answers in it.
        frames = [p.packet(state.manifest.median_survey(p.partition), encode_median_report([(0, 1)])) for p in peers]
        assert process_batch(state, frames, state.now()) == ["accepted"] * len(peers)
        await sleep_until(schedule.data.t_s + schedule.data.delta + 1)
        frames = []
        for peer in peers:
            oracle = state.data_oracle(peer.partition, 0)
            value = int(rng.integers(0, oracle.m if hasattr(oracle, "m") else 2))
            report = oracle.encode_report(oracle.privatize(np.array([value]), rng)[0])
            frames.append(peer.packet(SurveyId.data(state.round_id, peer.partition, 0), report))
        assert process_batch(state, frames, state.now()) == ["accepted"] * len(peers)

    directory = AggregatorHome(tmp_path / "agg").round_dir(state.round_id)
    test_file = tmp_path / "held-out.csv"
    rows = ["colour,shape,size,y"] + [
        f"{c},{sh},{z},{int(c == 'red')}" for c in ("red", "green", "blue") for sh in ("round", "square") for z in (1, 9)
    ]
    test_file.write_text("\n".join(rows) + "\n")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(all_peers)
        outcome = await drive_round(state, lambda s: learn(s, directory, test_file=test_file))
    assert outcome == "done"
    report = json.loads((directory / "report.json").read_text())
    assert report["counts"] == {"registered": 12, "credentials": 12, "accepted": 12 + 12}
    # Every median answer said "greater than 5": the search moves up by the next step.
    assert len(report["cut_points"]["size"]) == 1 and report["cut_points"]["size"][0] > 5.0
    assert sum(report["accepted_by_survey"].values()) == 12
    assert report["privacy"]["eps_total_local"] == state.manifest.eps_total
    assert (directory / "model.json").is_file() and (directory / "report.html").is_file()
    assert report["utility"]["rows"] == 12 and 0.0 <= report["utility"]["auc"] <= 1.0
    # The published model is plain JSON that rebuilds the same scores (no pickle).
    from anonml.learning import model_from_json, read_csv_table, table_matrix

    model = model_from_json((directory / "model.json").read_text())
    held_out = read_csv_table(test_file, state.spec)
    assert model.decision_function(table_matrix(state.spec, held_out)).shape == (12,)
    # The round's signed vote is the one its model combines with.
    assert model.named_steps["ensemble"].combiner == (vote or "weighted")


def test_malformed_test_file_names_its_line(tmp_path: Path) -> None:
    from anonml.learning import DataError, read_csv_table
    from anonml.protocol import FeatureSpec

    spec = FeatureSpec.from_dict({"features": spec_document()["task"]["features"], "label": spec_document()["task"]["label"]})
    path = tmp_path / "bad.csv"
    path.write_text("colour,shape,y\nred,round,1\ngreen,,0\n")
    with pytest.raises(DataError, match=r"bad.csv:3: empty field 'shape'"):
        read_csv_table(path, spec)
    path.write_text("colour,y\nred,1\n")
    with pytest.raises(DataError, match="header lacks"):
        read_csv_table(path, spec)


def test_worker_processes_verify_and_issue_as_the_thread_does(tmp_path: Path) -> None:
    from anonml.crypto import IssueJob, TokenJob, never_replayed, process_packet

    clock = SettableClock(T0 + 1)
    state, _ = make_round(tmp_path, clock)
    peers = credentialed_peers(state, clock)
    jobs = []
    for peer in peers:
        survey = SurveyId.data(state.round_id, 0, 0)
        frame = peer.packet(survey, b"\x01")
        opened = process_packet(state.geometry, state.secrets.final_hop_private_key, frame, is_replay=never_replayed)
        message = SurveyMessage.from_bytes(opened.message)  # type: ignore[union-attr]
        jobs.append(TokenJob(survey.to_bytes(), message.bound_bytes(), message.token, 0))
    in_thread = IssuerWorkers(state.secrets.issuer_key).verify(jobs)
    pool = IssuerWorkers(state.secrets.issuer_key, processes=2)
    try:
        assert pool.verify(jobs) == in_thread
        # Blind issuance in the pool: valid responses for good requests, the proof's reason for a tampered one.
        public = IssuerPublicKey.from_bytes(state.manifest.token_public_key)
        started = [begin_issuance(public, CredentialSecret.generate(), j) for j in (0, 1, 1)]
        requests = [request.to_bytes() for request, _ in started]
        requests[2] = requests[2][:-1] + bytes([requests[2][-1] ^ 1])
        issued = pool.issue([IssueJob(request, j) for request, j in zip(requests, (0, 1, 1))])
        for (_, issuance), response in zip(started[:2], issued[:2]):
            assert isinstance(response, bytes)
            finish_issuance(issuance, response)
        assert issued[2] == JobRefused("bad-proof")
    finally:
        pool.close()
    # Partition-0 survey: peers of partition 1 are refused as wrong-partition, the others accepted.
    assert [isinstance(r, bytes) for r in in_thread] == [p.partition == 0 for p in peers]
    assert {r for r in in_thread if isinstance(r, JobRefused)} == {JobRefused("wrong-partition")}


def test_a_replay_is_refused_whether_its_first_copy_waits_in_the_inbox_or_is_verified(tmp_path: Path) -> None:
    """The inbox's unique tag catches a copy of a message awaiting verification, the replay cache one verified."""
    from anonml.aggregator._verify import Delivered, judge_batch, open_batch, open_frames, store_judged

    clock = SettableClock(T0 + 1)
    state, _ = make_round(tmp_path, clock)
    peers = credentialed_peers(state, clock)
    data = state.manifest.schedule.data
    clock.now = data.t_s + data.delta + 1
    sender = next(p for p in peers if p.partition == 0)
    oracle = state.data_oracle(0, 0)
    report = oracle.encode_report(oracle.privatize(np.array([1]), np.random.default_rng(0))[0])
    frame = sender.packet(SurveyId.data(state.round_id, 0, 0), report)
    [opened] = open_frames(state, [frame])
    assert isinstance(opened, Delivered)
    first = state.store.enqueue([(opened.tag, opened.message)], state.now())
    assert first[0] is not None and state.store.enqueue([(opened.tag, opened.message)], state.now()) == [None]
    rows = state.store.claim_inbox("test", 10, state.now())
    judged = judge_batch(state, open_batch(state, rows), IssuerWorkers(state.secrets.issuer_key))
    assert store_judged(state, judged) == ["accepted"]
    assert state.store.enqueue([(opened.tag, opened.message)], state.now()) == [None]
    assert state.store.counts()["accepted"] == 1 and state.store.inbox_size() == 0


def test_schedule_leaves_a_publish_gap_before_phases_that_need_results() -> None:
    from anonml.aggregator._setup import build_schedule

    document = with_median(spec_document(), median_rounds=2)
    document["schedule"]["publish_gap"] = 3
    schedule = build_schedule(parse_round_spec(document), T0)
    assert schedule.t_register_end == T0 + 100 and schedule.t_issue_end == T0 + 200
    assert schedule.median[0].t_s == schedule.t_issue_end
    assert schedule.median[1].t_s == schedule.median[0].t_r + 3
    assert schedule.data.t_s == schedule.median[1].t_r + 3


async def test_garbage_on_the_packet_sink_is_counted_and_harmless(served: Any) -> None:
    state, addresses, _ = served
    stream = await trio.open_tcp_stream(*addresses.sink)
    await stream.send_all(b"GET / HTTP/1.1\r\n\r\n" + bytes(200))
    with trio.move_on_after(10):
        while await stream.receive_some(1024):
            pass
    await stream.aclose()
    with trio.fail_after(10):
        while not state.link_errors:
            await trio.sleep(0.05)
    with trio.fail_after(10):  # the status snapshot is rebuilt every second
        while True:
            status = json.loads((await get(addresses.http_url, "/v1/status")).content)["body"]
            if any(key.startswith("link/") for key in status["counts"]):
                break
            await trio.sleep(0.2)
    assert status["phase"] == "registration"


async def test_one_credential_per_peer_over_http(served: Any) -> None:
    state, addresses, clock = served
    peer, stranger = Peer(state, 1), Peer(state, 2)
    peer.register()
    Peer(state, 3).register()
    clock.now = state.manifest.schedule.t_register_end
    state.prepare()
    partition = state.assignment()[bytes(peer.key.verify_key)]
    request, issuance_state = begin_issuance(peer.public, peer.secret, partition)
    body = CredentialRequest.create(peer.key, state.round_id, request.to_bytes()).to_json()
    first = await post(addresses.http_url, "/v1/credential", body)
    assert first.status_code == 200, first.text
    assert first.json()["partition"] == partition
    finish_issuance(issuance_state, bytes.fromhex(first.json()["response"]))
    # The identical request again (a retry whose answer was lost) gets the stored answer, not a new one.
    again = await post(addresses.http_url, "/v1/credential", body)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    # Another blinded request from the same peer would be a second credential: refused.
    reblinded, _ = begin_issuance(peer.public, peer.secret, partition)
    second = await post(addresses.http_url, "/v1/credential",
                        CredentialRequest.create(peer.key, state.round_id, reblinded.to_bytes()).to_json())
    assert second.status_code == 409 and "already" in second.json()["error"]
    assert state.store.counts()["credentials"] == 1
    # A request whose proof does not verify is refused with the proof's reason, and issues nothing.
    other = Peer(state, 3)
    partition = state.assignment()[bytes(other.key.verify_key)]
    request, _ = begin_issuance(other.public, other.secret, partition)
    tampered = request.to_bytes()[:-1] + bytes([request.to_bytes()[-1] ^ 1])
    bad = await post(addresses.http_url, "/v1/credential", CredentialRequest.create(other.key, state.round_id, tampered).to_json())
    assert bad.status_code == 400 and bad.json()["error"] == "bad issuance request (bad-proof)"
    assert state.store.issued_answer(bytes(other.key.verify_key), bytes(32)) is None
    request, _ = begin_issuance(stranger.public, stranger.secret, 0)
    refused = await post(
        addresses.http_url, "/v1/credential", CredentialRequest.create(stranger.key, state.round_id, request.to_bytes()).to_json()
    )
    assert refused.status_code == 403 and "roster" in refused.json()["error"]
    # The roster now carries the revealed seed, which opens the manifest's commitment.
    from anonml.protocol import RosterResponse, check_seed

    roster = RosterResponse.from_json((await get(addresses.http_url, "/v1/roster")).content)
    head = roster.verify(state.manifest.identity_key, state.round_id)
    assert head.seed is not None and check_seed(head.seed, state.manifest.seed_commitment)


def test_a_restarted_aggregator_resumes_the_round(tmp_path: Path) -> None:
    from anonml.aggregator._setup import open_round

    clock = SettableClock(T0 + 1)
    state, _ = make_round(tmp_path, clock)
    peers = registered_peers(state, clock)
    issued = {bytes(p.key.verify_key): p.obtain_credential() for p in peers[:2]}
    roster_before = state.roster()
    state.store.close()
    home = AggregatorHome(tmp_path / "agg")
    again = open_round(home, state.round_id.hex(), clock=clock)
    assert again.round_id == state.round_id and again.manifest == state.manifest
    again.prepare()  # the driver's first step past t_register_end
    assert again.roster() == roster_before
    assert again.store.partitions() == issued
    # One credential per peer survives the restart.
    from anonml.aggregator._round import ApiRefused

    with pytest.raises(ApiRefused, match="already"):
        Peer(again, 1).obtain_credential()
    # The remaining peers still get theirs, in the same partitions as before.
    assert Peer(again, 3).obtain_credential() == state.assignment()[bytes(peers[2].key.verify_key)]


def test_promised_epsilon_does_not_depend_on_the_secret_seed(tmp_path: Path) -> None:
    # Which features a partition releases comes from the seed; the manifest's
    # eps_total is fixed before the seed is revealed, so it must be the worst case.
    document = with_median(spec_document())
    document["privacy"]["eps_total"] = 4.0
    promised = set()
    for attempt in range(6):
        home = AggregatorHome(tmp_path / f"agg{attempt}")
        home.initialise(bytes(range(32)), generate_keypair()[0])
        state, _ = create_round(home, parse_round_spec(document), now=T0)
        promised.add(state.manifest.eps_total)
        # A released numeric feature costs its median answer plus its subset.
        assert state.manifest.eps_median + state.manifest.eps_data <= state.manifest.eps_total
    assert promised == {4.0}


async def test_frames_are_judged_at_arrival_and_results_wait_for_them(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from anonml.aggregator._sink import PacketSink
    from anonml.protocol import encode_median_report

    # Only the median phase is judged here: no data report is sent, so the per-survey minimum is off (0).
    state, _ = make_round(tmp_path, lambda: T0 + trio.current_time(), with_median(spec_document(min_reports_per_survey=0)))
    schedule = state.manifest.schedule
    median = schedule.median[0]
    peers = [Peer(state, i) for i in range(1, 9)]
    for peer in peers:
        peer.register()
    sink = PacketSink(state, IssuerWorkers(state.secrets.issuer_key))

    async def scenario(nursery: trio.Nursery) -> None:
        await trio.sleep(schedule.t_register_end + 1 - state.now())
        await roster_frozen(state)
        for peer in peers:
            peer.obtain_credential()
        await trio.sleep(median.t_r - 1 - state.now())
        answering = [p for p in peers if p.partition == 0]
        survey = state.manifest.median_survey(0)
        # Received (durable, acknowledged) inside the window, verified only later.
        deliver(state, [p.packet(survey, encode_median_report([(0, 1)])) for p in answering[:-1]])
        await trio.sleep(2)
        deliver(state, [answering[-1].packet(survey, encode_median_report([(0, 1)]))])
        await trio.sleep(5)
        assert state.medians() is None  # the driver waits for the verifier
        nursery.start_soon(sink.verify_forever)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(scenario, nursery)
        outcome = await drive_round(state)
        nursery.cancel_scope.cancel()
    assert outcome == "done"
    answered = len([p for p in peers if p.partition == 0])
    assert state.store.counts()["accepted"] == answered - 1
    assert state.store.rejections() == {"outside-window": 1}
    medians = state.medians()
    assert medians is not None and medians.cut_points["size"][0] > 5.0


async def test_a_median_phase_searches_every_cut_point_and_publishes_them_ascending(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """``task.quantiles = 3``: each answer names the cut point it is about;
    only that cut point's search moves, one that got no answers keeps its
    threshold, and the published cut points are sorted (here the searches for
    the lowest and highest quantile cross)."""
    from anonml.aggregator._verify import process_batch
    from anonml.protocol import encode_median_report

    document = with_median(spec_document(min_reports_per_survey=0), median_rounds=2)
    document["task"]["quantiles"] = 3
    state, _ = make_round(tmp_path, lambda: T0 + trio.current_time(), document)
    schedule = state.manifest.schedule
    peers = [Peer(state, i) for i in range(1, 15)]

    async def scenario() -> None:
        await enrolled(state, peers)
        first = state.thresholds(0)
        assert first is not None and first.thresholds == ((5.0, 5.0, 5.0),)
        median = schedule.median[0]
        await trio.sleep(median.t_s + median.delta + 1 - state.now())
        survey = state.manifest.median_survey(0)
        answering = [p for p in peers if p.partition == 0]
        assert len(answering) == 7
        # At eps_median = 1, three identical answers are beyond eq. 7.2's margin (1.36/sqrt(3) < 0.83).
        answers = [(0, 1)] * 3 + [(2, 0)] * 3 + [(3, 1)]  # the last names a fourth cut point
        frames = [p.packet(survey, encode_median_report([answer])) for p, answer in zip(answering, answers)]
        assert process_batch(state, frames, state.now()) == ["accepted"] * 6 + ["bad-message"]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(scenario)
        outcome = await drive_round(state)
    assert outcome == "done"
    # Levels 0.25, 0.5, 0.75 start at the midpoint 5 with step 5; each moved one halved step.
    second = state.thresholds(1)
    assert second is not None and second.thresholds == ((7.5, 5.0, 2.5),)
    medians = state.medians()
    assert medians is not None and medians.cut_points == {"size": (2.5, 5.0, 7.5)}


async def test_every_partition_answers_in_one_median_sub_round_and_each_step_counts_them_all(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Issue 11: with one partition per sub-round, a step of the search heard
    from 1/k_p of the peers, so a round's cut points were much noisier than the
    experiment's. Now partition ``p`` answers in sub-round ``p % median_rounds``
    and a step takes the answers of all its partitions: here partitions 0 and 2
    together move the search where either alone would not, and a partition
    cannot answer in another partition's sub-round."""
    from anonml.aggregator._verify import process_batch
    from anonml.mechanisms import QuantileSearch
    from anonml.protocol import encode_median_report

    document = with_median(spec_document(min_reports_per_survey=0), median_rounds=2)
    document["learning"]["k_p"] = 4
    state, _ = make_round(tmp_path, lambda: T0 + trio.current_time(), document)
    manifest, schedule = state.manifest, state.manifest.schedule
    assert [list(manifest.median_partitions(s)) for s in range(2)] == [[0, 2], [1, 3]]
    peers = [Peer(state, i) for i in range(1, 17)]
    # Three "greater" answers and one "not greater" from each partition that answers.
    answers = [(0, 1)] * 3 + [(0, 0)]

    def alone_moves() -> bool:
        search = QuantileSearch(0, 10, manifest.eps_median, (0.5,))
        search.update(np.array([bit for _, bit in answers]))
        return bool(search.estimates()[0] != 5.0)

    assert not alone_moves()  # one partition's four answers are within eq. 7.2's margin

    async def scenario() -> None:
        await enrolled(state, peers)
        median = schedule.median[0]
        await trio.sleep(median.t_s + median.delta + 1 - state.now())
        by_partition = {p: [peer for peer in peers if peer.partition == p] for p in range(4)}
        assert all(len(members) == 4 for members in by_partition.values())
        frames = [
            peer.packet(manifest.median_survey(p), encode_median_report([answer]))
            for p in (0, 2) for peer, answer in zip(by_partition[p], answers, strict=True)
        ]
        assert process_batch(state, frames, state.now()) == ["accepted"] * 8
        one = by_partition[1][0]
        # Partition 1 answers in sub-round 1: sub-round 0's id is not its survey,
        # and its own survey is not open yet.
        assert process_batch(state, [one.packet(SurveyId.median(state.round_id, 1, 0), encode_median_report([(0, 1)]))],
                             state.now()) == ["unknown-survey"]
        assert process_batch(state, [one.packet(manifest.median_survey(1), encode_median_report([(0, 1)]))],
                             state.now()) == ["outside-window"]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(scenario)
        outcome = await drive_round(state)
    assert outcome == "done"
    second = state.thresholds(1)
    assert second is not None and second.sub_round == 1 and second.thresholds == ((7.5,),)


async def test_a_comparison_pool_answers_the_search_and_data_partitions_answer_none(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Issue 11: with ``learning.comparison_pool`` the pool's partitions (``k_p`` and ``k_p + 1`` here,
    one per sub-round) answer the search, one bit each naming its feature; a data partition's median
    answer is an unknown survey, and a pool answer naming a feature the round does not have is a
    bad message. The pool's answers alone move the search."""
    from anonml.aggregator._verify import process_batch
    from anonml.protocol import encode_median_report, encode_pool_answer

    document = with_median(spec_document(min_reports_per_survey=0), median_rounds=2)
    document["learning"].update({"plan": "one", "k_p": 2, "k_s": 2, "comparison_pool": 0.5})
    state, _ = make_round(tmp_path, lambda: T0 + trio.current_time(), document)
    manifest, schedule = state.manifest, state.manifest.schedule
    # One comparison at the full ε_T for a pool peer, one report at the full ε_T for a data peer.
    assert (manifest.comparison_pool, manifest.eps_median, manifest.eps_data, manifest.eps_total) == (500, 2.0, 2.0, 2.0)
    assert [list(manifest.median_partitions(s)) for s in range(2)] == [[2], [3]]
    peers = [Peer(state, i) for i in range(1, 41)]

    async def scenario() -> None:
        await enrolled(state, peers)
        by_partition = {p: [peer for peer in peers if peer.partition == p] for p in range(4)}
        assert [len(by_partition[p]) for p in range(4)] == [10, 10, 10, 10]
        median = schedule.median[0]
        await trio.sleep(median.t_s + median.delta + 1 - state.now())
        pool = by_partition[2]
        frames = [peer.packet(manifest.median_survey(2), encode_pool_answer(0, 0, 1)) for peer in pool[:-1]]
        frames.append(pool[-1].packet(manifest.median_survey(2), encode_pool_answer(1, 0, 1)))  # no feature 1
        # A data peer holds no median survey: not its sub-round's, not the pool's.
        frames.append(by_partition[0][0].packet(SurveyId.median(state.round_id, 0, 0), encode_median_report([(0, 1)])))
        frames.append(by_partition[0][1].packet(manifest.median_survey(2), encode_pool_answer(0, 0, 1)))
        # (the last: a data peer's token names its own partition, not the pool's)
        assert process_batch(state, frames, state.now()) == ["accepted"] * 9 + ["bad-message", "unknown-survey", "wrong-partition"]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(scenario)
        outcome = await drive_round(state)
    assert outcome == "done"
    # Nine "greater" answers at ε = 2 are beyond eq. 7.2's margin (0.46/(0.76·3) = 0.20): the step moved up.
    second = state.thresholds(1)
    assert second is not None and second.thresholds == ((7.5,),)
    assert state.shortfall(schedule.phases) == {}


async def test_a_full_inbox_answers_busy_and_unauthenticated_frames_are_never_stored(tmp_path: Path) -> None:
    """Issue 13 "sink flood": random frames were stored durably before any MAC check (5,603 per
    second from one connection) until the inbox cap made honest relays' packets BUSY."""
    from anonml.aggregator._sink import InboxLimits, PacketSink
    from anonml.transport import AckStatus

    clock = SettableClock(T0 + 1)
    state, _ = make_round(tmp_path, clock)
    peers = credentialed_peers(state, clock)
    data = state.manifest.schedule.data
    clock.now = data.t_s + data.delta + 1
    # The whole inbox's cap (each relay's share of it is tested in test_sink_fairness.py).
    sink = PacketSink(state, IssuerWorkers(state.secrets.issuer_key), inbox=InboxLimits(max_inbox=3, max_per_relay=3))
    rng = np.random.default_rng(3)
    garbage = [rng.bytes(state.geometry.packet_size) for _ in range(500)]
    assert await sink.on_packets(garbage) == [AckStatus.REJECTED] * 500
    assert state.store.inbox_size() == 0 and sink.pending_refusals() == {"bad-packet": 500}
    oracle = state.data_oracle(0, 0)
    report = oracle.encode_report(oracle.privatize(np.array([1]), rng)[0])
    honest = [p.packet(SurveyId.data(state.round_id, p.partition, 0), report) for p in peers]
    assert await sink.on_packets(honest[:2]) == [AckStatus.ACCEPTED] * 2
    assert await sink.on_packets(honest[2:]) == [AckStatus.BUSY] * 2  # the inbox holds 3
    assert state.store.inbox_size() == 2 and state.link_errors["inbox-full"] == 2
    # The refusals rode on the commit of the authentic ones.
    assert state.store.rejections() == {"bad-packet": 500} and sink.pending_refusals() == {}


async def test_concurrent_registrations_are_group_committed(served: Any) -> None:
    state, addresses, _ = served
    keys = [SigningKey(bytes([i]) * 32) for i in range(1, 41)]
    codes: list[int] = []
    # One address may hold HttpLimits().max_connections_per_source connections (issue 25): an honest
    # client keeps its pool within that, and its 40 requests queue for the pool's connections.
    pool = httpx.Limits(max_connections=HttpLimits().max_connections_per_source)
    async with httpx.AsyncClient(base_url=addresses.http_url, limits=pool) as client:

        async def register(key: SigningKey) -> None:
            body = RegisterRequest.create(key, state.round_id).to_json()
            codes.append((await client.post("/v1/register", content=body)).status_code)

        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(register, key)
    assert codes == [200] * len(keys)
    assert state.store.roster() == sorted(bytes(k.verify_key) for k in keys)


async def test_the_roster_waits_for_registrations_admitted_before_the_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from anonml.aggregator._health import Health
    from anonml.aggregator._service import RegistrationBatcher

    state, _ = make_round(tmp_path, lambda: T0 + trio.current_time())
    batcher = RegistrationBatcher(state, Health())
    deadline = state.manifest.schedule.t_register_end
    peers = [SigningKey(bytes([i]) * 32) for i in range(1, 4)]

    async def late_but_admitted() -> None:
        await trio.sleep(deadline - 1 - state.now())
        async with trio.open_nursery() as nursery:
            for key in peers:
                nursery.start_soon(batcher.register, RegisterRequest.create(key, state.round_id), "local")
            # The batcher only starts committing after the deadline has passed.
            await trio.sleep(5)
            nursery.start_soon(batcher.run)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(late_but_admitted)
        outcome = await drive_round(state, registrations=batcher)
        nursery.cancel_scope.cancel()
    # min_participation is 2: the three admitted in time count, and are on the final roster.
    assert outcome == "failed"  # nobody obtained a credential
    assert "credentials issued" in json.loads(state.store.get_result("outcome") or b"{}")["reason"]
    assert state.roster().keys == tuple(sorted(bytes(k.verify_key) for k in peers))


async def credential_requests_at_once(served: Any, blindings: int, copies: int) -> tuple[RoundState, list[httpx.Response]]:
    """One registered peer's credential requests, ``blindings`` different ones sent ``copies`` times each, all at once."""
    state, addresses, clock = served
    peer = Peer(state, 1)
    peer.register()
    Peer(state, 2).register()
    clock.now = state.manifest.schedule.t_register_end
    state.prepare()
    partition = state.assignment()[peer.identity]
    bodies = []
    for _ in range(blindings):
        request, _ = begin_issuance(peer.public, peer.secret, partition)
        bodies += [CredentialRequest.create(peer.key, state.round_id, request.to_bytes()).to_json()] * copies
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=addresses.http_url) as client:

        async def ask(body: bytes) -> None:
            answers.append(await client.post("/v1/credential", content=body))

        async with trio.open_nursery() as nursery:
            for body in bodies:
                nursery.start_soon(ask, body)
    return state, answers


async def test_two_concurrent_credential_requests_get_one_credential(served: Any) -> None:
    state, answers = await credential_requests_at_once(served, blindings=2, copies=1)
    assert sorted(answer.status_code for answer in answers) == [200, 409]
    assert state.store.counts()["credentials"] == 1


async def test_identical_credential_requests_at_once_get_the_one_stored_answer(served: Any) -> None:
    state, answers = await credential_requests_at_once(served, blindings=1, copies=3)
    assert [answer.status_code for answer in answers] == [200] * 3
    assert len({answer.content for answer in answers}) == 1
    assert state.store.counts()["credentials"] == 1


async def short_data_round(tmp_path: Path, senders: int | None = None, **participation: Any) -> tuple[RoundState, str, list[str]]:
    """Eight peers; only partition 0 sends its data report (partition 1's survey gets none), only
    its first ``senders`` peers if given.

    Returns the round, its outcome and the phases learning ran in (empty if it never ran).
    """
    from anonml.aggregator._verify import process_batch

    state, _ = make_round(tmp_path, lambda: T0 + trio.current_time(), **participation)
    schedule = state.manifest.schedule
    peers = [Peer(state, i) for i in range(1, 9)]
    rng = np.random.default_rng(5)
    learnt: list[str] = []

    async def peers_send() -> None:
        await enrolled(state, peers)
        assert {peer.partition for peer in peers} == {0, 1}
        await trio.sleep(schedule.data.t_s + schedule.data.delta + 1 - state.now())
        frames = []
        for peer in [p for p in peers if p.partition == 0][:senders]:
            oracle = state.data_oracle(0, 0)
            frames.append(peer.packet(SurveyId.data(state.round_id, 0, 0), oracle.encode_report(oracle.privatize(np.array([0]), rng)[0])))
        assert set(process_batch(state, frames, state.now())) == {"accepted"}

    def learn(s: RoundState) -> dict[str, Any]:
        learnt.append(str(s.status(s.learning_started_at).phase))
        return {}

    async with trio.open_nursery() as nursery:
        nursery.start_soon(peers_send)
        outcome = await drive_round(state, learn)
    return state, outcome, learnt


async def test_a_round_with_a_survey_below_the_minimum_ends_degraded(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    state, outcome, learnt = await short_data_round(tmp_path, min_reports_per_survey=1)
    assert outcome == "degraded" and learnt == ["learning"]  # the model is still learnt, from what arrived
    assert state.status(state.now()).phase == "degraded"
    detail = json.loads(state.store.get_result("outcome") or b"{}")
    assert detail["shortfall"] == {"data 1/0": 0}
    assert "data 1/0 accepted 0" in detail["reason"] and "at least 1" in detail["reason"]


async def test_a_fail_spec_round_below_the_minimum_fails_without_learning(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    state, outcome, learnt = await short_data_round(tmp_path, min_reports_per_survey=1, on_shortfall="fail")
    assert outcome == "failed" and learnt == []
    assert state.status(state.now()).phase == "failed"
    detail = json.loads(state.store.get_result("outcome") or b"{}")
    assert detail["shortfall"] == {"data 1/0": 0} and detail["reason"].startswith("too few reports")
    # Decided when the data phase's final check closed, not later.
    assert trio.current_time() == pytest.approx(state.manifest.schedule.data.t_r - T0)


async def test_a_round_that_meets_the_minimum_is_done(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    # The same round with partition 1's survey allowed to be empty (minimum 0): nothing is short.
    state, outcome, learnt = await short_data_round(tmp_path, min_reports_per_survey=0, on_shortfall="fail")
    assert outcome == "done" and learnt == ["learning"]
    assert state.shortfall(state.manifest.schedule.phases) == {}


async def test_the_shuffle_figure_counts_the_reports_a_survey_holds_not_the_partitions_peers(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from anonml.aggregator._dashboard import dashboard_data
    from anonml.aggregator._report import _privacy

    state, outcome, _ = await short_data_round(tmp_path, senders=2, min_reports_per_survey=0)
    assert outcome == "done" and min(state.partition_sizes()) > 2
    # Two reports were shuffled together in the only data survey that has any: the bound is about
    # those two, whatever the partition's size (and at n = 2 no shuffle bound holds).
    assert state.shuffled_reports() == [2]
    report_figure = _privacy(state)["central_per_survey"]
    assert report_figure["n"] == 2 and "epsilon" not in report_figure
    page = dashboard_data(state, None)["privacy"]
    assert page["figures"]["n"] == 2 and "central_epsilon" not in page["figures"]


def test_min_reports_per_survey_defaults_to_half_a_partitions_share() -> None:
    spec = parse_round_spec(spec_document(min_participation=40))  # k_p = 2: 40 / 2 / 2
    assert (spec.min_reports_per_survey, spec.participation.on_shortfall) == (10, "degraded")
    assert parse_round_spec(spec_document(min_participation=2)).min_reports_per_survey == 1
    with pytest.raises(RoundSpecError) as refused:
        parse_round_spec(spec_document(on_shortfall="ignore"))
    assert refused.value.field == "participation.on_shortfall"


@pytest.mark.parametrize("senders", [3, 2])
async def test_the_dashboard_claims_unlinkability_only_as_far_as_the_smallest_survey_measured(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, senders: int
) -> None:
    """Issue 24: the page said "the aggregator cannot tell which peer sent which report" whatever the sets were.
    Now it says so only once the smallest survey that closed with reports holds the signed minimum (and two at least)."""
    from anonml.aggregator._dashboard import dashboard_data, privacy_statement

    claim = "cannot tell which of the senders of a survey sent each report"
    holds = senders >= 3
    # 8 peers, 4 per partition; the spec promises 3 (its 6 peers at minimum participation leave 3 per partition).
    state, outcome, _ = await short_data_round(tmp_path, senders=senders, min_reports_per_survey=0, min_participation=6, min_anonymity_set=3)
    assert outcome == "done" and state.manifest.min_anonymity_set == 3
    assert state.smallest_anonymity_set(state.now()) == senders
    privacy = dashboard_data(state, None)["privacy"]
    assert privacy["figures"]["anonymity_set_min"] == senders and privacy["figures"]["min_anonymity_set"] == 3
    assert any(claim in sentence for sentence in privacy["sentences"]) is holds
    below = [w for w in privacy["warnings"] if "below the round's minimum anonymity set of 3" in w]
    assert (below == []) is holds
    if not holds:
        assert "closed with 2 report(s)" in below[0] and "hides among 2 senders only" in below[0]
    # Before any survey closes nothing is measured, and nothing is claimed beyond the signed promise.
    before = privacy_statement(state.manifest, None, None)
    assert not any(claim in sentence for sentence in before["sentences"])
    assert any("the round's signed minimum is 3" in sentence for sentence in before["sentences"])
    # One report in a survey names its sender, whatever the round promised.
    alone = privacy_statement(state.manifest, None, 1)
    assert any("its one report names its sender" in warning for warning in alone["warnings"])
    # `anonml aggregator report` flags a smallest set below the minimum.
    (line,) = [line for line in summarise({"anonymity": {"messages": 5, "links": "links.json", "chance": 0.25,
                                                          "anonymity_set_min": 2, "min_anonymity_set": 3}})
               if line.startswith("anonymity:")]
    assert "smallest anonymity set 2, BELOW the round's minimum 3" in line


@pytest.mark.parametrize("ending", ["degraded", "failed"])
async def test_the_driver_reads_and_writes_the_store_off_its_event_loop(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, store_calls_on_the_loop: list[tuple[str, ...]], ending: str,
) -> None:
    """The event loop that drives the round also serves the sink and the API: on PostgreSQL each store call is
    a round trip, and some read a whole survey's reports. The driver polled the inbox on the loop every 50 ms
    until each check, and counted, published and ended the round there."""
    state, outcome, _ = await short_data_round(tmp_path, min_reports_per_survey=1,
                                               on_shortfall="fail" if ending == "failed" else "degraded")
    assert outcome == ending
    driver = {"drive_round", "_settle", "_beacon_plan", "_fail"}
    assert [callers for callers in store_calls_on_the_loop if driver & set(callers)] == []
