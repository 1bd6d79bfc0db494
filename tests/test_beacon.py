"""Partitions nobody can bias (issue 24; DESIGN.md §3 step 3): the relays commit to fresh values before
registration closes, the signed roster head carries the commitments, the relays reveal only after, and the
partition seed is ``H(seed ‖ root ‖ r_1 ‖ … ‖ r_m)``.

The simulated rounds (every role's real code on a virtual clock) show the aggregator's Sybil grinding
isolating a target under the old seed ``H(seed ‖ root)`` and failing under the new one, and the peers
refusing a head without a listed relay's commitment or a reveal that does not open its commitment.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from dataclasses import replace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from nacl.signing import SigningKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from anonml.aggregator import AggregatorHome, RoundState
from anonml.aggregator._beacon import store_commitment
from anonml.aggregator._setup import create_round, open_round
from anonml.aggregator._spec import parse_round_spec
from anonml.base.errors import AnonMLError
from anonml.crypto import generate_keypair
from anonml.protocol import (
    BeaconCommitment,
    BeaconStatement,
    DocumentKind,
    InvalidApiMessage,
    InvalidBeacon,
    InvalidManifest,
    RegisterRequest,
    RosterHead,
    RosterResponse,
    SignedDocument,
    SignedManifest,
    beacon_commitment,
    canonical_json,
    partition_seed,
)
from anonml.protocol._manifest import _signed_bytes
from anonml.relay._beacon import RelayBeacon
from anonml.simulate import Adversary, HttpAction, HttpRecord, RoundContext, RoundSetup, SimulationConfig, peer_ip, simulate_round
from anonml.simulate._grind import GrindPartitions
from anonml.transport import Dial, HttpLimits, MemoryListener, connection_pair, serve_http_on
from test_peer_aggregator import spec_document

# --- the formula and the parsers -----------------------------------------------------------------------


def test_the_partition_seed_takes_every_reveal_and_keeps_v1_without_any() -> None:
    seed, root = bytes(range(32)), bytes(32)
    reveals = [bytes([1]) * 32, bytes([2]) * 32]
    v2 = partition_seed(seed, root, reveals)
    assert v2 != partition_seed(seed, root)
    assert v2 != partition_seed(seed, root, [reveals[0], bytes([3]) * 32])
    assert v2 != partition_seed(seed, root, reveals[::-1])  # the head's order counts
    with pytest.raises(ValueError):
        partition_seed(seed, root, [b"short"])


def test_a_beacon_statement_parses_strictly() -> None:
    round_id, value = bytes(32), bytes([7]) * 32
    statement = BeaconStatement(bytes(16), round_id, beacon_commitment(round_id, value), value)
    assert BeaconStatement.from_json(statement.to_json()) == statement and statement.opened()
    assert not BeaconStatement(bytes(16), round_id, statement.commitment, bytes([8]) * 32).opened()
    good = json.loads(statement.to_json())
    for broken in (
        {**good, "reveal": "00" * 31},
        {**good, "reveal": "ZZ" * 32},
        {**good, "round_id": "00" * 33},
        {**good, "extra": 1},
        {k: v for k, v in good.items() if k != "commitment"},
        {**good, "node_id": "00" * 65},
    ):
        with pytest.raises(InvalidBeacon):
            BeaconStatement.from_json(json.dumps(broken))
    with pytest.raises(InvalidBeacon):
        BeaconStatement.from_json(b" " * 2000 + statement.to_json())


@pytest.fixture
def state(tmp_path: Path) -> RoundState:
    """A round (not served) whose three relays are listed as mirrors."""
    home = AggregatorHome(tmp_path / "agg")
    home.initialise(bytes(range(32)), generate_keypair()[0])
    document = spec_document(register_seconds=100)
    for index, relay in enumerate(document["network"]["relays"]):
        relay["mirror_port"] = 9100 + index
    round_state, _ = create_round(home, parse_round_spec(document), now=int(time.time()))
    return round_state


def _head(state: RoundState, beacon: tuple[BeaconCommitment, ...]) -> SignedDocument:
    return RosterResponse.create(state.secrets.signing_key, state.round_id, [], state.secrets.seed, beacon).head


def test_the_signed_head_carries_the_commitments_and_refuses_a_relay_listed_twice(state: RoundState) -> None:
    entries = (BeaconCommitment(bytes(16), bytes(32)), BeaconCommitment(bytes([1]) * 16, bytes([1]) * 32))
    assert RosterHead.from_document(_head(state, entries)).beacon == entries
    assert b"beacon" not in _head(state, ()).body  # protocol v1 heads are unchanged
    body = {**json.loads(_head(state, entries).body), "beacon": [e.to_dict() for e in entries[:1] * 2]}
    twice = SignedDocument.create(state.secrets.signing_key, DocumentKind.ROSTER_HEAD, state.round_id, body)
    with pytest.raises(InvalidApiMessage, match="twice"):
        RosterHead.from_document(twice)


def test_a_restarted_aggregator_signs_the_same_head_with_the_stored_commitments(state: RoundState, tmp_path: Path) -> None:
    relays = state.manifest.relays
    for index, relay in enumerate(relays[::-1]):  # collected in any order, listed in the manifest's
        store_commitment(state.store, relay.node_id, bytes([index]) * 32)
    store_commitment(state.store, relays[0].node_id, bytes([9]) * 32)  # a second one for a relay is ignored
    home = AggregatorHome(tmp_path / "agg")  # the fixture's
    clock = [float(state.manifest.schedule.t_register_end)]
    state.clock = lambda: clock[0]
    state.prepare()
    head = RosterHead.from_document(state.final_roster.head)  # type: ignore[union-attr]
    assert [entry.node_id for entry in head.beacon] == [relay.node_id for relay in relays]
    assert head.beacon[0].commitment == bytes([2]) * 32
    assert state.plan is None  # the partitions wait for the reveals
    state.store.close()
    again = open_round(home, state.round_id.hex(), clock=lambda: clock[0])
    again.prepare()
    assert again.final_roster is not None and again.final_roster.head.same_as(state.final_roster.head)  # type: ignore[union-attr]


def test_a_statement_counts_as_the_relays_only_with_its_signature_over_every_field() -> None:
    key, other = SigningKey(bytes([1]) * 32), SigningKey(bytes([2]) * 32)
    beacon_key = bytes(key.verify_key)
    round_id, value = bytes(32), bytes([7]) * 32
    signed = BeaconStatement(bytes(16), round_id, beacon_commitment(round_id, value), value).sign(key)
    assert BeaconStatement.from_json(signed.to_json()) == signed and signed.signed_by(beacon_key)
    forged_value = bytes([8]) * 32
    for forged in (
        replace(signed, reveal=forged_value, commitment=beacon_commitment(round_id, forged_value)),  # opens, not signed
        replace(signed, reveal=None),
        replace(signed, node_id=bytes([1]) * 16),
        replace(signed, round_id=bytes([1]) * 32),
        replace(signed, signature=None),
        BeaconStatement(bytes(16), round_id, signed.commitment, value).sign(other),
    ):
        assert not forged.signed_by(beacon_key), forged
    with pytest.raises(InvalidBeacon):
        BeaconStatement.from_json({**json.loads(signed.to_json()), "signature": "00" * 63})


# --- the relay ------------------------------------------------------------------------------------------


def test_a_relay_reveals_only_after_registration_for_a_head_carrying_its_commitment(state: RoundState, tmp_path: Path) -> None:
    relay = state.manifest.relays[0]
    clock = [float(state.manifest.schedule.t_register_end - 1)]
    identity = state.manifest.identity_key
    beacon = RelayBeacon(tmp_path / "relay", relay.node_id, SigningKey(bytes(32)), now=lambda: clock[0], draw=lambda: bytes([9]) * 32)
    beacon.update(identity, state.signed, None)
    statement = beacon.statement(identity, state.signed)
    assert statement is not None and statement.reveal is None and statement.node_id == relay.node_id
    own = BeaconCommitment(relay.node_id, statement.commitment)
    other = BeaconCommitment(state.manifest.relays[1].node_id, bytes(32))

    beacon.update(identity, state.signed, _head(state, (own, other)))  # registration still open
    clock[0] += 1
    beacon.update(identity, state.signed, _head(state, (other,)))  # a head lacking its commitment
    beacon.update(identity, state.signed, _head(state, (BeaconCommitment(relay.node_id, bytes(32)), other)))  # a changed one
    assert beacon.statement(identity, state.signed).reveal is None  # type: ignore[union-attr]
    assert beacon.counts == {"withheld/no-roster-head": 1, "withheld/registration-open": 1, "withheld/commitment-missing": 1, "withheld/commitment-changed": 1}

    beacon.update(identity, state.signed, _head(state, (own, other)))
    revealed = beacon.statement(identity, state.signed)
    assert revealed is not None and revealed.reveal == bytes([9]) * 32 and revealed.opened()


def test_a_restarted_relay_serves_the_same_value(state: RoundState, tmp_path: Path) -> None:
    relay = state.manifest.relays[0]
    draws = iter([bytes([1]) * 32, bytes([2]) * 32])
    identity = state.manifest.identity_key

    def started() -> RelayBeacon:
        beacon = RelayBeacon(tmp_path / "relay", relay.node_id, SigningKey(bytes(32)), now=time.time, draw=lambda: next(draws))
        beacon.update(identity, state.signed, None)
        return beacon

    first = started().statement(identity, state.signed)
    again = started().statement(identity, state.signed)
    assert first is not None and again is not None and first.commitment == again.commitment
    assert first.commitment == beacon_commitment(state.round_id, bytes([1]) * 32)
    assert next(draws) == bytes([2]) * 32  # the restarted relay drew nothing new
    assert (tmp_path / "relay" / "beacon").stat().st_mode & 0o077 == 0


# --- whole simulated rounds -----------------------------------------------------------------------------

HONEST = 6
GRIND = SimulationConfig(peers=HONEST, seed=5)


def _without_mirrors(document: dict[str, Any]) -> None:
    """A manifest listing no relay mirror: the round keeps protocol v1's ``H(seed ‖ root)``."""
    for relay in document["network"]["relays"]:
        relay.pop("mirror_port", None)


