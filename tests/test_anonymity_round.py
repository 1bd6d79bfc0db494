"""Issue 12's attacks 1-3 against a real round: real relay processes with their mirrors, the real
aggregator service, and the real peer code, each peer with its own HTTP client so what it asks can be
recorded.

* Attack 1 (receipt withholding): a malicious aggregator serves one peer a log without that peer's
  receipt, re-signed with its own identity key. The peer compares the head with a relay's mirror before
  deciding, finds two different signed heads for one slot, stores both and stops: it never resends, so
  no duplicate tag can name it.
* Attack 2 (visible resends): a peer whose first packets were dropped after the first relay
  acknowledged them makes the same requests at the same scheduled times and sends the same number of
  packets in the same windows as every other peer; only its second-chance packets carry resends
  instead of covers.
"""

from __future__ import annotations

import re
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from nacl.signing import SigningKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from anonml.demo import free_port
from anonml.aggregator._service import AggregatorConfig, serve_aggregator
from anonml.aggregator._setup import create_round
from anonml.aggregator._spec import parse_round_spec
from anonml.peer import Equivocation, JoinResult
from anonml.peer._client import AggregatorClient
from anonml.peer._features import RoundPipeline
from anonml.peer._identity import PeerIdentity
from anonml.peer._join import Peer, RoundSession, join_round, peer_generator
from anonml.peer._store import PeerStore
from anonml.peer._transport import PacketTransport, open_transport
from anonml.protocol import (
    Attempt,
    DocumentKind,
    FeatureSpec,
    ReceiptSegment,
    SignedDocument,
    TreeHead,
    receipt_leaves_root,
)
from anonml.transport import AckStatus, tls_context
from test_e2e_round import spec_document as e2e_document
from test_e2e_round import aggregator_with_relays, served_manifest, vector

pytestmark = pytest.mark.slow


