"""Fuzz: over 100,000 malformed packets, ``process_packet`` raises only InvalidPacket.

Inputs: empty and non-bytes values, truncations, oversized packets, random
bytes of random and of exact length, small-order group elements, random bit
flips of valid packets at every hop, replays, and *authentic* packets (MAC
valid, forged with the hop's public key) whose routing slot is garbage, which
reach the parser behind the MAC. Most inputs stop at the length or MAC check,
so the whole run takes seconds.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from sphinx_support import keyed_path

from anonml.crypto import (
    InvalidPacket,
    NodeAddress,
    ReleaseWindow,
    SphinxGeometry,
    build_packet,
    never_replayed,
    process_packet,
)
from anonml.crypto._primitives import (
    chacha20_keystream,
    hmac_sha256,
    x25519,
    x25519_base,
    xor_bytes,
)
from anonml.crypto._sphinx import _derive_hop_keys

GEOMETRY = SphinxGeometry.create()
SMALL_ORDER_ELEMENTS = [
    bytes(32),
    (1).to_bytes(32, "little"),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    (2**255 - 19 - 1).to_bytes(32, "little"),  # u = p - 1, a small-order element
]


class Fuzzer:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        keypairs, path = keyed_path(
            4, lambda index: NodeAddress("127.0.0.1", 9000 + index), lambda index: ReleaseWindow(0, 10),
            rng_bytes=self.rng.randbytes,
        )
        self.private_keys = [private for private, _ in keypairs]
        self.public_keys = [public for _, public in keypairs]
        # Valid packets as each hop receives them: (hop index, packet).
        self.valid: list[tuple[int, bytes]] = []
        for _ in range(3):
            packet = build_packet(GEOMETRY, path, self.rng.randbytes(100), rng_bytes=self.rng.randbytes)
            for hop in range(4):
                self.valid.append((hop, packet))
                result = process_packet(GEOMETRY, self.private_keys[hop], packet, is_replay=never_replayed)
                packet = getattr(result, "packet", b"")
        self.outcomes: Counter[str] = Counter()
        self.count = 0

    def feed(self, hop: int, packet: object, is_replay: Callable[[bytes], bool] = never_replayed) -> None:
        self.count += 1
        try:
            process_packet(GEOMETRY, self.private_keys[hop], packet, is_replay=is_replay)  # type: ignore[arg-type]
        except InvalidPacket as exc:
            self.outcomes[exc.reason] += 1
        except Exception as exc:  # noqa: BLE001 - the point of the test
            raise AssertionError(f"process_packet raised {exc!r} for {packet!r}") from exc
        else:
            self.outcomes["accepted"] += 1

    def any_valid(self) -> tuple[int, bytes]:
        return self.valid[self.rng.randrange(len(self.valid))]

    def forged(self, hop: int) -> bytes:
        """An authentic packet for ``hop`` whose routing slot is random garbage."""
        rng = self.rng
        secret = rng.randbytes(32)
        alpha = x25519_base(secret)
        keys = _derive_hop_keys(GEOMETRY, x25519(secret, self.public_keys[hop]))
        command = rng.choice([0, 1, 1, 2, 2, 3, 3, rng.randrange(256)])
        node_id = rng.choice([bytes(GEOMETRY.node_id_size), rng.randbytes(GEOMETRY.node_id_size)])
        address = rng.choice(
            [bytes(GEOMETRY.address_size), rng.randbytes(GEOMETRY.address_size), rng.randbytes(16) + b"\x00\x00"]
        )
        window = rng.randbytes(GEOMETRY.window_size)
        next_mac = rng.choice([bytes(GEOMETRY.mac_size), rng.randbytes(GEOMETRY.mac_size)])
        slot = bytes((command,)) + node_id + address + window + next_mac
        plain = slot + rng.randbytes(GEOMETRY.routing_size - len(slot))
        beta = xor_bytes(plain, chacha20_keystream(keys.header_stream, GEOMETRY.routing_size))
        gamma = hmac_sha256(keys.header_mac, alpha + beta)
        return alpha + beta + gamma + rng.randbytes(GEOMETRY.payload_size)


@pytest.mark.slow
def test_process_packet_raises_only_invalid_packet_over_100k_inputs() -> None:
    fuzz = Fuzzer(seed=4)
    rng = fuzz.rng
    size = GEOMETRY.packet_size

    for value in (b"", bytearray(), None, "x" * size, size, [0] * size, object()):
        fuzz.feed(0, value)
    for _ in range(25_000):  # truncated
        hop, packet = fuzz.any_valid()
        fuzz.feed(hop, packet[: rng.randrange(size)])
    for _ in range(25_000):  # oversized
        hop, packet = fuzz.any_valid()
        fuzz.feed(hop, packet + rng.randbytes(rng.randrange(1, 64)))
    for _ in range(15_000):  # random bytes, random length
        fuzz.feed(rng.randrange(4), rng.randbytes(rng.randrange(3 * size)))
    for _ in range(10_000):  # random bytes, exact length
        fuzz.feed(rng.randrange(4), rng.randbytes(size))
    for element in SMALL_ORDER_ELEMENTS:
        hop, packet = fuzz.any_valid()
        fuzz.feed(hop, element + packet[len(element) :])
    for _ in range(20_000):  # random bit flips anywhere in a valid packet
        hop, packet = fuzz.any_valid()
        flipped = bytearray(packet)
        for _ in range(rng.randrange(1, 17)):
            bit = rng.randrange(8 * size)
            flipped[bit // 8] ^= 1 << (bit % 8)
        fuzz.feed(hop, bytes(flipped))
    seen: set[bytes] = set()

    def is_replay(tag: bytes) -> bool:
        replayed = tag in seen
        seen.add(tag)
        return replayed

    for _ in range(500):  # replays
        hop, packet = fuzz.any_valid()
        fuzz.feed(hop, packet, is_replay)
    for _ in range(5_000):  # authentic packets with garbage routing information
        hop = rng.randrange(4)
        fuzz.feed(hop, fuzz.forged(hop))

    assert fuzz.count >= 100_000
    expected = {"wrong_length", "bad_mac", "bad_group_element", "replay", "bad_routing_info", "bad_payload"}
    assert expected <= set(fuzz.outcomes), fuzz.outcomes
    # Only packets that passed the MAC can be accepted: a handful, not the fuzz.
    assert fuzz.outcomes["accepted"] < 20_000 + 500 + 5_000
