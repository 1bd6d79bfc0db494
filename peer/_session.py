"""The public side of a round, shared by every peer of a process (DESIGN.md §3, §5).

:class:`RoundSession` fetches what every peer of a process fetches alike —
the manifest, the roster, the thresholds, the medians, the receipt-log
segments, the relay mirrors' copies — once per process, and each peer checks
it for itself. A copy counts as confirmed only when a majority of the
relays' mirrors hold the same signed document (:func:`mirror_quorum`); two
different signed documents for one slot are an :class:`Equivocation`, whose
proof the peer stores before it stops.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from anonml.base.errors import AnonMLError
from anonml.crypto import IssuerPublicKey, SphinxGeometry
from anonml.peer._beacon import BeaconRefused, check_commitments, collect_reveals
from anonml.peer._client import AggregatorClient, AggregatorError, answer_by, mirror_clients, retry_delay
from anonml.peer._events import RefusalReason
from anonml.peer._store import EquivocationProof
from anonml.peer._transport import PacketTransport
from anonml.protocol import (
    MAX_CLOCK_ERROR,
    Check,
    DocumentKind,
    FeatureSpec,
    HeadsResponse,
    InvalidDocument,
    MedianResults,
    MedianThresholds,
    PartitionPlan,
    ReceiptSegment,
    RelayEntry,
    RosterHead,
    RosterResponse,
    RoundManifest,
    SgdModel,
    SignedDocument,
    SignedManifest,
    SurveyId,
    SurveyKind,
    TreeHead,
    check_seed,
)

T = TypeVar("T")

# Seconds kept free at the end of a window for the last link round trip.
_MARGIN = 0.5
# How long after t_r a peer waits for the aggregator to publish a phase's final heads.
_SETTLE_SECONDS = 300.0


class JoinRefused(AnonMLError):
    """Raised by :func:`join_round` when the peer declines to continue: the
    manifest changed under it, the seed does not open its commitment, it is
    not on the roster, the aggregator disagrees about its partition, a signed
    document fails to verify, the aggregator equivocated (``"equivocation"``,
    both documents stored), the relays' beacon does not give unbiased
    partitions (``"beacon-incomplete"``, ``"beacon-mismatch"``,
    ``"beacon-unrevealed"``: ``peer._beacon``), its clock is off the relays' (``"clock-off"``), or a release
    would exceed its budget. ``reason``
    is a short machine-readable name (counted by the demo)."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class Equivocation(JoinRefused):
    """Two documents signed by the round's aggregator that contradict each other; ``proof`` holds both."""

    def __init__(self, proof: EquivocationProof) -> None:
        self.proof = proof
        super().__init__("equivocation", f"the aggregator signed two different {proof.kind} documents for one slot; both are stored")


Clock = Callable[[], float]


async def sleep_until_wall(when: float, now: Clock = time.time) -> None:
    """Sleep until wall-clock time ``when`` (UTC seconds; the manifest's times are absolute)."""
    delay = when - now()
    if delay > 0:
        await trio.sleep(delay)


class _SingleFlight:
    """Fetch each keyed document once per process; concurrent askers wait for the first.

    A refusal (a failed check, an equivocation) is kept like a value: every
    peer waiting on that document gets it, nobody fetches again.
    """

    def __init__(self) -> None:
        self._values: dict[object, object] = {}
        self._refusals: dict[object, JoinRefused] = {}
        self._pending: dict[object, trio.Event] = {}

    async def get(self, key: object, fetch: Callable[[], Awaitable[T]]) -> T:
        while True:
            if key in self._values:
                return self._values[key]  # type: ignore[return-value]
            if key in self._refusals:
                raise self._refusals[key]
            pending = self._pending.get(key)
            if pending is None:
                break
            await pending.wait()
        event = self._pending[key] = trio.Event()
        try:
            value = await fetch()
            self._values[key] = value
            return value
        except JoinRefused as refused:
            self._refusals[key] = refused
            raise
        finally:
            del self._pending[key]
            event.set()


