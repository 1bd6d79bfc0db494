"""Issue 12's attacks 1-2 against a simulated round (``anonml.simulate``): the real aggregator service,
relays with their mirrors and every peer's ``join_round``, in one process on a virtual clock, with the
adversary a program that sees every request to the aggregator and, as colluding relay operators, every
link frame and mirror request of every peer.

* Attack 1 (receipt withholding): a malicious aggregator serves one peer a log without its receipts,
  re-signed with its own identity key (:class:`TailoredLog`). The peer compares the head with the relay
  mirrors before deciding, finds two different signed heads for one slot, stores both and stops: it
  never resends, so no duplicate tag can name it.
* Attack 2 (visible resends): a peer whose first-window packets every first relay acknowledges and drops
  makes the same requests at the same scheduled times and sends the same number of packets in the same
  windows as every other peer; only its second-chance packets carry resends instead of covers.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from anonml.aggregator import AggregatorHome
from anonml.peer import Equivocation, JoinResult, PeerStore
from anonml.protocol import SECOND_WINDOW_PATHS, Attempt, DocumentKind, SignedDocument, TreeHead
from anonml.simulate import Adversary, Composite, DroppingRelay, RoundContext, SimulationConfig, TailoredLog, peer_ip, simulate_round
from anonml.transport import HELLO_BYTES, Dial, connection_pair

HONEST = 5
DROPPED, TARGET = HONEST, HONEST + 1
# Seed 4: the dropped peer sent a report in a first window (so it had something to repair).
CONFIG = SimulationConfig(peers=HONEST + 2, seed=4)
REQUEST_LINE = re.compile(rb"(GET|POST|HEAD) (/\S*) HTTP/1\.1\r\n")


class Wiretap(Adversary):
    """What colluding relay operators see of the ``watched`` peers, passively: the time of every link frame
    each hands to a first relay, and every request it makes to a relay's mirror (bytes pass unchanged)."""

    name = "wiretap"

    def __init__(self, watched: Sequence[str]) -> None:
        super().__init__()
        self.watched = frozenset(watched)
        self.frames: dict[str, list[float]] = defaultdict(list)
        self.mirror_requests: dict[str, list[tuple[float, str, str]]] = defaultdict(list)

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        links = {tuple(address) for address in context.relays}
        mirrors = {(relay.host, relay.mirror_port) for relay in context.manifest.relays}
        packet_size = context.manifest.sphinx_geometry().packet_size
        previous = context.network.on_connect

        def frame_counter(source: str) -> Callable[[bytes], None]:
            received = [0]

            def observe(data: bytes) -> None:
                # An anonymous sender's hello, then frames of one size back to back (transport._link).
                before = max(0, received[0] - HELLO_BYTES) // packet_size
                received[0] += len(data)
                after = max(0, received[0] - HELLO_BYTES) // packet_size
                self.frames[source] += [context.clock()] * (after - before)

            return observe

        def request_reader(source: str) -> Callable[[bytes], None]:
            pending = [b""]

            def observe(data: bytes) -> None:
                # Mirror requests are GETs without bodies: every request line begins one.
                pending[0] += data
                for match in REQUEST_LINE.finditer(pending[0]):
                    self.mirror_requests[source].append((context.clock(), match[1].decode(), match[2].decode()))
                pending[0] = pending[0][pending[0].rfind(b"\r\n\r\n") + 4:] if b"\r\n\r\n" in pending[0] else pending[0]

            return observe

        async def tap(dial: Dial) -> None:
            if previous is not None:
                await previous(dial)
            source = dial.source[0]
            if source not in self.watched:
                return
            if dial.destination in links:
                observe = frame_counter(source)
            elif dial.destination in mirrors:
                observe = request_reader(source)
            else:
                return
            ours, theirs = connection_pair(dial.source, dial.destination)
            context.nursery.start_soon(pump, dial.server, ours, observe)
            context.nursery.start_soon(pump, ours, dial.server, None)
            dial.server = theirs

        context.network.on_connect = tap


async def pump(source: trio.abc.Stream, sink: trio.abc.Stream, observe: Callable[[bytes], None] | None) -> None:
    """Copy ``source`` to ``sink`` until either end goes, showing each chunk to ``observe``."""
    try:
        while data := await source.receive_some():
            if observe is not None:
                observe(bytes(data))
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(sink)


