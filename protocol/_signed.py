"""Signed public documents: one envelope for everything the aggregator publishes.

DESIGN.md §5: "every public document (manifest, roster, thresholds, medians,
receipt-log heads, report) is signed by the aggregator's identity key and
checked". The manifest keeps its own envelope (its hash is the round id);
everything else travels as a :class:`SignedDocument`::

    {"body": {...}, "kind": "tree-head", "round_id": HEX, "signature": HEX}

The signature covers ``domain ‖ kind ‖ round_id ‖ SHA-256(canonical body)``,
so a document can be neither moved to another round nor read as another
kind. A peer keeps the envelope's exact bytes: two validly signed documents
that contradict each other are the proof of equivocation it stores
(DESIGN.md §5).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from anonml.base.memo import PureCache
from anonml.protocol._canonical import FieldReader, InvalidDocument, canonical_json, parse_json_object
from anonml.protocol._survey import ROUND_ID_BYTES

if TYPE_CHECKING:
    from nacl.signing import SigningKey

_DOMAIN = b"anonml/signed-document/v1"
SIGNATURE_BYTES = 64


class DocumentKind(enum.StrEnum):
    """What a signed document is; part of what the signature covers."""

    ROSTER_HEAD = "roster-head"
    THRESHOLDS = "thresholds"
    MEDIANS = "medians"
    SGD_MODEL = "sgd-model"
    TREE_HEAD = "tree-head"
    STATUS = "status"
    REPORT = "report"


class InvalidSignedDocument(InvalidDocument):
    """Raised by :meth:`SignedDocument.from_json` for a malformed envelope and by
    :meth:`SignedDocument.verify` for a wrong kind, round or signature."""


# Signatures already found to hold, by the digest of (key, message, signature): a process running many
# peers (the demo, the round simulator) checks the same roster, heads and manifest once per peer, and the
# roster alone is one signature per entry, so n peers verified n^2 signatures. Verification is a pure
# function of those bytes, so a repeat answers from here; only successes are kept, so a forgery costs a
# real check every time. Bounded: least recently used first out.
_holds: PureCache[bytes, bool] = PureCache(max_entries=1 << 16)


def ed25519_holds(key: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``key``'s Ed25519 signature of ``message`` (False for a malformed key or signature)."""
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    digest = hashlib.sha256(len(key).to_bytes(4, "big") + key + len(signature).to_bytes(4, "big") + signature + message).digest()
    if _holds.get(digest):
        return True
    try:
        VerifyKey(key).verify(message, signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    _holds.put(digest, True)
    return True


def _signed_bytes(kind: DocumentKind, round_id: bytes, body: bytes) -> bytes:
    return b"".join((_DOMAIN, kind.value.encode(), b"\x00", round_id, hashlib.sha256(body).digest()))


@dataclass(frozen=True)
class SignedDocument:
    """A document body (canonical JSON) and the aggregator's signature over it."""

    kind: DocumentKind
    round_id: bytes
    body: bytes
    """The canonical JSON encoding of the body object."""
    signature: bytes

    @classmethod
    def create(cls, signing_key: SigningKey, kind: DocumentKind, round_id: bytes, body: Mapping[str, Any]) -> SignedDocument:
        encoded = canonical_json(dict(body))
        return cls(kind, round_id, encoded, signing_key.sign(_signed_bytes(kind, round_id, encoded)).signature)

    def verify(self, identity_key: bytes, *, kind: DocumentKind, round_id: bytes) -> None:
        """Raise InvalidSignedDocument unless ``identity_key`` signed this ``kind`` of document for ``round_id``."""
        if self.kind != kind:
            raise InvalidSignedDocument("kind", f"expected a {kind.value!r} document, got {self.kind.value!r}")
        if not hmac.compare_digest(self.round_id, round_id):
            raise InvalidSignedDocument("round_id", f"signed for round {self.round_id.hex()!r}, not {round_id.hex()!r}")
        if not ed25519_holds(identity_key, _signed_bytes(self.kind, self.round_id, self.body), self.signature):
            raise InvalidSignedDocument("signature", f"the {kind.value} signature does not verify") from None

    def fields(self, error: type[InvalidDocument]) -> FieldReader:
        """A strict reader over the body (raising ``error``)."""
        return FieldReader(parse_json_object(self.body, max_bytes=len(self.body), error=error), "body", error)

    def to_dict(self) -> dict[str, Any]:
        return {
            "body": parse_json_object(self.body, max_bytes=len(self.body)),
            "kind": self.kind.value,
            "round_id": self.round_id.hex(),
            "signature": self.signature.hex(),
        }

    def to_json(self) -> bytes:
        return canonical_json(self.to_dict())

    @classmethod
    def read(cls, reader: FieldReader) -> SignedDocument:
        """Parse an envelope from an open reader (the signature is checked by :meth:`verify`)."""
        raw_kind = reader.choice("kind", tuple(k.value for k in DocumentKind))
        body = reader.obj("body")
        try:
            encoded = canonical_json(body)
        except (TypeError, ValueError) as exc:
            reader.fail("body", f"not canonically encodable: {exc}")
        document = cls(
            DocumentKind(raw_kind),
            reader.hex("round_id", size=ROUND_ID_BYTES),
            encoded,
            reader.hex("signature", size=SIGNATURE_BYTES),
        )
        reader.done()
        return document

    @classmethod
    def from_json(cls, data: bytes | str, *, max_bytes: int) -> SignedDocument:
        obj = parse_json_object(data, max_bytes=max_bytes, error=InvalidSignedDocument)
        return cls.read(FieldReader(obj, "", InvalidSignedDocument))

    def same_as(self, other: SignedDocument) -> bool:
        """Whether two envelopes say the same thing (same kind, round and body)."""
        return self.kind == other.kind and self.round_id == other.round_id and hmac.compare_digest(self.body, other.body)
