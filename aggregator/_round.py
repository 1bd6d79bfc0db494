"""One round's logic, independent of HTTP and sockets (DESIGN.md §3).

:class:`RoundState` answers every API request, decides which surveys are open
and which partition each must come from, replays the median search from the
stored answers (so a restarted aggregator publishes the same thresholds), and
learns once the data phase's delivery window has closed. Time comes from an
injected ``clock`` (UTC seconds), so the phase logic runs under trio's
MockClock in tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from nacl.signing import SigningKey

from anonml.errors import AnonMLError
from anonml.crypto import (
    DEFAULT_MAX_HOPS,
    DEFAULT_PACKET_SIZE,
    IssueJob,
    IssuerSecretKey,
    SphinxGeometry,
    issue_credentials,
    node_id_of,
    public_key_of,
)
from anonml.mechanisms import FrequencyOracle, QuantileSearch, make_oracle, total_epsilon
from anonml.protocol import (
    AggregatorHop,
    CredentialRequest,
    CredentialResponse,
    FeatureSpec,
    FeatureSpecError,
    InvalidApiMessage,
    InvalidMessage,
    MedianResults,
    MedianThresholds,
    NumericFeature,
    PhaseTimes,
    PlanError,
    ReceiptLog,
    RegisterRequest,
    RelayEntry,
    ReleasePlan,
    RoundManifest,
    RosterResponse,
    RoundSchedule,
    RoundStatus,
    SignedManifest,
    SurveyId,
    SurveyKind,
    acceptance_window,
    assign_partitions,
    decode_median_report,
    derive_subsets,
    phase_at,
    seed_commitment,
    worst_case_releases,
)
from anonml.protocol._canonical import FieldReader, InvalidDocument

from anonml.aggregator._store import AggregatorHome, RegistrationRefused, RoundStore

Clock = Callable[[], float]


ALREADY_ISSUED = "a credential was already issued to this identity for this round"


class ApiRefused(AnonMLError):
    """Raised by :class:`RoundState` request handlers; ``status`` is the HTTP status, ``reason`` the error text."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


def issuance_refused(reason: str) -> ApiRefused:
    """The answer to a credential request whose blind-issuance proof fails (``InvalidIssuance.reason``)."""
    return ApiRefused(400, f"bad issuance request ({reason})")


