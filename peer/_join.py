"""One peer's part in one round (DESIGN.md §3), callable in process.

:func:`join_round` walks a peer through the round: register, check the roster
and the seed reveal, derive its partition and subsets, obtain its credential
blindly, answer its median sub-round, bin with the published medians, send
each subset as its own packet at a uniformly random time of the send window
over an independently chosen path, then read the receipt log and resend the
*same* message over another path when its receipt is missing.

What every peer of a process fetches alike — the manifest, the roster, the
thresholds, the receipt log — is public and the same for everyone, so a
:class:`RoundSession` fetches each once per process and every peer checks it
for itself (its own registered manifest hash, the seed commitment, its own
place in the roster). Each peer keeps its own identity, credential, ledger
and randomness.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeVar

import numpy as np
import trio

from anonml.errors import AnonMLError
from anonml.crypto import (
    Credential,
    CredentialSecret,
    IssuerPublicKey,
    NodeAddress,
    PathHop,
    ReleaseWindow,
    SphinxGeometry,
    begin_issuance,
    build_packet,
    finish_issuance,
    make_token,
    tag_digest,
)
from anonml.mechanisms import BudgetExceeded, FrequencyOracle, answer_is_greater, make_oracle
from anonml.peer._client import AggregatorClient, AggregatorError, retry_delay
from anonml.peer._features import RoundPipeline
from anonml.peer._framework import FeatureVector
from anonml.peer._identity import PeerIdentity
from anonml.peer._ledger import PeerLedger
from anonml.peer._store import PeerStore, StoreError
from anonml.peer._transport import PacketTransport
from anonml.protocol._api import (
    CredentialRequest,
    MedianResults,
    MedianThresholds,
    ReceiptLog,
    RegisterRequest,
    RosterResponse,
)
from anonml.protocol._features import FeatureSpec, NumericFeature
from anonml.protocol._link import AckStatus
from anonml.protocol._manifest import RelayEntry, RoundManifest, SignedManifest, check_seed
from anonml.protocol._message import SurveyMessage, bound_bytes, encode_median_report
from anonml.protocol._plan import assign_partitions, derive_subsets, worst_case_releases
from anonml.protocol._schedule import PhaseTimes, hop_windows
from anonml.protocol._survey import SurveyId, SurveyKind

T = TypeVar("T")

# Seconds kept free at the end of a window for the last link round trip.
_MARGIN = 0.5
# How long after t_r a peer waits for the aggregator to finish verifying a phase.
_SETTLE_SECONDS = 300.0


class JoinRefused(AnonMLError):
    """Raised by :func:`join_round` when the peer declines to continue: the
    manifest changed under it, the seed does not open its commitment, it is
    not on the roster, the aggregator disagrees about its partition, or a
    release would exceed its budget. ``reason`` is a short machine-readable
    name (counted by the demo)."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


Clock = Callable[[], float]


@lru_cache(maxsize=1024)
def _oracle(name: str, epsilon: float, m: int, n: int) -> FrequencyOracle:
    """The survey's frequency oracle, built once per process: ``"auto"``
    chooses by the partition size ``n``, as the aggregator does (DESIGN.md §8)."""
    return make_oracle(name, epsilon, m, n=n)


async def sleep_until_wall(when: float, now: Clock = time.time) -> None:
    """Sleep until wall-clock time ``when`` (UTC seconds; the manifest's times are absolute)."""
    delay = when - now()
    if delay > 0:
        await trio.sleep(delay)


class _SingleFlight:
    """Fetch each keyed document once per process; concurrent askers wait for the first."""

    def __init__(self) -> None:
        self._values: dict[object, object] = {}
        self._pending: dict[object, trio.Event] = {}

    async def get(self, key: object, fetch: Callable[[], Awaitable[T]]) -> T:
        while True:
            if key in self._values:
                return self._values[key]  # type: ignore[return-value]
            pending = self._pending.get(key)
            if pending is None:
                break
            await pending.wait()
        event = self._pending[key] = trio.Event()
        try:
            value = await fetch()
            self._values[key] = value
            return value
        finally:
            del self._pending[key]
            event.set()


