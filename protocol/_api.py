"""The aggregator's HTTP/JSON API: paths, bodies, and what each signature covers.

Every body is parsed by a strict, size-bounded ``from_json`` that raises
:class:`InvalidApiMessage` naming the offending field; the aggregator answers
such input with a 4xx ``{"error": reason}``. Byte strings are lowercase hex.

==========================================  ==========================================================
``GET /v1/manifest``                        :class:`SignedManifest` JSON (manifest, signature, round_id)
``POST /v1/register``                       :class:`RegisterRequest` → :class:`RegisterResponse`
``GET /v1/roster``                          :class:`RosterResponse`: the signed roster head and every entry
``GET /v1/roster/head``                     the signed :class:`RosterHead` alone (what relays mirror)
``POST /v1/credential``                     :class:`CredentialRequest` → :class:`CredentialResponse`
``GET /v1/median/{i}``                      signed :class:`MedianThresholds` (404 until published)
``GET /v1/medians``                         signed :class:`MedianResults` (404 until the median phase ends)
``GET /v1/receipts/{kind}/{p}/{check}``     :class:`ReceiptSegment`: one partition's surveys of a phase at a check
``GET /v1/heads``                           :class:`HeadsResponse`: every signed tree head so far (what relays mirror)
``GET /v1/status``                          signed :class:`RoundStatus`
``GET /v1/report``                          the signed round report (404 until the round has ended)
==========================================  ==========================================================

A relay's mirror serves ``mirror_path(identity, "beacon")``: its :class:`protocol.BeaconStatement` for the round.

Signed documents travel in :class:`protocol.SignedDocument` envelopes; the
``from_body`` of each typed document reads a verified envelope's body.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from anonml.base.memo import PureCache
from anonml.protocol._beacon import BEACON_BYTES, BeaconCommitment, read_commitments
from anonml.protocol._canonical import FieldReader, InvalidDocument, canonical_json, parse_json_object
from anonml.protocol._features import MAX_FEATURES, MAX_QUANTILES
from anonml.protocol._merkle import HASH_BYTES, consistency_proof, root_of_hashes, leaf_hash, verify_consistency
from anonml.protocol._schedule import PHASES, Check, RoundPhase, RoundSchedule
from anonml.protocol._signed import DocumentKind, SignedDocument, ed25519_holds
from anonml.protocol._survey import ROUND_ID_BYTES, SURVEY_ID_BYTES, InvalidSurveyId, SurveyId

if TYPE_CHECKING:
    from nacl.signing import SigningKey

PATH_MANIFEST = "/v1/manifest"
PATH_REGISTER = "/v1/register"
PATH_ROSTER = "/v1/roster"
PATH_ROSTER_HEAD = "/v1/roster/head"
PATH_CREDENTIAL = "/v1/credential"
PATH_MEDIAN = "/v1/median/{i}"
PATH_MEDIANS = "/v1/medians"
PATH_RECEIPTS = "/v1/receipts/{kind}/{partition}/{check}"
PATH_HEADS = "/v1/heads"
PATH_STATUS = "/v1/status"
PATH_REPORT = "/v1/report"
PATH_MIRROR = "/v1/mirror/{identity}"
"""A relay's read-only mirror of one aggregator's documents (``relay._mirror``)."""


CLOCK_HEADER = "anonml-clock"
"""Every relay mirror answer carries the relay's wall clock as it answered (UTC seconds, a decimal): a peer
compares its own clock with the mirrors' before it asks for its credential (``peer._session``)."""

MAX_CLOCK_ERROR = 2.0
"""Seconds a peer's clock may be off the relays' before it stops. A first relay refuses a packet whose window
has opened by its own clock; the first hop's guard absorbs at least a second, and in the simulator a peer 3 s
slow lost nothing while 4 s slow lost reports (README, "Peers' clocks")."""


def mirror_path(identity: bytes, what: str) -> str:
    """The mirror's path for ``what`` (``manifest``, ``roster/head``, ``heads``, ``conflicts``) of one aggregator."""
    return PATH_MIRROR.format(identity=identity.hex()) + "/" + what


