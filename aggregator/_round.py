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
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
from nacl.signing import SigningKey

from anonml.aggregator._anonymity import RequestLog
from anonml.aggregator._beacon import stored_commitments
from anonml.aggregator._store import IssuedAnswer, IssuedCredential, Refusal, Registered, Registration, RoundStore
from anonml.crypto import (
    IssueJob,
    IssuerSecretKey,
    JobRefused,
    SphinxGeometry,
    issue_credentials,
)
from anonml.base.errors import AnonMLError
from anonml.learning import SgdRule
from anonml.mechanisms import FrequencyOracle, QuantileSearch
from anonml.protocol import (
    Check,
    CredentialRequest,
    CredentialResponse,
    FeatureSpec,
    HeadsResponse,
    InvalidApiMessage,
    InvalidMessage,
    MedianResults,
    MedianThresholds,
    NumericFeature,
    PartitionPlan,
    PhaseTimes,
    ReceiptSegment,
    RegisterRequest,
    RosterHead,
    RosterResponse,
    RoundManifest,
    RoundPhase,
    RoundStatus,
    SgdModel,
    SignedDocument,
    SignedManifest,
    SurveyId,
    SurveyKind,
    TaskKind,
    TreeHead,
    acceptance_window,
    decode_median_report,
    decode_pool_answer,
    log_consistency_proof,
    phase_at,
    receipt_leaves_root,
)

if TYPE_CHECKING:
    from anonml.learning import RoundModel

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
    issuer_key: IssuerSecretKey | None
    """None once the round has ended: the key is erased then (:meth:`RoundState.finish`)."""
    seed: bytes
    final_hop_private_key: bytes


@dataclass
class Snapshots:
    """Responses every peer fetches alike, encoded and signed once off the event loop (issue 13).

    Built at the moments they change (the roster when registration closes,
    the log segments at each scheduled check, the status every second) and
    served as bytes: a request never rebuilds them.
    """

    roster: bytes | None = None
    roster_head: bytes | None = None
    segments: dict[tuple[SurveyKind, int, Check], bytes] = field(default_factory=dict)
    heads: bytes | None = None
    status: bytes | None = None
    report: bytes | None = None


def request_digest(request: CredentialRequest) -> bytes:
    """SHA-256 of a credential request's blinded issuance request: what a retry must match to be answered again."""
    return hashlib.sha256(request.request).digest()


def credential_answer(answer: IssuedAnswer) -> CredentialResponse:
    """The stored answer for the request it answered, or 409 for any other request from that identity.

    Idempotent for the identical request only: a peer whose answer was lost
    (a reset connection) retries the same bytes and gets the same answer,
    which tells the aggregator nothing it did not see when it first issued
    it; a different blinded request would be a second credential, never given.
    """
    if not answer.same_request:
        raise ApiRefused(409, ALREADY_ISSUED)
    return CredentialResponse(answer.response, answer.partition)


