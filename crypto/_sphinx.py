"""Sphinx packets (Danezis & Goldberg 2009), structured as the Katzenpost spec.

A client wraps one message for a path of hops; each hop removes one layer with
its private key and learns only the next hop, its own release window, and a
packet for the next hop that is bitwise unlinkable to the one it received. The
last hop of a forward path is the aggregator: it checks the payload's zero tag
and reads the message. Reply blocks (SURBs) are in :mod:`crypto._surb`.

Group and blinding (DESIGN.md §5: "X25519 group element per packet, blinded per
hop"). We use plain X25519 with clamped scalars everywhere, as Katzenpost does
(spec "Sphinx Packet Creation": the client applies every earlier blinding
factor in turn). X25519(k, u) computes the u-coordinate of [clamp(k)]P, and
scalar multiplications commute, so with alpha_0 = X25519(x, 9) and
alpha_{i+1} = X25519(b_i, alpha_i) the hop computes

    s_i = X25519(y_i, alpha_i) = [clamp(y_i)·clamp(b_{i-1})···clamp(b_0)·clamp(x)]G

while the client computes the same point as
X25519(b_{i-1}, ... X25519(b_0, X25519(x, Y_i))). We never multiply clamped
scalars together modulo the group order (that is what breaks with clamping:
the product of clamped scalars is not a clamped scalar, and X25519 would clamp
it again); the client pays i+1 multiplications for hop i instead (14 for a
4-hop path), which stays far inside the 1 ms budget. Clamping makes every
scalar a multiple of the cofactor 8, so a small-order component of any element
is killed and a small-order element gives the all-zero output, which is
refused. Because X25519 ignores the top bit of a u-coordinate and reduces
u >= p, several encodings name the same element; the header MAC covers alpha's
bytes, so a re-encoded alpha fails the MAC, and its replay tag (a function of
the shared secret) would match the original's anyway.
tests/test_sphinx.py checks client and hop secrets agree on a 5-hop path.

Why not a prime-order group (ristretto255) with blinding factors multiplied
modulo the group order, which would give the client two multiplications per
hop? The installed pynacl (1.6) exposes no ristretto255, and Ed25519 points
with unclamped multiplication need a subgroup check on every received
element (measured: 125 µs per multiplication against 37 µs for X25519), which
would put one hop near the 250 µs budget. Clamped X25519 is the construction
DESIGN.md names and Katzenpost deploys; its cost falls on the client, once per
packet.

Per-hop keys: HKDF-SHA256(ikm = s_i, salt = geometry hash, info = label)
-> header MAC key || header stream key || LIONESS payload key || blinding
scalar || replay tag (Katzenpost spec "Sphinx Key Derivation Function"; the
tag is derived, not the secret itself, so a relay stores nothing reusable).

Order of work at a hop (DESIGN.md §5): length, MAC, replay tag, decrypt, parse.
Nothing in the header is parsed before its MAC verifies, and every way a
packet can be bad raises :class:`InvalidPacket` (one opaque type for the
relay; subclasses carry a ``reason`` for counters).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from anonml.base.errors import InputError
from anonml.crypto._geometry import NODE_ID_SIZE, SphinxGeometry
from anonml.crypto._sizes import CHACHA20_KEY_SIZE, SHA256_SIZE, X25519_ELEMENT_SIZE, X25519_SCALAR_SIZE
from anonml.crypto._primitives import (
    InvalidGroupElement,
    chacha20_keystream,
    chacha20_xor,
    ct_equal,
    hkdf_sha256,
    hmac_sha256,
    lioness_decrypt,
    lioness_encrypt,
    x25519,
    x25519_base,
    xor_bytes,
)

RngBytes = Callable[[int], bytes]

_KDF_INFO = b"anonml/sphinx/v1/hop-keys"
_NODE_ID_DOMAIN = b"anonml/sphinx/v1/node-id\x00"
REPLAY_TAG_SIZE = SHA256_SIZE
_WINDOW = struct.Struct(">QQ")
_PORT = struct.Struct(">H")
_IPV6_SIZE = 16

# Routing commands (Katzenpost spec "Sphinx Packet Routing Commands"; ours are
# one fixed-size slot each).
_FORWARD = 1  # relay to the node named in the slot
_DELIVER = 2  # final hop of a forward packet: the payload holds the message
_SURB_REPLY = 3  # final hop of a reply: the payload is for the SURB's creator


# ---------------------------------------------------------------------------
# Errors


class InvalidRoute(InputError):
    """Raised on the sending side (hop descriptions, :func:`build_packet`,
    SURB creation) for a path, address, window or message that cannot be made
    into a packet of the geometry."""


class InvalidKey(InputError):
    """Raised by the key helpers and :func:`process_packet` for a private or
    public key of the wrong size or a public key that is not a usable element."""


class InvalidPacket(InputError):
    """The one exception a hop raises for a packet it will not process.

    Relays report only this type to the network (nothing tells a sender which
    check failed, STYLE.md §8); the subclass's ``reason`` feeds counters.
    """

    reason: ClassVar[str] = "invalid"


class WrongLength(InvalidPacket):
    """The packet is not exactly ``geometry.packet_size`` bytes."""

    reason = "wrong_length"


class BadMac(InvalidPacket):
    """The header MAC does not verify under this hop's key."""

    reason = "bad_mac"


