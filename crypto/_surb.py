"""Single-use reply blocks (Danezis & Goldberg 2009 §3.4; Katzenpost spec
"Single Use Reply Block (SURB) Creation"), for delivery acknowledgements
(DESIGN.md §5 (b)).

The receiver builds a header for a path ending at itself whose final routing
command is "SURB reply" with a random ``surb_id``, and a fresh reply key
``k~``. The :class:`Surb` (first hop, header, ``k~``) travels inside a
message; whoever holds it encrypts the reply payload once with ``k~``
(LIONESS) and sends header || payload to the first hop. Each hop, the
receiver included, LIONESS-decrypts the payload with its own key, so the
receiver ends with D_{n-1}(...D_0(E_{k~}(p))). :func:`open_reply` undoes the
hop layers (it kept every hop's payload key in :class:`SurbKeys`) and then
``k~``, and checks the zero tag. A reply packet has the same size and format
as a forward packet.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from anonml.base.errors import InputError
from anonml.crypto._geometry import SphinxGeometry
from anonml.crypto._primitives import ct_equal, lioness_decrypt, lioness_encrypt
from anonml.crypto._sphinx import (
    _SURB_REPLY,
    BadPayload,
    NodeAddress,
    PathHop,
    RngBytes,
    SurbReply,
    WrongLength,
    _build_header,
    _draw,
    _open_payload,
    _seal_payload,
)


class InvalidSurb(InputError):
    """Raised by :meth:`Surb.from_bytes`, :meth:`SurbKeys.from_bytes` and
    :func:`package_reply` for bytes or objects that are not a reply block of
    the geometry."""


@dataclass(frozen=True)
class Surb:
    """A reply block: send a reply packet to ``first_node_id`` at ``first_address``."""

    first_node_id: bytes
    first_address: NodeAddress
    header: bytes
    reply_key: bytes

    def to_bytes(self) -> bytes:
        """node id || address || header || reply key: ``geometry.surb_size`` bytes."""
        return self.first_node_id + self.first_address.to_bytes() + self.header + self.reply_key

    @classmethod
    def from_bytes(cls, geometry: SphinxGeometry, data: bytes) -> Surb:
        """Parse :meth:`to_bytes`; raises :class:`InvalidSurb` for anything else."""
        if not isinstance(data, bytes) or len(data) != geometry.surb_size:
            raise InvalidSurb(f"a SURB is {geometry.surb_size!r} bytes, got {len(data) if isinstance(data, bytes) else data!r}")
        address_start = geometry.node_id_size
        header_start = address_start + geometry.address_size
        key_start = header_start + geometry.header_size
        try:
            address = NodeAddress.from_bytes(data[address_start:header_start])
        except ValueError as exc:
            raise InvalidSurb(f"bad first-hop address in SURB: {data[address_start:header_start].hex()!r}") from exc
        return cls(data[:address_start], address, data[header_start:key_start], data[key_start:])


@dataclass(frozen=True)
class SurbKeys:
    """What the SURB's creator keeps to open the reply: never leaves it."""

    surb_id: bytes
    reply_key: bytes
    hop_payload_keys: tuple[bytes, ...]

    def to_bytes(self) -> bytes:
        """surb id || reply key || hop count (1 byte) || hop payload keys."""
        return self.surb_id + self.reply_key + bytes((len(self.hop_payload_keys),)) + b"".join(self.hop_payload_keys)

    @classmethod
    def from_bytes(cls, geometry: SphinxGeometry, data: bytes) -> SurbKeys:
        """Parse :meth:`to_bytes`; raises :class:`InvalidSurb` for anything else."""
        key_size = geometry.payload_key_size
        count_at = geometry.node_id_size + key_size
        if not isinstance(data, bytes) or len(data) <= count_at:
            raise InvalidSurb(f"SURB keys too short: {data!r}")
        count = data[count_at]
        if not 1 <= count <= geometry.max_hops or len(data) != count_at + 1 + count * key_size:
            raise InvalidSurb(f"SURB keys of {len(data)!r} bytes claim {count!r} hops")
        keys_start = count_at + 1
        hop_keys = tuple(data[keys_start + i * key_size : keys_start + (i + 1) * key_size] for i in range(count))
        return cls(data[: geometry.node_id_size], data[geometry.node_id_size : count_at], hop_keys)


def create_surb(
    geometry: SphinxGeometry,
    path: Sequence[PathHop],
    *,
    rng_bytes: RngBytes = os.urandom,
) -> tuple[Surb, SurbKeys]:
    """A reply block for ``path`` (its last hop is the receiver) and its keys."""
    surb_id = _draw(rng_bytes, geometry.node_id_size)
    header, hop_keys = _build_header(geometry, path, _SURB_REPLY, surb_id, rng_bytes)
    reply_key = _draw(rng_bytes, geometry.payload_key_size)
    surb = Surb(path[0].node_id, path[0].address, header, reply_key)
    return surb, SurbKeys(surb_id, reply_key, tuple(keys.payload for keys in hop_keys))


def package_reply(geometry: SphinxGeometry, surb: Surb, message: bytes) -> tuple[tuple[bytes, NodeAddress], bytes]:
    """The reply packet for ``message`` and the first hop to send it to."""
    if len(surb.header) != geometry.header_size or len(surb.reply_key) != geometry.payload_key_size:
        raise InvalidSurb(f"SURB does not match the geometry (header {len(surb.header)!r} bytes)")
    payload = lioness_encrypt(surb.reply_key, _seal_payload(geometry, message))
    return (surb.first_node_id, surb.first_address), surb.header + payload


def open_reply(geometry: SphinxGeometry, keys: SurbKeys, reply: SurbReply | bytes) -> bytes:
    """The message inside a reply that :func:`crypto.process_packet` returned.

    ``reply`` is the :class:`SurbReply` (its ``surb_id`` must be ``keys``'s) or
    its ``payload``. Raises :class:`BadPayload` if the reply was modified, is
    for another SURB, or was not made with this SURB.
    """
    if isinstance(reply, SurbReply):
        if not ct_equal(reply.surb_id, keys.surb_id):
            raise BadPayload(f"reply is for SURB {reply.surb_id.hex()!r}, not {keys.surb_id.hex()!r}")
        payload = reply.payload
    else:
        payload = reply
    if not isinstance(payload, bytes) or len(payload) != geometry.payload_size:
        raise WrongLength(f"reply payload must be {geometry.payload_size!r} bytes")
    # Every hop decrypted in path order; re-encrypt in reverse order to undo them.
    for hop_key in reversed(keys.hop_payload_keys):
        payload = lioness_encrypt(hop_key, payload)
    return _open_payload(geometry, lioness_decrypt(keys.reply_key, payload))