@dataclass
class RoundSession:
    """The public side of one round, shared by every peer of a process.

    ``client`` talks to the aggregator; ``transport`` sends packets to
    relays. Documents are fetched once per ``key`` (the manifest once per
    phase, the receipt log once per check time).
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

    def round_keys(self, signed: SignedManifest) -> tuple[SphinxGeometry, IssuerPublicKey]:
        """The round's packet geometry and token key, parsed once per process."""
        if signed.round_id not in self._keys:
            manifest = signed.manifest
            self._keys[signed.round_id] = (manifest.sphinx_geometry(), IssuerPublicKey.from_bytes(manifest.token_public_key))
        return self._keys[signed.round_id]

    async def manifest(self, phase: str) -> SignedManifest:
        return await self._cache.get(("manifest", phase), self.client.manifest)

    async def _poll(self, key: object, fetch: Callable[[], Awaitable[T | None]], until: float, what: str) -> T:
        async def poll() -> T:
            attempt = 0
            while True:
                value = await fetch()
                if value is not None:
                    return value
                if self.now() > until:
                    raise AggregatorError(404, f"{what} was not published by {until:.0f}")
                await trio.sleep(retry_delay(attempt))
                attempt += 1

        return await self._cache.get(key, poll)

    async def roster(self, manifest: RoundManifest, round_id: bytes) -> RosterResponse:
        """The signed roster with the seed revealed; its signature is checked
        once per process (one Ed25519 check over every key of the round)."""

        async def revealed() -> RosterResponse | None:
            roster = await self.client.roster()
            if roster is None or roster.seed is None:
                return None
            roster.verify(manifest.identity_key, round_id)
            return roster

        await sleep_until_wall(manifest.schedule.t_register_end, self.now)
        return await self._poll("roster", revealed, manifest.schedule.t_issue_end, "the roster and seed")

    async def thresholds(self, manifest: RoundManifest, sub_round: int) -> MedianThresholds:
        phase = manifest.schedule.median[sub_round]
        return await self._poll(("median", sub_round), lambda: self.client.median(sub_round), phase.send_end, f"median sub-round {sub_round}")

    async def medians(self, manifest: RoundManifest) -> MedianResults:
        if manifest.schedule.median:
            await sleep_until_wall(manifest.schedule.median[-1].t_r, self.now)
        return await self._poll("medians", self.client.medians, manifest.schedule.data.send_end, "the medians")

    async def receipts(self, at: float) -> ReceiptLog:
        """The whole receipt log as of wall time ``at`` (fetched once for everyone waiting on ``at``)."""
        await sleep_until_wall(at, self.now)
        return await self._cache.get(("receipts", at), self.client.receipts)

    async def settled_receipts(self, manifest: RoundManifest, survey: SurveyId) -> ReceiptLog:
        """The receipt log once the aggregator has verified every packet of ``survey``'s phase.

        Packets that reached it before ``t_r`` may still wait in its inbox
        (durable, not yet verified) at ``t_r``. The aggregator publishes the
        next sub-round's thresholds, the medians, or the round report only
        after the phase's packets are stored, so those mark the log final.
        """
        phase = manifest.schedule.phase_of(survey)
        await sleep_until_wall(phase.t_r, self.now)
        if survey.kind == SurveyKind.MEDIAN and survey.partition + 1 < manifest.median_rounds:
            key: object = ("median", survey.partition + 1)
            await self._poll(key, lambda: self.client.median(survey.partition + 1), phase.t_r + _SETTLE_SECONDS, "the next thresholds")
        elif survey.kind == SurveyKind.MEDIAN:
            key = "medians"
            await self._poll(key, self.client.medians, phase.t_r + _SETTLE_SECONDS, "the medians")
        else:
            key = "report"
            await self._poll(key, self.client.report, phase.t_r + _SETTLE_SECONDS, "the round report")
        return await self._cache.get(("settled", key), self.client.receipts)

    async def assignment(self, manifest: RoundManifest, roster: RosterResponse) -> dict[bytes, tuple[int, int]]:
        """Identity key -> (partition, partition size), as everyone derives it from the seed."""

        async def derive() -> dict[bytes, tuple[int, int]]:
            assert roster.seed is not None
            partitions = assign_partitions(roster.seed, list(roster.roster), manifest.k_p).partition
            sizes = np.bincount(partitions, minlength=manifest.k_p)
            return {key: (int(p), int(sizes[p])) for key, p in zip(roster.roster, partitions, strict=True)}

        return await self._cache.get(("assignment", roster.seed), derive)


