"""Sphinx packet geometry: every length the packet code uses, in one object.

Following Katzenpost's ``core/sphinx/geo`` (STYLE.md §10): a frozen object built
by one factory, :meth:`SphinxGeometry.create`, from the two numbers the round
manifest fixes (DESIGN.md §4: path length, packet size). The component sizes
are those of the primitive suite (X25519, HMAC-SHA256, ChaCha20, LIONESS) and
are recorded too, so the canonical hash, which salts every per-hop key
derivation, names the whole format: a packet built for one geometry fails the
MAC under any other.

Layout (Katzenpost Sphinx spec, "Sphinx Packet Geometry"; Danezis & Goldberg
2009 §3.2)::

    packet  = header || payload
    header  = alpha (group element) || beta (max_hops routing slots) || gamma (MAC)
    slot    = command (1) || node id || address || window || next MAC
    payload = zero tag || message length || message || zero padding   (innermost)
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from anonml.base.errors import InputError
from anonml.crypto._sizes import HMAC_SHA256_SIZE, LIONESS_KEY_SIZE, LIONESS_MIN_BLOCK_SIZE, X25519_ELEMENT_SIZE

SUITE = "anonml-sphinx/v1/x25519-hkdfsha256-hmacsha256-chacha20-lioness"
_HASH_DOMAIN = b"anonml/sphinx/geometry/v1\x00"
# The message length is carried in this many bytes inside the payload, so the
# packet must stay below 2**16 bytes.
_LENGTH_PREFIX_SIZE = 2
_MAX_PACKET_SIZE = 2 ** (8 * _LENGTH_PREFIX_SIZE) - 1
# A window is two unsigned 64-bit absolute UTC seconds (DESIGN.md §3).
_WINDOW_SIZE = 16
# Node ids are 16-byte hashes of the node's public key.
NODE_ID_SIZE = 16
# An IPv6 address (IPv4 as IPv4-mapped) and a 16-bit port.
_ADDRESS_SIZE = 18
_COMMAND_SIZE = 1
# Katzenpost spec: a 16-byte all-zero tag at the start of the innermost payload.
_PAYLOAD_TAG_SIZE = 16
# Every size the suite fixes: what create() fills in and validate() requires.
_SUITE_SIZES = {
    "group_element_size": X25519_ELEMENT_SIZE,
    "mac_size": HMAC_SHA256_SIZE,
    "command_size": _COMMAND_SIZE,
    "node_id_size": NODE_ID_SIZE,
    "address_size": _ADDRESS_SIZE,
    "window_size": _WINDOW_SIZE,
    "payload_tag_size": _PAYLOAD_TAG_SIZE,
    "length_prefix_size": _LENGTH_PREFIX_SIZE,
    "payload_key_size": LIONESS_KEY_SIZE,
}


class InvalidGeometry(InputError):
    """Raised by :meth:`SphinxGeometry.create`, ``validate`` and ``from_dict``
    for parameters that cannot form a packet format."""



# The geometry every role uses unless a round says otherwise. Relays and the
# aggregator must agree on it (the link hello compares geometry hashes), so
# both read these defaults from here. Five slots fit a 3-relay path plus the
# aggregator's final hop with one to spare; ~2 KiB fits this data (DESIGN §5).
DEFAULT_MAX_HOPS = 5
DEFAULT_PACKET_SIZE = 2048

@dataclass(frozen=True)
class SphinxGeometry:
    """The fixed sizes of every packet of one round (one per manifest).

    Build it with :meth:`create`; the constructor validates too, so no invalid
    geometry exists.
    """

    suite: str
    max_hops: int
    packet_size: int
    group_element_size: int
    mac_size: int
    command_size: int
    node_id_size: int
    address_size: int
    window_size: int
    payload_tag_size: int
    length_prefix_size: int
    payload_key_size: int

    @classmethod
    def create(cls, max_hops: int = DEFAULT_MAX_HOPS, packet_size: int = DEFAULT_PACKET_SIZE) -> SphinxGeometry:
        """The geometry for paths of up to ``max_hops`` hops in ``packet_size`` bytes.

        The header holds ``max_hops`` routing slots; the payload gets the rest.
        """
        return cls(suite=SUITE, max_hops=max_hops, packet_size=packet_size, **_SUITE_SIZES)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`InvalidGeometry` unless this geometry is the suite's and fits."""
        reference: dict[str, object] = {"suite": SUITE, **_SUITE_SIZES}
        for name, expected in reference.items():
            value = getattr(self, name)
            if type(value) is not type(expected) or value != expected:
                raise InvalidGeometry(f"{name} must be {expected!r} for suite {SUITE!r}, got {value!r}")
        for name in ("max_hops", "packet_size"):
            if type(getattr(self, name)) is not int:
                raise InvalidGeometry(f"{name} must be an int, got {getattr(self, name)!r}")
        if not 1 <= self.max_hops <= 32:
            raise InvalidGeometry(f"max_hops must be in [1, 32], got {self.max_hops!r}")
        if not 0 < self.packet_size <= _MAX_PACKET_SIZE:
            raise InvalidGeometry(f"packet_size must be in (0, {_MAX_PACKET_SIZE}], got {self.packet_size!r}")
        if self.payload_size < LIONESS_MIN_BLOCK_SIZE or self.message_size < self.surb_size:
            raise InvalidGeometry(
                f"packet_size {self.packet_size!r} leaves no room for a message holding a reply block "
                f"(header {self.header_size} bytes, SURB {self.surb_size} bytes)"
            )

    @functools.cached_property
    def routing_info_size(self) -> int:
        """Bytes of one hop's routing slot in the header."""
        return self.command_size + self.node_id_size + self.address_size + self.window_size + self.mac_size

    @functools.cached_property
    def routing_size(self) -> int:
        """Bytes of beta, all routing slots."""
        return self.max_hops * self.routing_info_size

    @functools.cached_property
    def header_size(self) -> int:
        return self.group_element_size + self.routing_size + self.mac_size

    @functools.cached_property
    def payload_size(self) -> int:
        return self.packet_size - self.header_size

    @functools.cached_property
    def message_size(self) -> int:
        """The largest end-to-end message one packet carries."""
        return self.payload_size - self.payload_tag_size - self.length_prefix_size

    @functools.cached_property
    def surb_size(self) -> int:
        """Bytes of a serialised single-use reply block."""
        return self.node_id_size + self.address_size + self.header_size + self.payload_key_size

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON values (for the round manifest)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> SphinxGeometry:
        """Parse :meth:`to_dict` output; raises :class:`InvalidGeometry` on anything else."""
        names = {field.name for field in fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            raise InvalidGeometry(f"geometry must be a dict with keys {sorted(names)!r}, got {data!r}")
        return cls(**data)

    def canonical_hash(self) -> bytes:
        """SHA-256 over the canonical JSON of :meth:`to_dict` (sorted keys, no spaces)."""
        return self._canonical_hash

    # Every packet operation salts its key derivation with the geometry hash
    # and reads the derived sizes several times: computed once per geometry
    # (the object is frozen), they stay off the per-packet path.
    @functools.cached_property
    def _canonical_hash(self) -> bytes:
        encoded = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(_HASH_DOMAIN + encoded).digest()
