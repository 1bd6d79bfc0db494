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
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from nacl.signing import SigningKey

from anonml.aggregator._store import RegistrationRefused, RoundStore
from anonml.crypto import (
    IssueJob,
    IssuerSecretKey,
    SphinxGeometry,
    issue_credentials,
)
from anonml.errors import AnonMLError
from anonml.mechanisms import FrequencyOracle, QuantileSearch, make_oracle
from anonml.protocol import (
    CredentialRequest,
    CredentialResponse,
    FeatureSpec,
    InvalidApiMessage,
    InvalidMessage,
    MedianResults,
    MedianThresholds,
    NumericFeature,
    ReceiptLog,
    RegisterRequest,
    RosterResponse,
    RoundManifest,
    RoundStatus,
    SignedManifest,
    SurveyId,
    SurveyKind,
    acceptance_window,
    assign_partitions,
    decode_median_report,
    derive_subsets,
    phase_at,
)

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

    def status(self, now: int | None = None) -> RoundStatus:
        """The public status at ``now`` (default: the clock; worker threads pass it, MockClock is loop-only)."""
        now = self.now() if now is None else now
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