@dataclass
class Peer:
    """One peer: its identity, its store, its feature vector and its randomness."""

    identity: PeerIdentity
    store: PeerStore
    vector: FeatureVector
    rng: np.random.Generator
    invitation: str | None = None


@dataclass
class JoinResult:
    """What one peer did in the round."""

    partition: int | None = None
    packets: int = 0
    sends: int = 0
    resends: int = 0
    acknowledged: int = 0
    missing: int = 0
    unconfirmed: int = 0
    epsilon_spent: float = 0.0
    events: list[str] = field(default_factory=list)


Listener = Callable[[str], None]


def _ignore(_: str) -> None:
    pass


def planned_releases(manifest: RoundManifest, spec: FeatureSpec) -> tuple[dict[str, float], list[tuple[tuple[str, ...], float]]]:
    """The worst case a peer of this round can be asked for, before partitions are known.

    :func:`protocol.worst_case_releases` with this manifest's parameters, the
    same rule the aggregator's promised ``eps_total`` comes from; its eq. 7.4
    total is what the peer is asked to accept.
    """
    return worst_case_releases(
        spec, k_h=manifest.k_h, k_s=manifest.k_s, eps_median=manifest.eps_median,
        eps_data=manifest.eps_data, median_rounds=manifest.median_rounds,
    )


def check_manifest_unchanged(peer: Peer, signed: SignedManifest, aggregator: str) -> None:
    """Refuse a manifest whose hash differs from the one this peer registered under (DESIGN.md §4)."""
    try:
        peer.store.remember_manifest(peer.identity.public_key, aggregator, signed.manifest.name, signed.round_id)
    except StoreError as exc:
        raise JoinRefused("manifest-changed", str(exc)) from None


def choose_path(relays: Sequence[RelayEntry], length: int, rng: np.random.Generator, avoid: set[bytes] | None = None) -> list[RelayEntry]:
    """``length`` distinct relays in random order, chosen independently per packet.

    Relays in ``avoid`` (those on paths whose packet went missing) are used
    only when there are not enough others.
    """
    avoid = avoid or set()
    fresh = [r for r in relays if r.node_id not in avoid]
    stale = [r for r in relays if r.node_id in avoid]
    order = [fresh[i] for i in rng.permutation(len(fresh))] + [stale[i] for i in rng.permutation(len(stale))]
    chosen = order[:length]
    return [chosen[i] for i in rng.permutation(len(chosen))]


def late_windows(start: int, end: int, n_relays: int) -> list[ReleaseWindow]:
    """Hop windows for a resend that leaves at ``start`` and must arrive by ``end``.

    The same slicing as ``protocol.hop_windows`` (relay ``k`` in slice ``k``,
    the last slice for link latency) over what is left of the delivery window.
    """
    slice_length = (end - start) // (n_relays + 1)
    if slice_length < 1:
        raise JoinRefused("window-closed", f"no time left to resend: {end - start!r} s for {n_relays!r} relays")
    windows = [ReleaseWindow(start + k * slice_length, start + (k + 1) * slice_length) for k in range(n_relays)]
    windows.append(ReleaseWindow(start, end))
    return windows


