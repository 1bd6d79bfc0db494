"""One peer's part in one round (DESIGN.md §3), callable in process.

:func:`join_round` walks a peer through the round: register (after comparing
the manifest with a relay's mirror), check the signed roster, the seed reveal
and the roster head against a mirror, derive its partition and subsets,
obtain its credential blindly (or reuse the one it stored before a crash),
answer its median sub-round, bin with the published medians and send each
subset as its own packet at a uniformly random time of the send window over
an independently chosen path.

Then, for each phase it took part in, it behaves exactly as every other peer
of its partition does, whatever happened to its packets (DESIGN.md §2,
§3.7): at the phase's first check it fetches its partition's receipt-log
segment, verifies the signed heads, compares them with a relay mirror's
copies, and in the second-chance window sends the same packets per survey as
every other peer (one message over ``SECOND_WINDOW_PATHS`` paths): the same
message over other paths if its receipt is missing, a cover otherwise. At the final check it reads the log once more. Two different
signed documents for one slot (manifest, roster head, log head) are a proof
of equivocation: the peer stores both and stops.

What every peer of a process fetches alike — the manifest, the roster, the
thresholds, the log segments, the mirrors' copies — is public and the same
for everyone, so a :class:`RoundSession` fetches each once per process and
every peer checks it for itself. Each peer keeps its own identity,
credential, ledger and cryptographic randomness.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import trio
from randomgen import ChaCha

from anonml.crypto import Credential, CredentialSecret, IssuanceRequest, IssuanceState, begin_issuance, finish_issuance
from anonml.learning import SgdRule
from anonml.mechanisms import BudgetExceeded, ReleaseKind, answer_is_greater
from anonml.peer._events import MISSING_REASONS, MessageOutcome, PeerEvent, RefusalReason
from anonml.peer._client import AggregatorError, answer_by
from anonml.peer._features import RoundPipeline
from anonml.peer._framework import FeatureVector
from anonml.peer._identity import PeerIdentity
from anonml.peer._ledger import PeerLedger
from anonml.peer._store import EquivocationProof, PeerStore, Spend
from anonml.peer._session import (
    _MARGIN, Equivocation, JoinRefused, LogView, RoundSession, T, mirror_quorum, sleep_until_wall,
)
from anonml.protocol import (
    SECOND_WINDOW_PATHS,
    Attempt,
    Check,
    CoverMessage,
    CredentialRequest,
    FeatureSpec,
    MedianResults,
    NONCE_BYTES,
    MedianThresholds,
    NumericFeature,
    PhaseTimes,
    RegisterRequest,
    RelayEntry,
    RoundManifest,
    SealedReport,
    SignedManifest,
    SurveyId,
    SurveyKind,
    TaskKind,
    PeerReleases,
    PeerRole,
    costliest,
    encode_median_report,
    encode_pool_answer,
    release_roles,
    seal_report,
)
from anonml.transport import AckStatus

_ISSUANCE_SEED_BYTES = 32
"""The random seed a stored credential request's blinding is derived from (``PeerRound.issuance``)."""

_MIN_FIRST_HOP_ATTEMPT = 0.25  # seconds; a first relay's ack takes milliseconds (p99 13-39 ms loaded, under attack)
_FIRST_RETRY_SECONDS, _LAST_RETRY_SECONDS = 0.05, 1.0
"""A peer's wait before another path once a first relay did not take its packet: doubling from the first to the last."""


def peer_generator(seed: int | None = None) -> np.random.Generator:
    """The peer's generator for every random choice it makes: noise, send times, paths, mirrors.

    ChaCha20 (randomgen's ``ChaCha`` with the standard 20 rounds) keyed with
    256 bits from the operating system's CSPRNG: an observer of send times
    and paths, or of many reports, cannot recover its state and predict the
    rest, as it can for PCG64 (issue 12, attack 7). The mechanisms take any
    numpy Generator, so it plugs in where PCG64 was. ``seed`` (tests and
    benchmarks only) keys it deterministically.
    """
    key = int.from_bytes(os.urandom(32), "big") if seed is None else seed % 2**256
    return np.random.Generator(ChaCha(key=key, rounds=20))


@dataclass
class Peer:
    """One peer: its identity, its store, its feature vector and its randomness (see :func:`peer_generator`)."""

    identity: PeerIdentity
    store: PeerStore
    vector: FeatureVector
    rng: np.random.Generator
    invitation: str | None = None
    rows: tuple[FeatureVector, ...] = ()
    """Every row the peer holds, for a task that learns from many (model averaging); ``vector`` is the latest."""


@dataclass
class SentMessage:
    """A message this peer's first send delivered to a first relay: what only the peer knows (the anonymity report's truth)."""

    survey: SurveyId
    receipt: bytes
    sent_at: float
    """When the first relay acknowledged it (UTC seconds)."""
    drawn_at: float
    """The send time drawn in the window (the peer sleeps until then; ``sent_at`` follows it by the send's latency)."""
    packet_hash: bytes
    """SHA-256 of the Sphinx packet the first relay took: what the demo's relay traces are matched by."""
    attempt: Attempt
    """The window it was sent in."""