def check_clock(offsets: Sequence[float]) -> None:
    """Refuse (``clock-off``) when more than half of the mirrors that told their clock put this machine's
    beyond ``protocol.MAX_CLOCK_ERROR`` on one side: its sends would reach first relays after their windows
    opened, and be refused. A minority of mirrors (colluding relays) can neither force the refusal nor hide it."""
    for side, behind in ((1, "behind"), (-1, "ahead of")):
        off = sorted(side * offset for offset in offsets if side * offset > MAX_CLOCK_ERROR)
        if 2 * len(off) > len(offsets):
            raise JoinRefused(RefusalReason.CLOCK_OFF, f"this machine's clock is at least {off[0]:.1f} s {behind} the "
                              f"clocks of {len(off)} of the round's {len(offsets)} relay mirrors asked; a first relay "
                              "refuses a packet that reaches it after its window opened: set the clock (NTP) and join again")


@dataclass(frozen=True)
class LogView:
    """One partition's receipt-log segment at one check, verified; ``compared`` says whether a mirror agreed."""

    heads: dict[SurveyId, TreeHead]
    documents: dict[SurveyId, SignedDocument]
    leaves: dict[SurveyId, frozenset[bytes]]
    ordered: dict[SurveyId, tuple[bytes, ...]]
    compared: bool

    def contains(self, survey: SurveyId, receipt: bytes) -> bool:
        return receipt in self.leaves.get(survey, frozenset())


