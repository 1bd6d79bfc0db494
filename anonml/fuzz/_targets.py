"""Every parser that reads bytes someone else chose, as a fuzz target (issue 13).

A target is its valid inputs (the fuzzer's seeds, made the way the services
make them) and a function that runs one input through the parser as the
service does: the input either parses or is refused with an
:class:`anonml.base.errors.AnonMLError`; anything else is a bug the fuzz command
counts. Where a MAC or a signature stands in front of a parser, a second
target feeds the parser behind it directly (``manifest-body``, the signed
documents' bodies), so the fuzzer reaches it at all.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tomli_w
import trio
import trio.testing
from nacl.signing import SigningKey

from anonml.aggregator import read_round_spec
from anonml.crypto import (
    ForwardPacket,
    begin_issuance,
    finish_issuance,
    issue_credential,
    never_replayed,
    process_packet,
    verify_token,
)
from anonml.fuzz._world import World, build_world, relay_hop, spec_document
from anonml.peer import RoundPipeline
from anonml.protocol import (
    Check,
    BeaconStatement,
    CredentialRequest,
    CredentialResponse,
    DocumentKind,
    ErrorResponse,
    FeatureSpec,
    HeadsResponse,
    InvalidBeacon,
    MedianResults,
    MedianThresholds,
    ReceiptSegment,
    RegisterRequest,
    RegisterResponse,
    RosterHead,
    RosterResponse,
    RoundManifest,
    RoundStatus,
    SignedDocument,
    SignedManifest,
    SurveyId,
    SurveyMessage,
    TreeHead,
    beacon_commitment,
    canonical_json,
    parse_message,
)
from anonml.transport import (
    HELLO_REPLY_BYTES,
    AckStatus,
    HelloStatus,
    LinkIdentity,
    LinkLimits,
    encode_hello,
    encode_hello_reply,
    parse_acks,
    parse_hello_reply,
    serve_link,
)
from anonml.relay import DirectoryEntry, parse_directory_file, render_directory_file

MAX_DOCUMENT_BYTES = 1 << 20


@dataclass(frozen=True)
class Target:
    """One parser: valid inputs to start from, and how one input is run through it."""

    name: str
    seeds: Sequence[bytes]
    run: Callable[[bytes], object]


# -- the link ---------------------------------------------------------------------------------

_LINK_PACKET_SIZE = 64
_LINK_GEOMETRY = hashlib.sha256(b"fuzz geometry").digest()
_LINK_LIMITS = LinkLimits(max_batch=4, max_pending_frames=8)


class _LinkLoop:
    """One trio loop (MockClock, in a thread) that serves a link session per input.

    ``trio.run`` per input costs milliseconds; a call into a running loop
    costs tens of microseconds. Under MockClock a stream that stops short
    waits out its deadline in no real time. The clock autojumps only while a
    session runs: an autojumping loop with nothing scheduled spins, and this
    thread outlives the fuzzing (a test that built the targets left it holding
    the GIL, and every later test in that pytest worker ran several times slower).
    Sessions run one at a time (:meth:`run` blocks until its session ends).
    """

    def __init__(self, identity: LinkIdentity) -> None:
        self.identity = identity
        self.token: trio.lowlevel.TrioToken | None = None
        self.clock = trio.testing.MockClock()
        ready = threading.Event()

        async def main() -> None:
            self.token = trio.lowlevel.current_trio_token()
            ready.set()
            await trio.sleep_forever()

        thread = threading.Thread(target=trio.run, args=(main,), kwargs={"clock": self.clock}, daemon=True)
        thread.start()
        ready.wait()

    async def _session(self, data: bytes) -> None:
        self.clock.autojump_threshold = 0
        try:
            client, server = trio.testing.memory_stream_pair()
            await client.send_all(data)
            await client.send_eof()
            await serve_link(server, _accept, packet_size=_LINK_PACKET_SIZE, geometry_hash=_LINK_GEOMETRY,
                             limits=_LINK_LIMITS, identity=self.identity)
        finally:
            self.clock.autojump_threshold = math.inf

    def run(self, data: bytes) -> None:
        """The server side of one link session (handshake, then frames) reading ``data`` as the client's bytes."""
        trio.from_thread.run(self._session, data, trio_token=self.token)


async def _accept(frames: list[bytes]) -> list[AckStatus]:
    return [AckStatus.ACCEPTED] * len(frames)


def _link_client(data: bytes) -> None:
    """What a link client parses: the server's hello reply, then acks."""
    parse_hello_reply(data[:HELLO_REPLY_BYTES])
    parse_acks(data[HELLO_REPLY_BYTES:])


# -- documents ------------------------------------------------------------------------------------


