"""The attacker process of ``anonml bench abuse``: each abuse at the scale of the cap it targets.

Run as ``python -m anonml.bench._abuse_attacks SPEC.json`` (one process: the
issue-25 attacker sends "as fast as one core allows"). It builds whatever it
sends first, prints ``{"ready": true}``, attacks until the spec's seconds
have passed, then prints a JSON summary: connections opened, frames or
requests the target answered, and those it refused.

Sources: the attacker model of the README's security section, up to 64
addresses in each of up to 16 /24 networks, taken from 127.0.0.0/8
(``127.N.0.H``: network N = 1..16, host H = 1..64; the honest probes use
127.0.0.1, in a /24 of its own). Connection attacks reopen each connection
as soon as the target closes it (churn), so evicting or timing one out only
makes room for the next.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import trio

from anonml.crypto import NodeAddress, PathHop, ReleaseWindow, SphinxGeometry, build_packet
from anonml.protocol import PATH_HEADS, PATH_RECEIPTS, PATH_ROSTER, PATH_STATUS
from anonml.transport import AckStatus, LinkClient, LinkIdentity, encode_hello

NETWORKS = 16
HOSTS_PER_NETWORK = 64
_SEND_BATCH = 32
# Junk-token packets built before relay-junk-tokens starts (~0.75 ms each): more than the relay forwarded
# in its 9 s on this machine (issue 25 measured 40,008 in 9.2 s from one address on a quieter one).
_JUNK_PACKETS = 8000
_COLLUDER_LINKS = 4  # sink-colluding-relay-junk: connections from the colluding relay (the sink allows it 8)
_REOPEN_PAUSE = 0.005  # a closed connection is reopened after this (a spinning loop would only burn our core)


def attacker_sources(networks: int = NETWORKS, hosts: int = HOSTS_PER_NETWORK) -> list[str]:
    """The attacker's addresses, interleaved across networks (so any prefix of the list spans them all)."""
    return [f"127.{network}.0.{host}" for host in range(1, hosts + 1) for network in range(1, networks + 1)]