@dataclass
class JoinResult:
    """What one peer did in the round."""

    partition: int | None = None
    packets: int = 0
    sends: int = 0
    resends: int = 0
    covers: int = 0
    acknowledged: int = 0
    missing: int = 0
    """Messages whose receipt the final log lacks; ``missing_reasons`` says why, one count each."""
    missing_reasons: Counter[str] = field(default_factory=Counter)
    """``never-sent`` (no first relay took it in either chance) or ``no-receipt-after-second-chance``."""
    unconfirmed: int = 0
    """Messages whose final log could not be read: they may or may not have counted."""
    deferred: int = 0
    """Reports sent in the second window by choice (a cover went in the first)."""
    missed_documents: int = 0
    """Surveys answered with covers only: a document their report needed did not come before its deadline."""
    resumed: bool = False
    epsilon_spent: float = 0.0
    events: list[str] = field(default_factory=list)
    sent: list[SentMessage] = field(default_factory=list)


Listener = Callable[[PeerEvent], None]


def _ignore(_: PeerEvent) -> None:
    pass


def release_roles_of(manifest: RoundManifest, spec: FeatureSpec) -> dict[PeerRole, PeerReleases]:
    """:func:`protocol.release_roles` with this manifest's parameters: what each kind of peer of the round releases.

    In an SGD round every peer makes one release, its gradient, which is about every feature and the label,
    at the whole ε_T (``learning.SgdRule``)."""
    if manifest.task_kind == TaskKind.SGD:
        return {PeerRole.DATA: ({}, [(spec.names, manifest.eps_total)])}
    return release_roles(
        spec, k_h=manifest.k_h, k_s=manifest.k_s, eps_median=manifest.eps_median,
        eps_data=manifest.eps_data, median_rounds=manifest.median_rounds, comparison_pool=bool(manifest.comparison_pool),
    )


def planned_releases(manifest: RoundManifest, spec: FeatureSpec) -> PeerReleases:
    """The worst case a peer of this round can be asked for, before partitions are known.

    The costliest of :func:`release_roles_of`: the rule of
    :func:`protocol.worst_case_releases`, which the aggregator's promised
    ``eps_total`` comes from; its record-level sum is what the peer is asked
    to accept.
    """
    return costliest(release_roles_of(manifest, spec))


def releases_still_to_make(manifest: RoundManifest, spec: FeatureSpec, spent: Sequence[Spend]) -> PeerReleases:
    """:func:`planned_releases` less what this round's ledger already holds (``spent``).

    A peer resuming after it spent re-sends the messages it sealed, never new
    ones (:meth:`PeerRound.stored_outgoing`), so each recorded release stands
    for one planned one: its median answer for the median answer, each subset
    report for one subset slot. Counting the planned releases again on top of
    the ledger would state (and check) twice what the round costs. In a round
    with a comparison pool, what it spent also says which kind of peer it is.
    """
    answered = any(not spend.label for spend in spent)
    # A model is one release carried by every data survey's packet: it fills every subset slot.
    reports = sum(manifest.k_h if spend.kind == ReleaseKind.MODEL else 1 for spend in spent if spend.label)
    roles = release_roles_of(manifest, spec)
    if manifest.comparison_pool and (answered or reports):
        medians, subsets = roles[PeerRole.COMPARISON_POOL if answered else PeerRole.DATA]
    else:
        medians, subsets = costliest(roles)
    if answered:
        medians = {}
    # Subset slots are listed worst first; the ones already sent replace the last.
    return medians, subsets[: max(len(subsets) - reports, 0)]


def check_thresholds(thresholds: MedianThresholds, spec: FeatureSpec) -> None:
    """Refuse thresholds that do not ask exactly one bit about each numeric feature, in the spec's order,
    with one threshold per cut point the spec gives that feature.

    That is what the peer consented to (``describe_release``) and what the
    aggregator publishes; a feature listed twice or a categorical one would
    make the peer reveal something it was never asked to accept.
    """
    if thresholds.features != spec.numeric_names:
        raise JoinRefused(RefusalReason.BAD_THRESHOLDS, f"median sub-round {thresholds.sub_round} asks about {list(thresholds.features)!r}, "
                          f"not once about each numeric feature {list(spec.numeric_names)!r}")
    for name, values in zip(thresholds.features, thresholds.thresholds, strict=True):
        feature = spec.feature(name)
        assert isinstance(feature, NumericFeature)
        if len(values) != feature.quantiles:
            raise JoinRefused(RefusalReason.BAD_THRESHOLDS, f"median sub-round {thresholds.sub_round} gives {len(values)} thresholds "
                              f"for {name!r}, whose spec has {feature.quantiles} cut points")