class RecordingClient(AggregatorClient):
    """An aggregator (or mirror) client that logs every request it makes: (trio time, method, path)."""

    def __init__(self, base_url: str, log: list[tuple[float, str, str]], **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.log = log

    async def _call(self, method: str, path: str, body: bytes | None = None) -> httpx.Response | None:
        self.log.append((time.time(), method, path))
        return await super()._call(method, path, body)


class RecordingTransport:
    """One peer's first hops: every packet handed over, with its wall time; optionally dropped after the ack."""

    def __init__(self, transport: PacketTransport, drop_in: list[tuple[int, int]]) -> None:
        self.transport = transport
        self.sent: list[float] = []
        self.drop_in = drop_in

    async def send(self, host: str, port: int, packet: bytes, *, give_up_at: float) -> AckStatus | None:
        now = time.time()
        self.sent.append(now)
        if any(start <= now <= end + 1 for start, end in self.drop_in):
            # A relay that acknowledges and then drops the packet.
            return AckStatus.ACCEPTED
        return await self.transport.send(host, port, packet, give_up_at=give_up_at)


def round_document(relays: list[dict[str, Any]], http_port: int) -> dict[str, Any]:
    """The e2e round with every partition answering a median sub-round (every peer takes part in two phases)."""
    document = e2e_document(relays, http_port)
    document["name"] = "anonymity-round"
    document["schedule"].update({"register": 12, "issue": 6, "data_delivery": 9, "check": 4})
    return document


def tailoring_proxy(upstream: str, signing_key: SigningKey, withheld: list[bytes]) -> Starlette:
    """The aggregator as a malicious operator runs it for one peer: everything is the real service's,
    except the first check's log segments, which leave out ``withheld`` receipts under a re-signed head."""

    async def forward(request: Request) -> Response:
        async with httpx.AsyncClient(base_url=upstream, timeout=30, verify=tls_context()) as client:
            upstream_response = await client.request(
                request.method, request.url.path, content=await request.body(), headers={"content-type": "application/json"}
            )
        body = upstream_response.content
        if upstream_response.status_code == 200 and re.fullmatch(r"/v1/receipts/\w+/\d+/0", request.url.path):
            segment = ReceiptSegment.from_json(body)
            heads, leaves = [], {}
            for document in segment.heads:
                head = TreeHead.from_document(document)
                kept = tuple(d for d in segment.leaves[head.survey] if d not in withheld)
                leaves[head.survey] = kept
                heads.append(TreeHead(head.survey, head.check, len(kept), receipt_leaves_root(kept)).sign(signing_key))
            body = ReceiptSegment(tuple(heads), leaves).to_json()
        return Response(body, status_code=upstream_response.status_code, media_type="application/json")

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


async def test_withheld_receipts_and_dropped_packets_leave_nothing_to_link(tmp_path: Path, relay_processes: list[trio.Process]) -> None:
    http_port = free_port()
    home, signing_key, descriptors = await aggregator_with_relays(tmp_path, http_port, relay_processes)
    spec = parse_round_spec(round_document(descriptors, http_port))
    state, _ = create_round(home, spec, now=int(time.time()))
    schedule = state.manifest.schedule
    url = state.manifest.aggregator_url
    store = PeerStore(tmp_path / "peers.sqlite", durable=False)
    withheld: list[bytes] = []
    outcome: list[str] = []
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            outcome.append(await serve_aggregator(AggregatorConfig(state, http_port=http_port, sink_port=spec.network.sink_port, linger=3.0)))

        nursery.start_soon(serve)
        proxy_port = free_port()
        proxy = HypercornConfig()
        proxy.bind = [f"127.0.0.1:{proxy_port}"]
        await nursery.start(partial(hypercorn_serve, tailoring_proxy(url, signing_key, withheld), proxy, mode="asgi"))  # type: ignore[arg-type]
        first = AggregatorClient(url, retry_for=10)
        signed = await served_manifest(first)
        await first.aclose()
        pipeline = RoundPipeline.for_spec(FeatureSpec.from_dict(dict(signed.manifest.features)))
        geometry = signed.manifest.sphinx_geometry()
        logs: dict[str, list[tuple[float, str, str]]] = {}
        transports: dict[str, RecordingTransport] = {}
        results: dict[str, JoinResult | Exception] = {}
        targets: dict[str, Peer] = {}
        async with open_transport(packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash()) as transport:

            async def one(name: str, i: int, base: str, drop_in: list[tuple[int, int]] | None = None) -> None:
                log = logs[name] = []
                client = RecordingClient(base, log, retry_for=10)
                recorder = transports[name] = RecordingTransport(transport, drop_in or [])
                session = RoundSession(client, recorder, mirror_client=lambda u: RecordingClient(u, log, max_connections=2, retry_for=2.0))  # type: ignore[arg-type]
                peer = targets[name] = Peer(PeerIdentity.generate(), store, vector(pipeline, i), peer_generator())
                try:
                    results[name] = await join_round(peer, session, await session.manifest("join"), pipeline)
                except Equivocation as exc:
                    results[name] = exc
                finally:
                    await session.aclose()
                    await client.aclose()

            async def withhold_the_targets_receipts() -> None:
                # The malicious operator knows whose receipt it leaves out (it wants that peer to resend).
                await trio.sleep(max(0.0, schedule.median[0].t_s - time.time()))
                target = targets["target"]
                withheld.extend(p.receipt for key, p in store.packets(signed.round_id) if key == target.identity.public_key)
                await trio.sleep(max(0.0, schedule.data.send_end - time.time()))
                withheld.extend(p.receipt for key, p in store.packets(signed.round_id) if key == target.identity.public_key)

            async with trio.open_nursery() as peers:
                for i in range(5):
                    peers.start_soon(one, f"honest-{i}", i, url)
                # Its relays acknowledge its first packet of every phase and drop it.
                peers.start_soon(one, "dropped", 5, url, [phase.send_window(Attempt.FIRST) for phase in schedule.phases])
                peers.start_soon(one, "target", 6, f"http://127.0.0.1:{proxy_port}")
                peers.start_soon(withhold_the_targets_receipts)
        with trio.fail_after(90):
            while not outcome:
                await trio.sleep(0.2)
        nursery.cancel_scope.cancel()

    assert outcome == ["done"]
    rejected = state.store.rejections()
    # Attack 1: the target caught the tailored log before its second chance and kept both signed heads.
    target_result = results["target"]
    assert isinstance(target_result, Equivocation), target_result
    proofs = store.equivocations(targets["target"].identity.public_key)
    assert len(proofs) == 1 and proofs[0].kind == "tree-head"
    served, mirrored = (SignedDocument.from_json(d, max_bytes=1 << 20) for d in (proofs[0].first, proofs[0].second))
    for document in (served, mirrored):
        document.verify(bytes(signing_key.verify_key), kind=DocumentKind.TREE_HEAD, round_id=signed.round_id)
    a, b = TreeHead.from_document(served), TreeHead.from_document(mirrored)
    assert (a.survey, a.check) == (b.survey, b.check) and a.root != b.root
    # ... and never resent: no tag reached the aggregator twice, so no duplicate can name the target.
    assert rejected.get("duplicate", 0) == 0, rejected
    # Attack 2: the dropped peer repaired its packets in the uniform window ...
    dropped, honest = results["dropped"], [results[f"honest-{i}"] for i in range(5)]
    assert isinstance(dropped, JoinResult) and all(isinstance(r, JoinResult) for r in honest)
    assert dropped.resends == dropped.packets == 2 and dropped.missing == 0 and dropped.acknowledged == 2
    assert all(r.resends == 0 and r.covers == r.packets == 2 and r.acknowledged == 2 for r in honest if isinstance(r, JoinResult))
    # ... and did exactly what every other peer did: the same requests, in the same scheduled slots, and
    # the same number of packets in the same windows (its partition number aside, which is public).
    def slots(name: str) -> list[tuple[str, str, int]]:
        partition = targets[name].store.registration(targets[name].identity.public_key, signed.round_id)
        assert partition is not None and partition.partition is not None
        cut_points = sorted({schedule.t_register_end, schedule.t_issue_end, *(t for phase in schedule.phases for t in (phase.t_s, phase.t_c, phase.t_2, phase.t_r))})
        own = str(partition.partition)
        normalised = []
        for at, method, path in logs[name]:
            path = re.sub(r"/(median|receipts/median)/" + own + r"\b", r"/\1/P", path)
            path = re.sub(r"/receipts/data/" + own + r"/", "/receipts/data/P/", path)
            normalised.append((method, path, sum(1 for t in cut_points if at >= t)))
        return sorted(set(normalised))

    def windows(name: str) -> list[int]:
        bounds = [phase.send_window(attempt) for phase in schedule.phases for attempt in Attempt]
        return [sum(1 for at in transports[name].sent if start <= at <= end + 1) for start, end in bounds]

    reference = next(f"honest-{i}" for i in range(5) if targets[f"honest-{i}"].store.registration(
        targets[f"honest-{i}"].identity.public_key, signed.round_id).partition ==  # type: ignore[union-attr]
        targets["dropped"].store.registration(targets["dropped"].identity.public_key, signed.round_id).partition)  # type: ignore[union-attr]
    assert slots("dropped") == slots(reference)
    assert windows("dropped") == windows(reference)
    assert not any("/v1/report" in path for log in logs.values() for _, _, path in log)