def _target_key(config: SimulationConfig, index: int) -> bytes:
    """Simulated peer ``index``'s identity key, as the simulator derives it from the seed."""
    return bytes(SigningKey(hashlib.sha256(f"{config.seed}:identity:{index}".encode()).digest()).verify_key)


@pytest.mark.slow
def test_sybil_grinding_isolates_a_target_under_the_old_seed_and_not_once_relays_reveal_after_the_head() -> None:
    # The setting: 6 honest peers, 2 partitions, 4 Sybils ground to fill the target's partition.
    old = GrindPartitions(target_key=_target_key(GRIND, 0), sybils=4)
    simulate_round(GRIND, old, setup=RoundSetup(adjust_spec=_without_mirrors))
    assert old.aimed == old.achieved == old.mates == 4, (old.aimed, old.achieved, old.mates)  # only Sybils beside it

    new = GrindPartitions(target_key=_target_key(GRIND, 0), sybils=4)
    trace = simulate_round(GRIND, new)
    assert new.aimed == 4 and new.mates is not None  # it found the same isolation in what it could compute...
    assert new.achieved is not None and new.achieved < new.mates  # ...and the relays' values, revealed after, undid it
    assert all(p.result is not None for p in trace.peers), [p.refused or p.error for p in trace.peers]