def check_manifest_unchanged(peer: Peer, signed: SignedManifest, aggregator: str) -> None:
    """Refuse a manifest whose hash differs from the one this peer registered under (DESIGN.md §4).

    Both are signed by the aggregator for one round name: the peer keeps the
    two as a proof of equivocation and stops.
    """
    first = peer.store.remember_manifest(peer.identity.public_key, aggregator, signed.manifest.name, signed.round_id, signed.to_json())
    if first is not None:
        proof = EquivocationProof(signed.round_id, "manifest", first, signed.to_json())
        peer.store.record_equivocation(peer.identity.public_key, proof)
        raise JoinRefused(RefusalReason.MANIFEST_CHANGED, f"round {signed.manifest.name!r} at {aggregator} now has manifest hash "
                          f"{signed.round_id.hex()!r}, not the one this peer registered under; both are stored")


def choose_path(relays: Sequence[RelayEntry], length: int, rng: np.random.Generator, avoid: set[bytes] | None = None,
                down: frozenset[bytes] = frozenset()) -> list[RelayEntry]:
    """``length`` distinct relays in random order, chosen independently per packet.

    Relays in ``avoid`` (those on paths this message already took) are used
    only when there are not enough others, and relays ``down`` (their mirror
    could not be reached) only when there are not enough of either.
    """
    avoid = avoid or set()
    tiers = ([r for r in relays if r.node_id not in avoid and r.node_id not in down],
             [r for r in relays if r.node_id in avoid and r.node_id not in down],
             [r for r in relays if r.node_id in down])
    order = [tier[i] for tier in tiers for i in rng.permutation(len(tier))]
    chosen = order[:length]
    return [chosen[i] for i in rng.permutation(len(chosen))]


@dataclass
class _Outgoing:
    """One survey this peer answers: its report (if it has one), the window the report goes in, the relays used.

    Every survey gets one packet in the phase's first send window and one
    message over ``SECOND_WINDOW_PATHS`` paths in the second. The report goes in ``window``, drawn at random (DESIGN.md §3.7:
    a report in the second window must not be recognisable as a repair);
    the other window gets a cover, unless a report sent in the first window
    is missing from the first check, when the second carries it again.
    ``sealed`` is None when a document the report depends on did not come
    before its deadline: then both windows get covers (a delayed answer may
    cost a report; it never marks one).
    """

    survey: SurveyId
    sealed: SealedReport | None
    phase: PhaseTimes
    window: Attempt = Attempt.FIRST
    tried: set[bytes] = field(default_factory=set)
    left: bool = False
    """A first relay acknowledged this message (not a cover) durably, in either window."""


def message_outcome(out: _Outgoing, final: LogView | None) -> MessageOutcome:
    """What the final check says of one report: ``acknowledged``, ``unconfirmed`` (no final log to read) or one of
    :data:`MISSING_REASONS`."""
    assert out.sealed is not None, "a survey answered with covers only has no report to look for"
    if final is None:
        return MessageOutcome.UNCONFIRMED
    if final.contains(out.survey, out.sealed.receipt):
        return MessageOutcome.ACKNOWLEDGED
    return MessageOutcome.NO_RECEIPT_AFTER_SECOND_CHANCE if out.left else MessageOutcome.NEVER_SENT