class BadGroupElement(BadMac):
    """The packet's group element has small order, so no key can be derived
    (a special case of an unverifiable MAC)."""

    reason = "bad_group_element"


class ReplayedPacket(InvalidPacket):
    """``is_replay`` reported this packet's replay tag as already seen."""

    reason = "replay"


class BadRoutingInfo(InvalidPacket):
    """The authenticated routing slot holds an unknown command or bad field.

    Only a dishonest sender can cause this (the MAC verified)."""

    reason = "bad_routing_info"


class BadPayload(InvalidPacket):
    """At the final hop the payload's zero tag or length is wrong: the payload
    was modified on the way (LIONESS garbled it) or built badly."""

    reason = "bad_payload"


# ---------------------------------------------------------------------------
# Hops


@dataclass(frozen=True)
class ReleaseWindow:
    """A hop's release window ``[start, end]``, absolute UTC seconds."""

    start: int
    end: int

    def __post_init__(self) -> None:
        for value in (self.start, self.end):
            if type(value) is not int or not 0 <= value < 2**64:
                raise InvalidRoute(f"window bounds must be ints in [0, 2**64), got {value!r}")
        if self.start > self.end:
            raise InvalidRoute(f"window start after end: {self!r}")


@dataclass(frozen=True)
class NodeAddress:
    """A node's IP literal and TCP port, with a fixed-size encoding.

    The host is normalised (IPv4-mapped IPv6 becomes dotted IPv4) so that
    ``from_bytes(to_bytes())`` returns an equal address.
    """

    host: str
    port: int

    def __post_init__(self) -> None:
        try:
            parsed = ipaddress.ip_address(self.host)
        except ValueError as exc:
            raise InvalidRoute(f"host must be an IP literal, got {self.host!r}") from exc
        if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
            parsed = parsed.ipv4_mapped
        object.__setattr__(self, "host", str(parsed))
        if type(self.port) is not int or not 0 < self.port < 2**16:
            raise InvalidRoute(f"port must be in [1, 65535], got {self.port!r}")

    def to_bytes(self) -> bytes:
        """16-byte IPv6 address (IPv4 as IPv4-mapped) then a big-endian port."""
        parsed = ipaddress.ip_address(self.host)
        if isinstance(parsed, ipaddress.IPv4Address):
            parsed = ipaddress.IPv6Address(b"\x00" * 10 + b"\xff\xff" + parsed.packed)
        return parsed.packed + _PORT.pack(self.port)

    @classmethod
    def from_bytes(cls, data: bytes) -> NodeAddress:
        """Parse :meth:`to_bytes`; raises :class:`InvalidRoute` for bad bytes."""
        return _address_from_bytes(data)