def registration_outcome(outcome: Registered | Refusal) -> bool:
    """True for a new registration, False for a repeat; raises ApiRefused(403) for a refusal."""
    if isinstance(outcome, Refusal):
        raise ApiRefused(403, outcome.reason)
    return outcome is Registered.NEW


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
        # The features the median search cuts: none in a model-averaging round, whose rows are encoded from public bounds.
        searched = self.manifest.task_kind != TaskKind.MODEL_AVERAGING
        self.numeric_features = tuple(f for f in self.spec.features if isinstance(f, NumericFeature) and searched)
        self.numeric = tuple(f.name for f in self.numeric_features)
        self.cut_point_counts = [feature.quantiles for feature in self.numeric_features]
        """Each numeric feature's number of cut points, in the order of ``self.numeric`` (what a median answer may name)."""
        self.sgd = SgdRule.of(self.manifest) if self.manifest.task_kind == TaskKind.SGD else None
        """An SGD round's rule (its median sub-rounds are gradient steps, ``learning._round_sgd``), else None."""
        self._manifest_json = signed.to_json()
        self.roster_final = False
        """Set when registration has closed and every admitted registration is stored."""
        self.final_roster: RosterResponse | None = None
        """The roster signed when registration closed (set by :meth:`freeze_roster`)."""
        self.plan: PartitionPlan | None = None
        """Partitions, subsets and oracles, derived from the final roster and the relays' beacon values."""
        self.snapshots = Snapshots()
        """Encoded, signed responses built off the event loop (issue 13): served as they are."""
        self.learning_started_at: int | None = None
        """Set by the driver when the data phase's delivery window has closed."""
        self.link_errors: Counter[str] = Counter()
        """Packet-sink connections that ended in a link error, by reason (reported in the status counts)."""
        self.beacon_refused: Counter[str] = Counter()
        """Relay beacon statements refused, by reason (``aggregator._beacon``; reported in the status counts)."""
        self.requests = RequestLog()
        """Every HTTP request served, as a logging adversary keeps it (the anonymity report, DESIGN.md §11)."""

    def now(self) -> int:
        return int(self.clock())

    @cached_property
    def geometry(self) -> SphinxGeometry:
        """The round's packet geometry, parsed once (every packet reads its lengths from it)."""
        return self.manifest.sphinx_geometry()

    # -- phases ---------------------------------------------------------------

    def outcome(self) -> RoundPhase | None:
        """``DONE``, ``DEGRADED`` or ``FAILED`` once the round has ended, else None."""
        value = self.store.get_result("outcome")
        return None if value is None else RoundPhase(json.loads(value)["phase"])

    def participation_failure(self, now: int) -> str | None:
        """Why the round cannot go on at ``now``, if minimum participation is missed."""
        schedule, needed = self.manifest.schedule, self.manifest.min_participation
        counts = self.store.counts()
        if now >= schedule.t_register_end and counts["registered"] < needed:
            return f"minimum participation not reached: {counts['registered']} registered, {needed} needed"
        if now >= schedule.t_issue_end and counts["credentials"] < needed:
            return f"minimum participation not reached: {counts['credentials']} credentials issued, {needed} needed"
        return None

    def shortfall_rule(self) -> tuple[int, str]:
        """``(min_reports_per_survey, on_shortfall)`` from the round spec (rounds made before the rule: 1, "degraded")."""
        minimum = self.store.get_meta("min_reports_per_survey")
        action = self.store.get_meta("on_shortfall")
        return (1 if minimum is None else int(minimum)), ("degraded" if action is None else action.decode())

    def shortfall(self, phases: Sequence[PhaseTimes]) -> dict[str, int]:
        """Surveys of ``phases`` that accepted fewer reports than the spec's minimum: ``"data 3/1"`` → accepted.

        Read from the store, so a restarted aggregator finds the same ones.
        """
        minimum, _ = self.shortfall_rule()
        accepted = self.store.accepted_by_survey()
        return {
            (f"median {survey.partition}/{survey.sub_round}" if survey.kind == SurveyKind.MEDIAN
             else f"data {survey.partition}/{survey.subset}"):
                accepted.get(survey, 0)
            for phase in phases
            for group in self.phase_surveys(phase).values()
            for survey in group
            if accepted.get(survey, 0) < self.minimum_reports(survey, minimum)
        }

    def minimum_reports(self, survey: SurveyId, minimum: int) -> int:
        """The fewest reports ``survey`` may accept without being short.

        ``minimum`` is the spec's, sized for a data partition. A comparison-pool
        partition is smaller (the pool's share of the peers, over the
        sub-rounds), so its surveys are held to the same fraction of their
        own share of ``min_participation``: half of it, at least 1.
        """
        m = self.manifest
        if not m.is_pool_partition(survey.partition):
            return minimum
        share = m.comparison_pool_size(m.min_participation) // max(m.median_rounds, 1)
        return min(minimum, max(1, share // 2))

    def ending(self) -> RoundPhase:
        """How a round that reached learning ends: ``DEGRADED`` if any survey fell short, else ``DONE``."""
        return RoundPhase.DEGRADED if self.shortfall(self.manifest.schedule.phases) else RoundPhase.DONE

    def status(self, now: int | None = None, counts: Mapping[str, int] | None = None,
               rejected: Mapping[str, int] | None = None) -> RoundStatus:
        """The public status at ``now`` (default: the clock; worker threads pass it, MockClock is loop-only).

        ``counts`` and ``rejected`` add what the round's store does not hold:
        the service's health and the refusals not yet committed (issue 13:
        reported, not only logged).
        """
        now = self.now() if now is None else now
        phase, sub_round = phase_at(self.manifest.schedule, now)
        outcome = self.outcome()
        if outcome is not None:
            phase, sub_round = outcome, None
        all_counts = self.store.counts()
        all_counts["awaiting-verification"] = self.store.inbox_size()
        all_counts.update({f"link/{reason}": count for reason, count in sorted(self.link_errors.items())})
        all_counts.update({f"beacon-refused/{reason}": count for reason, count in sorted(self.beacon_refused.items())})
        all_counts.update({reason if reason.startswith("cover/") else "cover/counted": count
                           for reason, count in self.store.covers().items()})
        all_counts.update(counts or {})
        all_rejected = Counter(self.store.rejections())
        all_rejected.update(rejected or {})
        return RoundStatus(
            self.round_id, phase, sub_round, now, self.manifest.schedule.to_dict(), all_counts, dict(all_rejected)
        )

    def refresh_status(self, now: int, counts: Mapping[str, int] | None = None,
                       rejected: Mapping[str, int] | None = None) -> None:
        """Sign and encode the status snapshot (``GET /v1/status`` serves the latest one)."""
        self.snapshots.status = self.status(now, counts, rejected).sign(self.secrets.signing_key).to_json()

    # -- announce, register, roster ------------------------------------------------

    def manifest_json(self) -> bytes:
        return self._manifest_json

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

    def register(self, request: RegisterRequest, client: str = "local") -> bool:
        """Admit and record one registration now; True if new (the HTTP path batches commits instead)."""
        now = self.admit_registration(request)
        if now is None:
            return False
        (outcome,) = self.store.register_many([Registration(request.entry, request.invitation, client, now)], **self.registration_rules())
        return registration_outcome(outcome)

    def registration_rules(self) -> dict[str, Any]:
        """The policy and caps :meth:`RoundStore.register_many` applies (DESIGN.md §3 step 2)."""
        return {
            "policy": self.manifest.registration,
            "max_roster": self.manifest.max_roster,
            "max_per_client": int(self.store.get_meta("max_per_client") or b"1"),
        }

    def close_registration(self) -> None:
        """Freeze the roster (registration has closed and every admitted request is stored): the seed may be revealed."""
        if not self.now() >= self.manifest.schedule.t_register_end:
            raise RuntimeError(f"registration is open until {self.manifest.schedule.t_register_end}")
        self.roster_final = True

    def seed_revealed(self, now: int) -> bool:
        """The seed (and with it every partition) is public once the roster is final (DESIGN.md §3 step 3)."""
        return self.roster_final and now >= self.manifest.schedule.t_register_end

    def roster(self) -> RosterResponse:
        """The signed roster: every entry and the head committing to them, with the seed and the relays'
        beacon commitments once final."""
        if not self.roster_final:
            return RosterResponse.create(self.secrets.signing_key, self.round_id, self.store.roster_entries(), None)
        return RosterResponse.create(self.secrets.signing_key, self.round_id, self.store.roster_entries(), self.secrets.seed,
                                     stored_commitments(self.store, self.manifest.relays))

    def freeze_roster(self) -> PartitionPlan | None:
        """Build the final roster and its snapshots (once; in a thread: it signs and hashes every entry), and the
        partition plan unless the head carries beacon commitments (then :meth:`derive_plan` follows the reveals)."""
        if self.final_roster is None:
            self.final_roster = self.roster()  # entries verified one by one at registration
            self.snapshots.roster = self.final_roster.to_json()
            self.snapshots.roster_head = self.final_roster.head.to_json()
        if self.plan is None and not RosterHead.from_document(self.final_roster.head).beacon:
            self.derive_plan(())
        return self.plan

    def derive_plan(self, reveals: Sequence[bytes]) -> PartitionPlan:
        """The partition plan from the signed roster and the relays' revealed beacon values, in the head's order."""
        assert self.final_roster is not None
        head = RosterHead.from_document(self.final_roster.head)
        self.plan = PartitionPlan.derive(self.manifest, self.spec, self.final_roster.keys, self.secrets.seed, head.root, reveals)
        return self.plan

    def assignment(self) -> dict[bytes, int]:
        """Identity key → partition (DESIGN.md §3 step 3); raises ApiRefused before the roster is final."""
        if not self.seed_revealed(self.now()) or self.plan is None:
            raise ApiRefused(409, "the roster is not final before t_register_end")
        return self.plan.partition_of

    def prepare(self) -> None:
        """Close registration and derive partitions, subsets and oracles from the final roster.

        The caller has stored every admitted registration (the driver drains
        the registration batcher first, and calls :meth:`freeze_roster` in a
        thread before this when it can).
        """
        if self.now() >= self.manifest.schedule.t_register_end:
            self.close_registration()
            self.freeze_roster()

    def _plan(self) -> PartitionPlan:
        if self.plan is None:
            raise RuntimeError("the partition plan is derived when registration closes")
        return self.plan

    def shuffled_reports(self) -> list[int]:
        """Accepted reports of each data survey that has any: the sets the shuffle bound is about.

        A report is hidden among the reports its survey actually holds, not
        among the peers of its partition (a peer that sent nothing hides no one).
        """
        counts = (self.store.accepted_count(SurveyId.data(self.round_id, p, j))
                  for p in range(self.manifest.k_p) for j in range(self.manifest.k_h))
        return [n for n in counts if n > 0]

    def smallest_anonymity_set(self, now: int) -> int | None:
        """The fewest reports accepted by any survey whose phase closed by ``now`` (None before any closed with a report).

        A report hides among the reports its survey holds (a peer that sent
        nothing hides no one, as in :meth:`shuffled_reports`), median answers
        included; a survey still open is not measured, since its count only grows.
        """
        schedule = self.manifest.schedule
        closed = [n for survey, n in self.store.accepted_by_survey().items() if n > 0 and schedule.phase_of(survey).t_r <= now]
        return min(closed, default=None)

    def partition_sizes(self) -> list[int]:
        """Peers per partition of the final roster (only meaningful after t_register_end)."""
        return list(self._plan().sizes)

    @property
    def subsets(self) -> tuple[tuple[tuple[str, ...], ...], ...]:
        """Feature subsets per partition, derived from the partition seed (protocol.PartitionPlan)."""
        return self._plan().subsets

    # -- credentials ---------------------------------------------------------------

    def _authenticate(self, request: RegisterRequest | CredentialRequest) -> None:
        """Refuse a request for another round (409) or one its identity key did not sign (403)."""
        if request.round_id != self.round_id:
            raise ApiRefused(409, f"round_id {request.round_id.hex()!r} is not this round")
        try:
            request.verify()
        except InvalidApiMessage:
            raise ApiRefused(403, "bad signature") from None

    def authenticate_credential(self, request: CredentialRequest) -> None:
        """Refuse a credential request for another round (409), one its identity key did not sign (403), or,
        once the roster is final, one whose identity key is not on it (403).

        Checked before anything else, and before a request may wait for the partitions
        (:meth:`CredentialBatcher.issue`): a stranger is answered at once, never held.
        """
        self._authenticate(request)
        if not self.roster_final:
            return
        # The plan's map once it is derived (no store read per request); the store while the reveals are awaited.
        if self.plan is not None:
            known = request.identity_key in self.plan.partition_of
        else:
            known = self.store.is_registered(request.identity_key)
        if not known:
            raise ApiRefused(403, "identity key is not on the roster")

    def place_credential(self, request: CredentialRequest) -> tuple[int, int]:
        """For an authenticated request (:meth:`authenticate_credential`): ``(partition, now)`` to issue it with
        if issuance is open, or ApiRefused."""
        now = self.now()
        if not self.seed_revealed(now):
            raise ApiRefused(409, "credentials are issued after registration closes")
        if self.plan is None:
            # Retried by the peer's client: the partitions follow the relays' beacon reveals within seconds.
            raise ApiRefused(503, "the partitions are derived once the relays have revealed their beacon values")
        if now >= self.manifest.schedule.t_issue_end:
            raise ApiRefused(403, "credential issuance has closed")
        return self.plan.partition_of[request.identity_key], now

    def admit_credential(self, request: CredentialRequest) -> tuple[int, int]:
        """Check a credential request; ``(partition, now)`` to issue it with, or ApiRefused."""
        self.authenticate_credential(request)
        return self.place_credential(request)

    def earlier_answer(self, request: CredentialRequest) -> CredentialResponse | None:
        """The answer stored for this identity if it had one (the same request retried gets it again,
        :func:`credential_answer`), None if it had none."""
        answer = self.store.issued_answer(request.identity_key, request_digest(request))
        return None if answer is None else credential_answer(answer)

    def issue(self, request: CredentialRequest) -> CredentialResponse:
        """Admit, issue and record one credential now (the HTTP path batches issuance and commits instead)."""
        partition, now = self.admit_credential(request)
        earlier = self.earlier_answer(request)
        if earlier is not None:
            return earlier
        if self.secrets.issuer_key is None:
            raise ApiRefused(403, "credential issuance has closed")
        [response] = issue_credentials(self.secrets.issuer_key, [IssueJob(request.request, partition)])
        if isinstance(response, JobRefused):
            raise issuance_refused(response.reason)
        return credential_answer(self.store.record_credential(
            IssuedCredential(request.identity_key, partition, response, now, request_digest(request))))

    # -- surveys -------------------------------------------------------------------

    def check_survey(self, survey: SurveyId, now: float) -> int:
        """The partition a token for ``survey`` must carry; raises SurveyRefused if it is not open at ``now``."""
        m = self.manifest
        if survey.round_id != self.round_id:
            raise SurveyRefused("unknown-survey")
        if survey.kind == SurveyKind.MEDIAN:
            # Each partition that answers does so in exactly one sub-round (its own, by the manifest's rule).
            if not (self.numeric or self.sgd) or not m.answers_median(survey.partition) or survey != m.median_survey(survey.partition):
                raise SurveyRefused("unknown-survey")
        elif survey.partition >= m.k_p or survey.subset >= m.k_h or self.sgd is not None:
            # An SGD round's one report per peer is its gradient, in its step's sub-round: it has no data survey.
            raise SurveyRefused("unknown-survey")
        start, end = acceptance_window(m.schedule, survey)
        # Delivery happens in (t_s + δ, t_r): at t_r the phase's results are
        # computed and published, so nothing more may count for it.
        if not start <= now < end:
            raise SurveyRefused("outside-window")
        return survey.partition

    def data_oracle(self, partition: int, subset: int) -> FrequencyOracle:
        """The frequency oracle of one data survey (``protocol.PartitionPlan.oracle``, as the peers choose it)."""
        return self._plan().oracle(partition, subset)

    def check_report(self, survey: SurveyId, report: bytes) -> None:
        """Raise InvalidMessage unless ``report`` is a well-formed answer to ``survey``."""
        from anonml.mechanisms import InvalidReport

        if survey.kind == SurveyKind.MEDIAN and self.sgd is not None:
            try:
                self.sgd.mechanism.decode_reports([report])
            except (InvalidReport, ValueError) as exc:
                raise InvalidMessage(f"bad gradient report for {survey}: {exc}") from None
            return
        if survey.kind == SurveyKind.MEDIAN:
            self.median_answers(report)
            return
        if self.manifest.task_kind == TaskKind.MODEL_AVERAGING:
            self.check_model_block(survey, report)
            return

        try:
            self.data_oracle(survey.partition, survey.subset).decode_reports([report])
        except (InvalidReport, ValueError) as exc:
            raise InvalidMessage(f"bad report for {survey}: {exc}") from None

    @cached_property
    def round_model(self) -> RoundModel:
        """A model-averaging round's encoding, mechanism and blocks, from the signed manifest (``learning.RoundModel``)."""
        from anonml.learning import RoundModel

        return RoundModel.of_manifest(self.manifest)

    def check_model_block(self, survey: SurveyId, report: bytes) -> None:
        """Raise InvalidMessage unless ``report`` is one block of grid steps: data survey ``j`` carries block ``j``."""
        from anonml.learning import InvalidModelReport

        try:
            self.round_model.blocks.decode(survey.subset, report)
        except (InvalidModelReport, ValueError) as exc:
            raise InvalidMessage(f"bad model block for {survey}: {exc}") from None

    # -- median phase (thesis Algorithm 1) ----------------------------------------------

    def median_answers(self, report: bytes) -> list[tuple[int, int, int]]:
        """A median report as ``(feature, level, bit)`` answers; raises InvalidMessage if it is malformed.

        A comparison-pool peer answers one bit about the feature it names
        (``decode_pool_answer``); without a pool a peer answers one bit about
        every numeric feature, in order (``decode_median_report``).
        """
        if self.manifest.comparison_pool:
            return [decode_pool_answer(report, self.cut_point_counts)]
        return [(feature, level, bit) for feature, (level, bit) in enumerate(decode_median_report(report, self.cut_point_counts))]

    def _searches_after(self, sub_rounds: int) -> list[QuantileSearch]:
        """The searches after consuming the answers of sub-rounds ``0..sub_rounds-1``:
        one per numeric feature, searching all of its cut points at once."""
        searches = [
            QuantileSearch(feature.low, feature.high, self.manifest.eps_median, feature.quantile_levels)
            for feature in self.numeric_features
        ]
        for sub_round in range(sub_rounds):
            # One step of every search takes the answers of all partitions of the sub-round.
            answers = [
                answer
                for partition in self.manifest.median_partitions(sub_round)
                for report in self.store.reports(self.manifest.median_survey(partition))
                for answer in self.median_answers(report)
            ]
            if not answers:
                continue
            # Shape (answers, 3): each answer's (feature, level, bit).
            triples = np.asarray(answers, dtype=np.int64)
            for feature, search in enumerate(searches):
                mine = triples[triples[:, 0] == feature]
                if mine.size:
                    search.update(mine[:, 2], mine[:, 1])
        return searches

    def publish_thresholds(self, sub_round: int) -> MedianThresholds | SgdModel | None:
        """Compute and store the thresholds of ``sub_round`` (once; the driver calls it when
        sub-round ``i-1``'s delivery window has closed and its batches are stored).

        In an SGD round, the model of step ``sub_round`` instead (:meth:`publish_sgd_model`)."""
        if self.sgd is not None:
            return self.publish_sgd_model(sub_round)
        if not 0 <= sub_round < self.manifest.median_rounds or not self.numeric:
            return None
        key = f"thresholds/{sub_round}"
        if self.store.get_result(key) is None:
            values = tuple(tuple(float(t) for t in search.thresholds()) for search in self._searches_after(sub_round))
            published = MedianThresholds(sub_round, self.numeric, values)
            self.store.publish_result(key, published.sign(self.secrets.signing_key, self.round_id).to_json())
        return self.thresholds(sub_round)

    def thresholds_json(self, sub_round: int) -> bytes | None:
        """The signed thresholds of ``sub_round`` as served, or None before they are published."""
        return self.store.get_result(f"thresholds/{sub_round}") if 0 <= sub_round < 2**16 else None

    def thresholds(self, sub_round: int) -> MedianThresholds | None:
        """The published thresholds of ``sub_round``, or None before they are published."""
        stored = self.thresholds_json(sub_round)
        return None if stored is None else MedianThresholds.from_document(SignedDocument.from_json(stored, max_bytes=len(stored)))

    def iteration_reports(self, iteration: int) -> list[bytes]:
        """The gradient reports accepted in SGD step ``iteration``: those of the partitions that answer its sub-round."""
        return [report for partition in self.manifest.median_partitions(iteration)
                for report in self.store.reports(self.manifest.median_survey(partition))]

    def publish_sgd_model(self, iteration: int) -> SgdModel | None:
        """Store the signed model of ``iteration`` (once), replayed from the stored reports of every earlier step,
        so a restarted aggregator publishes the same; iteration ``median_rounds`` is the model after the last step."""
        if self.sgd is None or not 0 <= iteration <= self.manifest.median_rounds:
            return None
        key = f"thresholds/{iteration}"
        if self.store.get_result(key) is None:
            model = self.sgd.replay([self.iteration_reports(i) for i in range(iteration)])[-1]
            self.store.publish_result(key, model.sign(self.secrets.signing_key, self.round_id).to_json())
        return self.sgd_model(iteration)

    def sgd_model(self, iteration: int) -> SgdModel | None:
        """The published model of SGD step ``iteration``, or None before it is published."""
        stored = self.thresholds_json(iteration)
        return None if stored is None else SgdModel.from_document(SignedDocument.from_json(stored, max_bytes=len(stored)))

    def publish_medians(self) -> MedianResults:
        """Compute and store the final cut points (once; after the last sub-round's batches are stored).

        Each feature's estimates are sorted: searches for neighbouring
        quantiles may cross, and bins are counted as cut points below a value.
        """
        if self.store.get_result("medians") is None:
            searches = self._searches_after(self.manifest.median_rounds)
            medians = MedianResults({n: tuple(sorted(float(e) for e in s.estimates())) for n, s in zip(self.numeric, searches)})
            self.store.publish_result("medians", medians.sign(self.secrets.signing_key, self.round_id).to_json())
        published = self.medians()
        assert published is not None
        return published

    def medians_json(self) -> bytes | None:
        return self.store.get_result("medians")

    def medians(self) -> MedianResults | None:
        """The published final cut points, or None before the median phase has ended."""
        stored = self.medians_json()
        return None if stored is None else MedianResults.from_document(SignedDocument.from_json(stored, max_bytes=len(stored)))

    # -- the receipt log (DESIGN.md §5) ----------------------------------------------------

    def phase_surveys(self, phase: PhaseTimes) -> dict[tuple[SurveyKind, int], list[SurveyId]]:
        """The surveys of one phase, grouped as peers fetch them: ``(kind, partition)`` → surveys."""
        schedule = self.manifest.schedule
        if phase is schedule.data and self.sgd is not None:
            return {}
        if phase is schedule.data:
            return {
                (SurveyKind.DATA, partition): [SurveyId.data(self.round_id, partition, i) for i in range(len(subsets))]
                for partition, subsets in enumerate(self.subsets)
            }
        sub_round = schedule.median.index(phase)
        return {
            (SurveyKind.MEDIAN, partition): [self.manifest.median_survey(partition)]
            for partition in self.manifest.median_partitions(sub_round)
        }

    def publish_heads(self, phase: PhaseTimes, check: Check) -> None:
        """Sign one head per survey of ``phase`` for ``check`` (once; durable) and rebuild the log snapshots.

        Runs in a thread after every frame that arrived before the check
        time is stored: the head covers exactly what was durable then.
        """
        for group in self.phase_surveys(phase).values():
            for survey in group:
                leaves = self.store.log_leaves(survey)
                head = TreeHead(survey, check, len(leaves), receipt_leaves_root(leaves))
                self.store.put_head(survey, check, head.size, head.sign(self.secrets.signing_key).to_json())
        self.rebuild_log_snapshots()

    def rebuild_log_snapshots(self) -> None:
        """Encode every published segment and the heads document from the stored heads (also after a restart)."""
        heads = self.store.heads()
        by_key = {(survey, check): (size, document) for survey, check, size, document in heads}
        segments: dict[tuple[SurveyKind, int, Check], bytes] = {}
        if self.plan is not None:
            for phase in self.manifest.schedule.phases:
                for (kind, partition), group in self.phase_surveys(phase).items():
                    for check in Check:
                        if not all((survey, check) in by_key for survey in group):
                            continue
                        documents, leaves = [], {}
                        for survey in group:
                            size, document = by_key[(survey, check)]
                            documents.append(SignedDocument.from_json(document, max_bytes=len(document)))
                            leaves[survey] = tuple(self.store.log_leaves(survey, size))
                        segments[(kind, partition, check)] = ReceiptSegment(tuple(documents), leaves).to_json()
        proofs = {}
        for (survey, check), (size, _) in by_key.items():
            first = by_key.get((survey, Check.FIRST))
            if check is Check.FINAL and first is not None:
                proofs[survey] = log_consistency_proof(self.store.log_leaves(survey, size), first[0])
        documents_all = tuple(SignedDocument.from_json(d, max_bytes=len(d)) for _, _, _, d in heads)
        self.snapshots.segments = segments
        self.snapshots.heads = HeadsResponse(documents_all, proofs).to_json()

    def finish(self, phase: RoundPhase, detail: dict[str, Any]) -> None:
        """Record the outcome, then erase the issuer key: no token is issued or verified after the
        round (its report is written before), and a seized database must not let anyone mint them."""
        self.store.put_result("outcome", json.dumps({"phase": str(phase), **detail}, sort_keys=True).encode())
        self.store.erase_meta("issuer_key")


def message_hash(bound: bytes) -> bytes:
    """What decides "same message" for duplicate detection (DESIGN.md §6): SHA-256 of the bound bytes."""
    return hashlib.sha256(bound).digest()