def format_host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 literal in brackets (RFC 3986 §3.2.2), as a URL or a config file writes it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


MAX_REQUEST_BYTES = 16 * 1024
"""Largest request body the aggregator reads (a credential request is well under 2 KiB)."""
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
"""Largest response a client should read (the receipt log of a 100k-peer round fits)."""
MAX_INVITATION_CHARS = 128
MAX_ROSTER = 100_000
"""The most entries any roster may hold: a full roster's JSON (at most
:data:`MAX_ROSTER_ENTRY_JSON` bytes per entry) stays well under
:data:`MAX_RESPONSE_BYTES`, so every client can read it (issue 12: ~1M
entries broke the peers' own size limits)."""
MAX_ROSTER_ENTRY_JSON = 64 + 64 + 128 + 48
"""Bytes of one roster entry in JSON: hex key, nonce and signature, and the field names."""
MAX_LOG_LEAVES = 2 * MAX_ROSTER
"""The most receipts one survey's log may list (one per rostered peer; twice for slack)."""
NONCE_BYTES = 32
MAX_CREDENTIAL_REQUEST_BYTES = 4096
IDENTITY_KEY_BYTES = 32
SIGNATURE_BYTES = 64


_ROSTER_ENTRY_DOMAIN = b"anonml/roster-entry/v1"
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
    if not ed25519_holds(key, message, signature):
        raise InvalidApiMessage(field, "signature does not verify") from None


def _reader(data: bytes | str | Mapping[str, Any], max_bytes: int = MAX_REQUEST_BYTES) -> FieldReader:
    obj = data if isinstance(data, Mapping) else parse_json_object(data, max_bytes=max_bytes, error=InvalidApiMessage)
    return FieldReader(dict(obj), "", InvalidApiMessage)


def roster_entry_bytes(round_id: bytes, identity_key: bytes, nonce: bytes) -> bytes:
    """What a peer signs to register, and what its roster entry proves: ``domain ‖ round_id ‖ key ‖ nonce``.

    The nonce is fresh per registration: the roster's Merkle root, and with
    it the partition seed (``partition_seed``), depends on values nobody knew
    when the aggregator committed to its seed (DESIGN.md §3 step 3).
    """
    return b"".join((_ROSTER_ENTRY_DOMAIN, round_id, identity_key, nonce))


@dataclass(frozen=True)
class RosterEntry:
    """One registration as the public roster lists it: the peer's key, its nonce, its signature over both."""

    identity_key: bytes
    nonce: bytes
    signature: bytes

    def verify(self, round_id: bytes) -> None:
        """Raise InvalidApiMessage unless ``identity_key`` signed ``(round_id, identity_key, nonce)``."""
        _verify_ed25519(self.identity_key, roster_entry_bytes(round_id, self.identity_key, self.nonce), self.signature, "signature")

    def leaf(self) -> bytes:
        """The entry's bytes as a leaf of the roster's Merkle tree (RFC 9162 §2.1)."""
        return self.identity_key + self.nonce + self.signature

    def to_dict(self) -> dict[str, str]:
        return {"key": self.identity_key.hex(), "nonce": self.nonce.hex(), "signature": self.signature.hex()}

    @classmethod
    def read(cls, reader: FieldReader) -> RosterEntry:
        entry = cls(
            reader.hex("key", size=IDENTITY_KEY_BYTES),
            reader.hex("nonce", size=NONCE_BYTES),
            reader.hex("signature", size=SIGNATURE_BYTES),
        )
        reader.done()
        return entry


