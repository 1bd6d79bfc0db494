"""Known-answer tests: rebuild the pinned vectors byte for byte.

The vectors were written by tests/vectors/gen_sphinx_vectors.py with a
deterministic ``rng_bytes``; here the library rebuilds every packet and SURB
from the pinned keys and seeds, and every hop's output is compared.
"""

from __future__ import annotations

from typing import Any

import pytest
from vector_support import load_generator, load_vectors

from anonml.crypto import (
    FinalMessage,
    ForwardPacket,
    NodeAddress,
    PathHop,
    ReleaseWindow,
    SphinxGeometry,
    Surb,
    SurbKeys,
    SurbReply,
    build_packet,
    create_surb,
    never_replayed,
    node_id_of,
    open_reply,
    package_reply,
    process_packet,
    public_key_of,
)
from anonml.crypto._primitives import hkdf_sha256, lioness_decrypt, lioness_encrypt

# The deterministic rng lives once, in the generator script; import it from there.
DeterministicRng = load_generator("gen_sphinx_vectors").DeterministicRng
PACKETS = load_vectors("sphinx_packets.json")
PRIMITIVES = load_vectors("sphinx_primitives.json")


def _path(case: dict[str, Any]) -> tuple[list[bytes], list[PathHop]]:
    private_keys, hops = [], []
    for hop in case["hops"]:
        private = bytes.fromhex(hop["private_key"])
        public = bytes.fromhex(hop["public_key"])
        assert public_key_of(private) == public
        assert node_id_of(public).hex() == hop["node_id"]
        private_keys.append(private)
        hops.append(
            PathHop(bytes.fromhex(hop["node_id"]), NodeAddress(hop["host"], hop["port"]), public, ReleaseWindow(*hop["window"]))
        )
    return private_keys, hops


def _check_trace(geometry: SphinxGeometry, private_keys: list[bytes], packet: bytes, outputs: list[dict[str, Any]]) -> object:
    result: object = None
    for private_key, expected in zip(private_keys, outputs, strict=True):
        result = process_packet(geometry, private_key, packet, is_replay=never_replayed)
        assert result.replay_tag.hex() == expected["replay_tag"]  # type: ignore[attr-defined]
        assert [result.window.start, result.window.end] == expected["window"]  # type: ignore[attr-defined]
        if expected["kind"] == "forward":
            assert isinstance(result, ForwardPacket)
            assert result.next_node_id.hex() == expected["next_node_id"]
            assert result.next_address == NodeAddress(expected["next_host"], expected["next_port"])
            assert result.packet.hex() == expected["packet"]
            packet = result.packet
        elif expected["kind"] == "final":
            assert isinstance(result, FinalMessage)
            assert result.message.hex() == expected["message"]
        else:
            assert isinstance(result, SurbReply)
            assert result.surb_id.hex() == expected["surb_id"]
            assert result.payload.hex() == expected["payload"]
    return result


@pytest.mark.parametrize("case", PACKETS["forward"], ids=lambda case: case["name"])
def test_forward_vector_rebuilds_and_processes_byte_for_byte(case: dict[str, Any]) -> None:
    geometry = SphinxGeometry.from_dict(case["geometry"])
    assert geometry.canonical_hash().hex() == case["geometry_hash"]
    private_keys, hops = _path(case)
    message = bytes.fromhex(case["message"])
    packet = build_packet(geometry, hops, message, rng_bytes=DeterministicRng(bytes.fromhex(case["packet_seed"])))
    assert packet.hex() == case["packet"]
    final = _check_trace(geometry, private_keys, packet, case["outputs"])
    assert isinstance(final, FinalMessage) and final.message == message


@pytest.mark.parametrize("case", PACKETS["surb"], ids=lambda case: case["name"])
def test_surb_vector_rebuilds_and_opens(case: dict[str, Any]) -> None:
    geometry = SphinxGeometry.from_dict(case["geometry"])
    private_keys, hops = _path(case)
    surb, keys = create_surb(geometry, hops, rng_bytes=DeterministicRng(bytes.fromhex(case["surb_seed"])))
    assert surb.to_bytes().hex() == case["surb"]
    assert keys.to_bytes().hex() == case["surb_keys"]
    parsed = Surb.from_bytes(geometry, bytes.fromhex(case["surb"]))
    (first_id, first_address), packet = package_reply(geometry, parsed, bytes.fromhex(case["message"]))
    assert (first_id, first_address) == (hops[0].node_id, hops[0].address)
    assert packet.hex() == case["packet"]
    reply = _check_trace(geometry, private_keys, packet, case["outputs"])
    assert isinstance(reply, SurbReply)
    stored_keys = SurbKeys.from_bytes(geometry, bytes.fromhex(case["surb_keys"]))
    assert open_reply(geometry, stored_keys, reply).hex() == case["message"]


def test_lioness_vector() -> None:
    for case in PRIMITIVES["lioness"]:
        key, plaintext = bytes.fromhex(case["key"]), bytes.fromhex(case["plaintext"])
        assert lioness_encrypt(key, plaintext).hex() == case["ciphertext"]
        assert lioness_decrypt(key, bytes.fromhex(case["ciphertext"])) == plaintext


def test_hop_key_derivation_vector() -> None:
    for case in PRIMITIVES["hkdf_sha256"]:
        okm = hkdf_sha256(
            bytes.fromhex(case["ikm"]), salt=bytes.fromhex(case["salt"]), info=bytes.fromhex(case["info"]), length=case["length"]
        )
        assert okm.hex() == case["okm"]


def test_generator_is_deterministic() -> None:
    generator = load_generator("gen_sphinx_vectors")
    rebuilt = generator.forward_case(
        "relays3-aggregator", SphinxGeometry.create(), 4, b"anonml sphinx known-answer message"
    )
    assert rebuilt == PACKETS["forward"][0]