class SurveyRefused(AnonMLError):
    """Raised by :meth:`RoundState.check_survey`; ``reason`` is the rejection counter's name."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class RoundSecrets:
    """What only the aggregator holds for one round."""

    signing_key: SigningKey
    issuer_key: IssuerSecretKey
    seed: bytes
    final_hop_private_key: bytes


class RoundState:
    """Everything the aggregator knows and decides about one round."""

    def __init__(
        self, store: RoundStore, signed: SignedManifest, secrets: RoundSecrets, *, clock: Clock = time.time
    ) -> None:
        self.store = store
        self.signed = signed
        self.manifest: RoundManifest = signed.manifest
        self.round_id = signed.round_id
        self.secrets = secrets
        self.clock = clock
        self.spec = FeatureSpec.from_dict(dict(self.manifest.features))
        self.numeric = self.spec.numeric_names
        self._manifest_json = signed.to_json()
        self._receipts_cache: tuple[int, bytes] | None = None
        self._roster_cache: tuple[tuple[int, bool], bytes] | None = None
        self.roster_final = False
        """Set when registration has closed and every admitted registration is stored."""
        self.learning_started_at: int | None = None
        """Set by the driver when the data phase's delivery window has closed."""
        self.link_errors: Counter[str] = Counter()
        """Packet-sink connections that ended in a link error, by reason (reported in the status counts)."""

    def now(self) -> int:
        return int(self.clock())

    @cached_property
    def geometry(self) -> SphinxGeometry:
        """The round's packet geometry, parsed once (every packet reads its lengths from it)."""
        return self.manifest.sphinx_geometry()

    # -- phases ---------------------------------------------------------------

    def outcome(self) -> str | None:
        """``"done"`` or ``"failed"`` once the round has ended, else None."""
        value = self.store.get_result("outcome")
        return None if value is None else json.loads(value)["phase"]

    def participation_failure(self, now: int) -> str | None:
        """Why the round cannot go on at ``now``, if minimum participation is missed."""
        schedule, needed = self.manifest.schedule, self.manifest.min_participation
        counts = self.store.counts()
        if now >= schedule.t_register_end and counts["registered"] < needed:
            return f"minimum participation not reached: {counts['registered']} registered, {needed} needed"
        if now >= schedule.t_issue_end and counts["credentials"] < needed:
            return f"minimum participation not reached: {counts['credentials']} credentials issued, {needed} needed"
        return None

    def status(self) -> RoundStatus:
        now = self.now()
        phase, sub_round = phase_at(self.manifest.schedule, now)
        outcome = self.outcome()
        if outcome is not None:
            phase, sub_round = outcome, None
        counts = self.store.counts()
        counts["awaiting-verification"] = self.store.inbox_size()
        counts.update({f"link/{reason}": count for reason, count in sorted(self.link_errors.items())})
        return RoundStatus(
            self.round_id, phase, sub_round, now, self.manifest.schedule.to_dict(), counts, self.store.rejections()
        )

    # -- announce, register, roster ------------------------------------------------

    def manifest_json(self) -> bytes:
        return self._manifest_json

    def receipts_json(self) -> bytes:
        """The whole receipt log (DESIGN.md §5), re-encoded only when a packet was accepted since."""
        version = self.store.packets_version
        if self._receipts_cache is None or self._receipts_cache[0] != version:
            log = self.store.receipts()
            body = ReceiptLog({survey: tuple(digests) for survey, digests in log.items()}).to_json()
            self._receipts_cache = (version, body)
        return self._receipts_cache[1]

    def admit_registration(self, request: RegisterRequest) -> int | None:
        """Check a registration request; the time to record it with, or None if there is nothing to record.

        None means the key registered earlier and registration has closed
        (re-registering is idempotent). Raises ApiRefused otherwise.
        """
        self._authenticate(request)
        now = self.now()
        if now >= self.manifest.schedule.t_register_end or self.roster_final:
            if self.store.is_registered(request.identity_key):
                return None
            raise ApiRefused(403, "registration has closed")
        return now

    def register(self, request: RegisterRequest) -> bool:
        """Admit and record one registration now; True if new (the HTTP path batches commits instead)."""
        now = self.admit_registration(request)
        if now is None:
            return False
        try:
            return self.store.register(request.identity_key, request.invitation, self.manifest.registration, now)
        except RegistrationRefused as exc:
            raise ApiRefused(403, exc.reason) from None

    def close_registration(self) -> None:
        """Freeze the roster (registration has closed and every admitted request is stored): the seed may be revealed."""
        if not self.now() >= self.manifest.schedule.t_register_end:
            raise RuntimeError(f"registration is open until {self.manifest.schedule.t_register_end}")
        self.roster_final = True

    def seed_revealed(self, now: int) -> bool:
        """The seed (and with it every partition) is public once the roster is final (DESIGN.md §3 step 3)."""
        return self.roster_final and now >= self.manifest.schedule.t_register_end

    def roster(self) -> RosterResponse:
        seed = self.secrets.seed if self.seed_revealed(self.now()) else None
        return RosterResponse.create(self.secrets.signing_key, self.round_id, self.store.roster(), seed)

    def roster_json(self) -> bytes:
        """``GET /v1/roster``, signed and encoded once per roster change (every peer fetches it)."""
        key = (self.store.registrations_version, self.seed_revealed(self.now()))
        if self._roster_cache is None or self._roster_cache[0] != key:
            self._roster_cache = (key, self.roster().to_json())
        return self._roster_cache[1]

    @cached_property
    def _assignment(self) -> dict[bytes, int]:
        # Only computed after t_register_end, when the roster is final.
        roster = self.store.roster()
        assignment = assign_partitions(self.secrets.seed, roster, self.manifest.k_p)
        return {key: int(partition) for key, partition in zip(roster, assignment.partition)}

    def assignment(self) -> dict[bytes, int]:
        """Identity key → partition (DESIGN.md §3 step 3); raises ApiRefused before the roster is final."""
        if not self.seed_revealed(self.now()):
            raise ApiRefused(409, "the roster is not final before t_register_end")
        return self._assignment

    def prepare(self) -> None:
        """Close registration and derive partitions, subsets and oracles from the final roster.

        The caller has stored every admitted registration (the driver drains
        the registration batcher first). Called on the event loop, so
        verification threads only read these (they must not consult the
        clock: under trio's MockClock it is only readable from the loop).
        """
        if self.now() >= self.manifest.schedule.t_register_end:
            self.close_registration()
            _ = self._oracles

    def partition_sizes(self) -> list[int]:
        """Peers per partition of the final roster (only meaningful after t_register_end)."""
        sizes = [0] * self.manifest.k_p
        for partition in self._assignment.values():
            sizes[partition] += 1
        return sizes

    @cached_property
    def subsets(self) -> tuple[tuple[tuple[str, ...], ...], ...]:
        """Feature subsets per partition, derived from the seed (protocol._plan)."""
        m = self.manifest
        return derive_subsets(self.secrets.seed, self.spec.names, m.plan, m.k_p, m.k_h, m.k_s)

    # -- credentials ---------------------------------------------------------------

    def _authenticate(self, request: RegisterRequest | CredentialRequest) -> None:
        """Refuse a request for another round (409) or one its identity key did not sign (403)."""
        if request.round_id != self.round_id:
            raise ApiRefused(409, f"round_id {request.round_id.hex()!r} is not this round")
        try:
            request.verify()
        except InvalidApiMessage:
            raise ApiRefused(403, "bad signature") from None

    def admit_credential(self, request: CredentialRequest) -> tuple[int, int]:
        """Check a credential request; ``(partition, now)`` to issue it with, or ApiRefused."""
        self._authenticate(request)
        now = self.now()
        if not self.seed_revealed(now):
            raise ApiRefused(409, "credentials are issued after registration closes")
        if now >= self.manifest.schedule.t_issue_end:
            raise ApiRefused(403, "credential issuance has closed")
        partition = self.assignment().get(request.identity_key)
        if partition is None:
            raise ApiRefused(403, "identity key is not on the roster")
        if self.store.credential_issued(request.identity_key):
            raise ApiRefused(409, ALREADY_ISSUED)
        return partition, now

    def issue(self, request: CredentialRequest) -> CredentialResponse:
        """Admit, issue and record one credential now (the HTTP path batches issuance and commits instead)."""
        partition, now = self.admit_credential(request)
        [response] = issue_credentials(self.secrets.issuer_key, [IssueJob(request.request, partition)])
        if isinstance(response, str):
            raise issuance_refused(response)
        if not self.store.record_credential(request.identity_key, partition, response, now):
            raise ApiRefused(409, ALREADY_ISSUED)
        return CredentialResponse(response, partition)

    # -- surveys -------------------------------------------------------------------

    def check_survey(self, survey: SurveyId, now: int) -> int:
        """The partition a token for ``survey`` must carry; raises SurveyRefused if it is not open at ``now``."""
        m = self.manifest
        if survey.round_id != self.round_id:
            raise SurveyRefused("unknown-survey")
        if survey.kind == SurveyKind.MEDIAN:
            if survey.partition >= m.median_rounds or not self.numeric:
                raise SurveyRefused("unknown-survey")
        elif survey.partition >= m.k_p or survey.subset >= m.k_h:
            raise SurveyRefused("unknown-survey")
        start, end = acceptance_window(m.schedule, survey)
        # Delivery happens in (t_s + δ, t_r): at t_r the phase's results are
        # computed and published, so nothing more may count for it.
        if not start <= now < end:
            raise SurveyRefused("outside-window")
        return survey.partition

    def data_oracle(self, partition: int, subset: int) -> FrequencyOracle:
        """The frequency oracle of one data survey; ``"auto"`` chooses with the partition's size (DESIGN.md §8).

        Peers make the same choice: the partition sizes follow from the signed roster and the seed.
        """
        return self._oracles[(partition, subset)]

    @cached_property
    def _oracles(self) -> dict[tuple[int, int], FrequencyOracle]:
        sizes = self.partition_sizes()
        oracles = {}
        for partition, subsets in enumerate(self.subsets):
            for index, subset in enumerate(subsets):
                m = self.spec.domain_size(subset)
                oracles[(partition, index)] = make_oracle(
                    self.manifest.oracle, self.manifest.eps_data, m, n=max(sizes[partition], 1)
                )
        return oracles

    def check_report(self, survey: SurveyId, report: bytes) -> None:
        """Raise InvalidMessage unless ``report`` is a well-formed answer to ``survey``."""
        if survey.kind == SurveyKind.MEDIAN:
            decode_median_report(report, len(self.numeric))
            return
        from anonml.mechanisms import InvalidReport

        try:
            self.data_oracle(survey.partition, survey.subset).decode_reports([report])
        except (InvalidReport, ValueError) as exc:
            raise InvalidMessage(f"bad report for {survey}: {exc}") from None

    # -- median phase (thesis Algorithm 1) ----------------------------------------------

    def _searches_after(self, sub_rounds: int) -> list[QuantileSearch]:
        """The searches after consuming the answers of sub-rounds ``0..sub_rounds-1``."""
        searches = []
        for name in self.numeric:
            feature = self.spec.feature(name)
            assert isinstance(feature, NumericFeature)
            searches.append(QuantileSearch(feature.low, feature.high, self.manifest.eps_median))
        for sub_round in range(sub_rounds):
            answers = [
                decode_median_report(report, len(self.numeric))
                for report in self.store.reports(SurveyId.median(self.round_id, sub_round))
            ]
            if not answers:
                continue
            bits = np.asarray(answers, dtype=np.int64)
            for column, search in enumerate(searches):
                search.update(bits[:, column])
        return searches

    def publish_thresholds(self, sub_round: int) -> MedianThresholds | None:
        """Compute and store the thresholds of ``sub_round`` (once; the driver calls it when
        sub-round ``i-1``'s delivery window has closed and its batches are stored)."""
        if not 0 <= sub_round < self.manifest.median_rounds or not self.numeric:
            return None
        key = f"thresholds/{sub_round}"
        if self.store.get_result(key) is None:
            values = tuple(float(search.thresholds()[0]) for search in self._searches_after(sub_round))
            published = MedianThresholds(sub_round, SurveyId.median(self.round_id, sub_round), self.numeric, values)
            self.store.put_result(key, published.to_json())
        return self.thresholds(sub_round)

    def thresholds(self, sub_round: int) -> MedianThresholds | None:
        """The published thresholds of ``sub_round``, or None before they are published."""
        stored = self.store.get_result(f"thresholds/{sub_round}") if 0 <= sub_round < 2**16 else None
        return None if stored is None else MedianThresholds.from_json(stored)

    def publish_medians(self) -> MedianResults:
        """Compute and store the final medians (once; after the last sub-round's batches are stored)."""
        if self.store.get_result("medians") is None:
            searches = self._searches_after(self.manifest.median_rounds)
            medians = MedianResults({n: float(s.estimates()[0]) for n, s in zip(self.numeric, searches)})
            self.store.put_result("medians", medians.to_json())
        published = self.medians()
        assert published is not None
        return published

    def medians(self) -> MedianResults | None:
        """The published final medians, or None before the median phase has ended."""
        stored = self.store.get_result("medians")
        return None if stored is None else MedianResults.from_json(stored)

    def finish(self, phase: str, detail: dict[str, Any]) -> None:
        self.store.put_result("outcome", json.dumps({"phase": phase, **detail}, sort_keys=True).encode())


