"""The relays' share of the partition seed: committed before registration closes, revealed after (DESIGN.md §3 step 3).

The aggregator knows its own seed and may add Sybil entries with nonces of
its choosing until it signs the roster head, so ``H(seed ‖ root)`` alone is
a value it can grind (``protocol.partition_seed``). Each relay that mirrors
the round therefore draws a fresh 32-byte value ``r`` and serves its
commitment ``H(domain ‖ round_id ‖ r)``; the aggregator writes every
commitment into the roster head it signs at ``t_register_end``, and a relay
reveals ``r`` only once it holds that signed head carrying its commitment.
The partition seed becomes ``H(seed ‖ root ‖ r_1 ‖ … ‖ r_m)`` in the head's
order: whatever the aggregator chose before signing, one honest relay's
value, unknown to it then, decides the partitions.

``GET /v1/mirror/{identity}/beacon`` serves a :class:`BeaconStatement`,
signed with the relay's beacon key (the manifest's ``RelayEntry.beacon_key``,
from the relay's descriptor): a commitment or reveal the relay did not sign
is refused by the aggregator and by peers, so whoever stands between them
and a relay's mirror cannot put a value of its choosing in the relay's name.
The signed roster head carries the :class:`BeaconCommitment` list.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from anonml.protocol._canonical import FieldReader, InvalidDocument, canonical_json, parse_json_object
from anonml.protocol._survey import ROUND_ID_BYTES

BEACON_BYTES = 32
"""Bytes of a relay's beacon value ``r`` (and of its commitment)."""
MAX_NODE_ID_BYTES = 64
"""As the manifest's relay directory bounds a node id."""
MAX_BEACON_COMMITMENTS = 256
"""At most one per listed relay (the manifest lists at most this many)."""
MAX_BEACON_STATEMENT_BYTES = 1024
"""A statement's JSON is under 550 bytes."""

BEACON_SIGNATURE_BYTES = 64
"""An Ed25519 signature."""

_COMMITMENT_DOMAIN = b"anonml/beacon-commitment/v1"
_STATEMENT_DOMAIN = b"anonml/beacon-statement/v1"


class InvalidBeacon(InvalidDocument):
    """A beacon statement or a roster head's beacon list that does not parse; ``field`` names what."""


def beacon_commitment(round_id: bytes, value: bytes) -> bytes:
    """``H(domain ‖ round_id ‖ r)``: binds ``r`` to one round, so a value revealed for one round opens no other's."""
    return hashlib.sha256(_COMMITMENT_DOMAIN + round_id + value).digest()


def opens(commitment: bytes, round_id: bytes, value: bytes) -> bool:
    """Whether ``value`` is the relay's value behind ``commitment`` for ``round_id``."""
    return len(value) == BEACON_BYTES and hmac.compare_digest(commitment, beacon_commitment(round_id, value))


@dataclass(frozen=True)
class BeaconCommitment:
    """One entry of the signed roster head's ``beacon`` list: a relay and the commitment it served."""

    node_id: bytes
    commitment: bytes

    def to_dict(self) -> dict[str, str]:
        return {"node_id": self.node_id.hex(), "commitment": self.commitment.hex()}

    @classmethod
    def read(cls, reader: FieldReader) -> BeaconCommitment:
        entry = cls(reader.hex("node_id", max_size=MAX_NODE_ID_BYTES), reader.hex("commitment", size=BEACON_BYTES))
        reader.done()
        return entry


def read_commitments(reader: FieldReader, key: str) -> tuple[BeaconCommitment, ...]:
    """A head's ``beacon`` list: 1 to :data:`MAX_BEACON_COMMITMENTS` entries, each relay once."""
    items = reader.items(key, max_items=MAX_BEACON_COMMITMENTS)
    if not items:
        reader.fail(key, "an empty beacon list is written by leaving the field out")
    entries = tuple(BeaconCommitment.read(reader.nested(item, f"{reader.name(key)}[{i}]")) for i, item in enumerate(items))
    if len({entry.node_id for entry in entries}) != len(entries):
        reader.fail(key, "a relay is listed twice")
    return entries


@dataclass(frozen=True)
class BeaconStatement:
    """``GET /v1/mirror/{identity}/beacon``: one relay's commitment for one round and, once revealed, its value,
    signed with the relay's beacon key.

    Parsing checks only the shape; whether the relay signed it
    (:meth:`signed_by`) and whether ``reveal`` opens ``commitment``
    (:meth:`opened`) are the reader's decisions, each counted as its own reason.
    """

    node_id: bytes
    round_id: bytes
    commitment: bytes
    reveal: bytes | None
    signature: bytes | None = None

    def opened(self) -> bool:
        return self.reveal is not None and opens(self.commitment, self.round_id, self.reveal)

    def _fields(self) -> dict[str, str | None]:
        return {
            "node_id": self.node_id.hex(),
            "round_id": self.round_id.hex(),
            "commitment": self.commitment.hex(),
            "reveal": None if self.reveal is None else self.reveal.hex(),
        }

    def signed_bytes(self) -> bytes:
        """What the relay signs: a domain, then the statement's canonical JSON without its signature."""
        return _STATEMENT_DOMAIN + canonical_json(self._fields())

    def sign(self, key: SigningKey) -> BeaconStatement:
        return BeaconStatement(self.node_id, self.round_id, self.commitment, self.reveal, key.sign(self.signed_bytes()).signature)

    def signed_by(self, beacon_key: bytes) -> bool:
        """Whether the relay whose beacon key is ``beacon_key`` signed exactly this statement."""
        if self.signature is None:
            return False
        try:
            VerifyKey(beacon_key).verify(self.signed_bytes(), self.signature)
        except (BadSignatureError, ValueError, TypeError):
            return False
        return True

    def to_json(self) -> bytes:
        fields = self._fields()
        return canonical_json(fields if self.signature is None else {**fields, "signature": self.signature.hex()})

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> BeaconStatement:
        obj = data if isinstance(data, Mapping) else parse_json_object(data, max_bytes=MAX_BEACON_STATEMENT_BYTES, error=InvalidBeacon)
        reader = FieldReader(dict(obj), "", InvalidBeacon)
        statement = cls(
            reader.hex("node_id", max_size=MAX_NODE_ID_BYTES),
            reader.hex("round_id", size=ROUND_ID_BYTES),
            reader.hex("commitment", size=BEACON_BYTES),
            reader.hex_bytes("reveal", size=BEACON_BYTES, nullable=True),
            # Absent from a relay the manifest lists no beacon key for; a reader that has the key requires it.
            reader.hex("signature", size=BEACON_SIGNATURE_BYTES) if reader.raw("signature", optional=True) is not None else None,
        )
        reader.done()
        return statement
