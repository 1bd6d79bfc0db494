"""The aggregator's HTTP/JSON API: paths, bodies, and what each signature covers.

Every body is parsed by a strict, size-bounded ``from_json`` that raises
:class:`InvalidApiMessage` naming the offending field; the aggregator answers
such input with a 4xx ``{"error": reason}``. Byte strings are lowercase hex.

=====================  =======================================================
``GET /v1/manifest``    :class:`SignedManifest` JSON (manifest, signature, round_id)
``POST /v1/register``   :class:`RegisterRequest` → :class:`RegisterResponse`
``GET /v1/roster``      :class:`RosterResponse` (seed is null until revealed)
``POST /v1/credential`` :class:`CredentialRequest` → :class:`CredentialResponse`
``GET /v1/median/{i}``  :class:`MedianThresholds` (404 until published)
``GET /v1/medians``     :class:`MedianResults` (404 until the median phase ends)
``GET /v1/receipts``    :class:`ReceiptLog` (the whole log, for every survey)
``GET /v1/status``      :class:`RoundStatus`
``GET /v1/report``      the round report JSON (404 until the round has ended)
=====================  =======================================================
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from anonml.protocol._canonical import FieldReader, InvalidDocument, canonical_json, parse_json_object
from anonml.protocol._survey import ROUND_ID_BYTES, SURVEY_ID_BYTES, InvalidSurveyId, SurveyId

if TYPE_CHECKING:
    from nacl.signing import SigningKey

PATH_MANIFEST = "/v1/manifest"
PATH_REGISTER = "/v1/register"
PATH_ROSTER = "/v1/roster"
PATH_CREDENTIAL = "/v1/credential"
PATH_MEDIAN = "/v1/median/{i}"
PATH_MEDIANS = "/v1/medians"
PATH_RECEIPTS = "/v1/receipts"
PATH_STATUS = "/v1/status"
PATH_REPORT = "/v1/report"

MAX_REQUEST_BYTES = 16 * 1024
"""Largest request body the aggregator reads (a credential request is well under 2 KiB)."""
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
"""Largest response a client should read (the receipt log of a 100k-peer round fits)."""
MAX_INVITATION_CHARS = 128
MAX_ROSTER = 1_000_000
MAX_CREDENTIAL_REQUEST_BYTES = 4096
IDENTITY_KEY_BYTES = 32
SIGNATURE_BYTES = 64

_REGISTER_DOMAIN = b"anonml/register/v1"
_ROSTER_DOMAIN = b"anonml/roster/v1"
_CREDENTIAL_DOMAIN = b"anonml/credential/v1"
_RECEIPT_DOMAIN = b"anonml/receipt/v1"


class InvalidApiMessage(InvalidDocument):
    """Raised by the ``from_json``/``from_dict`` of every API body, and by ``verify`` when a signature fails.

    ``field`` names the offending field (``"signature"``, ``"identity_key"``, …).
    """


def receipt_digest(tag_digest: bytes) -> bytes:
    """What the receipt log lists for an accepted token: ``SHA-256(domain ‖ H(T))``.

    ``tag_digest`` is the 32-byte digest ``verify_token`` returns (and the peer
    can compute from its own token). Hashing again under a domain keeps the
    public log from being the very value the uniqueness check stores.
    """
    return hashlib.sha256(_RECEIPT_DOMAIN + tag_digest).digest()


def _verify_ed25519(key: bytes, message: bytes, signature: bytes, field: str) -> None:
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    try:
        VerifyKey(key).verify(message, signature)
    except (BadSignatureError, ValueError, TypeError):
        raise InvalidApiMessage(field, "signature does not verify") from None


def _reader(data: bytes | str | Mapping[str, Any], max_bytes: int = MAX_REQUEST_BYTES) -> FieldReader:
    obj = data if isinstance(data, Mapping) else parse_json_object(data, max_bytes=max_bytes, error=InvalidApiMessage)
    return FieldReader(dict(obj), "", InvalidApiMessage)


def registration_bytes(round_id: bytes, identity_key: bytes, invitation: str | None) -> bytes:
    """What a peer signs to register: ``domain ‖ round_id ‖ identity_key ‖ len ‖ invitation``."""
    code = (invitation or "").encode("utf-8")
    return b"".join((_REGISTER_DOMAIN, round_id, identity_key, struct.pack(">H", len(code)), code))


@dataclass(frozen=True)
class RegisterRequest:
    """``POST /v1/register``: proves control of ``identity_key`` for round ``round_id``."""

    identity_key: bytes
    invitation: str | None
    round_id: bytes
    signature: bytes

    @classmethod
    def create(cls, signing_key: SigningKey, round_id: bytes, invitation: str | None = None) -> RegisterRequest:
        identity_key = bytes(signing_key.verify_key)
        signature = signing_key.sign(registration_bytes(round_id, identity_key, invitation)).signature
        return cls(identity_key, invitation, round_id, signature)

    def verify(self) -> None:
        """Raise InvalidApiMessage (field ``signature``) unless signed by ``identity_key``."""
        _verify_ed25519(
            self.identity_key, registration_bytes(self.round_id, self.identity_key, self.invitation), self.signature, "signature"
        )

    def to_json(self) -> bytes:
        return canonical_json(
            {
                "identity_key": self.identity_key.hex(),
                "invitation": self.invitation,
                "round_id": self.round_id.hex(),
                "signature": self.signature.hex(),
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> RegisterRequest:
        reader = _reader(data)
        request = cls(
            identity_key=reader.hex("identity_key", size=IDENTITY_KEY_BYTES),
            invitation=reader.string("invitation", max_len=MAX_INVITATION_CHARS, pattern=r"[\x21-\x7e]+", nullable=True),
            round_id=reader.hex("round_id", size=ROUND_ID_BYTES),
            signature=reader.hex("signature", size=SIGNATURE_BYTES),
        )
        reader.done()
        return request


@dataclass(frozen=True)
class RegisterResponse:
    registered: bool

    def to_json(self) -> bytes:
        return canonical_json({"registered": self.registered})

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> RegisterResponse:
        reader = _reader(data, MAX_RESPONSE_BYTES)
        response = cls(reader.boolean("registered"))
        reader.done()
        return response


def roster_bytes(round_id: bytes, roster: Sequence[bytes], seed: bytes | None) -> bytes:
    """What the aggregator signs for ``GET /v1/roster``: the sorted keys and the seed once revealed."""
    return b"".join((_ROSTER_DOMAIN, round_id, struct.pack(">I", len(roster)), *roster, seed or b""))


@dataclass(frozen=True)
class RosterResponse:
    """``GET /v1/roster``: the registered identity keys, sorted, and the partition seed once revealed.

    Peers check ``seed`` against the manifest's ``seed_commitment``
    (``protocol.check_seed``) before deriving partitions.
    """

    roster: tuple[bytes, ...]
    seed: bytes | None
    signature: bytes

    @classmethod
    def create(cls, signing_key: SigningKey, round_id: bytes, roster: Sequence[bytes], seed: bytes | None) -> RosterResponse:
        ordered = tuple(sorted(roster))
        return cls(ordered, seed, signing_key.sign(roster_bytes(round_id, ordered, seed)).signature)

    def verify(self, identity_key: bytes, round_id: bytes) -> None:
        """Raise InvalidApiMessage unless the aggregator ``identity_key`` signed this roster for ``round_id``."""
        _verify_ed25519(identity_key, roster_bytes(round_id, self.roster, self.seed), self.signature, "signature")

    def to_json(self) -> bytes:
        return canonical_json(
            {
                "roster": [key.hex() for key in self.roster],
                "seed": None if self.seed is None else self.seed.hex(),
                "signature": self.signature.hex(),
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> RosterResponse:
        reader = _reader(data, MAX_RESPONSE_BYTES)
        items = reader.items("roster", max_items=MAX_ROSTER)
        roster = tuple(
            reader.decode_hex(item, f"roster[{index}]", size=IDENTITY_KEY_BYTES) for index, item in enumerate(items)
        )
        if list(roster) != sorted(set(roster)):
            reader.fail("roster", "must be sorted and without duplicates")
        seed = reader.hex_bytes("seed", size=32, nullable=True)
        response = cls(roster, seed, reader.hex("signature", size=SIGNATURE_BYTES))
        reader.done()
        return response


def credential_bytes(round_id: bytes, identity_key: bytes, request: bytes) -> bytes:
    """What a peer signs to ask for its credential: ``domain ‖ round_id ‖ identity_key ‖ SHA-256(request)``."""
    return b"".join((_CREDENTIAL_DOMAIN, round_id, identity_key, hashlib.sha256(request).digest()))


@dataclass(frozen=True)
class CredentialRequest:
    """``POST /v1/credential``: a blind issuance request (``begin_issuance`` output) from a rostered peer."""

    identity_key: bytes
    round_id: bytes
    request: bytes
    signature: bytes

    @classmethod
    def create(cls, signing_key: SigningKey, round_id: bytes, request: bytes) -> CredentialRequest:
        identity_key = bytes(signing_key.verify_key)
        signature = signing_key.sign(credential_bytes(round_id, identity_key, request)).signature
        return cls(identity_key, round_id, request, signature)

    def verify(self) -> None:
        _verify_ed25519(self.identity_key, credential_bytes(self.round_id, self.identity_key, self.request), self.signature, "signature")

    def to_json(self) -> bytes:
        return canonical_json(
            {
                "identity_key": self.identity_key.hex(),
                "round_id": self.round_id.hex(),
                "request": self.request.hex(),
                "signature": self.signature.hex(),
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> CredentialRequest:
        reader = _reader(data)
        request = cls(
            identity_key=reader.hex("identity_key", size=IDENTITY_KEY_BYTES),
            round_id=reader.hex("round_id", size=ROUND_ID_BYTES),
            request=reader.hex("request", max_size=MAX_CREDENTIAL_REQUEST_BYTES),
            signature=reader.hex("signature", size=SIGNATURE_BYTES),
        )
        reader.done()
        return request


@dataclass(frozen=True)
class CredentialResponse:
    """The issuer's blind response (``finish_issuance`` input) and the peer's partition."""

    response: bytes
    partition: int

    def to_json(self) -> bytes:
        return canonical_json({"response": self.response.hex(), "partition": self.partition})

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> CredentialResponse:
        reader = _reader(data, MAX_RESPONSE_BYTES)
        response = cls(reader.hex("response", max_size=MAX_CREDENTIAL_REQUEST_BYTES), reader.integer("partition", 0, 2**16 - 1))
        reader.done()
        return response


def _finite(reader: FieldReader, value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        reader.fail_at(field, f"expected a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class MedianThresholds:
    """``GET /v1/median/{i}``: the value each numeric feature is compared with in sub-round ``i``.

    A peer of partition ``i`` answers with one perturbed bit per feature,
    ``x > threshold``, in the order of ``features`` (``encode_median_report``).
    """

    sub_round: int
    survey: SurveyId
    features: tuple[str, ...]
    thresholds: tuple[float, ...]

    def to_json(self) -> bytes:
        return canonical_json(
            {
                "sub_round": self.sub_round,
                "survey": self.survey.to_bytes().hex(),
                "features": list(self.features),
                "thresholds": list(self.thresholds),
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> MedianThresholds:
        reader = _reader(data, MAX_RESPONSE_BYTES)
        sub_round = reader.integer("sub_round", 0, 2**16 - 1)
        survey = _survey(reader, reader.hex("survey", size=SURVEY_ID_BYTES), "survey")
        features = tuple(
            reader.decode_text(item, f"features[{index}]")
            for index, item in enumerate(reader.items("features", max_items=4096))
        )
        thresholds = tuple(
            _finite(reader, item, f"thresholds[{index}]") for index, item in enumerate(reader.items("thresholds", max_items=4096))
        )
        reader.done()
        if len(features) != len(thresholds):
            reader.fail("thresholds", f"{len(thresholds)} thresholds for {len(features)} features")
        return cls(sub_round, survey, features, thresholds)


def _survey(reader: FieldReader, raw: bytes, field: str) -> SurveyId:
    try:
        return SurveyId.from_bytes(raw)
    except InvalidSurveyId as exc:
        reader.fail_at(field, str(exc))


@dataclass(frozen=True)
class MedianResults:
    """``GET /v1/medians``: the final private median of each numeric feature (thesis Algorithm 1)."""

    medians: Mapping[str, float]

    def to_json(self) -> bytes:
        return canonical_json({"medians": dict(self.medians)})

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> MedianResults:
        reader = _reader(data, MAX_RESPONSE_BYTES)
        raw = reader.obj("medians")
        medians: dict[str, float] = {}
        for key, value in raw.items():
            name = reader.decode_text(key, "medians")
            medians[name] = _finite(reader, value, f"medians.{name}")
        reader.done()
        return cls(medians)


@dataclass(frozen=True)
class ReceiptLog:
    """``GET /v1/receipts``: per survey (hex of ``SurveyId.to_bytes()``), the receipt digests of accepted tokens.

    Every peer downloads the whole log, so fetching it reveals nothing; a peer
    finds ``receipt_digest(its tag digest)`` under its survey (DESIGN.md §5).
    """

    receipts: Mapping[SurveyId, tuple[bytes, ...]]

    @cached_property
    def _index(self) -> dict[SurveyId, frozenset[bytes]]:
        # Built once: every peer of a process looks its own digests up in one log.
        return {survey: frozenset(digests) for survey, digests in self.receipts.items()}

    def contains(self, survey: SurveyId, tag_digest: bytes) -> bool:
        return receipt_digest(tag_digest) in self._index.get(survey, frozenset())

    def to_json(self) -> bytes:
        return canonical_json(
            {"receipts": {survey.to_bytes().hex(): [digest.hex() for digest in digests] for survey, digests in self.receipts.items()}}
        )

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> ReceiptLog:
        reader = _reader(data, MAX_RESPONSE_BYTES)
        raw = reader.obj("receipts")
        receipts: dict[SurveyId, tuple[bytes, ...]] = {}
        for key, digests in raw.items():
            field = f"receipts.{str(key)[:16]}"
            survey = _survey(reader, reader.decode_hex(key, field, size=SURVEY_ID_BYTES), field)
            items = reader.nested({"d": digests}, field).items("d", max_items=MAX_ROSTER)
            receipts[survey] = tuple(reader.decode_hex(item, f"{field}[{i}]", size=32) for i, item in enumerate(items))
        reader.done()
        return cls(receipts)


@dataclass(frozen=True)
class RoundStatus:
    """``GET /v1/status``: where the round is and what it has counted so far.

    ``phase`` is one of :data:`protocol.PHASES`; ``sub_round`` is the median
    sub-round during the median phase, else None; ``counts`` holds
    ``registered``, ``credentials``, ``accepted``; ``rejected`` maps each
    rejection reason to its count.
    """

    round_id: bytes
    phase: str
    sub_round: int | None
    now: int
    schedule: Mapping[str, Any]
    counts: Mapping[str, int]
    rejected: Mapping[str, int]

    def to_json(self) -> bytes:
        return canonical_json(
            {
                "round_id": self.round_id.hex(),
                "phase": self.phase,
                "sub_round": self.sub_round,
                "now": self.now,
                "schedule": dict(self.schedule),
                "counts": dict(self.counts),
                "rejected": dict(self.rejected),
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> RoundStatus:
        from anonml.protocol._schedule import PHASES, RoundSchedule

        reader = _reader(data, MAX_RESPONSE_BYTES)
        round_id = reader.hex("round_id", size=ROUND_ID_BYTES)
        phase = reader.choice("phase", PHASES)
        sub_round_raw = reader.raw("sub_round")
        sub_round = None if sub_round_raw is None else reader.integer("sub_round", 0, 2**16 - 1)
        now = reader.integer("now", 0, 2**40)
        schedule = RoundSchedule.read(reader.child("schedule")).to_dict()
        counts = _counts(reader, "counts")
        rejected = _counts(reader, "rejected")
        reader.done()
        return cls(round_id, phase, sub_round, now, schedule, counts, rejected)


def _counts(reader: FieldReader, key: str) -> dict[str, int]:
    child = reader.child(key)
    counts: dict[str, int] = {}
    for name in child.keys()[:256]:
        counts[child.decode_text(name, child.name(name[:32]), pattern=r"[A-Za-z0-9_.\-/]+")] = child.integer(name, 0, 2**62)
    child.done()
    return counts


@dataclass(frozen=True)
class ErrorResponse:
    """Every 4xx body: ``{"error": reason}``."""

    error: str

    def to_json(self) -> bytes:
        return canonical_json({"error": self.error})

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> ErrorResponse:
        reader = _reader(data, MAX_RESPONSE_BYTES)
        response = cls(reader.text("error", max_len=4096))
        reader.done()
        return response