# A relay forwards to a handful of neighbours: caching the parse keeps the
# ipaddress module's string round trip off the per-packet path.
@functools.lru_cache(maxsize=1024)
def _address_from_bytes(data: bytes) -> NodeAddress:
    if not isinstance(data, bytes) or len(data) != _IPV6_SIZE + _PORT.size:
        raise InvalidRoute(f"address must be {_IPV6_SIZE + _PORT.size} bytes, got {data!r}")
    (port,) = _PORT.unpack(data[_IPV6_SIZE:])
    return NodeAddress(str(ipaddress.IPv6Address(data[:_IPV6_SIZE])), port)


@dataclass(frozen=True)
class PathHop:
    """One hop of a path: who it is, where it listens, its key and its window."""

    node_id: bytes
    address: NodeAddress
    public_key: bytes
    window: ReleaseWindow

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, bytes) or len(self.node_id) != NODE_ID_SIZE:
            raise InvalidRoute(f"node_id must be {NODE_ID_SIZE} bytes, got {self.node_id!r}")
        if not isinstance(self.public_key, bytes) or len(self.public_key) != X25519_ELEMENT_SIZE:
            raise InvalidRoute(f"public_key must be {X25519_ELEMENT_SIZE} bytes, got {self.public_key!r}")
        if not isinstance(self.address, NodeAddress) or not isinstance(self.window, ReleaseWindow):
            raise InvalidRoute(f"address/window have wrong types: {self.address!r}, {self.window!r}")


# ---------------------------------------------------------------------------
# Results of processing


@dataclass(frozen=True)
class ForwardPacket:
    """Send ``packet`` to ``next_node_id`` at ``next_address`` inside ``window``
    (this hop's release window)."""

    next_node_id: bytes
    next_address: NodeAddress
    window: ReleaseWindow
    packet: bytes
    replay_tag: bytes


@dataclass(frozen=True)
class FinalMessage:
    """This hop is the destination: ``message`` is the end-to-end message."""

    window: ReleaseWindow
    message: bytes
    replay_tag: bytes


@dataclass(frozen=True)
class SurbReply:
    """This hop is the destination of a reply sent with a SURB it made.

    ``payload`` is still encrypted for the SURB's keys: pass this object to
    :func:`crypto.open_reply` with the :class:`SurbKeys` stored under
    ``surb_id``.
    """

    surb_id: bytes
    window: ReleaseWindow
    payload: bytes
    replay_tag: bytes


# ---------------------------------------------------------------------------
# Keys


def generate_keypair(*, rng_bytes: RngBytes = os.urandom) -> tuple[bytes, bytes]:
    """A fresh X25519 key pair ``(private, public)`` for a relay or aggregator."""
    private = _draw(rng_bytes, X25519_SCALAR_SIZE)
    return private, public_key_of(private)


def public_key_of(private_key: bytes) -> bytes:
    """The X25519 public key of ``private_key``."""
    _check_private_key(private_key)
    return x25519_base(private_key)


def node_id_of(public_key: bytes) -> bytes:
    """A node's 16-byte id: a domain-separated SHA-256 of its public key."""
    if not isinstance(public_key, bytes) or len(public_key) != X25519_ELEMENT_SIZE:
        raise InvalidKey(f"public key must be {X25519_ELEMENT_SIZE} bytes, got {public_key!r}")
    return hashlib.sha256(_NODE_ID_DOMAIN + public_key).digest()[:NODE_ID_SIZE]


def _check_private_key(private_key: bytes) -> None:
    if not isinstance(private_key, bytes) or len(private_key) != X25519_SCALAR_SIZE:
        # Never echo a private key into a message or a log.
        raise InvalidKey(f"private key must be {X25519_SCALAR_SIZE} bytes, got a {type(private_key).__name__}")


