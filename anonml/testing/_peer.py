"""Stand-ins for a peer and a clock, for tests and benchmarks that drive a round without the peer client."""

from __future__ import annotations

from collections.abc import Sequence

from nacl.signing import SigningKey

from anonml.aggregator import RoundState
from anonml.crypto import (
    Credential,
    CredentialSecret,
    IssuerPublicKey,
    NodeAddress,
    PathHop,
    ReleaseWindow,
    begin_issuance,
    build_packet,
    finish_issuance,
    make_token,
)
from anonml.protocol import (
    CoverMessage,
    CredentialRequest,
    RegisterRequest,
    SurveyId,
    SurveyMessage,
    acceptance_window,
    bound_bytes,
    seal_report,
)


class SimulatedPeer:
    """A peer reduced to what the aggregator sees of it: registration, credential, packets.

    Used by the bench and the tests to drive a round without the peer client.
    """

    def __init__(self, state: RoundState, identity_seed: bytes) -> None:
        self.state = state
        self.key = SigningKey(identity_seed)
        self.public = IssuerPublicKey.from_bytes(state.manifest.token_public_key)
        self.secret = CredentialSecret.generate()
        self.credential: Credential | None = None
        self.partition = -1

    @property
    def identity(self) -> bytes:
        return bytes(self.key.verify_key)

    def register(self, invitation: str | None = None, client: str = "local") -> bool:
        return self.state.register(RegisterRequest.create(self.key, self.state.round_id, invitation), client)

    def obtain_credential(self) -> int:
        """Blind issuance through :meth:`RoundState.issue`; returns the partition."""
        partition = self.state.assignment()[self.identity]
        request, issuance = begin_issuance(self.public, self.secret, partition)
        response = self.state.issue(CredentialRequest.create(self.key, self.state.round_id, request.to_bytes()))
        self.credential = finish_issuance(issuance, response.response)
        self.partition = response.partition
        return response.partition

    def message(
        self,
        survey: SurveyId,
        report: bytes,
        *,
        credential: Credential | None = None,
        public: IssuerPublicKey | None = None,
        tamper: bool = False,
    ) -> bytes:
        """The end-to-end message carrying a token for ``report`` (what the final Sphinx layer holds)."""
        chosen = credential or self.credential
        if chosen is None:
            raise ValueError("no credential: call obtain_credential() or pass one")
        size = self.state.geometry.message_size
        if not tamper and public is None:
            return seal_report(self.public, chosen, survey, report, size).message
        token = make_token(public or self.public, chosen, survey.to_bytes(), bound_bytes(survey, report))
        if tamper:
            token = token[:-1] + bytes([token[-1] ^ 1])
        return SurveyMessage(survey, token, report).to_bytes(size)

    def packet(self, survey: SurveyId, report: bytes, *, via: Sequence[PathHop] = ()) -> bytes:
        """A Sphinx packet carrying this peer's honest :meth:`message` for ``report``, through the relay
        hops ``via`` (none: straight to the aggregator)."""
        return self.packet_carrying(survey, self.message(survey, report), via=via)

    def packet_carrying(self, survey: SurveyId, message: bytes, *, via: Sequence[PathHop] = ()) -> bytes:
        """A Sphinx packet for ``survey`` carrying ``message`` (say one :meth:`message` forged), through
        the relay hops ``via`` (none: straight to the aggregator)."""
        if not via:
            return self.state.manifest.packet([], survey, message)
        hop = self.state.manifest.aggregator_hop
        window = ReleaseWindow(*acceptance_window(self.state.manifest.schedule, survey))
        path = [*via, PathHop(hop.node_id, NodeAddress(hop.host, hop.port), hop.public_key, window)]
        return build_packet(self.state.geometry, path, message)

    def cover(self, survey: SurveyId) -> bytes:
        """A one-hop cover packet for ``survey`` (what a peer sends in the second chance when its receipt is in the log)."""
        return self.state.manifest.packet([], survey, CoverMessage(survey).to_bytes(self.state.geometry.message_size))


def enrol(state: RoundState, clock: SettableClock, identity_seeds: Sequence[bytes]) -> list[SimulatedPeer]:
    """Peers registered while registration is open on ``clock``, then (the clock moved to its end and
    the round prepared, as the driver does) each holding its credential."""
    peers = [SimulatedPeer(state, seed) for seed in identity_seeds]
    for peer in peers:
        peer.register()
    clock.now = state.manifest.schedule.t_register_end
    state.prepare()
    for peer in peers:
        peer.obtain_credential()
    return peers


class SettableClock:
    """A UTC clock that reads what it was last set to (the bench, and tests with sockets where MockClock cannot serve)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