def _body_target(name: str, kind: DocumentKind, world: World, seed: SignedDocument,
                 parse: Callable[[SignedDocument], object]) -> Target:
    """A signed document's body parser, fed bodies directly (behind a signature the fuzzer cannot forge)."""
    round_id = world.state.round_id

    def run(data: bytes) -> None:
        document = SignedDocument.from_json(
            b'{"body":' + data + b',"kind":"' + kind.value.encode() + b'","round_id":"' + round_id.hex().encode()
            + b'","signature":"' + bytes(64).hex().encode() + b'"}', max_bytes=MAX_DOCUMENT_BYTES)
        parse(document)

    return Target(name, [seed.body], run)


def _signed_document(world: World) -> Callable[[bytes], object]:
    identity, round_id = world.identity, world.state.round_id

    def run(data: bytes) -> None:
        document = SignedDocument.from_json(data, max_bytes=MAX_DOCUMENT_BYTES)
        document.verify(identity, kind=document.kind, round_id=round_id)

    return run


def _beacon_target(world: World) -> Target:
    """A relay's revealed beacon value as its mirror serves it, read as the aggregator and peers read
    it: parsed, then its relay, round, signature and opening checked in that order
    (``aggregator._beacon``, ``peer._beacon``). The seed is signed and opens its commitment, so the
    fuzzer starts from an input that passes every check; a refusal raises ``InvalidBeacon``."""
    round_id = world.state.round_id
    node_id = b"\x01" * 16  # the fuzz round's one listed relay
    beacon_key = SigningKey(hashlib.sha256(b"fuzz beacon key").digest())
    public = bytes(beacon_key.verify_key)
    value = hashlib.sha256(b"fuzz beacon value").digest()
    seed = BeaconStatement(node_id, round_id, beacon_commitment(round_id, value), value).sign(beacon_key)

    def run(data: bytes) -> None:
        statement = BeaconStatement.from_json(data)
        if statement.node_id != node_id or statement.round_id != round_id:
            raise InvalidBeacon("$", "another relay's or round's statement")
        if not statement.signed_by(public):
            raise InvalidBeacon("signature", "not signed by the relay's beacon key")
        if not statement.opened():
            raise InvalidBeacon("reveal", "absent, or does not open the commitment")

    return Target("beacon-statement", [seed.to_json()], run)


def _spec_seed(world: World) -> bytes:
    """The round's own spec as ``round.toml`` (relays written out, not as files)."""
    return tomli_w.dumps(spec_document(world.relay_public, world.state.geometry)).encode()


def _credential_targets(world: World) -> list[Target]:
    """The credential request over HTTP, the blind issuance's two messages, and the response: for the applicant
    on the roster without a credential, with the round's clock inside the issuance phase."""
    state, applicant = world.state, world.applicant
    issuer = state.secrets.issuer_key
    assert issuer is not None
    applicant_partition = state.assignment()[applicant.identity]
    request, issuance = begin_issuance(applicant.public, applicant.secret, applicant_partition)
    credential = CredentialRequest.create(applicant.key, state.round_id, request.to_bytes()).to_json()
    issuance_response = issue_credential(issuer, request.to_bytes(), applicant_partition).to_bytes()
    issued = CredentialResponse(issuance_response, applicant_partition).to_json()

    def credential_request(data: bytes) -> None:
        # The HTTP path short of its commit: recorded, the applicant's credential would stop every
        # later input at 'already issued', before the issuer.
        world.clock.now = state.manifest.schedule.t_issue_end - 1  # issuance is open only in its phase
        parsed = CredentialRequest.from_json(data)
        partition, _ = state.admit_credential(parsed)
        issue_credential(issuer, parsed.request, partition)

    return [
        Target("http-credential", [credential], credential_request),
        # Behind the request's signature, which the applicant makes over any bytes it likes.
        Target("issuance-request", [request.to_bytes()],
               lambda data: issue_credential(issuer, data, applicant_partition)),
        Target("issuance-response", [issuance_response], lambda data: finish_issuance(issuance, data)),
        Target("credential-response", [issued], CredentialResponse.from_json),
    ]