def _draw(rng_bytes: RngBytes, size: int) -> bytes:
    drawn = rng_bytes(size)
    if not isinstance(drawn, bytes) or len(drawn) != size:
        raise InvalidRoute(f"rng_bytes({size!r}) returned {len(drawn)!r} bytes")
    return drawn


class _HopKeys(NamedTuple):
    header_mac: bytes
    header_stream: bytes
    payload: bytes
    blinding: bytes
    replay_tag: bytes


def _derive_hop_keys(geometry: SphinxGeometry, shared_secret: bytes) -> _HopKeys:
    sizes = (geometry.mac_size, CHACHA20_KEY_SIZE, geometry.payload_key_size, X25519_SCALAR_SIZE, REPLAY_TAG_SIZE)
    material = hkdf_sha256(shared_secret, salt=geometry.canonical_hash(), info=_KDF_INFO, length=sum(sizes))
    parts: list[bytes] = []
    offset = 0
    for size in sizes:
        parts.append(material[offset : offset + size])
        offset += size
    return _HopKeys(*parts)


class _HopSecret(NamedTuple):
    alpha: bytes  # the group element hop i receives
    shared_secret: bytes
    keys: _HopKeys


def _path_secrets(geometry: SphinxGeometry, public_keys: Sequence[bytes], secret: bytes) -> list[_HopSecret]:
    """The client's view of every hop's element and shared secret (module doc)."""
    alpha = x25519_base(secret)
    blindings: list[bytes] = []
    hops: list[_HopSecret] = []
    for index, public_key in enumerate(public_keys):
        try:
            shared = x25519(secret, public_key)
            for blinding in blindings:
                shared = x25519(blinding, shared)
        except InvalidGroupElement as exc:
            raise InvalidRoute(f"hop {index} public key is a small-order element: {public_key.hex()!r}") from exc
        keys = _derive_hop_keys(geometry, shared)
        hops.append(_HopSecret(alpha, shared, keys))
        if index + 1 < len(public_keys):
            alpha = x25519(keys.blinding, alpha)
            blindings.append(keys.blinding)
    return hops


# ---------------------------------------------------------------------------
# Routing slots


def _encode_slot(
    geometry: SphinxGeometry, command: int, node_id: bytes, address: bytes, window: ReleaseWindow, next_mac: bytes
) -> bytes:
    slot = bytes((command,)) + node_id + address + _WINDOW.pack(window.start, window.end) + next_mac
    if len(slot) != geometry.routing_info_size:
        raise InvalidRoute(f"routing slot is {len(slot)!r} bytes, geometry wants {geometry.routing_info_size!r}")
    return slot


class _Slot(NamedTuple):
    command: int
    node_id: bytes
    address: bytes
    window: ReleaseWindow
    next_mac: bytes


def _decode_slot(geometry: SphinxGeometry, slot: bytes) -> _Slot:
    offset = geometry.command_size
    node_id = slot[offset : offset + geometry.node_id_size]
    offset += geometry.node_id_size
    address = slot[offset : offset + geometry.address_size]
    offset += geometry.address_size
    start, end = _WINDOW.unpack(slot[offset : offset + geometry.window_size])
    offset += geometry.window_size
    next_mac = slot[offset : offset + geometry.mac_size]
    try:
        window = ReleaseWindow(start, end)
    except InvalidRoute as exc:
        raise BadRoutingInfo(f"bad window in routing info: {start!r} > {end!r}") from exc
    return _Slot(slot[0], node_id, address, window, next_mac)