def message_hash(bound: bytes) -> bytes:
    """What decides "same message" for duplicate detection (DESIGN.md §6): SHA-256 of the bound bytes."""
    return hashlib.sha256(bound).digest()


class RoundSpecError(InvalidDocument):
    """Raised by :func:`parse_round_spec` for a malformed round spec; ``field`` names the bad field."""


@dataclass(frozen=True)
class RoundSpec:
    """A validated ``round.toml``; times are seconds relative to the round's creation."""

    name: str
    spec: FeatureSpec
    k_p: int
    k_h: int
    k_s: int
    plan: str
    learner: str
    eps_total: float
    oracle: str
    median_share: float
    register_seconds: int
    issue_seconds: int
    median_rounds: int
    median_send: int
    median_delivery: int
    data_send: int
    data_delivery: int
    publish_gap: int
    relays: tuple[RelayEntry, ...]
    path_length: int
    packet_size: int
    max_hops: int
    http_host: str
    http_port: int
    sink_host: str
    sink_port: int
    min_participation: int
    registration: str
    invitations: int
    allow_list: tuple[bytes, ...]


ROUND_SPEC_EXAMPLE = """\
name = "adult-income"

[task]                      # builtin = "adult", or features + label as protocol.FeatureSpec.to_dict()
builtin = "adult"

[learning]
k_p = 8                     # partitions
k_h = 2                     # subsets per partition ("one" plan: 1)
k_s = 2                     # features per subset
plan = "split"              # or "one"
learner = "logreg"          # or "tree"

[privacy]
eps_total = 4.0             # promised to each peer (thesis eq. 7.4), median answers included
oracle = "auto"             # or a mechanisms.ORACLE_NAMES entry
median_share = 0.5          # optional: share of eps_total for the median search

[schedule]                  # seconds; the round starts when `round new` runs
register = 120
issue = 60
median_rounds = 4           # sub-round i queries partition i (needs <= k_p; 0 without numeric features)
median_send = 10            # each sub-round: send window (delta) ...
median_delivery = 20        # ... then delivery window (needs >= path_length + 1)
data_send = 60
data_delivery = 60
publish_gap = 2             # optional: seconds between publishing results and the next send window

[network]
path_length = 3             # relays per path
packet_size = 2048          # optional; relays must use the same geometry (their defaults match)
max_hops = 5                # optional: Sphinx routing slots, >= path_length + 1
http_host = "127.0.0.1"
http_port = 8080
sink_host = "127.0.0.1"     # where last relays deliver (the aggregator is the last Sphinx hop)
sink_port = 8081
relays = [                  # `anonml relay info` gives each entry
  { node_id = "<hex>", host = "127.0.0.1", port = 9001, public_key = "<hex>", key_epoch = 1 },
]

[participation]
min_participation = 100
registration = "open"       # or "allow-list" (allow_list = ["<hex identity key>", ...]) or "invitation" (invitations = N)
"""