class PeerRound:
    """One peer's run through one round, and its state between steps.

    The steps, in order (DESIGN.md §3): :meth:`register`, :meth:`partition`,
    :meth:`obtain_credential` (whose result the caller stores in
    ``credential``), :meth:`answer_median`, :meth:`send_subsets`, and
    :meth:`second_chance` for what each sending step returned.
    :func:`join_round` runs them all after checking the round's worst case
    against the ledger; tests drive them one at a time to stand in for a
    peer that stops early or misbehaves after registering.
    """

    def __init__(self, peer: Peer, session: RoundSession, signed: SignedManifest, pipeline: RoundPipeline, listener: Listener) -> None:
        self.peer = peer
        self.session = session
        self.signed = signed
        self.manifest = signed.manifest
        self.round_id = signed.round_id
        self.pipeline = pipeline
        self.spec = pipeline.spec
        self.key = peer.identity.public_key
        self.geometry, self.issuer_key = session.round_keys(signed)
        self.ledger = PeerLedger(peer.store, self.key, self.round_id, self.manifest.eps_total)
        self.listener = listener
        self.result = JoinResult()
        self.credential: Credential | None = None

    def emit(self, event: PeerEvent) -> None:
        self.result.events.append(event)
        self.listener(event)

    def stored(self, refused: JoinRefused) -> JoinRefused:
        """Keep an equivocation's two signed documents in this peer's store before it stops."""
        if isinstance(refused, Equivocation):
            self.peer.store.record_equivocation(self.key, refused.proof)
            self.emit(PeerEvent.EQUIVOCATION)
        return refused

    async def recheck_manifest(self, phase: str) -> None:
        check_manifest_unchanged(self.peer, await self.session.manifest(phase), self.session.client.base_url)

    async def register(self) -> None:
        """Register (a resumed peer is already registered); the manifest is compared with a mirror's before
        the credential, the first thing that depends on it (its token key)."""
        check_manifest_unchanged(self.peer, self.signed, self.session.client.base_url)
        registration = self.peer.store.registration(self.key, self.round_id)
        if registration is not None and registration.credential is not None:
            self.result.resumed = True
            self.emit(PeerEvent.RESUMED)
            return
        # The nonce comes from the peer's own CSPRNG, so a seeded run (the simulator) registers alike every time.
        nonce = self.peer.rng.bytes(NONCE_BYTES)
        request = RegisterRequest.create(self.peer.identity.signing_key, self.round_id, self.peer.invitation, nonce=nonce)
        # Needed before registration closes: a black-holed attempt must leave time for another (a repeat is idempotent).
        with answer_by(self.session.trio_deadline(self.manifest.schedule.t_register_end)):
            await self.session.client.register(request)
        self.emit(PeerEvent.REGISTERED)

    async def partition(self) -> tuple[int, int, tuple[tuple[str, ...], ...]]:
        try:
            if not await self.session.compare_manifest(self.signed):
                if any(relay.mirror_url is not None for relay in self.manifest.relays):
                    # A manifest the listed mirrors do not hold may be a round made for this peer alone:
                    # it stops before its credential, the first thing that would tie it to that round.
                    raise JoinRefused(RefusalReason.MANIFEST_UNCONFIRMED, f"fewer than {mirror_quorum(self.manifest)} of the round's "
                                      "relay mirrors hold this manifest; refusing a round others may not see")
                self.emit(PeerEvent.MANIFEST_UNMIRRORED)
            plan = await self.session.plan(self.signed, self.spec)
        except JoinRefused as refused:
            raise self.stored(refused) from None
        if self.key not in plan.partition_of:
            raise JoinRefused(RefusalReason.NOT_ROSTERED, f"identity {self.key.hex()!r} is not on the round's roster")
        partition = plan.partition_of[self.key]
        minimum = self.signed.manifest.min_anonymity_set
        if plan.sizes[partition] < minimum:
            # Before the credential: nothing this peer sends can yet be tied to the small partition.
            raise JoinRefused(RefusalReason.ANONYMITY_SET, f"partition {partition} has {plan.sizes[partition]} peer(s), fewer than "
                              f"the manifest's minimum anonymity set of {minimum}: refusing to send")
        self.result.partition = partition
        return partition, plan.sizes[partition], plan.subsets_of(partition)

    async def obtain_credential(self, partition: int) -> Credential:
        """The credential stored before a crash, or a new one obtained blindly (one per peer per round)."""
        registration = self.peer.store.registration(self.key, self.round_id)
        if registration is not None and registration.credential is not None:
            return Credential.from_bytes(registration.credential)
        # Needed before issuance closes: a black-holed attempt leaves time for another (the same stored request).
        # Made with a slot in hand: a worker's peers learn their partitions at once, and each one's blinding
        # (about a millisecond) ran before any was sent, so the Adult demo's first request left 14 s late.
        with answer_by(self.session.trio_deadline(self.manifest.schedule.t_issue_end)):
            async with self.session.slots:
                await self.recheck_manifest("issuance")
                self.peer.store.set_partition(self.key, self.round_id, partition)
                request, state = self.issuance(partition, None if registration is None else registration.issuance)
                response = await self.session.client.credential(
                    CredentialRequest.create(self.peer.identity.signing_key, self.round_id, request.to_bytes()))
        if response.partition != partition:
            raise JoinRefused(RefusalReason.PARTITION_MISMATCH, f"the aggregator says partition {response.partition!r}, the seed says {partition!r}")
        credential = finish_issuance(state, response.response)
        self.peer.store.set_credential(self.key, self.round_id, credential.to_bytes())
        self.emit(PeerEvent.CREDENTIAL)
        return credential

    def issuance(self, partition: int, stored: bytes | None) -> tuple[IssuanceRequest, IssuanceState]:
        """This round's one blinded credential request, made once and stored before it is first sent.

        Every retry sends the same request: the client's after a lost answer,
        and this peer's run again after a crash (``stored``). The aggregator
        answers the identical request with the answer it stored and refuses
        any other (one credential per peer per round), so a re-blinded retry
        would leave the peer without a credential. The request is the
        secret ``s`` and a random seed the blinding is derived from; the
        aggregator learns nothing from a retry that it did not see the first time.
        """
        if stored is None:
            stored = CredentialSecret.generate().to_bytes() + os.urandom(_ISSUANCE_SEED_BYTES)
            self.peer.store.set_issuance(self.key, self.round_id, stored)
        secret, seed = CredentialSecret.from_bytes(stored[:-_ISSUANCE_SEED_BYTES]), stored[-_ISSUANCE_SEED_BYTES:]
        return begin_issuance(self.issuer_key, secret, partition, rng=lambda n: hashlib.shake_256(seed).digest(n))

    def prepare(self, survey: SurveyId, report: bytes, features: Sequence[str], phase: PhaseTimes) -> _Outgoing:
        """Seal one report (``protocol.seal_report``) and commit its release to the ledger together
        with the message, before anything is sent (``PeerStore.record_spend``)."""
        assert self.credential is not None
        sealed = seal_report(self.issuer_key, self.credential, survey, report, self.geometry.message_size)
        if self.manifest.task_kind == TaskKind.SGD:
            self.ledger.spend_labelled(survey, features, self.manifest.eps_total, kind=ReleaseKind.GRADIENT, sealed=sealed)
        elif survey.kind == SurveyKind.MEDIAN:
            self.ledger.spend_median(survey, features, self.manifest.eps_median, sealed=sealed)
        else:
            self.ledger.spend_labelled(survey, features, self.manifest.eps_data, sealed=sealed)
        self.result.packets += 1
        return _Outgoing(survey, sealed, phase, window=self.draw_window())

    def draw_window(self) -> Attempt:
        """The send window of a report: either, with probability one half (independent of everything else)."""
        return Attempt.FIRST if self.peer.rng.random() < 0.5 else Attempt.SECOND

    def without_report(self, survey: SurveyId, phase: PhaseTimes, missed: PeerEvent) -> _Outgoing:
        """A survey whose report cannot be made in time: covers in both windows, nothing spent."""
        self.result.missed_documents += 1
        self.emit(missed)
        return _Outgoing(survey, None, phase)

    async def by_deadline(self, deadline: float, fetch: Callable[[], Awaitable[T]]) -> T | None:
        """``fetch()``, cut off at wall time ``deadline`` (a request in flight too); None if it failed or was cut off.

        A document that comes late must never move a send (DESIGN.md §2): the
        aggregator controls when it answers, so the peer gives up at a time
        the manifest fixes instead. A document the relays' mirrors do not
        confirm in time counts as not come (``RoundSession._confirm``).
        """
        cutoff = self.session.trio_deadline(deadline)
        with trio.move_on_at(cutoff), answer_by(cutoff):
            try:
                return await fetch()
            except AggregatorError:
                return None
            except JoinRefused as refused:  # a tailored document: its proof is kept before the peer stops
                raise self.stored(refused) from None
        return None

    def stored_outgoing(self, survey: SurveyId, phase: PhaseTimes) -> _Outgoing | None:
        """What a resumed peer already sealed for ``survey`` (it sends the same message, never a new one)."""
        stored = self.peer.store.packet(self.key, survey.to_bytes())
        if stored is None:
            return None
        # Whether a first relay took it before the crash is not stored; a send was tried.
        return _Outgoing(survey, SealedReport(survey, stored.message, stored.receipt), phase, left=stored.sends > 0)

    async def send_once(self, survey: SurveyId, message: bytes, tried: set[bytes], attempt: Attempt, deadline: float) -> bytes | None:
        """Send ``message`` over a fresh path in ``attempt``'s hop windows; the packet once the first relay
        acknowledges it durably, None if none did by ``deadline``."""
        retry_after = _FIRST_RETRY_SECONDS
        while self.session.now() < deadline:
            relays = choose_path(self.manifest.relays, self.manifest.path_length, self.peer.rng, tried,
                                 frozenset(self.session.unreachable))
            tried.update(r.node_id for r in relays)
            packet = self.manifest.packet(relays, survey, message, attempt)
            # Half the time left per attempt (at least _MIN_FIRST_HOP_ATTEMPT): a down or black-holed first relay leaves time for another.
            left = max(0.0, deadline - self.session.now())
            give_up_at = trio.current_time() + min(left, max(_MIN_FIRST_HOP_ATTEMPT, left / 2))
            status = await self.session.transport.send(relays[0].host, relays[0].port, packet, give_up_at=give_up_at)
            self.result.sends += 1
            self.peer.store.count_send(self.key, survey.to_bytes())
            if status is AckStatus.ACCEPTED:
                return packet
            self.emit(PeerEvent.FIRST_HOP_FAILED)
            # Not a busy loop (a packet built and a send count written per turn) on a first relay that answers
            # at once without taking it. Only first relays see the retries, and each knows who is sending.
            await trio.sleep(min(retry_after, max(0.0, deadline - self.session.now())))
            retry_after = min(2 * retry_after, _LAST_RETRY_SECONDS)
        return None

    async def send_in_window(self, survey: SurveyId, message: bytes, phase: PhaseTimes, attempt: Attempt,
                             tried: set[bytes], receipt: bytes = b"") -> SentMessage | None:
        """Send at a uniformly random time of ``attempt``'s send window (thesis §5.1), whatever the message is.

        Returns what was sent and when (``receipt`` is the message's), or None if no first relay took it.
        """
        start, end = phase.send_window(attempt)
        drawn_at = self.peer.rng.uniform(start, end)
        await sleep_until_wall(drawn_at, self.session.now)
        # A packet must be taken by its first relay before that relay's window opens: one taken later would be
        # released in what is left of the window, after an intake that follows this send (a colluding first
        # relay that refuses or holds its ack could push a retry there). Honest relays refuse it as late; a
        # packet not taken by then counts as not sent (a first-window report missing from the log is resent in
        # the second window, where every peer sends).
        windows = self.manifest.hop_windows(survey, attempt)
        packet = await self.send_once(survey, message, tried, attempt, windows[0].start - _MARGIN)
        if packet is None:
            return None
        return SentMessage(survey, receipt, self.session.now(), float(drawn_at), hashlib.sha256(packet).digest(), attempt)

    async def send_cover(self, out: _Outgoing, attempt: Attempt) -> None:
        cover = CoverMessage(out.survey).to_bytes(self.geometry.message_size)
        await self.send_in_window(out.survey, cover, out.phase, attempt, out.tried)

    async def send_report(self, out: _Outgoing, attempt: Attempt) -> None:
        """The report in ``attempt``'s window; a resend is the same message over paths it has not taken."""
        assert out.sealed is not None
        sent = await self.send_in_window(out.survey, out.sealed.message, out.phase, attempt, out.tried, out.sealed.receipt)
        if sent is not None:
            # The report's send, once: its first window's send, or the first copy a first relay
            # took of a report kept for the second window (SECOND_WINDOW_PATHS copies go there).
            if attempt is Attempt.FIRST or (out.window is Attempt.SECOND and not out.left):
                self.result.sent.append(sent)
            out.left = True
        self.emit(PeerEvent.SENT)

    async def send_first(self, out: _Outgoing) -> None:
        """The first window's packet: the report if it goes there, else a cover."""
        if out.sealed is not None and out.window is Attempt.FIRST:
            await self.send_report(out, Attempt.FIRST)
        else:
            await self.send_cover(out, Attempt.FIRST)

    async def second_chance(self, kind: SurveyKind, partition: int, outgoing: Sequence[_Outgoing]) -> None:
        """The phase's first check, the uniform second-chance window, and the final check (DESIGN.md §3.7, §5).

        Every peer of the partition makes the same requests at the same
        times and sends the same packets per survey it answers: the report
        it kept for this window, a resend, or a cover, each over
        :data:`~anonml.protocol.SECOND_WINDOW_PATHS` independent paths (no
        later window repairs what this one loses, so no report rides one
        path alone here; every packet goes that way, so none stands out). It resends only when a
        log that a mirror confirms lacks its receipt; a log it could not
        compare with any mirror, or none at all, gets covers (a resend decided
        on a log shown to this peer alone would name it). A resend is one of
        the second window's reports, which about half the partition sends by
        choice: its anonymity set is those peers, not the partition.
        """
        if not outgoing:
            return
        stopped: JoinRefused | None = None
        async with trio.open_nursery() as nursery:
            # A report kept for this window needs no log: its send time is drawn now, whenever (and
            # whether) the first check's log comes (issue 27: a log request stuck on a dead connection
            # held these back until the window had passed).
            for out in outgoing:
                if out.sealed is not None and out.window is Attempt.SECOND:
                    self.result.deferred += 1
                    self._send_second(nursery, self.send_report, out)
            try:
                view = await self.session.log_view(self.manifest, kind, partition, Check.FIRST)
            except JoinRefused as refused:  # the peer stops: nothing more goes out
                stopped = refused
                nursery.cancel_scope.cancel()
                view = None
            if stopped is None and (view is None or not view.compared):
                self.emit(PeerEvent.LOG_UNVERIFIED)
            for out in outgoing if stopped is None else ():
                if out.sealed is not None and out.window is Attempt.SECOND:
                    continue
                if out.sealed is not None and view is not None and view.compared and not view.contains(out.survey, out.sealed.receipt):
                    self.result.resends += 1
                    self.emit(PeerEvent.RESENT)
                    self._send_second(nursery, self.send_report, out)
                else:
                    self.result.covers += 1
                    self._send_second(nursery, self.send_cover, out)
        if stopped is not None:
            raise self.stored(stopped) from None
        try:
            final = await self.session.log_view(self.manifest, kind, partition, Check.FINAL)
        except JoinRefused as refused:
            raise self.stored(refused) from None
        if final is not None and view is not None:
            self._check_grew(view, final)
        for out in outgoing:
            if out.sealed is None:
                continue
            outcome = message_outcome(out, final)
            if outcome is MessageOutcome.UNCONFIRMED:
                self.result.unconfirmed += 1
            elif outcome is MessageOutcome.ACKNOWLEDGED:
                self.peer.store.acknowledge(self.key, out.survey.to_bytes())
                self.result.acknowledged += 1
            else:
                self.result.missing += 1
                self.result.missing_reasons[outcome] += 1
            self.emit(PeerEvent.MISSING if outcome in MISSING_REASONS else PeerEvent(outcome))

    @staticmethod
    def _send_second(nursery: trio.Nursery, send: Callable[[_Outgoing, Attempt], Awaitable[None]], out: _Outgoing) -> None:
        """``send`` ``out``'s packet in the second window over each of its SECOND_WINDOW_PATHS paths, each at
        its own uniform time; ``out.tried`` steers each path to relays the message has not crossed yet."""
        for _ in range(SECOND_WINDOW_PATHS):
            nursery.start_soon(send, out, Attempt.SECOND)

    def _check_grew(self, first: LogView, final: LogView) -> None:
        """The final log must extend the first (append-only); two signed heads that disagree are a proof."""
        for survey, head in first.heads.items():
            later = final.ordered.get(survey, ())
            if later[: head.size] != first.ordered[survey]:
                # The two signed heads, whose leaves (served with them) show the rewritten history.
                proof = EquivocationProof(self.round_id, "tree-head", first.documents[survey].to_json(), final.documents[survey].to_json())
                raise self.stored(Equivocation(proof)) from None

    async def answer_median(self, partition: int) -> list[_Outgoing]:
        """The peer's answer in its partition's median sub-round (thesis Algorithm 1), if it answers one.

        Without a comparison pool: one perturbed bit per numeric feature,
        about one of its cut points chosen uniformly at random. A pool peer
        answers ONE bit, about one feature and one of its cut points, both
        chosen uniformly at random. Either choice is independent of the data,
        so it reveals nothing and the whole partition stays the answer's
        anonymity set.
        """
        if not self.manifest.answers_median(partition) or not self.spec.numeric_names:
            return []
        survey = self.manifest.median_survey(partition)
        phase = self.manifest.schedule.median[survey.sub_round]
        resumed = self.stored_outgoing(survey, phase)
        if resumed is not None:
            return [resumed]
        thresholds = await self.by_deadline(phase.send_end - _MARGIN, lambda: self.session.thresholds(self.manifest, survey.sub_round))
        if thresholds is None:
            # Not in hand by the end of the send window: this peer's answer is missing from the
            # search (nothing is spent), and it sends covers where the answer would have gone.
            return [self.without_report(survey, phase, PeerEvent.MEDIAN_MISSED)]
        check_thresholds(thresholds, self.spec)
        rng = self.peer.rng

        def answer(name: str, values: Sequence[float]) -> tuple[int, int]:
            level = int(rng.integers(len(values)))
            return level, answer_is_greater(float(self.peer.vector.features[name]), values[level], self.manifest.eps_median, rng)

        if self.manifest.is_pool_partition(partition):
            index = int(rng.integers(len(thresholds.features)))
            features = [thresholds.features[index]]
            report = encode_pool_answer(index, *answer(features[0], thresholds.thresholds[index]))
        else:
            features = list(thresholds.features)
            report = encode_median_report([answer(name, values) for name, values in zip(features, thresholds.thresholds, strict=True)])
        async with self.session.slots:
            return [self.prepare(survey, report, features, phase)]

    async def answer_gradient(self, partition: int) -> list[_Outgoing]:
        """An SGD round's one report: the perturbed gradient of this peer's record at the model published for
        its partition's step (``learning.SgdRule.gradient_report``), sent in that step's sub-round."""
        survey = self.manifest.median_survey(partition)
        phase = self.manifest.schedule.median[survey.sub_round]
        resumed = self.stored_outgoing(survey, phase)
        if resumed is not None:
            return [resumed]
        model = await self.by_deadline(phase.send_end - _MARGIN, lambda: self.session.sgd_model(self.manifest, survey.sub_round))
        if model is None:
            # Not in hand by the end of the send window: nothing is spent, and covers go where the gradient would have.
            return [self.without_report(survey, phase, PeerEvent.MEDIAN_MISSED)]
        rule = SgdRule.of(self.manifest)
        if len(model.coefficients) != rule.encoding.dimension:
            raise JoinRefused(RefusalReason.BAD_THRESHOLDS, f"the model of SGD step {survey.sub_round} has {len(model.coefficients)} "
                              f"coefficients; the round's feature spec encodes {rule.encoding.dimension}")
        report = rule.gradient_report(model, self.peer.vector.features, self.peer.vector.known_label(), self.peer.rng)
        async with self.session.slots:
            return [self.prepare(survey, report, self.spec.names, phase)]

    async def seal_subsets(self, partition: int, subsets: Sequence[tuple[str, ...]]) -> list[_Outgoing]:
        """One sealed report per subset (or what a resumed peer sealed before); none for a pool peer."""
        if not subsets:
            return []
        phase = self.manifest.schedule.data
        surveys = [SurveyId.data(self.round_id, partition, index) for index in range(len(subsets))]
        resumed = [self.stored_outgoing(survey, phase) for survey in surveys]
        if all(out is not None for out in resumed):
            return [out for out in resumed if out is not None]
        medians = (await self.by_deadline(phase.send_end - _MARGIN, lambda: self.session.medians(self.manifest))
                   if self.spec.numeric_names else MedianResults({}))
        if medians is None:
            return [self.without_report(survey, phase, PeerEvent.MEDIANS_MISSED) for survey in surveys]
        cut_points: dict[str, list[float]] = {}
        for feature in self.spec.features:
            if isinstance(feature, NumericFeature):
                published = medians.cut_points.get(feature.name, ())
                if len(published) != feature.quantiles:
                    raise JoinRefused(RefusalReason.NO_MEDIAN, f"{len(published)} published cut points for {feature.name!r}, "
                                      f"whose spec has {feature.quantiles}")
                cut_points[feature.name] = list(published)
        bins = self.pipeline.bins(self.peer.vector, cut_points)
        plan = await self.session.plan(self.signed, self.spec)
        outgoing = []
        for index, (subset, survey) in enumerate(zip(subsets, surveys, strict=True)):
            if resumed[index] is not None:
                outgoing.append(resumed[index])
                continue
            value = self.pipeline.encode_subset(subset, bins, self.peer.vector.label if self.manifest.labelled_reports else None)
            oracle = plan.oracle(partition, index)
            report = oracle.encode_report(oracle.privatize(np.asarray([value]), self.peer.rng)[0])
            async with self.session.slots:
                outgoing.append(self.prepare(survey, report, subset, phase))
        return [out for out in outgoing if out is not None]

    async def seal_model(self, partition: int, blocks: int) -> list[_Outgoing]:
        """A model-averaging round's data packets: the peer's model released once, one block per data survey
        (``learning.RoundModel``), all sealed and charged ONCE in one transaction (``PeerLedger.spend_model``)
        before any is sent; or what a resumed peer sealed before. Every data peer sends ``blocks`` packets."""
        from anonml.learning import RoundModel

        phase = self.manifest.schedule.data
        surveys = [SurveyId.data(self.round_id, partition, index) for index in range(blocks)]
        resumed = [self.stored_outgoing(survey, phase) for survey in surveys]
        if any(out is not None for out in resumed):
            return [out for out in resumed if out is not None]
        model = RoundModel.of_manifest(self.manifest)
        if model.blocks.blocks != blocks:
            raise JoinRefused(RefusalReason.MODEL_LAYOUT, f"the manifest deals {blocks} data surveys, the model needs {model.blocks.blocks}")
        reports = model.reports([row.features for row in self.peer.rows], [row.known_label() for row in self.peer.rows], self.peer.rng)
        assert self.credential is not None
        async with self.session.slots:
            sealed = [seal_report(self.issuer_key, self.credential, survey, report, self.geometry.message_size)
                      for survey, report in zip(surveys, reports, strict=True)]
            self.ledger.spend_model(sealed, self.spec.names, self.manifest.eps_total)
        self.result.packets += len(sealed)
        return [_Outgoing(out.survey, out, phase, window=self.draw_window()) for out in sealed]

    async def phase(self, kind: SurveyKind, partition: int, outgoing: Sequence[_Outgoing]) -> None:
        """Send each message in the first window, then the phase's second chance and final check."""
        if not outgoing:
            return
        async with trio.open_nursery() as nursery:
            for out in outgoing:
                nursery.start_soon(self.send_first, out)
        await self.second_chance(kind, partition, outgoing)