def _build_header(
    geometry: SphinxGeometry,
    path: Sequence[PathHop],
    final_command: int,
    final_id: bytes,
    rng_bytes: RngBytes,
) -> tuple[bytes, list[_HopKeys]]:
    """Sphinx header creation (Danezis & Goldberg 2009 §3.2; Katzenpost spec
    "Sphinx Packet Creation"): returns the header and every hop's keys."""
    hop_count = len(path)
    if not 1 <= hop_count <= geometry.max_hops:
        raise InvalidRoute(f"path must have 1..{geometry.max_hops} hops, got {hop_count!r}")
    if not all(isinstance(hop, PathHop) for hop in path):
        raise InvalidRoute(f"path must hold PathHop objects, got {path!r}")
    secret = _draw(rng_bytes, X25519_SCALAR_SIZE)
    hops = _path_secrets(geometry, [hop.public_key for hop in path], secret)
    slot_size = geometry.routing_info_size
    beta_size = geometry.routing_size
    # Hop i xors (beta || 0^slot) with this stream, then drops its own slot.
    streams = [chacha20_keystream(hop.keys.header_stream, beta_size + slot_size) for hop in hops]

    # The filler: what the zero bytes appended at hops 0..n-2 turn into, so the
    # client can predict the tail of every later beta and MAC it.
    filler = b""
    for index in range(hop_count - 1):
        filler = xor_bytes(filler + bytes(slot_size), streams[index][beta_size - index * slot_size :])

    # The final slot, then random bytes for the unused slots (never zeros: zero
    # padding would show the last hop where the path's real slots end).
    final_slot = _encode_slot(
        geometry, final_command, final_id, bytes(geometry.address_size), path[-1].window, bytes(geometry.mac_size)
    )
    padding = _draw(rng_bytes, (geometry.max_hops - hop_count) * slot_size)
    head_size = beta_size - (hop_count - 1) * slot_size
    beta = xor_bytes(final_slot + padding, streams[-1][:head_size]) + filler
    gamma = hmac_sha256(hops[-1].keys.header_mac, hops[-1].alpha + beta)

    for index in range(hop_count - 2, -1, -1):
        following = path[index + 1]
        slot = _encode_slot(
            geometry, _FORWARD, following.node_id, following.address.to_bytes(), path[index].window, gamma
        )
        beta = xor_bytes(slot + beta[: beta_size - slot_size], streams[index][:beta_size])
        gamma = hmac_sha256(hops[index].keys.header_mac, hops[index].alpha + beta)
    return hops[0].alpha + beta + gamma, [hop.keys for hop in hops]


# ---------------------------------------------------------------------------
# Payload


def _seal_payload(geometry: SphinxGeometry, message: bytes) -> bytes:
    """The innermost payload: zero tag, message length, message, zero padding."""
    if not isinstance(message, bytes):
        raise InvalidRoute(f"message must be bytes, got {type(message).__name__!r}")
    if len(message) > geometry.message_size:
        raise InvalidRoute(f"message of {len(message)!r} bytes exceeds {geometry.message_size!r}")
    padding = bytes(geometry.message_size - len(message))
    length = len(message).to_bytes(geometry.length_prefix_size, "big")
    return bytes(geometry.payload_tag_size) + length + message + padding


def _open_payload(geometry: SphinxGeometry, payload: bytes) -> bytes:
    """Check and strip what :func:`_seal_payload` added; raises :class:`BadPayload`."""
    tag_end = geometry.payload_tag_size
    if not ct_equal(payload[:tag_end], bytes(tag_end)):
        raise BadPayload("payload zero tag does not verify (payload modified in transit)")
    message_start = tag_end + geometry.length_prefix_size
    length = int.from_bytes(payload[tag_end:message_start], "big")
    if length > geometry.message_size:
        raise BadPayload(f"message length {length!r} exceeds {geometry.message_size!r}")
    padding = payload[message_start + length :]
    if padding != bytes(len(padding)):
        raise BadPayload("payload padding is not zero")
    return payload[message_start : message_start + length]


# ---------------------------------------------------------------------------
# Public recipe


def build_packet(
    geometry: SphinxGeometry,
    path: Sequence[PathHop],
    message: bytes,
    *,
    rng_bytes: RngBytes = os.urandom,
) -> bytes:
    """Wrap ``message`` for ``path``; the last hop (the aggregator) reads it.

    Returns exactly ``geometry.packet_size`` bytes, whatever the path length
    (1..max_hops) and message length (0..message_size). Raises
    :class:`InvalidRoute` for a path or message that does not fit.
    """
    header, hop_keys = _build_header(geometry, path, _DELIVER, bytes(geometry.node_id_size), rng_bytes)
    payload = _seal_payload(geometry, message)
    for keys in reversed(hop_keys):
        payload = lioness_encrypt(keys.payload, payload)
    return header + payload