@dataclass(frozen=True)
class RegisterRequest:
    """``POST /v1/register``: a signed roster entry for round ``round_id``, and an invitation code if the round needs one.

    The invitation is not signed: it is a bearer code and must not appear in
    the public roster, whose entries everyone verifies.
    """

    entry: RosterEntry
    invitation: str | None
    round_id: bytes

    @property
    def identity_key(self) -> bytes:
        return self.entry.identity_key

    @classmethod
    def create(cls, signing_key: SigningKey, round_id: bytes, invitation: str | None = None, *, nonce: bytes | None = None) -> RegisterRequest:
        import os

        identity_key = bytes(signing_key.verify_key)
        fresh = os.urandom(NONCE_BYTES) if nonce is None else nonce
        signature = signing_key.sign(roster_entry_bytes(round_id, identity_key, fresh)).signature
        return cls(RosterEntry(identity_key, fresh, signature), invitation, round_id)

    def verify(self) -> None:
        """Raise InvalidApiMessage (field ``signature``) unless signed by ``identity_key``."""
        self.entry.verify(self.round_id)

    def to_json(self) -> bytes:
        return canonical_json({"entry": self.entry.to_dict(), "invitation": self.invitation, "round_id": self.round_id.hex()})

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> RegisterRequest:
        reader = _reader(data)
        request = cls(
            entry=RosterEntry.read(reader.child("entry")),
            invitation=reader.string("invitation", max_len=MAX_INVITATION_CHARS, pattern=r"[\x21-\x7e]+", nullable=True),
            round_id=reader.hex("round_id", size=ROUND_ID_BYTES),
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


def roster_root(entries: Sequence[RosterEntry]) -> bytes:
    """The roster's Merkle root (RFC 9162 §2.1) over its entries in key order."""
    return root_of_hashes([leaf_hash(entry.leaf()) for entry in entries])


def partition_seed(seed: bytes, root: bytes, reveals: Sequence[bytes] = ()) -> bytes:
    """``H(seed ‖ roster root ‖ r_1 ‖ … ‖ r_m)``: what orders peers into partitions (DESIGN.md §3 step 3).

    The aggregator committed to ``seed`` before registration opened and the
    root depends on every peer's fresh nonce, so no registrant can predict the
    partitions, and the aggregator cannot pick a seed after seeing the keys.
    But after registration closes the aggregator knows ``seed`` and every
    honest entry, and may add entries of Sybil identities it controls, signed
    over nonces of its choosing, before it signs the roster head: every nonce
    gives another root, so another assignment (issue 24 measured a target
    isolated among 4 Sybils after 176 tries, 0.01 s). ``reveals`` closes that:
    each relay listed as a mirror committed to a fresh value ``r_i`` that the
    signed head carries (``protocol._beacon``) and reveals it only once it
    holds that head, so every root the aggregator could still choose is
    fixed before any ``r_i`` is known; one honest relay suffices. A relay
    that withholds its reveal aborts the round (a colluding relay gives the
    aggregator at most the choice between this assignment and none).

    Without reveals (a round whose manifest lists no mirror) the seed is the
    weaker ``H(seed ‖ root)`` of protocol v1, which the aggregator can grind.
    Each ``r_i`` is :data:`BEACON_BYTES` long, so the concatenation is unambiguous.
    """
    if not reveals:
        return hashlib.sha256(b"anonml/partition-seed/v1" + seed + root).digest()
    if any(len(value) != BEACON_BYTES for value in reveals):
        raise ValueError(f"every beacon value is {BEACON_BYTES} bytes")
    return hashlib.sha256(b"anonml/partition-seed/v2" + seed + root + b"".join(reveals)).digest()


@dataclass(frozen=True)
class RosterHead:
    """The signed summary of a roster: its size, Merkle root, once revealed the aggregator's seed, and the
    relays' beacon commitments (``protocol._beacon``; the field is left out when there are none).

    Relays mirror it; a peer compares the head it was served with a
    mirror's before it derives its partition (DESIGN.md §5).
    """

    size: int
    root: bytes
    seed: bytes | None
    beacon: tuple[BeaconCommitment, ...] = ()

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"size": self.size, "root": self.root.hex(), "seed": None if self.seed is None else self.seed.hex()}
        if self.beacon:
            body["beacon"] = [entry.to_dict() for entry in self.beacon]
        return body

    def sign(self, signing_key: SigningKey, round_id: bytes) -> SignedDocument:
        return SignedDocument.create(signing_key, DocumentKind.ROSTER_HEAD, round_id, self.to_body())

    @classmethod
    def from_document(cls, document: SignedDocument) -> RosterHead:
        reader = document.fields(InvalidApiMessage)
        head = cls(reader.integer("size", 0, MAX_ROSTER), reader.hex("root", size=HASH_BYTES), reader.hex_bytes("seed", size=32, nullable=True),
                   read_commitments(reader, "beacon") if reader.optional("beacon") else ())
        reader.done()
        return head