class _StripCommitment(Adversary):
    """An aggregator that signs, for everyone, a roster head without relay 0's beacon commitment."""

    name = "strip-commitment"

    def on_request(self, record: HttpRecord) -> HttpAction:
        if record.path in ("/v1/roster", "/v1/roster/head"):
            return HttpAction(alter=self._strip_roster if record.path == "/v1/roster" else self._strip_head)
        return HttpAction()

    def _resign(self, head: SignedDocument) -> SignedDocument:
        assert self.context is not None
        parsed = RosterHead.from_document(head)
        kept = tuple(e for e in parsed.beacon if e.node_id != self.context.manifest.relays[0].node_id)
        return RosterHead(parsed.size, parsed.root, parsed.seed, kept).sign(self.context.signing_key, self.context.manifest.round_id)

    def _strip_head(self, body: bytes) -> bytes:
        return self._resign(SignedDocument.from_json(body, max_bytes=1 << 20)).to_json()

    def _strip_roster(self, body: bytes) -> bytes:
        roster = RosterResponse.from_json(body)
        return RosterResponse(self._resign(roster.head), roster.entries).to_json()


@pytest.mark.slow
def test_a_head_without_a_listed_relays_commitment_is_refused_by_every_peer_and_the_relay_never_reveals() -> None:
    trace = simulate_round(SimulationConfig(peers=4, seed=2), _StripCommitment())
    assert {p.refused.reason for p in trace.peers if p.refused is not None} == {"beacon-incomplete"}
    assert all(p.refused is not None for p in trace.peers)
    # The relay withheld its value (its commitment is not in the head it mirrored): no partitions, the round fails.
    assert trace.outcome == "failed" and not trace.arrivals