def parse_round_spec(document: dict[str, Any]) -> RoundSpec:
    """Validate a parsed round.toml (see ROUND_SPEC_EXAMPLE); every error names its field (``learning.k_p``)."""
    reader = FieldReader(document, "", RoundSpecError)
    name = reader.text("name", max_len=128, pattern=r"[A-Za-z0-9][A-Za-z0-9 ._\-]*")
    task = reader.child("task")
    if task.optional("builtin"):
        builtin = task.choice("builtin", ("adult",))
        from anonml.learning._adult import adult_spec

        spec = adult_spec() if builtin == "adult" else None
        assert spec is not None
    else:
        raw = {"features": task.items("features", max_items=256), "label": task.obj("label")}
        try:
            spec = FeatureSpec.from_dict(raw)
        except FeatureSpecError as exc:
            task.fail("features", str(exc))
    task.done()
    if any(getattr(spec.feature(n), "quantiles", 1) != 1 for n in spec.numeric_names):
        reader.fail_at("task.features", "the network round supports median binning only (quantiles = 1)")
    learning = reader.child("learning")
    k_p = learning.integer("k_p", 1, 4096)
    k_h = learning.integer("k_h", 1, 64)
    k_s = learning.integer("k_s", 1, 16)
    plan = learning.choice("plan", ("split", "one"))
    learner = learning.choice("learner", ("logreg", "tree"))
    learning.done()
    privacy = reader.child("privacy")
    eps_total = privacy.number("eps_total", 1e-6, 100.0)
    oracle = privacy.text("oracle", max_len=32, pattern=r"[a-z0-9_\-]+")
    median_share = privacy.number("median_share", 0.01, 0.99) if privacy.optional("median_share") else 0.5
    privacy.done()
    schedule = reader.child("schedule")
    register_seconds = schedule.integer("register", 1, 10**7)
    issue_seconds = schedule.integer("issue", 1, 10**7)
    median_rounds = schedule.integer("median_rounds", 0, min(k_p, 64)) if spec.numeric_names else 0
    if not spec.numeric_names:
        schedule.optional("median_rounds")
    elif median_rounds == 0:
        schedule.fail("median_rounds", "numeric features need at least one median sub-round")
    median_send = schedule.integer("median_send", 1, 10**7)
    median_delivery = schedule.integer("median_delivery", 2, 10**7)
    data_send = schedule.integer("data_send", 1, 10**7)
    data_delivery = schedule.integer("data_delivery", 2, 10**7)
    # Thresholds of sub-round i (and the final medians) are published when the
    # previous delivery window closes; the gap lets every peer fetch them
    # before its send window opens.
    publish_gap = schedule.integer("publish_gap", 0, 10**6) if schedule.optional("publish_gap") else 2
    schedule.done()
    network = reader.child("network")
    relays = tuple(
        RelayEntry.read(network.nested(item, f"network.relays[{i}]"))
        for i, item in enumerate(network.items("relays", max_items=256))
    )
    path_length = network.integer("path_length", 1, 16)
    if path_length > len(relays):
        network.fail("path_length", f"{path_length} relays per path but {len(relays)} relays listed")
    for phase_name, delivery in (("median_delivery", median_delivery), ("data_delivery", data_delivery)):
        if delivery < path_length + 1:
            reader.fail_at(f"schedule.{phase_name}", f"{delivery} s cannot hold {path_length} relay windows and the slack slice")
    packet_size = (
        network.integer("packet_size", 512, 65536) if network.optional("packet_size") else DEFAULT_PACKET_SIZE
    )
    max_hops = network.integer("max_hops", 2, 32) if network.optional("max_hops") else DEFAULT_MAX_HOPS
    if path_length + 1 > max_hops:
        network.fail("max_hops", f"{max_hops} routing slots cannot hold {path_length} relays and the aggregator")
    http_host = network.text("http_host", max_len=255)
    http_port = network.integer("http_port", 1, 65535)
    sink_host = network.text("sink_host", max_len=255)
    sink_port = network.integer("sink_port", 1, 65535)
    network.done()
    participation = reader.child("participation")
    min_participation = participation.integer("min_participation", 1, 2**31)
    registration = participation.choice("registration", ("open", "allow-list", "invitation"))
    invitations = participation.integer("invitations", 0, 10**6) if participation.optional("invitations") else 0
    allow_list = tuple(
        participation.decode_hex(item, f"participation.allow_list[{i}]", size=32)
        for i, item in enumerate(participation.items("allow_list", max_items=10**6) if participation.optional("allow_list") else [])
    )
    participation.done()
    reader.done()
    if registration == "invitation" and invitations == 0:
        reader.fail_at("participation.invitations", "the invitation policy needs invitations > 0")
    if registration == "allow-list" and not allow_list:
        reader.fail_at("participation.allow_list", "the allow-list policy needs a non-empty allow_list")
    try:
        derive_subsets(bytes(32), spec.names, plan, k_p, k_h, k_s)
    except PlanError as exc:
        reader.fail_at("learning", str(exc))
    return RoundSpec(
        name, spec, k_p, k_h, k_s, plan, learner, eps_total, oracle, median_share, register_seconds, issue_seconds,
        median_rounds, median_send, median_delivery, data_send, data_delivery, publish_gap, relays, path_length,
        packet_size, max_hops,
        http_host, http_port, sink_host, sink_port, min_participation, registration, invitations, allow_list,
    )


