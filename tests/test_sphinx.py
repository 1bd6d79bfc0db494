"""Sphinx packets: geometry, hops, and the properties DESIGN.md §5 promises."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sphinx_support import keyed_path

from anonml.cli import main
from anonml.crypto import (
    BadGroupElement,
    BadMac,
    BadPayload,
    FinalMessage,
    ForwardPacket,
    InvalidGeometry,
    InvalidKey,
    InvalidPacket,
    InvalidRoute,
    NodeAddress,
    PathHop,
    ReleaseWindow,
    ReplayedPacket,
    SphinxGeometry,
    WrongLength,
    build_packet,
    generate_keypair,
    never_replayed,
    node_id_of,
    process_packet,
    public_key_of,
)
from anonml.crypto._primitives import chacha20_xor, x25519
from anonml.crypto._sphinx import _derive_hop_keys, _path_secrets

GEOMETRY = SphinxGeometry.create()
KEYS, PATH = keyed_path(
    GEOMETRY.max_hops,
    lambda index: NodeAddress(f"127.0.0.{index + 1}", 7000 + index),
    lambda index: ReleaseWindow(100 * index, 100 * index + 60),
)


def replay_cache() -> Callable[[bytes], bool]:
    """What a relay passes as ``is_replay``: record the tag, report a repeat."""
    seen: set[bytes] = set()

    def is_replay(tag: bytes) -> bool:
        if tag in seen:
            return True
        seen.add(tag)
        return False

    return is_replay


def route(packet: bytes, hop_count: int) -> list[bytes]:
    """The packet as each hop of PATH[:hop_count] receives it, in order."""
    seen = [packet]
    for index in range(hop_count - 1):
        result = process_packet(GEOMETRY, KEYS[index][0], seen[-1], is_replay=never_replayed)
        assert isinstance(result, ForwardPacket)
        seen.append(result.packet)
    return seen


# A 3-relay route: relays at hops 0..2, the aggregator at hop 3.
FOUR_HOP_PACKETS = route(build_packet(GEOMETRY, PATH[:4], b"message for the aggregator"), 4)


def flip(data: bytes, bit: int) -> bytes:
    flipped = bytearray(data)
    flipped[bit // 8] ^= 1 << (bit % 8)
    return bytes(flipped)


# --- geometry -------------------------------------------------------------------


def test_default_geometry_sizes_add_up() -> None:
    g = GEOMETRY
    assert (g.max_hops, g.packet_size) == (5, 2048)
    assert g.routing_info_size == 1 + 16 + 18 + 16 + 32
    assert g.header_size == 32 + 5 * g.routing_info_size + 32
    assert g.header_size + g.payload_size == g.packet_size
    assert g.message_size == g.payload_size - 16 - 2
    assert g.surb_size <= g.message_size  # a SURB fits inside a message


def test_geometry_dict_round_trip_and_hash() -> None:
    encoded = json.loads(json.dumps(GEOMETRY.to_dict()))
    assert SphinxGeometry.from_dict(encoded) == GEOMETRY
    assert SphinxGeometry.from_dict(encoded).canonical_hash() == GEOMETRY.canonical_hash()
    others = {SphinxGeometry.create(4).canonical_hash(), SphinxGeometry.create(5, 2049).canonical_hash()}
    assert GEOMETRY.canonical_hash() not in others and len(others) == 2


@pytest.mark.parametrize(
    ("max_hops", "packet_size"),
    [(0, 2048), (33, 8192), (5, 600), (5, 0), (5, 70000), (True, 2048), (5, 2048.0)],
)
def test_geometry_rejects_impossible_parameters(max_hops: object, packet_size: object) -> None:
    with pytest.raises(InvalidGeometry, match=repr(max_hops) if max_hops in (0, 33) else None):
        SphinxGeometry.create(max_hops, packet_size)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d.update(mac_size=16),
        lambda d: d.update(suite="other"),
        lambda d: d.pop("max_hops"),
        lambda d: d.update(extra=1),
    ],
)
def test_geometry_from_dict_rejects_tampered_fields(tamper: Callable[[dict[str, object]], object]) -> None:
    data = GEOMETRY.to_dict()
    tamper(data)
    with pytest.raises(InvalidGeometry):
        SphinxGeometry.from_dict(data)
    with pytest.raises(InvalidGeometry):
        SphinxGeometry.from_dict([1, 2])


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(GEOMETRY.to_dict())),
        st.one_of(st.integers(-5, 5000), st.text(max_size=3), st.none(), st.booleans(), st.floats()),
    )
)
def test_geometry_from_dict_raises_only_invalid_geometry(overrides: dict[str, object]) -> None:
    data = {**GEOMETRY.to_dict(), **overrides}
    try:
        parsed = SphinxGeometry.from_dict(data)
    except InvalidGeometry:
        return
    assert parsed.to_dict() == data


def test_packet_for_another_geometry_of_same_size_fails_the_mac() -> None:
    other = SphinxGeometry.create(max_hops=4)
    packet = build_packet(other, PATH[:2], b"hello")
    with pytest.raises(BadMac):
        process_packet(GEOMETRY, KEYS[0][0], packet, is_replay=never_replayed)


# --- hops and keys ---------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "2001:db8::1", "::ffff:10.0.0.1"])
def test_address_round_trip(host: str) -> None:
    address = NodeAddress(host, 443)
    encoded = address.to_bytes()
    assert len(encoded) == GEOMETRY.address_size
    assert NodeAddress.from_bytes(encoded) == address


def test_ipv4_mapped_host_is_normalised() -> None:
    assert NodeAddress("::ffff:10.0.0.1", 1).host == "10.0.0.1"


@pytest.mark.parametrize(("host", "port"), [("localhost", 1), ("1.2.3.4", 0), ("1.2.3.4", 65536), ("1.2.3.4", "80")])
def test_address_rejects_names_and_bad_ports(host: str, port: object) -> None:
    with pytest.raises(InvalidRoute):
        NodeAddress(host, port)  # type: ignore[arg-type]


def test_window_validation() -> None:
    with pytest.raises(InvalidRoute, match="start after end"):
        ReleaseWindow(10, 9)
    with pytest.raises(InvalidRoute, match="-1"):
        ReleaseWindow(-1, 9)
    assert ReleaseWindow(5, 5).end == 5


def test_key_helpers() -> None:
    private, public = generate_keypair()
    assert public_key_of(private) == public and len(public) == 32
    assert len(node_id_of(public)) == GEOMETRY.node_id_size
    assert node_id_of(public) != node_id_of(generate_keypair()[1])
    with pytest.raises(InvalidKey):
        public_key_of(bytes(31))
    with pytest.raises(InvalidKey):
        node_id_of(bytes(33))
    with pytest.raises(InvalidKey):
        process_packet(GEOMETRY, bytes(16), bytes(GEOMETRY.packet_size), is_replay=never_replayed)


def test_build_rejects_bad_paths_and_messages() -> None:
    with pytest.raises(InvalidRoute, match="1..5 hops"):
        build_packet(GEOMETRY, [], b"")
    with pytest.raises(InvalidRoute, match="1..5 hops"):
        build_packet(GEOMETRY, PATH + PATH[:1], b"")
    with pytest.raises(InvalidRoute, match=str(GEOMETRY.message_size + 1)):
        build_packet(GEOMETRY, PATH[:2], bytes(GEOMETRY.message_size + 1))
    small_order = PathHop(bytes(16), NodeAddress("127.0.0.1", 1), bytes(32), ReleaseWindow(0, 1))
    with pytest.raises(InvalidRoute, match="small-order"):
        build_packet(GEOMETRY, [PATH[0], small_order], b"")


# --- processing ------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(hop_count=st.integers(1, GEOMETRY.max_hops), message=st.binary(max_size=GEOMETRY.message_size))
def test_every_path_length_delivers_every_message(hop_count: int, message: bytes) -> None:
    packet = build_packet(GEOMETRY, PATH[:hop_count], message)
    for index in range(hop_count):
        assert len(packet) == GEOMETRY.packet_size
        result = process_packet(GEOMETRY, KEYS[index][0], packet, is_replay=never_replayed)
        assert result.window == PATH[index].window
        if index < hop_count - 1:
            assert isinstance(result, ForwardPacket)
            assert result.next_node_id == PATH[index + 1].node_id
            assert result.next_address == PATH[index + 1].address
            packet = result.packet
        else:
            assert isinstance(result, FinalMessage)
            assert result.message == message


def test_largest_message_round_trips() -> None:
    message = os.urandom(GEOMETRY.message_size)
    packet = route(build_packet(GEOMETRY, PATH, message), GEOMETRY.max_hops)[-1]
    result = process_packet(GEOMETRY, KEYS[-1][0], packet, is_replay=never_replayed)
    assert isinstance(result, FinalMessage) and result.message == message


@settings(max_examples=40, deadline=None)
@given(hop_count=st.integers(1, GEOMETRY.max_hops), size=st.integers(0, GEOMETRY.message_size))
def test_all_packets_of_a_geometry_have_one_length(hop_count: int, size: int) -> None:
    packets = route(build_packet(GEOMETRY, PATH[:hop_count], bytes(size)), hop_count)
    assert {len(packet) for packet in packets} == {GEOMETRY.packet_size}


def test_client_and_hop_shared_secrets_agree_over_five_hops() -> None:
    secret = os.urandom(32)
    draws = iter([secret])

    def rng_bytes(size: int) -> bytes:
        return next(draws, None) or os.urandom(size)

    packets = route(build_packet(GEOMETRY, PATH, b"x", rng_bytes=rng_bytes), GEOMETRY.max_hops)
    client_view = _path_secrets(GEOMETRY, [hop.public_key for hop in PATH], secret)
    alphas = [packet[: GEOMETRY.group_element_size] for packet in packets]
    assert len(set(alphas)) == GEOMETRY.max_hops  # blinded anew at every hop
    for (private, _), alpha, client in zip(KEYS, alphas, client_view, strict=True):
        assert client.alpha == alpha
        assert x25519(private, alpha) == client.shared_secret


def test_unused_routing_slots_hold_random_bytes_not_zeros() -> None:
    draws: list[bytes] = []

    def rng_bytes(size: int) -> bytes:
        draws.append(os.urandom(size))
        return draws[-1]

    packet = route(build_packet(GEOMETRY, PATH[:2], b"x", rng_bytes=rng_bytes), 2)[-1]
    # Decrypt the last hop's routing information by hand.
    alpha = packet[: GEOMETRY.group_element_size]
    keys = _derive_hop_keys(GEOMETRY, x25519(KEYS[1][0], alpha))
    beta = packet[GEOMETRY.group_element_size : GEOMETRY.group_element_size + GEOMETRY.routing_size]
    plain = chacha20_xor(keys.header_stream, beta)
    slot = GEOMETRY.routing_info_size
    unused = plain[slot : slot + (GEOMETRY.max_hops - 2) * slot]
    assert unused == draws[1]  # the padding draw (the first draw is the packet secret)
    assert unused != bytes(len(unused))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hop=st.integers(0, 3), bit=st.integers(0, 8 * GEOMETRY.header_size - 1))
def test_any_header_bit_flip_is_rejected_by_the_mac(hop: int, bit: int) -> None:
    packet = FOUR_HOP_PACKETS[hop]
    calls: list[bytes] = []
    with pytest.raises(BadMac):  # BadGroupElement is a BadMac
        process_packet(GEOMETRY, KEYS[hop][0], flip(packet, bit), is_replay=lambda tag: bool(calls.append(tag)))
    assert calls == []  # the replay cache is not touched before the MAC verifies


@settings(max_examples=150, deadline=None)
@given(hop=st.integers(0, 3), bit=st.integers(8 * GEOMETRY.header_size, 8 * GEOMETRY.packet_size - 1))
def test_any_payload_bit_flip_garbles_the_message(hop: int, bit: int) -> None:
    packet = flip(FOUR_HOP_PACKETS[hop], bit)
    for index in range(hop, 3):
        result = process_packet(GEOMETRY, KEYS[index][0], packet, is_replay=never_replayed)
        assert isinstance(result, ForwardPacket)  # relays cannot see the change...
        packet = result.packet
    with pytest.raises(BadPayload):  # ...the final hop's zero tag does
        process_packet(GEOMETRY, KEYS[3][0], packet, is_replay=never_replayed)


def _eight_byte_runs(data: bytes) -> set[bytes]:
    return {data[offset : offset + 8] for offset in range(len(data) - 7)}


@settings(max_examples=20, deadline=None)
@given(hop_count=st.integers(2, GEOMETRY.max_hops), message=st.binary(max_size=64))
def test_consecutive_hops_share_no_run_of_eight_bytes(hop_count: int, message: bytes) -> None:
    packets = route(build_packet(GEOMETRY, PATH[:hop_count], message), hop_count)
    for before, after in zip(packets, packets[1:]):
        assert not _eight_byte_runs(before) & _eight_byte_runs(after)


def test_replay_is_detected_through_is_replay() -> None:
    is_replay = replay_cache()
    packet = build_packet(GEOMETRY, PATH[:3], b"once")
    first = process_packet(GEOMETRY, KEYS[0][0], packet, is_replay=is_replay)
    assert isinstance(first, ForwardPacket)
    with pytest.raises(ReplayedPacket) as caught:
        process_packet(GEOMETRY, KEYS[0][0], packet, is_replay=is_replay)
    assert caught.value.reason == "replay" and isinstance(caught.value, InvalidPacket)
    # The same content over the same hop in a fresh packet is not a replay.
    assert isinstance(process_packet(GEOMETRY, KEYS[0][0], build_packet(GEOMETRY, PATH[:3], b"once"), is_replay=is_replay), ForwardPacket)


def test_replay_tags_differ_per_hop_and_per_packet() -> None:
    tags = []
    for _ in range(3):
        packet = build_packet(GEOMETRY, PATH[:3], b"m")
        for index in range(3):
            result = process_packet(GEOMETRY, KEYS[index][0], packet, is_replay=never_replayed)
            tags.append(result.replay_tag)
            if isinstance(result, ForwardPacket):
                packet = result.packet
    assert len(set(tags)) == len(tags)


def test_wrong_lengths_and_types_are_wrong_length() -> None:
    packet = FOUR_HOP_PACKETS[0]
    for bad in (b"", packet[:-1], packet + b"\x00", "text", None, 3):
        with pytest.raises(WrongLength) as caught:
            process_packet(GEOMETRY, KEYS[0][0], bad, is_replay=never_replayed)  # type: ignore[arg-type]
        assert caught.value.reason == "wrong_length"
    assert isinstance(process_packet(GEOMETRY, KEYS[0][0], bytearray(packet), is_replay=never_replayed), ForwardPacket)


def test_small_order_element_is_a_bad_group_element() -> None:
    packet = bytes(GEOMETRY.group_element_size) + FOUR_HOP_PACKETS[0][GEOMETRY.group_element_size :]
    with pytest.raises(BadGroupElement) as caught:
        process_packet(GEOMETRY, KEYS[0][0], packet, is_replay=never_replayed)
    assert caught.value.reason == "bad_group_element"


def test_wrong_key_is_bad_mac() -> None:
    with pytest.raises(BadMac) as caught:
        process_packet(GEOMETRY, KEYS[1][0], FOUR_HOP_PACKETS[0], is_replay=never_replayed)
    assert caught.value.reason == "bad_mac"


def test_bench_crypto_json_reports_figures_and_ratios() -> None:
    result = CliRunner().invoke(main, ["bench", "crypto", "--json", "--repeat", "10"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    figures = report["figures"]
    for name in ("sphinx_build_4hop_us", "sphinx_build_3hop_us", "sphinx_process_hop_us"):
        assert figures[name]["value"] > 0
        assert figures[name]["x_x25519"] == pytest.approx(
            figures[name]["value"] / report["baselines_us"]["x25519_mult_us"], rel=0.02
        )
    assert figures["sphinx_packet_bytes"]["value"] == GEOMETRY.packet_size
    # Token verification alone and per token in a batch of 256, each against one P-256 multiplication.
    for name in ("token_verify_us", "token_verify_batch256_us"):
        assert figures[name]["x_p256"] == pytest.approx(
            figures[name]["value"] / report["baselines_us"]["p256_mult_us"], rel=0.02
        )
    assert figures["token_verify_batch256_us"]["target"] == "<= 4 × P-256"
