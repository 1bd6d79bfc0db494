"""Generate the pinned Sphinx known-answer vectors in this folder.

Run from the repository root (it rewrites the JSON files beside it):

    .venv/bin/python tests/vectors/gen_sphinx_vectors.py

Every random byte comes from :class:`DeterministicRng`, so re-running this
script on an unchanged implementation rewrites identical files; a change to
the packet format shows up as a diff and as failures of
tests/test_sphinx_vectors.py (Katzenpost keeps its Sphinx vectors the same
way, testdata/sphinx_vectors.json).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from anonml.crypto import (  # noqa: E402  (the path set-up above must run first)
    FinalMessage,
    ForwardPacket,
    NodeAddress,
    PathHop,
    ReleaseWindow,
    SphinxGeometry,
    SurbReply,
    build_packet,
    create_surb,
    generate_keypair,
    never_replayed,
    node_id_of,
    package_reply,
    process_packet,
)
from anonml.crypto._primitives import hkdf_sha256, lioness_encrypt  # noqa: E402

VECTORS_DIR = Path(__file__).resolve().parent
PACKETS_FILE = VECTORS_DIR / "sphinx_packets.json"
PRIMITIVES_FILE = VECTORS_DIR / "sphinx_primitives.json"
_HOSTS = ("127.0.0.1", "::1", "10.1.2.3", "2001:db8::7", "192.0.2.55")


class DeterministicRng:
    """A reproducible ``rng_bytes``: SHAKE-256(label || call counter).

    For known-answer vectors only; never for real packets.
    """

    def __init__(self, label: bytes) -> None:
        self._label = label
        self._calls = 0

    def __call__(self, size: int) -> bytes:
        self._calls += 1
        return hashlib.shake_256(self._label + self._calls.to_bytes(8, "big")).digest(size)


def _hops(label: bytes, count: int) -> tuple[list[bytes], list[PathHop]]:
    rng = DeterministicRng(label)
    private_keys: list[bytes] = []
    hops: list[PathHop] = []
    for index in range(count):
        private, public = generate_keypair(rng_bytes=rng)
        private_keys.append(private)
        window = ReleaseWindow(1_800_000_000 + 600 * index, 1_800_000_300 + 600 * index)
        hops.append(PathHop(node_id_of(public), NodeAddress(_HOSTS[index], 7000 + index), public, window))
    return private_keys, hops


def _hop_json(private_key: bytes, hop: PathHop) -> dict[str, Any]:
    return {
        "private_key": private_key.hex(),
        "public_key": hop.public_key.hex(),
        "node_id": hop.node_id.hex(),
        "host": hop.address.host,
        "port": hop.address.port,
        "window": [hop.window.start, hop.window.end],
    }


def _trace(geometry: SphinxGeometry, private_keys: list[bytes], packet: bytes) -> list[dict[str, Any]]:
    """What every hop outputs when it processes ``packet`` in turn."""
    outputs: list[dict[str, Any]] = []
    for private_key in private_keys:
        result = process_packet(geometry, private_key, packet, is_replay=never_replayed)
        if isinstance(result, ForwardPacket):
            outputs.append(
                {
                    "kind": "forward",
                    "replay_tag": result.replay_tag.hex(),
                    "next_node_id": result.next_node_id.hex(),
                    "next_host": result.next_address.host,
                    "next_port": result.next_address.port,
                    "window": [result.window.start, result.window.end],
                    "packet": result.packet.hex(),
                }
            )
            packet = result.packet
        elif isinstance(result, FinalMessage):
            outputs.append(
                {
                    "kind": "final",
                    "replay_tag": result.replay_tag.hex(),
                    "window": [result.window.start, result.window.end],
                    "message": result.message.hex(),
                }
            )
        else:
            assert isinstance(result, SurbReply)
            outputs.append(
                {
                    "kind": "surb_reply",
                    "replay_tag": result.replay_tag.hex(),
                    "surb_id": result.surb_id.hex(),
                    "window": [result.window.start, result.window.end],
                    "payload": result.payload.hex(),
                }
            )
    return outputs


def forward_case(name: str, geometry: SphinxGeometry, hop_count: int, message: bytes) -> dict[str, Any]:
    private_keys, hops = _hops(b"anonml/vectors/keys/" + name.encode(), hop_count)
    packet_seed = b"anonml/vectors/packet/" + name.encode()
    packet = build_packet(geometry, hops, message, rng_bytes=DeterministicRng(packet_seed))
    return {
        "name": name,
        "geometry": geometry.to_dict(),
        "geometry_hash": geometry.canonical_hash().hex(),
        "hops": [_hop_json(private, hop) for private, hop in zip(private_keys, hops)],
        "message": message.hex(),
        "packet_seed": packet_seed.hex(),
        "packet": packet.hex(),
        "outputs": _trace(geometry, private_keys, packet),
    }


def surb_case(name: str, geometry: SphinxGeometry, hop_count: int, message: bytes) -> dict[str, Any]:
    private_keys, hops = _hops(b"anonml/vectors/keys/" + name.encode(), hop_count)
    surb_seed = b"anonml/vectors/surb/" + name.encode()
    surb, keys = create_surb(geometry, hops, rng_bytes=DeterministicRng(surb_seed))
    _, packet = package_reply(geometry, surb, message)
    return {
        "name": name,
        "geometry": geometry.to_dict(),
        "hops": [_hop_json(private, hop) for private, hop in zip(private_keys, hops)],
        "message": message.hex(),
        "surb_seed": surb_seed.hex(),
        "surb": surb.to_bytes().hex(),
        "surb_keys": keys.to_bytes().hex(),
        "packet": packet.hex(),
        "outputs": _trace(geometry, private_keys, packet),
    }


def primitive_cases() -> dict[str, Any]:
    rng = DeterministicRng(b"anonml/vectors/primitives")
    lioness_key, lioness_block = rng(128), rng(200)
    ikm, salt = rng(32), rng(32)
    return {
        "lioness": [
            {
                "key": lioness_key.hex(),
                "plaintext": lioness_block.hex(),
                "ciphertext": lioness_encrypt(lioness_key, lioness_block).hex(),
            }
        ],
        "hkdf_sha256": [
            {
                "ikm": ikm.hex(),
                "salt": salt.hex(),
                "info": b"anonml/sphinx/v1/hop-keys".hex(),
                "length": 256,
                "okm": hkdf_sha256(ikm, salt=salt, info=b"anonml/sphinx/v1/hop-keys", length=256).hex(),
            }
        ],
    }


def main() -> None:
    default = SphinxGeometry.create()
    small = SphinxGeometry.create(max_hops=3, packet_size=1200)
    packets = {
        "forward": [
            forward_case("relays3-aggregator", default, 4, b"anonml sphinx known-answer message"),
            forward_case("aggregator-only", default, 1, b""),
            forward_case("full-path-max-message", default, default.max_hops, bytes(range(256)) * 6 + b"x" * 15),
            forward_case("small-geometry", small, 3, b"small"),
        ],
        "surb": [surb_case("ack-3hop", default, 3, b"ack: accepted")],
    }
    PACKETS_FILE.write_text(json.dumps(packets, indent=1, sort_keys=True) + "\n")
    PRIMITIVES_FILE.write_text(json.dumps(primitive_cases(), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