def never_replayed(tag: bytes) -> bool:
    """An ``is_replay`` for :func:`process_packet` callers that keep no replay
    cache: benchmarks, tests and offline inspection (never a relay)."""
    return False


def process_packet(
    geometry: SphinxGeometry,
    private_key: bytes,
    packet: bytes,
    *,
    is_replay: Callable[[bytes], bool],
) -> ForwardPacket | FinalMessage | SurbReply:
    """Remove this hop's layer from ``packet``.

    Work in DESIGN.md §5's order: length, header MAC (constant time), replay
    tag (``is_replay(tag)`` is called once, only for authentic packets; the
    caller records the tag there), decryption, and only then parsing of the
    routing slot. Raises :class:`InvalidPacket` (a subclass naming the reason)
    for any bad packet, and nothing else for any ``packet`` value.
    """
    _check_private_key(private_key)
    if isinstance(packet, (bytearray, memoryview)):
        packet = bytes(packet)
    if not isinstance(packet, bytes):
        raise WrongLength(f"packet must be bytes, got {type(packet).__name__!r}")
    if len(packet) != geometry.packet_size:
        raise WrongLength(f"packet of {len(packet)!r} bytes, geometry wants {geometry.packet_size!r}")

    alpha_end = geometry.group_element_size
    beta_end = alpha_end + geometry.routing_size
    alpha = packet[:alpha_end]
    beta = packet[alpha_end:beta_end]
    gamma = packet[beta_end : geometry.header_size]
    try:
        shared = x25519(private_key, alpha)
    except InvalidGroupElement as exc:
        raise BadGroupElement(f"small-order group element {alpha.hex()!r}") from exc
    keys = _derive_hop_keys(geometry, shared)
    if not ct_equal(hmac_sha256(keys.header_mac, alpha + beta), gamma):
        raise BadMac("header MAC does not verify")
    if is_replay(keys.replay_tag):
        raise ReplayedPacket(f"replay tag seen before: {keys.replay_tag.hex()!r}")

    routing = chacha20_xor(keys.header_stream, beta + bytes(geometry.routing_info_size))
    payload = lioness_decrypt(keys.payload, packet[geometry.header_size :])
    slot = _decode_slot(geometry, routing[: geometry.routing_info_size])
    next_beta = routing[geometry.routing_info_size :]

    if slot.command == _FORWARD:
        try:
            address = NodeAddress.from_bytes(slot.address)
        except InvalidRoute as exc:
            raise BadRoutingInfo(f"bad next-hop address {slot.address.hex()!r}") from exc
        next_alpha = x25519(keys.blinding, alpha)
        return ForwardPacket(
            next_node_id=slot.node_id,
            next_address=address,
            window=slot.window,
            packet=next_alpha + next_beta + slot.next_mac + payload,
            replay_tag=keys.replay_tag,
        )
    if slot.command not in (_DELIVER, _SURB_REPLY):
        raise BadRoutingInfo(f"unknown routing command {slot.command!r}")
    if slot.address != bytes(geometry.address_size) or slot.next_mac != bytes(geometry.mac_size):
        raise BadRoutingInfo(f"final routing slot has non-zero unused fields (command {slot.command!r})")
    if slot.command == _SURB_REPLY:
        return SurbReply(surb_id=slot.node_id, window=slot.window, payload=payload, replay_tag=keys.replay_tag)
    if slot.node_id != bytes(geometry.node_id_size):
        raise BadRoutingInfo("deliver command has a non-zero id field")
    return FinalMessage(window=slot.window, message=_open_payload(geometry, payload), replay_tag=keys.replay_tag)