def build_schedule(spec: RoundSpec, start: int) -> RoundSchedule:
    """Absolute times from the spec's durations; ``publish_gap`` seconds before each phase that needs published results."""
    t_register_end = start + spec.register_seconds
    t_issue_end = t_register_end + spec.issue_seconds
    t = t_issue_end
    median = []
    for index in range(spec.median_rounds):
        # Sub-round 0's thresholds are public from the start; later ones need the gap.
        t += spec.publish_gap if index else 0
        phase = PhaseTimes(t, spec.median_send, t + spec.median_send + spec.median_delivery)
        median.append(phase)
        t = phase.t_r
    t += spec.publish_gap if median else 0
    data = PhaseTimes(t, spec.data_send, t + spec.data_send + spec.data_delivery)
    return RoundSchedule(t_register_end, t_issue_end, tuple(median), data)


def worst_case_epsilon(spec: FeatureSpec, k_h: int, k_s: int, eps_median: float, eps_data: float, median_rounds: int) -> float:
    """ε_T to promise in the manifest: eq. 7.4 of :func:`protocol.worst_case_releases`.

    Peers check the same releases against their ledger before consenting, so
    the promise and the consent follow one rule.
    """
    medians, subsets = worst_case_releases(
        spec, k_h=k_h, k_s=k_s, eps_median=eps_median, eps_data=eps_data, median_rounds=median_rounds
    )
    return float(total_epsilon(medians, subsets))