class _StarveOneMirror(Adversary):
    """An aggregator that never lets relay 0's mirror have the signed roster head: that relay never reveals."""

    name = "starve-one-mirror"

    def on_request(self, record: HttpRecord) -> HttpAction:
        assert self.context is not None
        relay = self.context.manifest.relays[0]
        return HttpAction(withhold=record.address == relay.host and record.path == "/v1/roster/head")


@pytest.mark.slow
def test_a_relay_that_never_reveals_stops_every_peer_before_its_credential_and_fails_the_round() -> None:
    trace = simulate_round(SimulationConfig(peers=4, seed=2), _StarveOneMirror())
    assert [p.refused.reason if p.refused else p.error for p in trace.peers] == ["beacon-unrevealed"] * 4
    assert trace.outcome == "failed" and not trace.arrivals


REVEAL = re.compile(rb'"reveal":"([0-9a-f])')


class _TamperedReveal(Adversary):
    """Relay 0's mirror, as its colluding operator serves it to peers: a revealed value that does not open its commitment."""

    name = "tampered-reveal"

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        relay = context.manifest.relays[0]
        peers = {peer_ip(i) for i in range(64)}

        def flip(data: bytes) -> bytes:
            return REVEAL.sub(lambda m: b'"reveal":"' + (b"1" if m[1] == b"0" else b"0"), data)

        async def tamper(dial: Dial) -> None:
            if dial.destination != (relay.host, relay.mirror_port) or dial.source[0] not in peers:
                return
            # (As in test_anonymity_round's Wiretap: the dialler's bytes come out of ``dial.server``, the listener's
            # answers out of ``ours``.)
            ours, theirs = connection_pair(dial.source, dial.destination)
            context.nursery.start_soon(_pump, dial.server, ours, lambda data: data)
            context.nursery.start_soon(_pump, ours, dial.server, flip)
            dial.server = theirs

        context.network.on_connect = tamper


async def _pump(source: trio.abc.Stream, sink: trio.abc.Stream, change: Callable[[bytes], bytes]) -> None:
    try:
        while data := await source.receive_some():
            await sink.send_all(change(bytes(data)))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(sink)


@pytest.mark.slow
def test_a_reveal_altered_on_its_way_is_not_the_relays_word_and_the_round_stops() -> None:
    # It no longer opens the commitment, and its signature no longer verifies: the peers ignore it as not the
    # relay's, wait for a reveal the relay signed, and stop at t_issue_end.
    trace = simulate_round(SimulationConfig(peers=4, seed=2), _TamperedReveal())
    assert [p.refused.reason if p.refused else p.error for p in trace.peers] == ["beacon-unrevealed"] * 4
    assert not trace.arrivals


def test_the_dashboard_shows_no_partitions_while_the_reveals_are_awaited(state: RoundState) -> None:
    """Between the signed head and the relays' reveals there is no plan: the live page must still render
    (it answered 500 on every poll of that interval)."""
    from anonml.aggregator._dashboard import dashboard_data

    for index, relay in enumerate(state.manifest.relays):
        store_commitment(state.store, relay.node_id, bytes([index]) * 32)
    clock = [float(state.manifest.schedule.t_register_end - 10)]
    state.clock = lambda: clock[0]
    assert state.register(RegisterRequest.create(SigningKey(bytes(32)), state.round_id))
    clock[0] = state.manifest.schedule.t_register_end
    state.prepare()
    assert state.plan is None
    assert dashboard_data(state, None)["partition_sizes"] is None


