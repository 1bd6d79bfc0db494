"""Stand-ins for a peer and a clock, for tests and benchmarks that drive a round without the peer client."""

from __future__ import annotations

from nacl.signing import SigningKey

from anonml.aggregator import RoundState
from anonml.crypto import (
    Credential,
    CredentialSecret,
    IssuerPublicKey,
    NodeAddress,
    PathHop,
    begin_issuance,
    build_packet,
    finish_issuance,
    make_token,
)
from anonml.protocol import (
    CredentialRequest,
    RegisterRequest,
    SurveyId,
    SurveyMessage,
    hop_windows,
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

    def register(self, invitation: str | None = None) -> bool:
        return self.state.register(RegisterRequest.create(self.key, self.state.round_id, invitation))

    def obtain_credential(self) -> int:
        """Blind issuance through :meth:`RoundState.issue`; returns the partition."""
        partition = self.state.assignment()[self.identity]
        request, issuance = begin_issuance(self.public, self.secret, partition)
        response = self.state.issue(CredentialRequest.create(self.key, self.state.round_id, request.to_bytes()))
        self.credential = finish_issuance(issuance, response.response)
        self.partition = response.partition
        return response.partition

    def packet(
        self,
        survey: SurveyId,
        report: bytes,
        *,
        credential: Credential | None = None,
        public: IssuerPublicKey | None = None,
        tamper: bool = False,
    ) -> bytes:
        """A one-hop Sphinx packet (straight to the aggregator) carrying a token for ``report``."""
        chosen = credential or self.credential
        if chosen is None:
            raise ValueError("no credential: call obtain_credential() or pass one")
        bound = SurveyMessage(survey, b"\x00", report).bound_bytes()
        token = make_token(public or self.public, chosen, survey.to_bytes(), bound)
        if tamper:
            token = token[:-1] + bytes([token[-1] ^ 1])
        geometry = self.state.geometry
        body = SurveyMessage(survey, token, report).to_bytes(geometry.message_size)
        hop = self.state.manifest.aggregator_hop
        window = hop_windows(self.state.manifest.schedule, survey, 1)[-1]
        path = [PathHop(hop.node_id, NodeAddress(hop.host, hop.port), hop.public_key, window)]
        return build_packet(geometry, path, body)


class SettableClock:
    """A UTC clock that reads what it was last set to (the bench, and tests with sockets where MockClock cannot serve)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