def create_round(
    home: AggregatorHome, spec: RoundSpec, *, now: int, rng_bytes: Callable[[int], bytes] = os.urandom
) -> tuple[RoundState, list[str]]:
    """Make a round: issuer key, seed and commitment, signed manifest, database. Returns it and its invitation codes."""
    signing_key = home.signing_key()
    final_private = home.read_key(home.final_hop_path)
    final_public = public_key_of(final_private)
    seed = rng_bytes(32)
    issuer_key = IssuerSecretKey.generate()
    issuer_public = issuer_key.public_key()
    plan = ReleasePlan.build(
        kind=spec.plan, features=spec.spec.names, numeric_features=spec.spec.numeric_names, k_p=spec.k_p,
        k_h=spec.k_h, k_s=spec.k_s, epsilon_total=spec.eps_total, seed=seed, oracle=spec.oracle,
        median_peers="all", median_share=spec.median_share, median_steps=max(spec.median_rounds, 1),
    )
    geometry = SphinxGeometry.create(max_hops=spec.max_hops, packet_size=spec.packet_size)
    manifest = RoundManifest(
        name=spec.name, label=spec.spec.label.name, features=spec.spec.to_dict(), k_p=spec.k_p, k_h=spec.k_h,
        k_s=spec.k_s, plan=spec.plan, learner=spec.learner, eps_median=plan.median_epsilon,
        eps_data=plan.release_epsilon, oracle=spec.oracle,
        eps_total=worst_case_epsilon(
            spec.spec, spec.k_h, spec.k_s, plan.median_epsilon, plan.release_epsilon, spec.median_rounds
        ),
        schedule=build_schedule(spec, now), relays=spec.relays,
        aggregator_hop=AggregatorHop(node_id_of(final_public), spec.sink_host, spec.sink_port, final_public),
        aggregator_url=f"http://{spec.http_host}:{spec.http_port}", path_length=spec.path_length,
        geometry=geometry.to_dict(), token_public_key=issuer_public.to_bytes(), token_kid=issuer_public.kid,
        seed_commitment=seed_commitment(seed), min_participation=spec.min_participation,
        registration=spec.registration, identity_key=bytes(signing_key.verify_key),
    )
    signed = SignedManifest.sign(manifest, signing_key)
    directory = home.round_dir(signed.round_id)
    directory.mkdir(mode=0o700, parents=True, exist_ok=False)
    store = RoundStore(directory / "round.sqlite")
    store.put_meta("manifest", signed.to_json())
    store.put_meta("issuer_key", issuer_key.to_bytes())
    store.put_meta("seed", seed)
    codes = [rng_bytes(12).hex() for _ in range(spec.invitations)]
    store.add_invitations(codes)
    store.add_allowed(spec.allow_list)
    secrets = RoundSecrets(signing_key, issuer_key, seed, final_private)
    return RoundState(store, signed, secrets), codes


def open_round(home: AggregatorHome, round_id_hex: str, *, clock: Clock = time.time) -> RoundState:
    """Load a round created by :func:`create_round` (raises FileNotFoundError for an unknown round)."""
    directory = home.root / "rounds" / round_id_hex
    if not (directory / "round.sqlite").is_file():
        raise FileNotFoundError(f"no round {round_id_hex!r} in {str(home.root)!r}")
    store = RoundStore(directory / "round.sqlite")
    signing_key = home.signing_key()
    manifest_json, issuer, seed = (store.get_meta(k) for k in ("manifest", "issuer_key", "seed"))
    if manifest_json is None or issuer is None or seed is None:
        raise FileNotFoundError(f"round {round_id_hex!r} is incomplete")
    signed = SignedManifest.from_json(manifest_json, expected_identity=bytes(signing_key.verify_key))
    secrets = RoundSecrets(signing_key, IssuerSecretKey.from_bytes(issuer), seed, home.read_key(home.final_hop_path))
    return RoundState(store, signed, secrets, clock=clock)
