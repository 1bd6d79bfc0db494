"""The adversary as a program: what a malicious aggregator and its colluding relays may do in a simulated round.

DESIGN.md §2: about *who sent what* the aggregator may be actively malicious
— delay, withhold or tailor any answer per requester — and relays may
collude (drop, delay, record who sent what) while one relay on each path is
honest. An :class:`Adversary` gets two hooks into a simulated round:

* every HTTP request to the aggregator passes :meth:`Adversary.on_request`
  first (an ASGI interposer in front of the real API, so it sees the
  requester's address, the path and the time) and may be delayed or withheld
  (the client then times out as it would over TCP);
* :meth:`Adversary.attach` hands it the in-memory network, where it may
  stand in front of a relay's link address (:meth:`MemoryNetwork.interpose`)
  as that relay's colluding operator: record each frame's sender and time,
  acknowledge it, and drop it or pass it on;
* an answer it lets through may be altered (:attr:`HttpAction.alter`), and
  re-signed with the round's own identity key (:attr:`RoundContext.signing_key`:
  the adversary *is* the aggregator), as :class:`TailoredLog` does; it may
  read a request's body (:attr:`HttpAction.inspect`) or answer a request
  itself (:attr:`HttpAction.answer`), as a round it runs for one peer alone
  needs (:class:`RoundOfItsOwn`).

What it observes goes to an :class:`AdversaryView`; the linking estimator
(``_property``) reads only that view and the aggregator's own store.
Strategies compose (:class:`Composite`), and :class:`RandomStrategy` draws
per-requester delays, withholdings and drops from a seed, so the search
covers attacks nobody named.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import trio
from nacl.signing import SigningKey
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from anonml.aggregator import RoundState
from anonml.crypto import IssuerSecretKey
from anonml.protocol import (
    PATH_MANIFEST,
    PATH_MEDIANS,
    PATH_REGISTER,
    PATH_ROSTER,
    PATH_ROSTER_HEAD,
    Attempt,
    MedianThresholds,
    ReceiptSegment,
    RegisterResponse,
    RoundManifest,
    SignedDocument,
    SignedManifest,
    TreeHead,
    receipt_leaves_root,
)
from anonml.simulate._names import StrategyName
from anonml.transport import (
    AckStatus,
    Dial,
    LinkClient,
    LinkError,
    LinkSessionStats,
    MemoryNetwork,
    WorkDemand,
    connection_pair,
    serve_link,
)

Clock = Callable[[], float]

# How long a withheld answer is held: past every window of a simulated round.
WITHHOLD_SECONDS = 100_000.0
# How long a colluding relay tries to hand a frame it passes on to its own relay.
FORWARD_SECONDS = 30.0


@dataclass(frozen=True)
class HttpRecord:
    """One request as the aggregator saw it: when, from which address, which method and path."""

    at: float
    address: str
    method: str
    path: str


@dataclass(frozen=True)
class FrameRecord:
    """One link frame a colluding relay took from a sender: when, from whom, whether it was dropped, the work asked."""

    at: float
    relay: int
    source: str
    dropped: bool
    work_bits: int = 0
    """The work the relay asked of it (it answered MORE_WORK for a stamp short of that, or regardless)."""


@dataclass
class AdversaryView:
    """Everything the adversary observed or did in one round, besides its own store (arrivals with their times)."""

    http: list[HttpRecord] = field(default_factory=list)
    held: list[tuple[HttpRecord, float]] = field(default_factory=list)
    """Requests it answered late: each with when its answer went out (inf: never)."""
    frames: list[FrameRecord] = field(default_factory=list)
    isolated: set[str] = field(default_factory=set)
    """Addresses of peers that went on in a round the adversary ran for them alone (only its Sybils beside
    them): everything such a peer sends there is its own, so the adversary links all of it."""


@dataclass(frozen=True)
class RoundContext:
    """What an adversary is handed when the round starts.

    ``relays`` are the relays' link addresses in manifest order; ``nursery``
    runs whatever the adversary serves itself (a colluding relay's link);
    ``signing_key`` is the aggregator's identity key, which signs the round's
    documents (a malicious aggregator signs whatever it likes with it).
    """

    network: MemoryNetwork
    view: AdversaryView
    clock: Clock
    manifest: RoundManifest
    relays: Sequence[tuple[str, int]]
    nursery: trio.Nursery
    signing_key: SigningKey
    state: RoundState
    """The aggregator's round itself: its store, secrets and plan (the adversary *is* the aggregator)."""


@dataclass(frozen=True)
class HttpAction:
    """What to do with one request: answer after ``delay`` seconds, or never (``withhold``);
    ``alter`` rewrites the body of a successful (200) answer before it goes out; ``inspect`` reads the
    request's body (the aggregator sees every request it is sent: which identity registered from which address)."""

    delay: float = 0.0
    withhold: bool = False
    alter: Callable[[bytes], bytes] | None = None
    inspect: Callable[[bytes], None] | None = None
    answer: bytes | None = None
    """Answer 200 with this body itself, without asking the round's API (a round the adversary runs alone)."""


class Adversary:
    """The base adversary: an honest aggregator and honest relays. Strategies override the hooks.

    ``targets`` are the addresses of the peers it wants to link (the linking
    estimator scores its guesses for them; an honest adversary targets a
    peer too, so its figures are the baseline).
    """

    name = "honest"

    def __init__(self, targets: Sequence[str] = ()) -> None:
        self.targets = frozenset(targets)
        self.context: RoundContext | None = None

    @property
    def manifest(self) -> RoundManifest | None:
        return self.context.manifest if self.context is not None else None

    def attach(self, context: RoundContext) -> None:
        """Called once as the round starts, with the network, where to record, the round's clock and manifest."""
        self.context = context

    def on_request(self, record: HttpRecord) -> HttpAction:
        """Decide what happens to one request to the aggregator (called after it is recorded)."""
        return HttpAction()

    def describe(self) -> str:
        return self.name


class Composite(Adversary):
    """Several strategies at once: the longest delay wins, any withholding wins, every interposer stands,
    every alteration and inspection applies, the first part's own answer wins."""

    def __init__(self, parts: Sequence[Adversary]) -> None:
        super().__init__(sorted(frozenset().union(*(p.targets for p in parts))))
        self.parts = list(parts)
        self.name = "+".join(p.name for p in parts)

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        for part in self.parts:
            part.attach(context)

    def on_request(self, record: HttpRecord) -> HttpAction:
        actions = [part.on_request(record) for part in self.parts]
        alters = [a.alter for a in actions if a.alter is not None]
        inspects = [a.inspect for a in actions if a.inspect is not None]
        answers = [a.answer for a in actions if a.answer is not None]
        return HttpAction(max((a.delay for a in actions), default=0.0), any(a.withhold for a in actions),
                          functools.reduce(lambda f, g: lambda body: g(f(body)), alters) if alters else None,
                          functools.partial(_inspect_all, inspects) if inspects else None, answers[0] if answers else None)


def _inspect_all(inspects: Sequence[Callable[[bytes], None]], body: bytes) -> None:
    for inspect in inspects:
        inspect(body)


class LateDocuments(Adversary):
    """Hold the answers a target's sends depend on (thresholds, medians) until its first packets can no longer go.

    No collusion and every document genuine: the attack of issue 24's first
    bullet. Each answer goes out at the phase's first check (``t_c``), after
    every first-hop window has closed and before the second send window. A
    peer that then sent its report late, in the second window, would be the
    one report there among covers.
    """

    name = "late-documents"

    def on_request(self, record: HttpRecord) -> HttpAction:
        if record.address not in self.targets or self.manifest is None:
            return HttpAction()
        schedule = self.manifest.schedule
        if record.path == PATH_MEDIANS:
            until = schedule.data.t_c
        elif record.path.startswith("/v1/median/"):
            sub_round = int(record.path.rsplit("/", 1)[1]) if record.path.rsplit("/", 1)[1].isdecimal() else 0
            until = schedule.median[min(sub_round, len(schedule.median) - 1)].t_c
        else:
            return HttpAction()
        return HttpAction(delay=max(0.0, until - record.at) + 1.0)


class DroppingRelay(Adversary):
    """A colluding first-hop relay: it records who sends each frame, acknowledges it, and drops the targets' frames.

    Acknowledged and dropped, a target's packet never reaches the aggregator:
    the attack of issue 24's second bullet. Every other sender's frames pass
    through to the real relay unchanged. With ``attempt``, it drops only the
    frames handed over in that send window of each phase and forwards the
    targets' other frames to the real relay (from the relay's own address:
    the operator hands them to its own relay), each recorded as not dropped.
    """

    name = "dropping-relay"

    def __init__(self, targets: Sequence[str] = (), relay: int = 0, attempt: Attempt | None = None) -> None:
        super().__init__(targets)
        self.relay = relay
        self.attempt = attempt

    def drops_now(self, manifest: RoundManifest, now: float) -> bool:
        """Whether a frame handed over at ``now`` is dropped (a second's grace after each window, as clocks skew)."""
        if self.attempt is None:
            return True
        windows = [phase.send_window(self.attempt) for phase in manifest.schedule.phases]
        return any(start <= now <= end + 1 for start, end in windows)

    def attach(self, context: RoundContext) -> None:
        super().attach(context)

        async def on_packets_from(source: str, forward: LinkClient, session: LinkSessionStats,
                                  frames: list[bytes]) -> list[AckStatus]:
            dropped = self.drops_now(context.manifest, context.clock())
            context.view.frames.extend(FrameRecord(context.clock(), self.relay, source, dropped) for _ in frames)
            if dropped:
                return [AckStatus.ACCEPTED] * len(frames)
            return await forward_frames(forward, frames)

        collude_on_link(context, self.relay, self.targets, on_packets_from)


TargetPackets = Callable[[str, LinkClient, LinkSessionStats, list[bytes]], Awaitable[list[AckStatus]]]
"""A colluding relay's answer to a batch of a target's frames: ``(source, forward, session, frames)``."""


async def forward_frames(forward: LinkClient, packets: Sequence[bytes]) -> list[AckStatus]:
    """Hand ``packets`` on to the colluding operator's own relay; their statuses (BUSY where none came)."""
    statuses = await forward.send_batch(packets, give_up_at=trio.current_time() + FORWARD_SECONDS)
    return [AckStatus.BUSY if status is None else status for status in statuses]


def collude_on_link(context: RoundContext, relay: int, targets: frozenset[str], on_packets_from: TargetPackets,
                    work: WorkDemand | None = None) -> None:
    """Stand in front of relay ``relay``'s link address for the targets' connections, as its colluding operator.

    Each batch of a target's frames goes to ``on_packets_from(source, forward, session, frames)``: ``forward``
    hands frames on to the real relay (from the relay's own address: the operator hands them to its own
    relay), ``session.work_context`` binds the frames' stamps when ``work`` asks the target for work (then
    each frame is packet then stamp). Every other sender's link reaches the real relay untouched.
    """
    address = tuple(context.relays[relay])
    geometry = context.manifest.sphinx_geometry()
    previous = context.network.on_connect

    async def collude(dial: Dial) -> None:
        if previous is not None:
            await previous(dial)
        if dial.destination != address or dial.source[0] not in targets:
            return
        # The colluding operator answers the target's link itself; the relay's own listener gets a
        # connection that is closed at once (as a sender that gave up would leave it).
        ours, dial.server = dial.server, await _closed_stream(dial)
        forward = LinkClient(*address, packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash(),
                             network=context.network, local_address=address[0])
        context.nursery.start_soon(serve_colluding_link, ours, forward, dial.source[0])

    async def serve_colluding_link(stream: trio.abc.Stream, forward: LinkClient, source: str) -> None:
        session = LinkSessionStats()
        try:
            await serve_link(stream, functools.partial(on_packets_from, source, forward, session),
                             packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash(), stats=session,
                             work=work)
        except LinkError:
            pass  # the sender went quiet or away, as links do
        finally:
            await trio.aclose_forcefully(stream)
            await forward.aclose()

    context.network.on_connect = collude


class TailoredLog(Adversary):
    """Serve the targets a first-check receipt log that leaves receipts out, under heads re-signed with the round's key.

    The attack of issue 12's first bullet: a peer shown a log without its
    receipt would resend, and the duplicate tag would name it. The aggregator
    cannot tell whose receipts are whose, so by default it leaves out every
    receipt (the target's among them); ``leave_out`` narrows that to the
    digests it picks. Its mirrors get the genuine heads: a peer that compares
    holds two signed heads for one slot, a proof of equivocation.
    """

    name = "tailored-log"

    def __init__(self, targets: Sequence[str] = (), leave_out: Callable[[bytes], bool] = lambda digest: True) -> None:
        super().__init__(targets)
        self.leave_out = leave_out

    def on_request(self, record: HttpRecord) -> HttpAction:
        first_check = re.fullmatch(r"/v1/receipts/\w+/\d+/0", record.path) is not None
        return HttpAction(alter=self.tailor) if first_check and record.address in self.targets else HttpAction()

    def tailor(self, body: bytes) -> bytes:
        assert self.context is not None, "attached before the round serves anything"
        segment = ReceiptSegment.from_json(body)
        heads, leaves = [], {}
        for document in segment.heads:
            head = TreeHead.from_document(document)
            kept = leaves[head.survey] = tuple(d for d in segment.leaves[head.survey] if not self.leave_out(d))
            heads.append(TreeHead(head.survey, head.check, len(kept), receipt_leaves_root(kept)).sign(self.context.signing_key))
        return ReceiptSegment(tuple(heads), leaves).to_json()


class TailoredThresholds(Adversary):
    """Serve the targets their own thresholds: every cut point moved to the feature's lower end, re-signed.

    The attack of issue 24's fifth bullet: a cut point nobody else was asked
    about tags the target's answer. The mirrors get the genuine document, so
    a peer that holds its thresholds up to them finds two signed documents
    for one slot before it answers.
    """

    name = "tailored-thresholds"

    def on_request(self, record: HttpRecord) -> HttpAction:
        tailored = record.address in self.targets and re.fullmatch(r"/v1/median/\d+", record.path) is not None
        return HttpAction(alter=self.tailor) if tailored else HttpAction()

    def tailor(self, body: bytes) -> bytes:
        assert self.context is not None, "attached before the round serves anything"
        genuine = MedianThresholds.from_document(SignedDocument.from_json(body, max_bytes=len(body)))
        moved = tuple(tuple(0.0 for _ in values) for values in genuine.thresholds)
        tailored = MedianThresholds(genuine.sub_round, genuine.features, moved)
        return tailored.sign(self.context.signing_key, self.context.manifest.round_id).to_json()



class RoundOfItsOwn(Adversary):
    """Show the targets a round of their own: another name, the same schedule, its own issuer key.

    Issue 24's fourth bullet. The targets get the rival manifest, signed with
    the round's identity key, and the aggregator accepts their registration
    to it itself; beside them it would put only Sybils, so whatever they
    send there is theirs. The mirrors hold the real manifest, so a target
    that compares finds two manifests of one signer whose schedules overlap.
    A target that asks for the rival round's roster went on past that check:
    it is recorded as isolated (:attr:`AdversaryView.isolated`).
    """

    name = "round-of-its-own"

    def __init__(self, targets: Sequence[str] = ()) -> None:
        super().__init__(targets)
        self.rival: SignedManifest | None = None
        self.registered: set[str] = set()

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        genuine = context.manifest
        issuer = IssuerSecretKey.generate().public_key()
        rival = replace(genuine, name=f"{genuine.name}-for-you", token_public_key=issuer.to_bytes(), token_kid=issuer.kid)
        self.rival = SignedManifest.sign(rival, context.signing_key)

    def on_request(self, record: HttpRecord) -> HttpAction:
        if record.address not in self.targets or self.rival is None:
            return HttpAction()
        if record.path == PATH_MANIFEST:
            return HttpAction(answer=self.rival.to_json())
        if record.path == PATH_REGISTER:
            self.registered.add(record.address)
            return HttpAction(answer=RegisterResponse(True).to_json())
        if record.path in (PATH_ROSTER, PATH_ROSTER_HEAD) and record.address in self.registered and self.context is not None:
            # The rival round's roster would list it and the Sybils alone: it did not notice.
            self.context.view.isolated.add(record.address)
            return HttpAction(withhold=True)
        return HttpAction()


RELAY_PREFIX = "10.0.1."
"""The simulated relays' addresses (``_world.relay_ip``): where the mirrors' fetches come from."""


class StarvedMirrors(RoundOfItsOwn):
    """Starve the mirrors, then show the targets a round of their own (issue 24's third bullet).

    The aggregator never answers the relays' own fetches of the manifest, so
    no mirror holds it: a target shown a round made for it alone finds no
    rival manifest to prove it, and nothing confirms the round either. Only
    the mirror quorum stops it: a manifest fewer than a majority of the
    listed mirrors hold is refused before the credential (every peer is
    starved alike, so every peer stops).
    """

    name = "starved-mirrors"

    def on_request(self, record: HttpRecord) -> HttpAction:
        if record.address.startswith(RELAY_PREFIX) and record.path == PATH_MANIFEST:
            return HttpAction(withhold=True)
        return super().on_request(record)


def grind_partitions(targets: Sequence[str]) -> Adversary:
    """Partition grinding with Sybil nonces (``_grind``, imported here: it builds on this module's Adversary)."""
    from anonml.simulate._grind import GrindPartitions

    return GrindPartitions(targets)


def first_hop_work(targets: Sequence[str]) -> Adversary:
    """Colluding first relays asking the targets alone for work (``_work``, imported here: it builds on this module)."""
    from anonml.simulate._work import FirstHopWork

    return FirstHopWork(targets)


def first_hop_work_held(targets: Sequence[str]) -> Adversary:
    """The same, every stamp refused and each refusal held until just before the client's ack timeout."""
    from anonml.simulate._work import held_first_hop_work

    return held_first_hop_work(targets)


def lying_mirror_clocks(targets: Sequence[str]) -> Adversary:
    """Colluding mirrors stating a false clock to the targets (``_clocks``, imported here: it builds on this module)."""
    from anonml.simulate._clocks import LyingMirrorClocks

    return LyingMirrorClocks(targets)


async def _closed_stream(dial: Dial) -> trio.abc.Stream:
    """A server end whose client end is already gone."""
    client, server = connection_pair(dial.source, dial.destination)
    await client.aclose()
    return server


class RandomStrategy(Adversary):
    """Per-requester delays and withholdings on random paths, and random first-hop drops or work, drawn from a seed.

    Each draw picks targets, a set of API paths to disturb for them, a delay
    (or withholding) per path, and whether one relay colludes by dropping
    their frames; if none drops, whether one asks them for work (``_work``:
    its level, how often it refuses a paid stamp, how long it holds each
    refusal). The work is drawn after everything else, so a seed's earlier
    draws are those it made before work was drawn at all. Strategies nobody
    named come from here.
    """

    name = "random"
    PATHS = ("/v1/manifest", "/v1/register", "/v1/roster", "/v1/credential", "/v1/median/", "/v1/medians",
             "/v1/receipts/", "/v1/heads")

    def __init__(self, targets: Sequence[str], seed: int) -> None:
        super().__init__(targets)
        rng = np.random.default_rng(seed)
        chosen = rng.random(len(self.PATHS)) < 0.4
        self.delays = {path: (math.inf if rng.random() < 0.2 else float(rng.exponential(40.0)))
                       for path, pick in zip(self.PATHS, chosen) if pick}
        self.dropper = DroppingRelay(targets, relay=int(rng.integers(4))) if rng.random() < 0.5 else None
        self.worker: Adversary | None = None
        if self.dropper is None and rng.random() < 0.5:
            from anonml.simulate._work import FirstHopWork  # it builds on this module's Adversary

            hold = float(rng.exponential(10.0)) if rng.random() < 0.5 else 0.0
            self.worker = FirstHopWork(targets, relays=(int(rng.integers(4)),), bits=int(rng.integers(12, 21)),
                                       refusals=int(rng.integers(5)), hold=hold)
        self.name = f"random-{seed}"

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        if self.dropper is not None:
            self.dropper.relay %= len(context.relays)
            self.dropper.attach(context)
        if self.worker is not None:
            self.worker.attach(context)

    def on_request(self, record: HttpRecord) -> HttpAction:
        if record.address not in self.targets:
            return HttpAction()
        for prefix, delay in self.delays.items():
            if record.path.startswith(prefix):
                return HttpAction(withhold=True) if math.isinf(delay) else HttpAction(delay=delay)
        return HttpAction()

    def describe(self) -> str:
        paths = ", ".join(f"{p}{'=withheld' if math.isinf(d) else f'+{d:.0f}s'}" for p, d in self.delays.items())
        relay = f"; relay {self.dropper.relay} drops" if self.dropper is not None else ""
        work = f"; {self.worker.describe()}" if self.worker is not None else ""
        return f"{self.name} ({paths or 'no HTTP change'}{relay}{work})"


def asgi_interposer(app: ASGIApp, adversary: Adversary, view: AdversaryView, clock: Clock) -> ASGIApp:
    """The aggregator's API with the adversary in front: each request is recorded, then delayed or withheld."""

    async def interposed(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return
        client = scope.get("client") or ("unknown", 0)
        record = HttpRecord(clock(), str(client[0]), str(scope.get("method", "")), str(scope.get("path", "")))
        view.http.append(record)
        action = adversary.on_request(record)
        if action.withhold or action.delay > 0:
            view.held.append((record, math.inf if action.withhold else record.at + action.delay))
        if action.inspect is not None:
            receive = await _inspected(receive, action.inspect)
        if action.withhold:
            await trio.sleep(WITHHOLD_SECONDS)
        elif action.delay > 0:
            await trio.sleep(action.delay)
        if action.answer is not None:
            await _answer(send, action.answer)
            return
        await app(scope, receive, send if action.alter is None else _altering(send, action.alter))

    return interposed


async def _answer(send: Send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _inspected(receive: Receive, inspect: Callable[[bytes], None]) -> Receive:
    """Read the whole request body, hand it to ``inspect``, and give the app a ``receive`` that replays it."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    inspect(b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request"))

    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return replay


def _altering(send: Send, alter: Callable[[bytes], bytes]) -> Send:
    """``send`` for an answer whose body ``alter`` rewrites if its status is 200 (its length header follows)."""
    start: list[Message] = []
    chunks: list[bytes] = []

    async def altered(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.append(message)
            return
        if message["type"] != "http.response.body" or not start:
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = b"".join(chunks)
        if start[0]["status"] == 200:
            body = alter(body)
        headers = [(k, v) for k, v in start[0].get("headers", []) if k.lower() != b"content-length"]
        await send({**start[0], "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return altered


STRATEGIES: dict[StrategyName, Callable[[Sequence[str]], Adversary]] = {
    StrategyName.HONEST: Adversary,
    StrategyName.LATE_DOCUMENTS: LateDocuments,
    StrategyName.DROPPING_RELAY: DroppingRelay,
    StrategyName.LATE_DOCUMENTS_DROPPING_RELAY: lambda targets: Composite([LateDocuments(targets), DroppingRelay(targets)]),
    StrategyName.TAILORED_LOG: TailoredLog,
    StrategyName.TAILORED_THRESHOLDS: TailoredThresholds,
    StrategyName.STARVED_MIRRORS: StarvedMirrors,
    StrategyName.ROUND_OF_ITS_OWN: RoundOfItsOwn,
    StrategyName.GRIND_PARTITIONS: grind_partitions,
    StrategyName.FIRST_HOP_WORK: first_hop_work,
    StrategyName.FIRST_HOP_WORK_HELD: first_hop_work_held,
    StrategyName.LYING_MIRROR_CLOCKS: lying_mirror_clocks,
}
"""The named strategies, each built for a set of target addresses (one per :class:`StrategyName`)."""