def build_targets(work: Path) -> dict[str, Target]:
    """Every target, over one round built in ``work``."""
    world = build_world(work)
    state, peer = world.state, world.peers[0]
    manifest = state.manifest
    now = int(world.clock())
    link_identity = LinkIdentity(world.relay_private)
    hello = encode_hello(_LINK_PACKET_SIZE, _LINK_GEOMETRY, nonce=bytes(32))
    frames = bytes(range(_LINK_PACKET_SIZE))

    packet = peer.packet(world.survey, world.report, via=[relay_hop(world)])
    final_key = state.secrets.final_hop_private_key

    def sphinx(data: bytes) -> None:
        forwarded = process_packet(state.geometry, world.relay_private, data, is_replay=never_replayed)
        if isinstance(forwarded, ForwardPacket):
            process_packet(state.geometry, final_key, forwarded.packet, is_replay=never_replayed)

    message = peer.message(world.survey, world.report)
    issuer = state.secrets.issuer_key
    assert issuer is not None
    parsed = SurveyMessage.from_bytes(message)
    token_seed, bound = parsed.token, parsed.bound_bytes()

    def token(data: bytes) -> None:
        verify_token(issuer, world.survey.to_bytes(), bound, data, expected_partition=peer.partition)

    def survey_message(data: bytes) -> None:
        opened = parse_message(data)
        state.check_survey(opened.survey, now)
        if isinstance(opened, SurveyMessage):  # a cover carries no report
            state.check_report(opened.survey, opened.report)

    state.refresh_status(now)
    status = state.snapshots.status
    roster = state.snapshots.roster
    assert status is not None and roster is not None
    roster_response = RosterResponse.from_json(roster)
    state.publish_heads(manifest.schedule.data, Check.FIRST)
    segment = next(iter(state.snapshots.segments.values()))
    heads = state.snapshots.heads
    assert heads is not None
    thresholds = MedianThresholds(0, ("age",), ((30.5, 42.5, 51.0),)).sign(world.signing_key, state.round_id)
    medians = MedianResults({"age": (30.5, 42.5, 51.0)}).sign(world.signing_key, state.round_id)
    tree = HeadsResponse.from_json(heads).heads[0]
    registering = world.registering
    register = RegisterRequest.create(SigningKey(b"\x77" * 32), registering.round_id).to_json()
    pipeline = RoundPipeline.for_spec(FeatureSpec.from_dict(dict(manifest.features)))
    cut_points = {"age": [42.5]}

    def peer_csv(data: bytes) -> None:
        vector = pipeline.vector_of(pipeline.importer.import_bytes(data))
        pipeline.bins(vector, cut_points)

    spec_seed = _spec_seed(world)
    directory = render_directory_file(
        [DirectoryEntry(relay.node_id, relay.host, relay.port) for relay in manifest.relays]).encode()

    targets = [
        Target("link-session", [hello, hello + frames, hello + frames * 3],
               _LinkLoop(link_identity).run),
        Target("link-client", [encode_hello_reply(HelloStatus.OK, nonce=bytes(32)) + bytes([AckStatus.ACCEPTED, AckStatus.BUSY])], _link_client),
        Target("sphinx", [packet], sphinx),
        Target("token", [token_seed], token),
        Target("message", [message], survey_message),
        Target("manifest", [state.manifest_json()],
               lambda data: SignedManifest.from_json(data, expected_identity=world.identity)),
        Target("manifest-body", [canonical_json(manifest.to_dict())], RoundManifest.from_json),
        Target("signed-document", [status, thresholds.to_json(), medians.to_json(), tree.to_json(),
                                   roster_response.head.to_json()], _signed_document(world)),
        _body_target("roster-head", DocumentKind.ROSTER_HEAD, world, roster_response.head, RosterHead.from_document),
        _body_target("thresholds", DocumentKind.THRESHOLDS, world, thresholds, MedianThresholds.from_document),
        _body_target("medians", DocumentKind.MEDIANS, world, medians, MedianResults.from_document),
        _body_target("tree-head", DocumentKind.TREE_HEAD, world, tree, TreeHead.from_document),
        _body_target("status", DocumentKind.STATUS, world, SignedDocument.from_json(status, max_bytes=len(status)),
                     RoundStatus.from_document),
        Target("http-register", [register], lambda data: registering.register(RegisterRequest.from_json(data), "fuzz")),
        *_credential_targets(world),
        Target("register-response", [RegisterResponse(True).to_json()], RegisterResponse.from_json),
        Target("roster-response", [roster], lambda data: RosterResponse.from_json(data).verify(world.identity,
                                                                                                state.round_id)),
        Target("receipt-segment", [segment], lambda data: ReceiptSegment.from_json(data).verify(
            world.identity, state.round_id, Check.FIRST)),
        Target("heads-response", [heads], lambda data: HeadsResponse.from_json(data).verify(world.identity, state.round_id)),
        Target("error-response", [ErrorResponse("registration has closed").to_json()], ErrorResponse.from_json),
        _beacon_target(world),
        Target("peer-csv", [b"colour,age,y\nred,31,1\n", b"y,age,colour\n0,55.5,blue\n"], peer_csv),
        Target("round-spec", [spec_seed], lambda data: read_round_spec(data, base_dir=work)),
        Target("relay-directory", [directory], parse_directory_file),
    ]
    return {target.name: target for target in targets}