def test_withheld_receipts_and_dropped_packets_leave_nothing_to_link(tmp_path: Path) -> None:
    wiretap = Wiretap([peer_ip(i) for i in range(CONFIG.peers)])
    # Every first relay of the dropped peer acknowledges its packet of each phase's first window and drops it.
    droppers = [DroppingRelay([peer_ip(DROPPED)], relay=i, attempt=Attempt.FIRST) for i in range(CONFIG.relays)]
    trace = simulate_round(CONFIG, Composite([wiretap, TailoredLog([peer_ip(TARGET)]), *droppers]), keep=tmp_path / "round")
    assert trace.outcome == "done"
    signed = trace.manifest
    schedule = signed.manifest.schedule
    rejected = trace.report["rejected"]

    # Attack 1: the target caught the tailored log before its second chance and kept both signed heads.
    target = trace.peers[TARGET]
    assert isinstance(target.refused, Equivocation), (target.refused, target.result, target.error)
    assert trace.peer_store is not None
    store = PeerStore(trace.peer_store)
    proofs = store.equivocations(target.key)
    store.close()
    assert len(proofs) == 1 and proofs[0].kind == "tree-head"
    served, mirrored = (SignedDocument.from_json(d, max_bytes=1 << 20) for d in (proofs[0].first, proofs[0].second))
    identity = bytes(AggregatorHome(tmp_path / "round" / "aggregator").signing_key().verify_key)
    for document in (served, mirrored):
        document.verify(identity, kind=DocumentKind.TREE_HEAD, round_id=signed.round_id)
    a, b = TreeHead.from_document(served), TreeHead.from_document(mirrored)
    assert (a.survey, a.check) == (b.survey, b.check) and a.root != b.root
    # ... and never resent: every duplicate is the second copy of a second-window message (each goes over
    # SECOND_WINDOW_PATHS paths, issue 27), so none can name the target.
    second_window = sum(p.result.deferred + p.result.resends for p in trace.peers if p.result is not None)
    assert rejected.get("duplicate", 0) == (SECOND_WINDOW_PATHS - 1) * second_window, rejected

    # Attack 2: the dropped peer's first-window packets were taken and dropped, and it repaired them in the
    # uniform window ...
    assert any(f.dropped for f in trace.view.frames if f.source == peer_ip(DROPPED))
    dropped, honest = trace.peers[DROPPED].result, [trace.peers[i].result for i in range(HONEST)]
    assert isinstance(dropped, JoinResult) and all(isinstance(r, JoinResult) for r in honest)
    # (each report goes in the first window or, by choice, the second: only a first-window report can need a resend)
    assert dropped.resends >= 1
    assert dropped.resends + dropped.deferred == dropped.packets == 2 and dropped.missing == 0 and dropped.acknowledged == 2
    assert all(r.resends == 0 and r.covers + r.deferred == r.packets == 2 and r.acknowledged == 2 for r in honest if isinstance(r, JoinResult))

    # ... and did exactly what every other peer did: the same requests to the aggregator and the mirrors, in
    # the same scheduled slots, and the same number of packets in the same windows (its partition number
    # aside, which is public).
    cut_points = sorted({schedule.t_register_end, schedule.t_issue_end,
                         *(t for phase in schedule.phases for t in (phase.t_s, phase.t_c, phase.t_2, phase.t_r))})

    def slots(index: int) -> list[tuple[str, str, int]]:
        result = trace.peers[index].result
        assert result is not None and result.partition is not None
        own = str(result.partition)
        requests = [(r.at, r.method, r.path) for r in trace.view.http if r.address == peer_ip(index)]
        normalised = []
        for at, method, path in [*requests, *wiretap.mirror_requests[peer_ip(index)]]:
            path = re.sub(r"/(median|receipts/median)/" + own + r"\b", r"/\1/P", path)
            path = re.sub(r"/receipts/data/" + own + r"/", "/receipts/data/P/", path)
            normalised.append((method, path, sum(1 for t in cut_points if at >= t)))
        return sorted(set(normalised))

    def windows(index: int) -> list[int]:
        bounds = [phase.send_window(attempt) for phase in schedule.phases for attempt in Attempt]
        return [sum(1 for at in wiretap.frames[peer_ip(index)] if start <= at <= end + 1) for start, end in bounds]

    partition = dropped.partition
    reference = next(i for i, r in enumerate(honest) if r is not None and r.partition == partition)
    assert wiretap.mirror_requests[peer_ip(DROPPED)] and slots(DROPPED) == slots(reference)
    # two phases answered: one frame in each first window, one per path in each second (issue 27)
    assert windows(DROPPED) == windows(reference) and sum(windows(DROPPED)) == 2 * (1 + SECOND_WINDOW_PATHS)
    assert not any("/v1/report" in r.path for r in trace.view.http)