class _Attack:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.geometry = SphinxGeometry.create(max_hops=spec["max_hops"], packet_size=spec["packet_size"])
        self.relay = (spec["relay"][0], int(spec["relay"][1]))
        self.sink = (spec["sink"][0], int(spec["sink"][1]))
        host, port = spec["http"].removeprefix("http://").rsplit(":", 1)
        self.http = (host, int(port))
        self.counts: Counter[str] = Counter()
        self.until = 0.0

    def relay_packets(self, window: ReleaseWindow, count: int) -> list[bytes]:
        """``count`` packets through the relay (in ``window``) to the sink, each carrying random bytes."""
        return [build_packet(self.geometry, self._path(window, window), os.urandom(16)) for _ in range(count)]

    def junk_packets(self, count: int) -> list[bytes]:
        """``count`` packets released at once by the relay, each carrying one of the spec's junk-token
        messages (in turn) to the sink inside its acceptance window."""
        now = ReleaseWindow(int(self.spec["instant"]), int(self.spec["instant"]))
        junk = [(bytes.fromhex(message), self._path(now, ReleaseWindow(start, end)))
                for message, start, end in self.spec["junk"]]
        return [build_packet(self.geometry, junk[i % len(junk)][1], junk[i % len(junk)][0]) for i in range(count)]

    def sink_junk_packets(self, count: int) -> list[bytes]:
        """``count`` final-hop packets (what a last relay delivers) carrying the spec's junk-token messages in
        turn: their final layers are authentic, so the sink stores them and verifies their tokens."""
        junk = [(bytes.fromhex(message), [self._sink_hop(ReleaseWindow(start, end))])
                for message, start, end in self.spec["junk"]]
        return [build_packet(self.geometry, junk[i % len(junk)][1], junk[i % len(junk)][0]) for i in range(count)]

    def _path(self, relay_window: ReleaseWindow, sink_window: ReleaseWindow) -> list[PathHop]:
        spec = self.spec
        return [PathHop(bytes.fromhex(spec["relay_node"]), NodeAddress(*self.relay), bytes.fromhex(spec["relay_key"]),
                        relay_window),
                self._sink_hop(sink_window)]

    def _sink_hop(self, window: ReleaseWindow) -> PathHop:
        spec = self.spec
        return PathHop(bytes.fromhex(spec["sink_node"]), NodeAddress(*self.sink), bytes.fromhex(spec["sink_key"]), window)

    async def send_frames(self, target: tuple[str, int], frames: list[bytes], source: str,
                          identity: LinkIdentity | None) -> None:
        """Send ``frames`` on one connection from ``source``; count what the target acknowledged."""
        client = LinkClient(*target, packet_size=self.geometry.packet_size,
                            geometry_hash=self.geometry.canonical_hash(), identity=identity, local_address=source,
                            connect_timeout=2, ack_timeout=5)
        self.counts["connections"] += 1
        try:
            for offset in range(0, len(frames), _SEND_BATCH):
                if trio.current_time() >= self.until:
                    break
                statuses = await client.send_batch(frames[offset : offset + _SEND_BATCH], give_up_at=trio.current_time())
                self.counts["accepted"] += statuses.count(AckStatus.ACCEPTED)
                self.counts["refused"] += sum(s is AckStatus.REJECTED or s is AckStatus.BUSY for s in statuses)
                self.counts["busy"] += statuses.count(AckStatus.BUSY)
                self.counts["unanswered"] += statuses.count(None)
                if None in statuses:
                    break
        finally:
            await client.aclose()
            # The first-hop work this attacker paid (relay._work): LinkClient stamps each frame with the work
            # the relay asks, as a peer's does, on this process's one core.
            self.counts["stamped"] += client.stamps
            self.counts["max-work-bits"] = max(self.counts["max-work-bits"], client.work_bits)

    async def flood_relay(self, frames: list[bytes], sources: list[str]) -> None:
        """``frames`` to the relay, a share from each source, one connection per source at a time per network."""
        shares = [frames[i :: len(sources)] for i in range(len(sources))]

        async def network_worker(offset: int) -> None:
            for index in range(offset, len(sources), NETWORKS):
                if trio.current_time() >= self.until:
                    return
                await self.send_frames(self.relay, shares[index], sources[index], None)

        async with trio.open_nursery() as nursery:
            for offset in range(min(NETWORKS, len(sources))):
                nursery.start_soon(network_worker, offset)

    async def churn(self, target: tuple[str, int], source: str, first: bytes, trickle: bytes | None) -> None:
        """One connection from ``source`` that sends ``first`` and then stays silent (or sends ``trickle``
        every second), reopened as soon as the target closes it, until the attack ends."""
        while trio.current_time() < self.until:
            try:
                stream = await trio.open_tcp_stream(*target, local_address=source)
            except OSError:
                self.counts["connect-failed"] += 1
                await trio.sleep(_REOPEN_PAUSE)
                continue
            self.counts["connections"] += 1
            try:
                with trio.move_on_at(self.until):
                    await stream.send_all(first)
                    while True:
                        with trio.move_on_after(1.0):
                            if not await stream.receive_some(65536):
                                self.counts["closed-by-target"] += 1
                                break
                        if trickle is not None:
                            await stream.send_all(trickle)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self.counts["closed-by-target"] += 1
            await trio.aclose_forcefully(stream)
            await trio.sleep(_REOPEN_PAUSE)

    async def churn_many(self, target: tuple[str, int], connections: int, first: bytes, trickle: bytes | None) -> None:
        sources = attacker_sources()
        async with trio.open_nursery() as nursery:
            for index in range(connections):
                nursery.start_soon(self.churn, target, sources[index % len(sources)], first, trickle)

    async def poll(self, source: str) -> None:
        paths = [PATH_ROSTER, PATH_RECEIPTS.format(kind="data", partition=0, check=0), PATH_HEADS, PATH_STATUS]
        transport = httpx.AsyncHTTPTransport(local_address=source)
        async with httpx.AsyncClient(base_url=self.spec["http"], timeout=10, transport=transport) as client:
            while trio.current_time() < self.until:
                try:
                    await client.get(paths[self.counts["answered"] % len(paths)])
                    self.counts["answered"] += 1
                except httpx.HTTPError:
                    self.counts["refused"] += 1