async def join_round(
    peer: Peer,
    session: RoundSession,
    signed: SignedManifest,
    pipeline: RoundPipeline,
    *,
    listener: Listener = _ignore,
) -> JoinResult:
    """Take part in the round ``signed`` describes, from registration to the final receipt check.

    The caller has fetched ``signed`` (``session.manifest("join")``), built
    ``pipeline`` from its feature spec, computed ``peer.vector`` with it and
    obtained the peer's consent. A peer whose store already holds its
    registration and credential for this round (a crashed run) resumes with
    them. Raises :class:`JoinRefused` (:class:`Equivocation` after storing
    the proof), :class:`AggregatorError` or :class:`mechanisms.BudgetExceeded`.
    """
    async with session.slots:
        run = PeerRound(peer, session, signed, pipeline, listener)
        medians, subsets = releases_still_to_make(run.manifest, run.spec, run.peer.store.spends(run.key, run.round_id))
        try:
            run.ledger.check(medians=medians, subsets=subsets)
        except BudgetExceeded as exc:
            raise JoinRefused(RefusalReason.BUDGET, str(exc)) from None
    if run.manifest.task_kind == TaskKind.MODEL_AVERAGING and len(peer.rows) < run.manifest.rows_per_peer:
        # Before registering: the model's noise is calibrated to rows_per_peer rows, and a smaller slice would need more.
        raise JoinRefused(RefusalReason.TOO_FEW_ROWS, f"this round's model needs at least {run.manifest.rows_per_peer} rows "
                          f"from each peer; this peer holds {len(peer.rows)}")
    await run.register()
    partition, _, my_subsets = await run.partition()
    run.credential = await run.obtain_credential(partition)

    sgd = run.manifest.task_kind == TaskKind.SGD

    async def median_phase() -> None:
        # An SGD round's median sub-rounds are its gradient steps; it sends nothing in the data phase.
        outgoing = await (run.answer_gradient(partition) if sgd else run.answer_median(partition))
        await run.phase(SurveyKind.MEDIAN, partition, outgoing)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(median_phase)
            await run.recheck_manifest("data")
            data_out = (await run.seal_model(partition, len(my_subsets)) if run.manifest.task_kind == TaskKind.MODEL_AVERAGING
                        else await run.seal_subsets(partition, () if sgd else my_subsets))
            await run.phase(SurveyKind.DATA, partition, data_out)
    except* JoinRefused as refused:
        # Either phase may refuse (an equivocation found in its log): the peer stops, and says why.
        raise refused.exceptions[0] from None
    run.result.epsilon_spent = run.ledger.spent()
    return run.result