@dataclass(frozen=True)
class RosterResponse:
    """``GET /v1/roster``: the signed head and every entry, sorted by key.

    :meth:`verify` checks the head's signature, every entry's own signature
    and that the entries hash to the signed root; the peer then checks the
    seed against the manifest's commitment (``protocol.check_seed``).
    """

    head: SignedDocument
    entries: tuple[RosterEntry, ...]

    @classmethod
    def create(cls, signing_key: SigningKey, round_id: bytes, entries: Sequence[RosterEntry], seed: bytes | None,
               beacon: Sequence[BeaconCommitment] = ()) -> RosterResponse:
        ordered = tuple(sorted(entries, key=lambda entry: entry.identity_key))
        head = RosterHead(len(ordered), roster_root(ordered), seed, tuple(beacon))
        return cls(head.sign(signing_key, round_id), ordered)

    @property
    def keys(self) -> tuple[bytes, ...]:
        return tuple(entry.identity_key for entry in self.entries)

    def verify(self, identity_key: bytes, round_id: bytes) -> RosterHead:
        """The verified head; raises InvalidApiMessage (or InvalidSignedDocument) naming what failed."""
        self.head.verify(identity_key, kind=DocumentKind.ROSTER_HEAD, round_id=round_id)
        head = RosterHead.from_document(self.head)
        if head.size != len(self.entries) or not hmac.compare_digest(head.root, roster_root(self.entries)):
            raise InvalidApiMessage("entries", "the roster entries do not hash to the signed root")
        for entry in self.entries:
            entry.verify(round_id)
        return head

    def to_json(self) -> bytes:
        return canonical_json({"head": self.head.to_dict(), "entries": [entry.to_dict() for entry in self.entries]})

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> RosterResponse:
        reader = _reader(data, MAX_RESPONSE_BYTES)
        head = SignedDocument.read(reader.child("head"))
        entries = tuple(
            RosterEntry.read(reader.nested(item, f"entries[{index}]"))
            for index, item in enumerate(reader.items("entries", max_items=MAX_ROSTER))
        )
        keys = [entry.identity_key for entry in entries]
        if keys != sorted(set(keys)):
            reader.fail("entries", "must be sorted by key and without duplicates")
        reader.done()
        return cls(head, entries)


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


def finite_number(reader: FieldReader, value: object, field: str) -> float:
    """``value`` as a float, or the reader's error at ``field`` (a full path) unless it is a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        reader.fail_at(field, f"expected a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class MedianThresholds:
    """``GET /v1/median/{i}`` (signed): the values each numeric feature is compared with in sub-round ``i``.

    ``thresholds[f]`` holds one value per cut point of feature ``f`` (the
    current estimate of each of its quantile searches). A peer of every
    partition that answers in sub-round ``i`` (``RoundManifest.median_partitions``)
    picks one cut point per feature at random and answers one perturbed bit,
    ``x > threshold``, in the order of ``features`` (``encode_median_report``).
    """

    sub_round: int
    features: tuple[str, ...]
    thresholds: tuple[tuple[float, ...], ...]

    def to_body(self) -> dict[str, Any]:
        return {
            "sub_round": self.sub_round,
            "features": list(self.features),
            "thresholds": [list(values) for values in self.thresholds],
        }

    def sign(self, signing_key: SigningKey, round_id: bytes) -> SignedDocument:
        return SignedDocument.create(signing_key, DocumentKind.THRESHOLDS, round_id, self.to_body())

    @classmethod
    def from_document(cls, document: SignedDocument) -> MedianThresholds:
        reader = document.fields(InvalidApiMessage)
        sub_round = reader.integer("sub_round", 0, 2**16 - 1)
        features = tuple(
            reader.decode_text(item, f"features[{index}]")
            for index, item in enumerate(reader.items("features", max_items=MAX_FEATURES))
        )
        thresholds = tuple(
            _cut_point_values(reader, item, f"thresholds[{index}]")
            for index, item in enumerate(reader.items("thresholds", max_items=MAX_FEATURES))
        )
        reader.done()
        if len(features) != len(thresholds):
            reader.fail("thresholds", f"{len(thresholds)} threshold lists for {len(features)} features")
        return cls(sub_round, features, thresholds)


def _cut_point_values(reader: FieldReader, value: object, field: str) -> tuple[float, ...]:
    """One feature's values, one per cut point: 1 to MAX_QUANTILES finite numbers (``field`` is in the body)."""
    path = reader.name(field)
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_QUANTILES:
        reader.fail_at(path, f"expected a list of 1 to {MAX_QUANTILES} numbers, got {value!r:.80}")
    return tuple(finite_number(reader, item, f"{path}[{index}]") for index, item in enumerate(value))


