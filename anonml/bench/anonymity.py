"""``anonml bench anonymity``: can timing link a report to its sender? (DESIGN.md §11 "anonymity")

Setup. Three real relays run as separate processes on the wall clock (the
real ``serve_relay``, each with its SQLite store and a directory naming only
the next hop), and this process runs the final hop (a recording sink). N
peers each draw a send time uniformly in the send window ``[t_s, t_s + δ]``
with their own ChaCha20 generator (``peer.peer_generator``), build a Sphinx
packet whose hop windows are the protocol's (``protocol.hop_windows``:
relay ``k`` releases in slice ``k`` of the delivery window), and hand it to
the first relay at that time. The sink records when each message arrives and
which peer it came from (the message carries the peer's index: the ground
truth only the bench knows).

What the aggregator sees. Under the uniform protocol (DESIGN.md §2, §3.7)
every peer of a partition makes the same HTTP requests at the same scheduled
times whatever happened to its packets, so its HTTP log orders peers by
nothing that depends on their packets; what is left is every arrival time.
The bench grants the adversary more: the true send time of every peer (what
a global observer of the first hops would see, a superset of the
aggregator's full view). It reports

* Spearman's rank correlation between send and arrival times;
* the accuracy of the best linking guess from those times, two ways: the
  exact sender by rank matching (the k-th arrival guessed to be the k-th
  sender; chance 1/N), and the one-bit game "was it sent in the first half
  of the send window" guessed from "did it arrive in the first half"
  (chance 1/2). Order statistics are what a timing adversary can use when
  send and arrival are monotonically related; if they are independent both
  guesses stay at chance.

The baseline, as in every benchmark, is measured in the same run: the same
two guesses with send times taken as arrival times (a network with no
mixing), which link every packet.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
import trio

from anonml.bench.relay import _start_relay
from anonml.crypto import DEFAULT_PACKET_SIZE, NodeAddress, PathHop, SphinxGeometry, build_packet, generate_keypair, node_id_of
from anonml.peer import peer_generator
from anonml.protocol import AckStatus, LinkClient, PhaseTimes, RoundSchedule, SurveyId, hop_windows, timing_figures
from anonml.relay import DirectoryEntry
from anonml.testing import FinalHopSink

_RELAYS = 3


async def _run(peers: int, send_window: int, delivery_window: int, work: Path, processes: list[subprocess.Popen[str]]) -> dict[str, Any]:
    geometry = SphinxGeometry.create(packet_size=DEFAULT_PACKET_SIZE)
    now = int(time.time())
    sink_private, sink_public = generate_keypair()
    sink = FinalHopSink(geometry, sink_private)
    rng = peer_generator()
    async with trio.open_nursery() as nursery:
        sink_address = await nursery.start(sink.serve)
        hops: list[tuple[bytes, bytes, int]] = []
        next_hop = DirectoryEntry(node_id_of(sink_public), *sink_address)
        for index in reversed(range(_RELAYS)):
            node_id, public, link_port, _ = await trio.to_thread.run_sync(
                lambda: _start_relay(work, index, now, "NORMAL", geometry, next_hop, processes, wall=True))
            hops.insert(0, (node_id, public, link_port))
            next_hop = DirectoryEntry(node_id, "127.0.0.1", link_port)
        # Build every packet first (about 1 ms each), then open the send window.
        build_seconds = peers * 0.002 + 5
        t_s = int(time.time() + build_seconds)
        phase = PhaseTimes(t_s, send_window, t_s + send_window + delivery_window, t_s + send_window + delivery_window + 1,
                           1, t_s + send_window + delivery_window + 3)
        schedule = RoundSchedule(t_s - 2, t_s - 1, (), phase)
        survey = SurveyId.data(bytes(32), 0, 0)
        windows = hop_windows(schedule, survey, _RELAYS)
        path = [PathHop(node_id, NodeAddress("127.0.0.1", port), public, window)
                for (node_id, public, port), window in zip(hops, windows, strict=False)]
        path.append(PathHop(node_id_of(sink_public), NodeAddress(*sink_address), sink_public, windows[-1]))
        send_at = rng.uniform(t_s, t_s + send_window, peers)
        order = np.argsort(send_at)
        packets = [build_packet(geometry, path, int(i).to_bytes(4, "big")) for i in range(peers)]
        sent = np.zeros(peers)
        client = LinkClient("127.0.0.1", hops[0][2], packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash())
        position = 0
        while position < peers:
            # Everything due now goes in one batch; the next batch waits for its first packet's time.
            await trio.sleep(max(0.0, float(send_at[order[position]]) - time.time()))
            now_wall = time.time()
            due = []
            while position < peers and send_at[order[position]] <= now_wall:
                due.append(int(order[position]))
                position += 1
            statuses = await client.send_batch([packets[i] for i in due], give_up_at=trio.current_time() + 30)
            sent[due] = now_wall
            if statuses != [AckStatus.ACCEPTED] * len(due):
                raise RuntimeError(f"the first relay refused packets: {statuses[:5]!r}")
        await client.aclose()
        with trio.move_on_at(trio.current_time() + (phase.t_c - time.time()) + 10):
            await sink.wait_for(peers)
        nursery.cancel_scope.cancel()
    arrival = np.full(peers, np.nan)
    for record in sink.arrivals:
        arrival[int.from_bytes(record.message[:4], "big")] = record.arrived_at
    delivered = ~np.isnan(arrival)
    figures = timing_figures(sent[delivered], arrival[delivered], np.random.default_rng(0))
    return {
        "peers": peers,
        "delivered": int(delivered.sum()),
        "send_window_s": send_window,
        "delivery_window_s": delivery_window,
        "relays": _RELAYS,
        **figures,
        "baseline_no_mixing": timing_figures(sent[delivered], sent[delivered], np.random.default_rng(0)),
        "rho_two_standard_errors": 2.0 / float(np.sqrt(max(int(delivered.sum()) - 1, 1))),
        "half_link_two_standard_errors": 2.0 * 0.5 / float(np.sqrt(max(int(delivered.sum()), 1))),
        "load_average": os.getloadavg(),
    }


def run_bench(peers: int, send_window: int, delivery_window: int) -> dict[str, Any]:
    processes: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="anonml-bench-anonymity-") as work:
        try:
            return trio.run(_run, peers, send_window, delivery_window, Path(work), processes)
        finally:
            for process in processes:
                if process.stdin is not None:
                    process.stdin.close()
                process.wait(timeout=30)


@click.command(name="anonymity")
@click.option("--peers", type=click.IntRange(100, 100_000), default=10_000, show_default=True)
@click.option("--send-window", type=click.IntRange(2, 3600), default=30, show_default=True, help="Seconds (δ).")
@click.option("--delivery-window", type=click.IntRange(4, 3600), default=40, show_default=True, help="Seconds (t_r - t_s - δ).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_anonymity(peers: int, send_window: int, delivery_window: int, as_json: bool) -> None:
    """Send-vs-arrival rank correlation and timing-linking accuracy through 3 real relays, vs chance."""
    result = run_bench(peers, send_window, delivery_window)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"{result['delivered']}/{peers} packets through {_RELAYS} relays; send window {send_window} s, "
               f"delivery window {delivery_window} s; load average {result['load_average']}")
    click.echo(f"Spearman rho(send, arrival) = {result['spearman_rho']:+.4f} (2 standard errors under independence: "
               f"±{result['rho_two_standard_errors']:.4f}); without mixing: {result['baseline_no_mixing']['spearman_rho']:+.4f}")
    click.echo(f"exact sender by rank matching: {100 * result['exact_link_accuracy']:.3f}% (chance {100 * result['exact_link_chance']:.3f}%; "
               f"without mixing {100 * result['baseline_no_mixing']['exact_link_accuracy']:.1f}%)")
    click.echo(f"sent in the first half, guessed from arrival: {100 * result['half_link_accuracy']:.2f}% (chance 50%, "
               f"±{100 * result['half_link_two_standard_errors']:.2f} pp at 2 s.e.; without mixing "
               f"{100 * result['baseline_no_mixing']['half_link_accuracy']:.1f}%)")