def receipt_check_time(manifest: RoundManifest, survey: SurveyId) -> float:
    """When to read the receipt log for ``survey``'s packets.

    Not before the last relay's window has closed (every packet released),
    and as late as still leaves a resend enough time to cross every relay
    (one second per hop window plus the slack slice): the later the check,
    the more time the aggregator has had to verify what arrived, so fewer
    packets look missing that are merely queued.
    """
    windows = hop_windows(manifest.schedule, survey, manifest.path_length)
    t_r = manifest.schedule.phase_of(survey).t_r
    slack = t_r - windows[-2].end
    resend_time = max(manifest.path_length + 2, slack // 2)
    return max(windows[-2].end + _MARGIN, t_r - resend_time)


@dataclass
class _Outgoing:
    """One message this peer sends, and the paths it has tried."""

    survey: SurveyId
    message: bytes
    receipt: bytes
    phase: PhaseTimes
    tried: set[bytes] = field(default_factory=set)
    sends: int = 0


class PeerRound:
    """One peer's run through one round, and its state between steps.

    The steps, in order (DESIGN.md §3): :meth:`register`, :meth:`partition`,
    :meth:`obtain_credential` (whose result the caller stores in
    ``credential``), :meth:`answer_median`, :meth:`send_subsets` and
    :meth:`confirm` for what each sending step returned. :func:`join_round`
    runs them all after checking the round's worst case against the ledger;
    tests drive them one at a time to stand in for a peer that stops early or
    misbehaves after registering.
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

    def emit(self, event: str) -> None:
        self.result.events.append(event)
        self.listener(event)

    async def recheck_manifest(self, phase: str) -> None:
        check_manifest_unchanged(self.peer, await self.session.manifest(phase), self.session.client.base_url)

    async def register(self) -> None:
        check_manifest_unchanged(self.peer, self.signed, self.session.client.base_url)
        request = RegisterRequest.create(self.peer.identity.signing_key, self.round_id, self.peer.invitation)
        try:
            await self.session.client.register(request)
        except AggregatorError as exc:
            # A peer resuming after a crash is already registered: that is not a failure.
            if exc.status != 409:
                raise
        self.emit("registered")

    async def partition(self) -> tuple[int, int, tuple[tuple[str, ...], ...]]:
        roster = await self.session.roster(self.manifest, self.round_id)
        assert roster.seed is not None
        if not check_seed(roster.seed, self.manifest.seed_commitment):
            raise JoinRefused("seed-mismatch", "the revealed seed does not open the manifest's commitment; refusing the round")
        assignment = await self.session.assignment(self.manifest, roster)
        if self.key not in assignment:
            raise JoinRefused("not-rostered", f"identity {self.key.hex()!r} is not on the round's roster")
        partition, size = assignment[self.key]
        subsets = derive_subsets(roster.seed, self.spec.names, self.manifest.plan, self.manifest.k_p, self.manifest.k_h, self.manifest.k_s)[partition]
        self.peer.store.set_partition(self.key, self.round_id, partition)
        self.result.partition = partition
        return partition, size, subsets

    async def obtain_credential(self, partition: int) -> Credential:
        await self.recheck_manifest("issuance")
        async with self.session.slots:
            secret = CredentialSecret.generate()
            request, state = begin_issuance(self.issuer_key, secret, partition)
            body = CredentialRequest.create(self.peer.identity.signing_key, self.round_id, request.to_bytes())
            response = await self.session.client.credential(body)
            if response.partition != partition:
                raise JoinRefused("partition-mismatch", f"the aggregator says partition {response.partition!r}, the seed says {partition!r}")
            credential = finish_issuance(state, response.response)
        self.peer.store.set_credential(self.key, self.round_id, credential.to_bytes())
        self.emit("credential")
        return credential

    def prepare(self, survey: SurveyId, report: bytes, phase: PhaseTimes) -> _Outgoing:
        """Token, padded message and receipt for one report; stored before anything is sent."""
        assert self.credential is not None
        ctx = survey.to_bytes()
        token = make_token(self.issuer_key, self.credential, ctx, bound_bytes(survey, report))
        message = SurveyMessage(survey, token, report).to_bytes(self.geometry.message_size)
        receipt = tag_digest(self.credential, ctx)
        self.peer.store.record_packet(self.key, self.round_id, ctx, message, receipt)
        self.result.packets += 1
        return _Outgoing(survey, message, receipt, phase)

    def _hops(self, relays: Sequence[RelayEntry], windows: Sequence[ReleaseWindow]) -> list[PathHop]:
        hops = [PathHop(r.node_id, NodeAddress(r.host, r.port), r.public_key, w) for r, w in zip(relays, windows, strict=False)]
        last = self.manifest.aggregator_hop
        hops.append(PathHop(last.node_id, NodeAddress(last.host, last.port), last.public_key, windows[-1]))
        return hops

    async def send_once(self, out: _Outgoing, windows: Sequence[ReleaseWindow], deadline: float) -> bool:
        """Send ``out`` over a fresh path; True once the first relay acknowledges it durably."""
        while self.session.now() < deadline:
            relays = choose_path(self.manifest.relays, self.manifest.path_length, self.peer.rng, out.tried)
            out.tried.update(r.node_id for r in relays)
            packet = build_packet(self.geometry, self._hops(relays, windows), out.message)
            # Half the time left per attempt: a first relay that is down must
            # leave time to try a path through another one.
            left = max(0.0, deadline - self.session.now())
            give_up_at = trio.current_time() + (left if left < 2.0 else max(2.0, left / 2))
            status = await self.session.transport.send(relays[0].host, relays[0].port, packet, give_up_at=give_up_at)
            out.sends += 1
            self.result.sends += 1
            self.peer.store.count_send(self.key, out.survey.to_bytes())
            if status is AckStatus.ACCEPTED:
                return True
            self.emit("first-hop-failed")
        return False

    async def send_in_window(self, out: _Outgoing) -> None:
        """Send at a uniformly random time in ``[t_s, t_s + δ]`` (thesis §5.1)."""
        phase = out.phase
        await sleep_until_wall(self.peer.rng.uniform(phase.t_s, phase.send_end), self.session.now)
        windows = hop_windows(self.manifest.schedule, out.survey, self.manifest.path_length)
        # A packet must reach the first relay before that relay's window closes.
        await self.send_once(out, windows, windows[0].end - _MARGIN)
        self.emit("sent")

    async def confirm(self, outgoing: Sequence[_Outgoing]) -> None:
        """Read the receipt log once every relay has released; resend what is missing."""
        if not outgoing:
            return
        phase = outgoing[0].phase
        log = await self.session.receipts(receipt_check_time(self.manifest, outgoing[0].survey))
        for out in outgoing:
            if log.contains(out.survey, out.receipt):
                self.acknowledged(out)
                continue
            start = math.ceil(self.session.now())
            try:
                late = late_windows(start, phase.t_r, self.manifest.path_length)
            except JoinRefused:
                continue  # no time left to resend; the final check below decides
            self.result.resends += 1
            self.emit("resent")
            await self.send_once(out, late, late[0].end - _MARGIN)
        pending = [out for out in outgoing if not log.contains(out.survey, out.receipt)]
        if pending:
            # After t_r nothing more is accepted: once the aggregator has
            # verified what arrived, the log says what counted.
            try:
                final = await self.session.settled_receipts(self.manifest, outgoing[0].survey)
            except AggregatorError:
                # The log could not be read (the aggregator stopped serving):
                # the packets may well have counted, but the peer cannot tell.
                self.result.unconfirmed += len(pending)
                for _ in pending:
                    self.emit("unconfirmed")
                return
            for out in pending:
                if final.contains(out.survey, out.receipt):
                    self.acknowledged(out)
                else:
                    self.result.missing += 1
                    self.emit("missing")

    def acknowledged(self, out: _Outgoing) -> None:
        self.peer.store.acknowledge(self.key, out.survey.to_bytes())
        self.result.acknowledged += 1
        self.emit("acknowledged")

    async def answer_median(self, partition: int) -> list[_Outgoing]:
        """Sub-round ``partition`` queries this peer (thesis Algorithm 1): one perturbed bit per feature."""
        if partition >= self.manifest.median_rounds:
            return []
        try:
            thresholds = await self.session.thresholds(self.manifest, partition)
        except AggregatorError:
            # Not published in time: this peer's answer is simply missing from
            # the search; it still sends its data (nothing was spent).
            self.emit("median-missed")
            return []
        survey = SurveyId.median(self.round_id, partition)
        if thresholds.survey != survey:
            raise JoinRefused("bad-thresholds", f"thresholds for sub-round {partition} name survey {thresholds.survey}")
        bits = [
            answer_is_greater(float(self.peer.vector.features[name]), threshold, self.manifest.eps_median, self.peer.rng)
            for name, threshold in zip(thresholds.features, thresholds.thresholds, strict=True)
        ]
        report = encode_median_report(bits)
        async with self.session.slots:
            self.ledger.spend_median(survey, thresholds.features, self.manifest.eps_median)
            out = self.prepare(survey, report, self.manifest.schedule.median[partition])
        await self.send_in_window(out)
        return [out]

    async def send_subsets(self, partition: int, size: int, subsets: Sequence[tuple[str, ...]]) -> list[_Outgoing]:
        medians = await self.session.medians(self.manifest) if self.spec.numeric_names else MedianResults({})
        cut_points: dict[str, list[float]] = {}
        for feature in self.spec.features:
            if isinstance(feature, NumericFeature):
                if feature.quantiles != 1 or feature.name not in medians.medians:
                    raise JoinRefused("no-median", f"no published median for {feature.name!r}")
                cut_points[feature.name] = [medians.medians[feature.name]]
        bins = self.pipeline.bins(self.peer.vector, cut_points)
        outgoing = []
        for index, subset in enumerate(subsets):
            value = self.pipeline.encode_subset(subset, bins, self.peer.vector.label)
            oracle = _oracle(self.manifest.oracle, self.manifest.eps_data, self.spec.domain_size(subset), size)
            report = oracle.encode_report(oracle.privatize(np.asarray([value]), self.peer.rng)[0])
            survey = SurveyId.data(self.round_id, partition, index)
            async with self.session.slots:
                self.ledger.spend_subset(survey, subset, self.manifest.eps_data)
                outgoing.append(self.prepare(survey, report, self.manifest.schedule.data))
        async with trio.open_nursery() as nursery:
            for out in outgoing:
                nursery.start_soon(self.send_in_window, out)
        return outgoing


async def join_round(
    peer: Peer,
    session: RoundSession,
    signed: SignedManifest,
    pipeline: RoundPipeline,
    *,
    listener: Listener = _ignore,
) -> JoinResult:
    """Take part in the round ``signed`` describes, from registration to receipts.

    The caller has fetched ``signed`` (``session.manifest("join")``), built
    ``pipeline`` from its feature spec, computed ``peer.vector`` with it and
    obtained the peer's consent. Raises :class:`JoinRefused`,
    :class:`AggregatorError` or :class:`mechanisms.BudgetExceeded`.
    """
    async with session.slots:
        run = PeerRound(peer, session, signed, pipeline, listener)
        medians, subsets = planned_releases(run.manifest, run.spec)
        try:
            run.ledger.check(medians=medians, subsets=subsets)
        except BudgetExceeded as exc:
            raise JoinRefused("budget", str(exc)) from None
        await run.register()
    partition, size, my_subsets = await run.partition()
    run.credential = await run.obtain_credential(partition)
    median_out = await run.answer_median(partition)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run.confirm, median_out)
        await run.recheck_manifest("data")
        data_out = await run.send_subsets(partition, size, my_subsets)
    await run.confirm(data_out)
    run.result.epsilon_spent = run.ledger.spent()
    return run.result