def _survey(reader: FieldReader, raw: bytes, field: str) -> SurveyId:
    try:
        return SurveyId.from_bytes(raw)
    except InvalidSurveyId as exc:
        reader.fail_at(field, str(exc))


@dataclass(frozen=True)
class MedianResults:
    """``GET /v1/medians`` (signed): the final private cut points of each
    numeric feature, ascending (thesis Algorithm 1; one cut point, the median,
    unless the feature spec asks for more quantiles)."""

    cut_points: Mapping[str, tuple[float, ...]]

    def to_body(self) -> dict[str, Any]:
        return {"cut_points": {name: list(values) for name, values in self.cut_points.items()}}

    def sign(self, signing_key: SigningKey, round_id: bytes) -> SignedDocument:
        return SignedDocument.create(signing_key, DocumentKind.MEDIANS, round_id, self.to_body())

    @classmethod
    def from_document(cls, document: SignedDocument) -> MedianResults:
        reader = document.fields(InvalidApiMessage)
        raw = reader.obj("cut_points")
        if len(raw) > MAX_FEATURES:
            reader.fail("cut_points", f"{len(raw)} features, more than {MAX_FEATURES}")
        cut_points: dict[str, tuple[float, ...]] = {}
        for key, value in raw.items():
            name = reader.decode_text(key, "cut_points")
            cut_points[name] = _cut_point_values(reader, value, f"cut_points.{name}")
            if list(cut_points[name]) != sorted(cut_points[name]):
                reader.fail(f"cut_points.{name}", f"expected ascending values, got {list(cut_points[name])!r}")
        reader.done()
        return cls(cut_points)


@dataclass(frozen=True)
class TreeHead:
    """One signed head of one survey's receipt log at one scheduled check (DESIGN.md §5).

    ``root`` is the RFC 9162 Merkle tree hash of the first ``size`` receipt
    digests in acceptance order. The aggregator signs exactly one head per
    survey per check; two different signed heads for the same ``(survey,
    check)``, or heads whose sizes and roots are not consistent, prove
    equivocation.
    """

    survey: SurveyId
    check: Check
    size: int
    root: bytes

    def to_body(self) -> dict[str, Any]:
        return {"survey": self.survey.to_bytes().hex(), "check": int(self.check), "size": self.size, "root": self.root.hex()}

    def sign(self, signing_key: SigningKey) -> SignedDocument:
        return SignedDocument.create(signing_key, DocumentKind.TREE_HEAD, self.survey.round_id, self.to_body())

    @classmethod
    def from_document(cls, document: SignedDocument) -> TreeHead:
        """The head a tree-head document's body states (its signature is checked by ``document.verify``).

        A pure function of the document: each peer reads every head of its
        checks several times, and the heads are the same for every peer, so a
        head read before answers from memory (a malformed one is read, and
        refused, every time).
        """
        head = _TREE_HEADS.get(document)
        if head is None:
            head = cls._read(document)
            _TREE_HEADS.put(document, head)
        return head

    @classmethod
    def _read(cls, document: SignedDocument) -> TreeHead:
        reader = document.fields(InvalidApiMessage)
        survey = _survey(reader, reader.hex("survey", size=SURVEY_ID_BYTES), "survey")
        head = cls(survey, Check(reader.integer("check", 0, len(Check) - 1)), reader.integer("size", 0, MAX_LOG_LEAVES), reader.hex("root", size=HASH_BYTES))
        reader.done()
        if survey.round_id != document.round_id:
            reader.fail("survey", "belongs to another round")
        return head