FORGER = "10.0.9.1"


class _ForgedReveal(Adversary):
    """An aggregator that puts a commitment of its own in relay 0's name into the head it signs, and answers at
    relay 0's mirror address (for peers and itself alike) with a statement revealing the value behind it: a
    value it chose, so partitions it chose. Relay 0 sees its commitment changed and never reveals its own."""

    name = "forged-reveal"
    VALUE = bytes([5]) * 32

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        relay = context.manifest.relays[0]
        assert relay.mirror_port is not None
        forged = BeaconStatement(relay.node_id, context.manifest.round_id,
                                 beacon_commitment(context.manifest.round_id, self.VALUE), self.VALUE)
        # Stored before the aggregator's collector asks relay 0: the head it signs lists this commitment.
        store_commitment(context.state.store, relay.node_id, forged.commitment)

        async def statement(request: Request) -> Response:
            return Response(forged.to_json(), media_type="application/json")

        app = Starlette(routes=[Route("/v1/mirror/{identity}/beacon", statement)])
        listeners: list[MemoryListener] = []

        async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            opened = await context.network.listen(FORGER, relay.mirror_port or 0)
            listeners.extend(listener for listener in opened if isinstance(listener, MemoryListener))
            await serve_http_on(app, opened, HttpLimits(), Counter())

        async def answer_for_relay_0(dial: Dial) -> None:
            if dial.destination == (relay.host, relay.mirror_port) and listeners:
                ours, dial.server = dial.server, connection_pair(dial.source, dial.destination)[1]
                listeners[0].deliver(ours)

        context.nursery.start_soon(serve)
        context.network.on_connect = answer_for_relay_0


@pytest.mark.slow
def test_a_reveal_the_relay_did_not_sign_is_refused_even_when_it_opens_the_commitment_in_the_head() -> None:
    """Unsigned statements let whoever answers at a relay's mirror choose the partitions (the round finished
    with the forger's value on the old code); signed ones leave it only the choice to stop the round."""
    trace = simulate_round(SimulationConfig(peers=4, seed=2), _ForgedReveal())
    assert [p.refused.reason if p.refused else p.error for p in trace.peers] == ["beacon-unrevealed"] * 4
    assert trace.outcome == "failed" and not trace.arrivals


def _without_beacon_keys(document: dict[str, Any]) -> None:
    """The manifest a forger would sign: every relay keeps its mirror, none lists the key its statements are signed with."""
    for relay in document["network"]["relays"]:
        relay.pop("beacon_key", None)


@pytest.mark.slow
def test_a_forged_reveal_cannot_pass_as_unsigned_by_a_manifest_listing_mirrors_without_beacon_keys() -> None:
    """Issue 24: with every beacon key left out, the peers and the aggregator skipped the signature check, and the
    round finished on the forger's value (8 arrivals, no refusal). A relay listed with a mirror must list its key."""
    with pytest.raises(AnonMLError, match=r"relays\[0\]\.beacon_key: a relay listed with a mirror must list its beacon key"):
        simulate_round(SimulationConfig(peers=4, seed=2), _ForgedReveal(), setup=RoundSetup(adjust_spec=_without_beacon_keys))


def test_a_peer_refuses_a_signed_manifest_listing_a_mirror_without_its_beacon_key(state: RoundState) -> None:
    """The aggregator signs whatever manifest it likes: the peer's own parse of it must refuse the keyless mirror."""

    def signed(manifest: dict[str, Any]) -> dict[str, Any]:
        round_id = hashlib.sha256(canonical_json(manifest)).digest()
        signature = state.secrets.signing_key.sign(_signed_bytes(round_id)).signature
        return {"manifest": manifest, "signature": signature.hex(), "round_id": round_id.hex()}

    manifest = state.signed.to_dict()["manifest"]
    assert SignedManifest.from_dict(signed(manifest)) == state.signed  # re-signed as the aggregator signs
    for relay in manifest["network"]["relays"]:
        del relay["beacon_key"]
    with pytest.raises(InvalidManifest, match=r"^manifest\.network\.relays\[0\]\.beacon_key: a relay listed with a mirror"):
        SignedManifest.from_dict(signed(manifest))