async def _attack(spec: dict[str, Any]) -> dict[str, Any]:
    attack = _Attack(spec)
    abuse = spec["abuse"]
    instant, max_held = int(spec["instant"]), int(spec["max_held_packets"])
    sources = attacker_sources()
    # Build what is sent first (a remote attacker's CPU is not ours), then say so and start.
    prepared: list[bytes] = []
    if abuse in ("relay-hold-fill", "relay-hold-fill-one", "relay-neighbour-fill"):
        # In the data phase and open now: held until the window's end (the relay's clock is pinned).
        prepared = attack.relay_packets(ReleaseWindow(instant, instant + 600), max_held * 5 // 4)
    elif abuse == "relay-late-tags":
        prepared = attack.relay_packets(ReleaseWindow(instant - 120, instant - 60), 4000)
    elif abuse == "relay-junk-tokens":
        prepared = attack.junk_packets(_JUNK_PACKETS)
    elif abuse in ("sink-stranger", "sink-garbage"):
        prepared = [os.urandom(attack.geometry.packet_size) for _ in range(640)]
    elif abuse == "sink-colluding-relay-junk":
        prepared = attack.sink_junk_packets(_JUNK_PACKETS)
    print(json.dumps({"ready": True}), flush=True)
    attack.until = trio.current_time() + float(spec["seconds"])
    hello = encode_hello(attack.geometry.packet_size, attack.geometry.canonical_hash())
    head = b"POST /v1/register HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
    if abuse == "relay-hold-fill":
        await attack.flood_relay(prepared, sources)
    elif abuse == "relay-hold-fill-one":
        await attack.flood_relay(prepared, sources[:1])
    elif abuse in ("relay-late-tags", "relay-junk-tokens"):
        await attack.flood_relay(prepared, sources)
    elif abuse == "relay-neighbour-fill":
        # A colluding relay of the round's directory, authenticated with its listed key from its listed
        # address, forwards the packets to the honest relay as fast as it is answered.
        colluder = LinkIdentity(bytes.fromhex(spec["colluder_identity"]))
        while trio.current_time() < attack.until:
            await attack.send_frames(attack.relay, prepared, spec["colluder_host"], colluder)
    elif abuse == "relay-link-churn":
        await attack.churn_many(attack.relay, int(spec["link_slots"]) * 11 // 10, hello, None)
    elif abuse in ("sink-stranger", "sink-garbage"):
        identity = LinkIdentity(bytes.fromhex(spec["relay_identity"])) if abuse == "sink-garbage" else None
        index = 0
        while trio.current_time() < attack.until:
            source = "127.0.0.2" if identity is not None else sources[index % len(sources)]
            await attack.send_frames(attack.sink, prepared, source, identity)
            index += 1
            if identity is None:
                await trio.sleep(0.01)  # each attempt ends at the handshake: do not spin
    elif abuse == "sink-colluding-relay-junk":
        await _colluding_relay_junk(attack, prepared)
    elif abuse == "http-churn":
        await attack.churn_many(attack.http, int(spec["http_slots"]) * 11 // 10, b"", None)
    elif abuse == "http-slow-bodies":
        await attack.churn_many(attack.http, int(spec["http_slots"]) * 11 // 10, head, b"{")
    elif abuse == "http-polling":
        async with trio.open_nursery() as nursery:
            for source in sources[:NETWORKS]:
                nursery.start_soon(attack.poll, source)
    else:
        raise SystemExit(f"unknown abuse {abuse!r}")
    return dict(attack.counts)


async def _colluding_relay_junk(attack: _Attack, junk_tokens: list[bytes]) -> None:
    """A colluding relay of the round's directory (its listed key, from its listed address) floods the sink on
    ``_COLLUDER_LINKS`` connections: half deliver packets whose tokens fail their proofs (each stored, then
    verified: resent, a replay), half random frames whose final-layer MAC fails; each reopened as it ends."""
    colluder = LinkIdentity(bytes.fromhex(attack.spec["colluder_identity"]))
    bad_mac = [os.urandom(attack.geometry.packet_size) for _ in range(640)]

    async def flood(frames: list[bytes]) -> None:
        while trio.current_time() < attack.until:
            await attack.send_frames(attack.sink, frames, attack.spec["colluder_host"], colluder)

    async with trio.open_nursery() as nursery:
        for link in range(_COLLUDER_LINKS):
            # Each junk-token link starts at its own offset, so their first passes deliver distinct packets.
            offset = link * len(junk_tokens) // _COLLUDER_LINKS
            nursery.start_soon(flood, junk_tokens[offset:] + junk_tokens[:offset] if link % 2 == 0 else bad_mac)


def main(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    print(json.dumps(trio.run(_attack, spec)), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m anonml.bench._abuse_attacks SPEC.json")
    main(sys.argv[1])
