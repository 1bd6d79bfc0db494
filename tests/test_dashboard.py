"""The round dashboard's data and relay health, without a browser (tests/test_dashboard_browser.py drives the page)."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import httpx
import trio

from anonml.aggregator import AggregatorConfig, AggregatorHome, serve_aggregator
from anonml.aggregator._dashboard import RelayWatch, privacy_statement
from anonml.crypto import generate_keypair
from anonml.transport import LinkError, serve_link
from test_peer_aggregator import make_round


def home_at(tmp_path: Path) -> AggregatorHome:
    home = AggregatorHome(tmp_path / "agg")
    home.initialise(bytes(range(32)), generate_keypair()[0])
    return home


async def test_relay_health_is_a_real_link_hello(tmp_path: Path) -> None:
    state = make_round(home_at(tmp_path), int(time.time()))
    geometry = state.geometry
    relays = state.manifest.relays

    sessions: list[str] = []

    async def accept(stream: trio.SocketStream, packet_size: int, geometry_hash: bytes) -> None:
        async def on_packets(frames: list[bytes]) -> list[object]:
            raise AssertionError("a hello carries no frame")

        # As the relay's handler does: a session ends cleanly or with a counted LinkError.
        try:
            await serve_link(stream, on_packets, packet_size=packet_size, geometry_hash=geometry_hash)  # type: ignore[arg-type]
            sessions.append("clean")
        except LinkError as exc:
            sessions.append(exc.reason)

    async with trio.open_nursery() as nursery:
        good = await nursery.start(trio.serve_tcp, partial(accept, packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash()), 0)
        other = await nursery.start(trio.serve_tcp, partial(accept, packet_size=geometry.packet_size, geometry_hash=bytes(32)), 0)
        watch = RelayWatch(state)
        ports = [good[0].socket.getsockname()[1], other[0].socket.getsockname()[1]]
        from dataclasses import replace

        probed = [replace(relays[0], host="127.0.0.1", port=ports[0]), replace(relays[1], host="127.0.0.1", port=ports[1])]
        # The third relay's port (9002 in the spec) has nothing listening on loopback here.
        free = trio.socket.socket()
        await free.bind(("127.0.0.1", 0))
        probed.append(replace(relays[2], host="127.0.0.1", port=free.getsockname()[1]))
        free.close()
        for relay in probed:
            await watch.probe(relay)
        nursery.cancel_scope.cancel()
    statuses = [watch.health[r.node_id].status for r in relays]
    assert statuses == ["ok", "refuses this round's packet geometry", "unreachable"]
    # The probe of a healthy relay ends at a frame boundary: nothing for the relay to count as an error.
    assert sessions == ["clean", "geometry-mismatch"]
    assert watch.health[relays[0].node_id].round_trip_ms is not None
    assert all(watch.health[r.node_id].checked_at is not None for r in relays)


async def test_the_dashboard_serves_its_page_and_figures_and_no_secret(
    tmp_path: Path, store_calls_on_the_loop: list[tuple[str, ...]],
) -> None:
    state = make_round(home_at(tmp_path), int(time.time()), register_seconds=600)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(serve_aggregator, AggregatorConfig(state))
        async with httpx.AsyncClient(base_url=addresses.http_url) as client:
            page = await client.get("/dashboard")
            figures = await client.get("/v1/dashboard")
            plotly = await client.get("/dashboard/plotly.min.js")
        nursery.cancel_scope.cancel()
    assert page.status_code == 200 and 'data-figure="registered"' in page.text and "/v1/dashboard" in page.text
    assert plotly.status_code == 200 and "plotly" in plotly.text[:2000].lower()
    data = figures.json()
    assert data["phase"] == "registration" and data["counts"]["registered"] == 0
    # The figures count every registration and accepted packet: off the event loop, which serves the sink.
    assert [callers for callers in store_calls_on_the_loop if "figures" in callers] == []
    assert data["round"]["id"] == state.round_id.hex()
    assert [step["at"] for step in data["steps"]] == sorted(step["at"] for step in data["steps"])
    assert data["steps"][0] == {**data["steps"][0], "what": "registration closes", "at": state.manifest.schedule.t_register_end}
    for secret in (state.secrets.seed, state.secrets.final_hop_private_key, state.secrets.issuer_key.to_bytes()):
        assert secret.hex() not in figures.text and secret.hex() not in page.text


def test_the_privacy_statement_flags_a_meaningless_delta(tmp_path: Path) -> None:
    manifest = make_round(home_at(tmp_path), int(time.time())).manifest
    tiny = privacy_statement(manifest, [2, 2])
    assert tiny["figures"]["delta"] == 0.25
    assert any("delta = 0.25" in warning for warning in tiny["warnings"])
    large = privacy_statement(manifest, [5000, 5000])
    assert large["warnings"] == [] and "central_epsilon" in large["figures"]
    assert any("at most" in sentence and "times" in sentence for sentence in large["sentences"])


def test_the_report_page_embeds_its_figures(tmp_path: Path) -> None:
    from anonml.aggregator._dashboard import dashboard_data
    from anonml.aggregator._report import write_report

    state = make_round(home_at(tmp_path), int(time.time()))
    report = {"round_id": state.round_id.hex(), "name": "peer-test", "status": "failed", "reason": "nobody came", "rejected": {}}
    write_report(report, tmp_path, dashboard_data(state, None, report))
    html = (tmp_path / "report.html").read_text()
    start = html.index('<script id="report-data" type="application/json">') + len('<script id="report-data" type="application/json">')
    embedded = json.loads(html[start:html.index("</script>", start)])
    assert embedded["phase"] == "failed" and embedded["report"]["reason"] == "nobody came"
    assert "Plotly" in html  # plotly.js is inlined: the file opens without a server or a network