@dataclass
class RoundSession:
    """The public side of one round, shared by every peer of a process.

    ``client`` talks to the aggregator; ``transport`` sends packets to
    relays; a mirror client per relay that mirrors (``RelayEntry.mirror_url``)
    is opened on first use. Documents are fetched once per ``key``.
    """

    client: AggregatorClient
    transport: PacketTransport
    now: Clock = time.time
    # CPU-heavy steps (signing, blind issuance, tokens) of thousands of peers
    # in one process take turns here, so the event loop keeps serving sockets
    # between them instead of running every peer's step in one long batch.
    slots: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(32))
    _cache: _SingleFlight = field(default_factory=_SingleFlight)
    _keys: dict[bytes, tuple[SphinxGeometry, IssuerPublicKey]] = field(default_factory=dict)
    _mirrors: dict[str, AggregatorClient] = field(default_factory=dict)
    mirror_client: Callable[[str], AggregatorClient] = field(default=mirror_clients())
    """Opens the client for one relay mirror (tests record what each peer asks)."""
    mirror_order: random.Random = field(default_factory=random.SystemRandom)
    """Shuffles the mirrors each time they are asked (seeded in the simulator, so one seed gives one trace)."""
    unreachable: set[bytes] = field(default_factory=set)
    """Relays (node ids) whose mirror could not be reached when last asked: later paths avoid them."""

    def round_keys(self, signed: SignedManifest) -> tuple[SphinxGeometry, IssuerPublicKey]:
        """The round's packet geometry and token key, parsed once per process."""
        if signed.round_id not in self._keys:
            manifest = signed.manifest
            self._keys[signed.round_id] = (manifest.sphinx_geometry(), IssuerPublicKey.from_bytes(manifest.token_public_key))
        return self._keys[signed.round_id]

    async def aclose(self) -> None:
        for mirror in self._mirrors.values():
            await mirror.aclose()

    def _mirror_clients(self, manifest: RoundManifest) -> list[tuple[RelayEntry, AggregatorClient]]:
        """Every relay mirror the manifest lists, in a random order (each process asks them in its own order)."""
        relays = [relay for relay in manifest.relays if relay.mirror_url is not None]
        self.mirror_order.shuffle(relays)
        for relay in relays:
            assert relay.mirror_url is not None
            if relay.mirror_url not in self._mirrors:
                self._mirrors[relay.mirror_url] = self.mirror_client(relay.mirror_url)
        return [(relay, self._mirrors[relay.mirror_url or ""]) for relay in relays]

    async def _from_mirrors(self, manifest: RoundManifest, fetch: Callable[[AggregatorClient], Awaitable[T | None]], until: float) -> list[T]:
        """What the mirrors answer, one answer per mirror: every mirror is asked, polling until a quorum
        answered (:func:`mirror_quorum`) or ``until`` passes.

        A mirror that cannot be reached is noted in ``unreachable``: its relay
        is down or cut off, and paths chosen later avoid it while others are up.
        """
        answers: dict[bytes, T] = {}
        asked: set[bytes] = set()
        mirrors = self._mirror_clients(manifest)
        quorum = mirror_quorum(manifest)
        attempt = 0
        # Each mirror's attempts share the time left (a black-holed one must not use it all up).
        with answer_by(self.trio_deadline(until)):
            while mirrors:
                for relay, mirror in mirrors:
                    if relay.node_id in answers:
                        continue
                    asked.add(relay.node_id)
                    try:
                        value = await fetch(mirror)
                    except AggregatorError as exc:
                        if exc.status == 0:  # no HTTP answer at all: connection refused, reset or timed out
                            self.unreachable.add(relay.node_id)
                        continue
                    except InvalidDocument:
                        continue
                    self.unreachable.discard(relay.node_id)
                    if value is not None:
                        answers[relay.node_id] = value
                if len(answers) == len(mirrors) or len(answers) >= quorum or self.now() > until:
                    break
                await trio.sleep(retry_delay(attempt))
                attempt += 1
        return list(answers.values())

    def trio_deadline(self, until: float) -> float:
        """Wall time ``until`` (the schedule's clock) as trio time, for :func:`answer_by` and cancel scopes."""
        return trio.current_time() + max(0.0, until - self.now())

    async def manifest(self, phase: str) -> SignedManifest:
        return await self._cache.get(("manifest", phase), self.client.manifest)

    async def compare_manifest(self, signed: SignedManifest) -> bool:
        """Whether a relay mirror holds this very manifest; raises Equivocation if it holds a rival one.

        A rival is another manifest signed by the same identity for a round
        of the same name whose schedule overlaps this one's (DESIGN.md §4:
        every peer must see the same manifest). False when no mirror answered.
        """
        manifest = signed.manifest

        async def compare() -> bool:
            identity = manifest.identity_key
            # One offset per mirror, its latest: a mirror asked again (it answered 404) must not count twice.
            offsets: dict[str, float] = {}

            async def fetch(mirror: AggregatorClient) -> SignedManifest | None:
                mirrored = await mirror.mirrored_manifest(identity)
                if mirror.server_clock is not None:
                    told, at = mirror.server_clock
                    offsets[mirror.base_url] = told - (self.now() - (trio.current_time() - at))
                if mirrored is not None:
                    mirrored.verify(identity)
                return mirrored

            answers = await self._from_mirrors(manifest, fetch, manifest.schedule.t_issue_end - _MARGIN)
            check_clock(list(offsets.values()))
            for mirrored in answers:
                # DESIGN.md §5: two manifests of one signer with overlapping schedules, whatever their names.
                if mirrored.round_id != signed.round_id and _overlap(mirrored.manifest, manifest):
                    raise Equivocation(EquivocationProof(signed.round_id, "manifest", signed.to_json(), mirrored.to_json()))
            return sum(1 for mirrored in answers if mirrored.round_id == signed.round_id) >= mirror_quorum(manifest)

        return await self._cache.get(("compare-manifest", signed.round_id), compare)

    async def _poll(self, key: object, fetch: Callable[[], Awaitable[T | None]], until: float, what: str) -> T:
        async def poll() -> T:
            attempt = 0
            with answer_by(self.trio_deadline(until)):  # a black-holed request must not outlast ``until``
                while True:
                    value = await fetch()
                    if value is not None:
                        return value
                    if self.now() > until:
                        raise AggregatorError(404, f"{what} was not published by {until:.0f}")
                    await trio.sleep(retry_delay(attempt))
                    attempt += 1

        return await self._cache.get(key, poll)

    async def roster(self, signed: SignedManifest) -> tuple[RosterResponse, RosterHead]:
        """The signed roster once final: its head, every entry's own signature and the root checked once
        per process, the seed checked against the commitment, and the head compared with a mirror's."""
        manifest, round_id = signed.manifest, signed.round_id

        async def final() -> RosterResponse | None:
            return await self.client.roster()

        await sleep_until_wall(manifest.schedule.t_register_end, self.now)
        roster = await self._poll("roster", final, manifest.schedule.t_issue_end, "the roster and seed")

        async def check() -> tuple[RosterResponse, RosterHead]:
            try:
                head = roster.verify(manifest.identity_key, round_id)
            except InvalidDocument as exc:
                raise JoinRefused("bad-roster", f"the roster does not verify: {exc}") from None
            if head.seed is None or not check_seed(head.seed, manifest.seed_commitment):
                raise JoinRefused("seed-mismatch", "the revealed seed does not open the manifest's commitment; refusing the round")

            async def fetch(mirror: AggregatorClient) -> SignedDocument | None:
                return await mirror.mirrored_roster_head(manifest.identity_key)

            for mirrored in await self._from_mirrors(manifest, fetch, manifest.schedule.t_issue_end - _MARGIN):
                mirrored.verify(manifest.identity_key, kind=DocumentKind.ROSTER_HEAD, round_id=round_id)
                if not mirrored.same_as(roster.head):
                    raise Equivocation(EquivocationProof(round_id, "roster-head", roster.head.to_json(), mirrored.to_json()))
            # After the comparison: a head tailored to this peer is worth its stored proof more than a refusal.
            try:
                check_commitments(manifest, head)
            except BeaconRefused as refused:
                raise JoinRefused(refused.reason, str(refused)) from None
            return roster, head

        return await self._cache.get("roster-checked", check)

    async def plan(self, signed: SignedManifest, spec: FeatureSpec) -> PartitionPlan:
        """Partitions, subsets and oracles as everyone derives them (``protocol.PartitionPlan``), from the
        relays' beacon values revealed after the head was signed (``peer._beacon``)."""
        roster, head = await self.roster(signed)
        assert head.seed is not None

        async def derive() -> PartitionPlan:
            try:
                reveals = await collect_reveals(signed.manifest, head, self._mirror_clients(signed.manifest), self.now,
                                                signed.manifest.schedule.t_issue_end - _MARGIN)
            except BeaconRefused as refused:
                raise JoinRefused(refused.reason, str(refused)) from None
            return PartitionPlan.derive(signed.manifest, spec, roster.keys, head.seed or b"", head.root, reveals)

        return await self._cache.get("plan", derive)

    async def _signed(self, key: object, manifest: RoundManifest, fetch: Callable[[], Awaitable[SignedDocument | None]],
                      until: float, what: str, kind: DocumentKind) -> SignedDocument:
        document = await self._poll(key, fetch, until, what)
        try:
            document.verify(manifest.identity_key, kind=kind, round_id=manifest.round_id)
        except InvalidDocument as exc:
            raise JoinRefused("bad-signature", f"{what}: {exc}") from None
        return document

    async def _sub_round_document(self, manifest: RoundManifest, sub_round: int, kind: DocumentKind) -> SignedDocument:
        """The signed document of median sub-round ``sub_round`` (thresholds, or an SGD round's model), confirmed
        by the mirrors before its send window closes."""
        phase = manifest.schedule.median[sub_round]
        if sub_round:
            # Published once the previous sub-round has ended: polling before then only asks in vain,
            # and a poll backed off by then would reach the document seconds late.
            await sleep_until_wall(manifest.schedule.median[sub_round - 1].t_r, self.now)
        document = await self._signed(("median", sub_round), manifest, lambda: self.client.median(sub_round), phase.send_end,
                                      f"median sub-round {sub_round}", kind)
        await self._confirm(manifest, document, f"median/{sub_round}", kind, phase.send_end - _MARGIN)
        return document

    async def thresholds(self, manifest: RoundManifest, sub_round: int) -> MedianThresholds:
        thresholds = MedianThresholds.from_document(await self._sub_round_document(manifest, sub_round, DocumentKind.THRESHOLDS))
        if thresholds.sub_round != sub_round:
            raise JoinRefused("bad-thresholds", f"asked for median sub-round {sub_round}, the aggregator sent sub-round {thresholds.sub_round}")
        return thresholds

    async def sgd_model(self, manifest: RoundManifest, iteration: int) -> SgdModel:
        """The signed model an SGD round's peers of step ``iteration`` compute their gradient at."""
        model = SgdModel.from_document(await self._sub_round_document(manifest, iteration, DocumentKind.SGD_MODEL))
        if model.iteration != iteration:
            raise JoinRefused("bad-thresholds", f"asked for the model of SGD step {iteration}, the aggregator sent step {model.iteration}")
        return model

    async def medians(self, manifest: RoundManifest) -> MedianResults:
        if manifest.schedule.median:
            await sleep_until_wall(manifest.schedule.median[-1].t_r, self.now)
        document = await self._signed("medians", manifest, self.client.medians, manifest.schedule.data.send_end,
                                      "the medians", DocumentKind.MEDIANS)
        await self._confirm(manifest, document, "medians", DocumentKind.MEDIANS, manifest.schedule.data.send_end - _MARGIN)
        return MedianResults.from_document(document)

    async def _confirm(self, manifest: RoundManifest, document: SignedDocument, slot: str, kind: DocumentKind, until: float) -> None:
        """Hold ``document`` up to the relays' mirrors before a report depends on it (DESIGN.md §5).

        A different signed copy at any mirror is an :class:`Equivocation` (the
        aggregator tailored this document to this peer). Fewer than a quorum
        of mirrors holding the same copy by ``until`` raises AggregatorError:
        the report that needed it is not made (covers go in its place). A
        round whose manifest lists no mirror has nothing to compare with.
        """
        if not any(relay.mirror_url is not None for relay in manifest.relays):
            return

        async def fetch(mirror: AggregatorClient) -> SignedDocument | None:
            mirrored = await mirror.mirrored_document(manifest.identity_key, slot)
            if mirrored is not None:
                mirrored.verify(manifest.identity_key, kind=kind, round_id=manifest.round_id)
            return mirrored

        async def confirm() -> bool:
            answers = await self._from_mirrors(manifest, fetch, until)
            for mirrored in answers:
                if not mirrored.same_as(document):
                    raise Equivocation(EquivocationProof(manifest.round_id, kind.value, document.to_json(), mirrored.to_json()))
            return len(answers) >= mirror_quorum(manifest)

        if not await self._cache.get(("confirmed", slot, document.to_json()), confirm):
            raise AggregatorError(0, f"the {slot} document was not confirmed by {mirror_quorum(manifest)} relay mirrors in time")

    async def log_view(self, manifest: RoundManifest, kind: SurveyKind, partition: int, check: Check) -> LogView | None:
        """One partition's log segment at ``check``, verified and compared with a mirror; None if none came in time.

        Every peer of the partition makes this same request at the same
        scheduled time, whatever happened to its packets (DESIGN.md §5).
        """
        phase = manifest.schedule.data if kind is SurveyKind.DATA else manifest.schedule.median[manifest.median_sub_round(partition)]
        at = phase.check_time(check)
        until = phase.t_2 - _MARGIN if check is Check.FIRST else phase.t_r + _SETTLE_SECONDS

        async def view() -> LogView | None:
            await sleep_until_wall(at, self.now)
            try:
                segment = await self._poll(("segment", kind, partition, check), lambda: self.client.segment(kind, partition, check),
                                           until, "the receipt log")
            except AggregatorError:
                return None
            try:
                heads = segment.verify(manifest.identity_key, manifest.round_id, check)
            except InvalidDocument as exc:
                raise JoinRefused("bad-log", f"the receipt log does not verify: {exc}") from None
            compared = await self._compare_heads(manifest, segment, heads, until)
            documents = {TreeHead.from_document(d).survey: d for d in segment.heads}
            return LogView(heads, documents, {s: frozenset(d) for s, d in segment.leaves.items()}, dict(segment.leaves), compared)

        return await self._cache.get(("log", kind, partition, check), view)

    async def _compare_heads(self, manifest: RoundManifest, segment: ReceiptSegment, heads: dict[SurveyId, TreeHead], until: float) -> bool:
        """Whether a quorum of mirrors holds the same signed head for every survey; raises Equivocation on a different one."""
        wanted = {(head.survey, head.check) for head in heads.values()}

        async def fetch(mirror: AggregatorClient) -> HeadsResponse | None:
            mirrored = await mirror.mirrored_heads(manifest.identity_key)
            if mirrored is None:
                return None
            mirrored.verify(manifest.identity_key, manifest.round_id)
            have = {(h.survey, h.check) for h in map(TreeHead.from_document, mirrored.heads)}
            return mirrored if wanted <= have else None

        answers = await self._from_mirrors(manifest, fetch, until)
        for mirrored in answers:
            theirs = {(head.survey, head.check): document for document in mirrored.heads for head in (TreeHead.from_document(document),)}
            for document in segment.heads:
                head = TreeHead.from_document(document)
                other = theirs[(head.survey, head.check)]
                if not other.same_as(document):
                    raise Equivocation(EquivocationProof(manifest.round_id, "tree-head", document.to_json(), other.to_json()))
        return len(answers) >= mirror_quorum(manifest)


def mirror_quorum(manifest: RoundManifest) -> int:
    """How many relay mirrors must hold the same signed copy of a document to confirm it: a majority of those listed.

    One mirror that answers first could be the aggregator's accomplice, and a
    mirror lacking the document confirms nothing (DESIGN.md §5).
    """
    return sum(1 for relay in manifest.relays if relay.mirror_url is not None) // 2 + 1


def _overlap(a: RoundManifest, b: RoundManifest) -> bool:
    """Whether two rounds' schedules overlap (from the end of registration to the end of the round)."""
    return a.schedule.t_register_end <= b.schedule.end and b.schedule.t_register_end <= a.schedule.end
