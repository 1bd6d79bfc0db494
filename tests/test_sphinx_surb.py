"""Single-use reply blocks: round trips, sizes, tampering and strict parsing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sphinx_support import keyed_path

from anonml.crypto import (
    BadPayload,
    ForwardPacket,
    InvalidSurb,
    NodeAddress,
    ReleaseWindow,
    SphinxGeometry,
    Surb,
    SurbKeys,
    SurbReply,
    WrongLength,
    build_packet,
    create_surb,
    never_replayed,
    open_reply,
    package_reply,
    process_packet,
)

GEOMETRY = SphinxGeometry.create()
# The last hop is the SURB's receiver (a peer that can receive, DESIGN.md §5 (b)).
KEYS, PATH = keyed_path(
    GEOMETRY.max_hops, lambda index: NodeAddress("::1", 8000 + index), lambda index: ReleaseWindow(10 * index, 10 * index + 5)
)


def deliver(packet: bytes, hop_count: int) -> SurbReply:
    for index in range(hop_count):
        result = process_packet(GEOMETRY, KEYS[index][0], packet, is_replay=never_replayed)
        if isinstance(result, ForwardPacket):
            packet = result.packet
    assert isinstance(result, SurbReply)
    return result


@settings(max_examples=20, deadline=None)
@given(hop_count=st.integers(1, GEOMETRY.max_hops), message=st.binary(max_size=GEOMETRY.message_size))
def test_surb_round_trip(hop_count: int, message: bytes) -> None:
    surb, keys = create_surb(GEOMETRY, PATH[:hop_count])
    serialised = surb.to_bytes()
    assert len(serialised) == GEOMETRY.surb_size
    (first_id, first_address), packet = package_reply(GEOMETRY, Surb.from_bytes(GEOMETRY, serialised), message)
    assert (first_id, first_address) == (PATH[0].node_id, PATH[0].address)
    assert len(packet) == GEOMETRY.packet_size
    reply = deliver(packet, hop_count)
    assert reply.surb_id == keys.surb_id and reply.window == PATH[hop_count - 1].window
    stored = SurbKeys.from_bytes(GEOMETRY, keys.to_bytes())
    assert open_reply(GEOMETRY, stored, reply) == message
    assert open_reply(GEOMETRY, stored, reply.payload) == message


def test_surb_travels_inside_a_forward_message() -> None:
    surb, keys = create_surb(GEOMETRY, PATH[:3])
    forward = build_packet(GEOMETRY, PATH[:2], surb.to_bytes())
    hop0 = process_packet(GEOMETRY, KEYS[0][0], forward, is_replay=never_replayed)
    assert isinstance(hop0, ForwardPacket)
    final = process_packet(GEOMETRY, KEYS[1][0], hop0.packet, is_replay=never_replayed)
    carried = Surb.from_bytes(GEOMETRY, final.message)  # type: ignore[union-attr]
    _, reply_packet = package_reply(GEOMETRY, carried, b"ack")
    assert open_reply(GEOMETRY, keys, deliver(reply_packet, 3)) == b"ack"


@settings(max_examples=60, deadline=None)
@given(bit=st.integers(8 * GEOMETRY.header_size, 8 * GEOMETRY.packet_size - 1))
def test_tampered_reply_payload_is_rejected(bit: int) -> None:
    surb, keys = create_surb(GEOMETRY, PATH[:2])
    _, packet = package_reply(GEOMETRY, surb, b"receipt")
    tampered = bytearray(packet)
    tampered[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(BadPayload):
        open_reply(GEOMETRY, keys, deliver(bytes(tampered), 2))


def test_reply_opened_with_other_keys_is_rejected() -> None:
    surb, _ = create_surb(GEOMETRY, PATH[:2])
    _, other_keys = create_surb(GEOMETRY, PATH[:2])
    _, packet = package_reply(GEOMETRY, surb, b"receipt")
    reply = deliver(packet, 2)
    with pytest.raises(BadPayload, match="not"):
        open_reply(GEOMETRY, other_keys, reply)  # surb id mismatch
    with pytest.raises(BadPayload):
        open_reply(GEOMETRY, other_keys, reply.payload)  # keys do not decrypt it
    with pytest.raises(WrongLength):
        open_reply(GEOMETRY, other_keys, reply.payload[:-1])


def test_surb_parsing_is_strict() -> None:
    surb, keys = create_surb(GEOMETRY, PATH[:3])
    data = surb.to_bytes()
    for bad in (b"", data[:-1], data + b"\x00"):
        with pytest.raises(InvalidSurb):
            Surb.from_bytes(GEOMETRY, bad)
    port_zero = bytearray(data)
    port_zero[GEOMETRY.node_id_size + GEOMETRY.address_size - 2 : GEOMETRY.node_id_size + GEOMETRY.address_size] = b"\x00\x00"
    with pytest.raises(InvalidSurb, match="address"):
        Surb.from_bytes(GEOMETRY, bytes(port_zero))
    key_bytes = keys.to_bytes()
    count_at = GEOMETRY.node_id_size + GEOMETRY.payload_key_size
    for bad in (b"", key_bytes[:count_at], key_bytes[:-1], key_bytes[:count_at] + b"\x00", key_bytes[:count_at] + b"\x09" + key_bytes[count_at + 1 :]):
        with pytest.raises(InvalidSurb):
            SurbKeys.from_bytes(GEOMETRY, bad)
    rng = random.Random(20261122)
    for _ in range(2000):
        blob = rng.randbytes(rng.randrange(2 * GEOMETRY.surb_size))
        for parser in (Surb.from_bytes, SurbKeys.from_bytes):
            try:
                parser(GEOMETRY, blob)
            except InvalidSurb:
                pass


def test_package_reply_rejects_surb_of_another_geometry() -> None:
    small = SphinxGeometry.create(max_hops=3, packet_size=1200)
    surb, _ = create_surb(small, PATH[:2])
    with pytest.raises(InvalidSurb):
        package_reply(GEOMETRY, surb, b"x")
