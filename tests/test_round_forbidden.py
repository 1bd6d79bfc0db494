"""Every forbidden submission in a whole round, on the simulator (``anonml.simulate``): the real
aggregator service, relays and honest peers' ``join_round`` in one process on ``MockClock``, beside a
registered peer that misbehaves. Each forbidden submission is rejected and counted by reason in the
report: a double submission, a forged token, an outsider's token (its own issuer), a token for another
partition's survey, a replayed message (the same message in a fresh packet over another path); an
exact replay of a packet is dropped by the first relay. Every honest message is still accepted.

(``tests/test_e2e_round.py`` runs the same checks over relay processes and real TCP in the system suite:
a minute and more of wall-clock windows; this round takes seconds and does not depend on the machine.)
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import trio

from anonml.crypto import (
    CredentialSecret,
    IssuerPublicKey,
    IssuerSecretKey,
    begin_issuance,
    finish_issuance,
    issue_credential,
    make_token,
)
from anonml.peer import (
    AggregatorClient,
    Dataset,
    Event,
    Peer,
    PeerIdentity,
    PeerRound,
    PeerStore,
    RoundPipeline,
    RoundSession,
    mirror_clients,
    open_transport,
)
from anonml.protocol import SECOND_WINDOW_PATHS, FeatureSpec, RelayEntry, SurveyId, SurveyMessage, bound_bytes, encode_median_report
from anonml.simulate import Adversary, RoundContext, SimulationConfig, simulate_round
from anonml.transport import AckStatus, LinkClient

HONEST = 8
CONFIG = SimulationConfig(peers=HONEST, seed=3)
# Outside the honest peers' addresses (10.1.x.y) and the roles' (10.0.x.y).
MISBEHAVING_IP = "10.2.0.1"


class MisbehavingPeer(Adversary):
    """A registered peer that sends every forbidden submission, as a task beside the round's roles.

    ``sent`` records each forbidden packet's acknowledgement at the first relay (the relay cannot read
    the message, so it accepts all but the exact replay); ``done`` says the task reached its end."""

    def __init__(self, store_path: Path) -> None:
        super().__init__()
        self.store_path = store_path
        self.sent: dict[str, AckStatus | None] = {}
        self.done = False

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        context.nursery.start_soon(self.misbehave, context)

    async def misbehave(self, context: RoundContext) -> None:
        # Attached before the roles start serving: begin a virtual second later, as the honest peers do.
        await trio.sleep(1.0)
        node = context.network.node(MISBEHAVING_IP)
        client = AggregatorClient(context.manifest.aggregator_url, network=node, jitter=random.Random(0))
        signed = await client.manifest()
        manifest = signed.manifest
        geometry = manifest.sphinx_geometry()
        pipeline = RoundPipeline.for_spec(FeatureSpec.from_dict(dict(manifest.features)))
        row = {"age": 40.0, "colour": "red", "y": "1"}
        peer = Peer(PeerIdentity.generate(), PeerStore(self.store_path, durable=False),
                    pipeline.vector_of(Dataset((Event(row, None, 1),))), np.random.default_rng(100))

        async def wait_until(when: float) -> None:
            await trio.sleep(max(0.0, when - context.clock()))

        async def send(path: list[RelayEntry], packet: bytes) -> AckStatus | None:
            link = LinkClient(path[0].host, path[0].port, packet_size=geometry.packet_size,
                              geometry_hash=geometry.canonical_hash(), network=node)
            try:
                (status,) = await link.send_batch([packet], give_up_at=trio.current_time() + 5)
            finally:
                await link.aclose()
            return status

        def packet(survey: SurveyId, token: bytes, report: bytes, path: list[RelayEntry]) -> bytes:
            return manifest.packet(path, survey, SurveyMessage(survey, token, report).to_bytes(geometry.message_size))

        async with open_transport(packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash(),
                                  network=context.network, local_address=MISBEHAVING_IP) as transport:
            session = RoundSession(client, transport, now=context.clock, mirror_client=mirror_clients(node),
                                   mirror_order=random.Random(0))
            run = PeerRound(peer, session, signed, pipeline, lambda _: None)
            await run.register()
            partition, _, _ = await run.partition()
            credential = await run.obtain_credential(partition)
            issuer = IssuerPublicKey.from_bytes(manifest.token_public_key)
            mine = SurveyId.data(signed.round_id, partition, 0)
            theirs = SurveyId.data(signed.round_id, 1 - partition, 0)
            # An outsider: a credential from its own issuer key, never registered.
            outsider_key = IssuerSecretKey.generate()
            request, issuance = begin_issuance(outsider_key.public_key(), CredentialSecret.generate(), partition)
            outsider = finish_issuance(issuance, issue_credential(outsider_key, request.to_bytes(), partition).to_bytes())
            # A replayed message: its median answer, then the same message in a fresh packet over another path.
            median = manifest.median_survey(partition)
            thresholds = await session.thresholds(manifest, median.sub_round)
            answer = encode_median_report([(0, 0)] * len(thresholds.features))
            token = make_token(issuer, credential, median.to_bytes(), bound_bytes(median, answer))
            encoded = SurveyMessage(median, token, answer).to_bytes(geometry.message_size)
            first_path, second_path = list(manifest.relays[:3]), list(manifest.relays[1:4])
            original = manifest.packet(first_path, median, encoded)
            await wait_until(manifest.schedule.median[median.sub_round].t_s + 0.2)
            self.sent["median"] = await send(first_path, original)
            self.sent["median-replayed-message"] = await send(second_path, manifest.packet(second_path, median, encoded))
            # the very same bytes again: the first relay's replay cache drops them
            self.sent["median-replayed-packet"] = await send(first_path, original)

            one, two = bytes([1]), bytes([2])
            plan = {
                "first": packet(mine, make_token(issuer, credential, mine.to_bytes(), bound_bytes(mine, one)), one, first_path),
                "double": packet(mine, make_token(issuer, credential, mine.to_bytes(), bound_bytes(mine, two)), two, first_path),
                "forged": packet(mine, os.urandom(len(token)), one, first_path),
                "outsider": packet(mine, make_token(outsider_key.public_key(), outsider, mine.to_bytes(), bound_bytes(mine, one)), one,
                                   first_path),
                "other-partition": packet(theirs, make_token(issuer, credential, theirs.to_bytes(), bound_bytes(theirs, one)), one,
                                          first_path),
            }
            await wait_until(manifest.schedule.data.t_s + 0.5)
            for name, forbidden in plan.items():
                self.sent[name] = await send(first_path, forbidden)
            await session.aclose()
        await client.aclose()
        self.done = True


def test_a_simulated_round_rejects_every_forbidden_submission_and_counts_it_by_reason(tmp_path: Path) -> None:
    misbehaving = MisbehavingPeer(tmp_path / "misbehaving.sqlite")
    trace = simulate_round(CONFIG, misbehaving)
    assert misbehaving.done, "the misbehaving peer did not reach its last packet"
    accepted_at_relay = {name: status is AckStatus.ACCEPTED for name, status in misbehaving.sent.items()}
    assert accepted_at_relay == {"median": True, "median-replayed-message": True, "median-replayed-packet": False,
                                 "first": True, "double": True, "forged": True, "outsider": True, "other-partition": True}
    assert trace.outcome == "done"
    results = [p.result for p in trace.peers]
    assert all(r is not None for r in results), [p.error or p.refused for p in trace.peers]
    honest_messages = sum(r.packets for r in results if r is not None)
    assert sum(r.missing + r.unconfirmed for r in results if r is not None) == 0
    rejected = trace.report["rejected"]
    assert rejected.get("double-submission") == 1
    assert rejected.get("wrong-partition") == 1
    # the replayed median answer, and the second copy of each honest second-window message (issue 27)
    second_window = sum(r.deferred + r.resends for r in results if r is not None)
    assert rejected.get("duplicate") == 1 + (SECOND_WINDOW_PATHS - 1) * second_window
    assert sum(v for k, v in rejected.items() if k.startswith("bad-token/")) == 2  # the forged token and the outsider's
    # honest messages, the misbehaving peer's median answer and its first data message: nothing else
    assert trace.report["counts"]["accepted"] == honest_messages + 2
    assert trace.report["model"] is not None