_TREE_HEADS: PureCache[SignedDocument, TreeHead] = PureCache(max_entries=1 << 14)


def receipt_leaves_root(digests: Sequence[bytes]) -> bytes:
    """The Merkle root of a receipt log's leaves (the receipt digests, in acceptance order)."""
    return root_of_hashes([leaf_hash(digest) for digest in digests])


@dataclass(frozen=True)
class ReceiptSegment:
    """``GET /v1/receipts/{kind}/{p}/{check}``: the signed heads and every leaf of one partition's surveys of a phase.

    Partition membership is public (the signed roster and the seed give it),
    so every peer of partition ``p`` fetches the same segment at the same
    scheduled time and looks for its own receipts locally: the request names
    nothing the aggregator did not know (DESIGN.md §5).
    """

    heads: tuple[SignedDocument, ...]
    leaves: Mapping[SurveyId, tuple[bytes, ...]]

    def verify(self, identity_key: bytes, round_id: bytes, check: Check) -> dict[SurveyId, TreeHead]:
        """Each survey's verified head; raises InvalidApiMessage unless every head is signed and its leaves hash to it."""
        verified: dict[SurveyId, TreeHead] = {}
        for document in self.heads:
            document.verify(identity_key, kind=DocumentKind.TREE_HEAD, round_id=round_id)
            head = TreeHead.from_document(document)
            leaves = self.leaves.get(head.survey)
            if head.check != check or leaves is None or head.survey in verified:
                raise InvalidApiMessage("heads", f"unexpected head for {head.survey} at check {int(head.check)}")
            if head.size != len(leaves) or not hmac.compare_digest(head.root, receipt_leaves_root(leaves)):
                raise InvalidApiMessage("leaves", f"the leaves of {head.survey} do not hash to its signed head")
            verified[head.survey] = head
        if set(verified) != set(self.leaves):
            raise InvalidApiMessage("leaves", "leaves without a signed head")
        return verified

    def to_json(self) -> bytes:
        return canonical_json(
            {
                "heads": [head.to_dict() for head in self.heads],
                "leaves": {survey.to_bytes().hex(): [d.hex() for d in digests] for survey, digests in self.leaves.items()},
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> ReceiptSegment:
        reader = _reader(data, MAX_RESPONSE_BYTES)
        heads = _documents(reader, "heads", 4096)
        leaves = _hashes_by_survey(reader, "leaves", 4096, MAX_LOG_LEAVES)
        reader.done()
        return cls(heads, leaves)


@dataclass(frozen=True)
class HeadsResponse:
    """``GET /v1/heads``: every signed tree head published so far, and the proofs that each log only grew.

    ``proofs[survey]`` is the RFC 9162 §2.1.4 consistency proof from the
    survey's first-check head to its final head (present once both exist).
    Relays mirror this document and serve it read-only; peers compare the
    heads of their surveys with a mirror's (DESIGN.md §5).
    """

    heads: tuple[SignedDocument, ...]
    proofs: Mapping[SurveyId, tuple[bytes, ...]]

    def verify(self, identity_key: bytes, round_id: bytes) -> dict[tuple[SurveyId, Check], TreeHead]:
        """Every head by ``(survey, check)``; raises InvalidApiMessage for a bad signature, two heads for one check,
        or a final head that is not consistent with the first."""
        verified: dict[tuple[SurveyId, Check], TreeHead] = {}
        for document in self.heads:
            document.verify(identity_key, kind=DocumentKind.TREE_HEAD, round_id=round_id)
            head = TreeHead.from_document(document)
            if (head.survey, head.check) in verified:
                raise InvalidApiMessage("heads", f"two heads for {head.survey} at check {int(head.check)}")
            verified[(head.survey, head.check)] = head
        for (survey, check), final in verified.items():
            first = verified.get((survey, Check.FIRST))
            if check is Check.FINAL and first is not None:
                proof = self.proofs.get(survey)
                if proof is None or not verify_consistency(first.size, final.size, first.root, final.root, proof):
                    raise InvalidApiMessage("proofs", f"the final head of {survey} is not consistent with its first")
        return verified

    def to_json(self) -> bytes:
        return canonical_json(
            {
                "heads": [head.to_dict() for head in self.heads],
                "proofs": {survey.to_bytes().hex(): [p.hex() for p in proof] for survey, proof in self.proofs.items()},
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> HeadsResponse:
        reader = _reader(data, MAX_RESPONSE_BYTES)
        heads = _documents(reader, "heads", 65536)
        proofs = _hashes_by_survey(reader, "proofs", 65536, 64)
        reader.done()
        return cls(heads, proofs)


def _documents(reader: FieldReader, key: str, max_items: int) -> tuple[SignedDocument, ...]:
    """A list of signed envelopes (each checked later by ``verify``)."""
    return tuple(SignedDocument.read(reader.nested(item, f"{key}[{i}]")) for i, item in enumerate(reader.items(key, max_items=max_items)))


def _hashes_by_survey(reader: FieldReader, key: str, max_surveys: int, max_hashes: int) -> dict[SurveyId, tuple[bytes, ...]]:
    """``{survey hex: [hash hex, ...]}``: receipt leaves per survey, or consistency proofs per survey."""
    raw = reader.obj(key)
    if len(raw) > max_surveys:
        reader.fail(key, f"{len(raw)} surveys exceed the limit of {max_surveys}")
    found: dict[SurveyId, tuple[bytes, ...]] = {}
    for name, items in raw.items():
        field = f"{key}.{str(name)[:16]}"
        survey = _survey(reader, reader.decode_hex(name, field, size=SURVEY_ID_BYTES), field)
        hashes = reader.nested({"h": items}, field).items("h", max_items=max_hashes)
        found[survey] = tuple(reader.decode_hex(item, f"{field}[{i}]", size=HASH_BYTES) for i, item in enumerate(hashes))
    return found


def log_consistency_proof(digests: Sequence[bytes], first: int) -> tuple[bytes, ...]:
    """The consistency proof from the head of the first ``first`` receipts to the head of all of them."""
    return tuple(consistency_proof(digests, first)) if first else ()


@dataclass(frozen=True)
class RoundStatus:
    """``GET /v1/status`` (signed): where the round is and what it has counted so far.

    ``phase`` is a :class:`protocol.RoundPhase`; ``sub_round`` is the median
    sub-round during the median phase, else None; ``counts`` holds
    ``registered``, ``credentials``, ``accepted`` and the covers by reason
    (``cover/...``); ``rejected`` maps each rejection reason to its count.
    """

    round_id: bytes
    phase: RoundPhase
    sub_round: int | None
    now: int
    schedule: Mapping[str, Any]
    counts: Mapping[str, int]
    rejected: Mapping[str, int]

    def to_body(self) -> dict[str, Any]:
        return {
            "phase": self.phase.value,
            "sub_round": self.sub_round,
            "now": self.now,
            "schedule": dict(self.schedule),
            "counts": dict(self.counts),
            "rejected": dict(self.rejected),
        }

    def sign(self, signing_key: SigningKey) -> SignedDocument:
        return SignedDocument.create(signing_key, DocumentKind.STATUS, self.round_id, self.to_body())

    @classmethod
    def from_document(cls, document: SignedDocument) -> RoundStatus:
        reader = document.fields(InvalidApiMessage)
        phase = RoundPhase(reader.choice("phase", PHASES))
        sub_round_raw = reader.raw("sub_round")
        sub_round = None if sub_round_raw is None else reader.integer("sub_round", 0, 2**16 - 1)
        now = reader.integer("now", 0, 2**40)
        schedule = RoundSchedule.read(reader.child("schedule")).to_dict()
        counts = _counts(reader, "counts")
        rejected = _counts(reader, "rejected")
        reader.done()
        return cls(document.round_id, phase, sub_round, now, schedule, counts, rejected)


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
