"""The round's live dashboard, and the same page as the final report (issue 15).

``GET /dashboard`` serves one page (``dashboard/page.html`` with its script
and style) that polls ``GET /v1/dashboard`` every two seconds; the report
written after the round (``report.html``) is that page with the final data,
the script and plotly.js inlined, so it opens anywhere without a server.

What the page shows is public or aggregate only (no secret, no identity
key, no report content): the round's phase and countdowns, registrations,
credentials and accepted packets per survey over time, rejections by
reason, each relay's health as the aggregator sees it, the privacy promise
in plain words, and, once learning is done, the model's AUC and ROC curve
when a held-out test file was given.

Relay health is a real link hello (DESIGN.md §7, ``transport._link``): the
aggregator opens a link to each relay of the manifest with the round's
geometry, reads the reply, and closes at a frame boundary (the relay counts
nothing as an error); reachable, geometry accepted, and the round trip.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from anonml.aggregator._round import RoundState
from anonml.base.display import epsilon_in_words
from anonml.base.threads import run_blocking
from anonml.protocol import RelayEntry, RoundManifest, SurveyId, SurveyKind
from anonml.transport import (
    HELLO_REPLY_BYTES,
    TCP_NETWORK,
    HelloStatus,
    LinkError,
    Network,
    encode_hello,
    parse_hello_reply,
    receive_exactly,
)

log = logging.getLogger(__name__)

DASHBOARD_PATH = "/dashboard"
DASHBOARD_DATA_PATH = "/v1/dashboard"
PLOTLY_PATH = "/dashboard/plotly.min.js"
POLL_SECONDS = 2.0
"""How often the live page asks for new figures."""
RELAY_PROBE_SECONDS = 15.0
"""How often the aggregator says hello to each relay (one short link session each)."""
_PROBE_TIMEOUT = 5.0
_ASSETS = Path(__file__).parent / "dashboard"
_SERIES_POINTS = 120
"""Time buckets per series: enough to see each phase's curve, few enough to poll."""
DELTA_TOO_LARGE = 1e-3
"""A shuffle bound with δ above this is not a meaningful guarantee (δ should be far below 1/n)."""


@dataclass
class RelayHealth:
    """What the last hello to one relay found."""

    node_id: str
    address: str
    status: str = "not checked yet"
    round_trip_ms: float | None = None
    checked_at: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id, "address": self.address, "status": self.status,
            "round_trip_ms": self.round_trip_ms, "checked_at": self.checked_at,
        }


class RelayWatch:
    """Says hello to every relay of the round now and then, over ``network``; :meth:`snapshot` is what the page shows."""

    def __init__(self, state: RoundState, network: Network = TCP_NETWORK) -> None:
        self.state = state
        self.network = network
        manifest = state.manifest
        geometry = state.geometry
        self._hello = encode_hello(geometry.packet_size, geometry.canonical_hash())
        self.health = {
            relay.node_id: RelayHealth(relay.node_id.hex(), f"{relay.host}:{relay.port}") for relay in manifest.relays
        }

    def snapshot(self) -> list[dict[str, Any]]:
        return [health.to_dict() for health in self.health.values()]

    async def probe(self, relay: RelayEntry) -> None:
        """One hello to ``relay``; records its status and round trip."""
        health = self.health[relay.node_id]
        started = trio.current_time()
        status = "unreachable"
        try:
            with trio.fail_after(_PROBE_TIMEOUT):
                stream = await self.network.connect(relay.host, relay.port)
                try:
                    await stream.send_all(self._hello)
                    answer = parse_hello_reply(await receive_exactly(stream, HELLO_REPLY_BYTES))
                    status = {
                        HelloStatus.OK: "ok",
                        HelloStatus.GEOMETRY_MISMATCH: "refuses this round's packet geometry",
                        HelloStatus.UNSUPPORTED_VERSION: "speaks another link version",
                    }.get(answer, f"answered {answer.name}")
                finally:
                    await stream.aclose()
        except trio.TooSlowError:
            status = "no answer within 5 s"
        except (OSError, trio.BrokenResourceError):
            status = "unreachable"
        except LinkError:
            status = "not an AnonML relay"
        health.status = status
        health.round_trip_ms = round((trio.current_time() - started) * 1000, 1) if status == "ok" else None
        health.checked_at = self.state.now()

    async def probe_forever(self, interval: float = RELAY_PROBE_SECONDS) -> None:
        while True:
            async with trio.open_nursery() as nursery:
                for relay in self.state.manifest.relays:
                    nursery.start_soon(self.probe, relay)
            await trio.sleep(interval)


def survey_label(survey: SurveyId) -> str:
    if survey.kind == SurveyKind.MEDIAN:
        return f"median sub-round {survey.sub_round}: partition {survey.partition}"
    return f"data: partition {survey.partition}, subset {survey.subset}"


def schedule_steps(manifest: RoundManifest) -> list[dict[str, Any]]:
    """Every deadline of the round, in order, each with what happens then."""
    schedule = manifest.schedule
    steps = [
        {"what": "registration closes", "at": schedule.t_register_end,
         "explain": "the roster is final; the seed is revealed and every peer learns its partition"},
        {"what": "credential issuance closes", "at": schedule.t_issue_end,
         "explain": "each rostered peer has had its one blind credential for the round"},
    ]
    for i, window in enumerate(schedule.median):
        steps += [
            {"what": f"median sub-round {i}: sending opens", "at": window.t_s,
             "explain": f"peers of partition {i} send one perturbed bit per numeric feature"},
            {"what": f"median sub-round {i}: sending closes", "at": window.send_end,
             "explain": "relays now release what they hold inside their windows"},
            {"what": f"median sub-round {i}: delivery closes", "at": window.t_r,
             "explain": "the next thresholds (or the medians) are published"},
        ]
    steps += [
        {"what": "data: sending opens", "at": schedule.data.t_s,
         "explain": "every peer sends each of its subsets as one packet, at a random time in the window"},
        {"what": "data: sending closes", "at": schedule.data.send_end,
         "explain": "relays release every held packet before delivery closes"},
        {"what": "data: delivery closes", "at": schedule.data.t_r,
         "explain": "nothing more is accepted; the aggregator learns and publishes the report"},
    ]
    return steps


def _median_clause(manifest: RoundManifest) -> str:
    """How the median search spends, to end the data-report sentence."""
    if not manifest.median_rounds:
        return "."
    if manifest.comparison_pool:
        return (f"; a comparison pool of {manifest.comparison_pool / 10:g}% of the peers answers the median search instead, "
                f"each pool peer one bit about one feature at epsilon {manifest.eps_median:.3g} and nothing else.")
    return f"; each median answer flips its bit at epsilon {manifest.eps_median:.3g} per numeric feature."


def _anonymity_clause(manifest: RoundManifest, smallest: int | None) -> tuple[str, str | None]:
    """How far the round's unlinkability claim reaches, and a warning where it does not.

    The claim is made only once a survey has closed with reports, and only
    while the smallest such survey holds at least the manifest's minimum
    anonymity set and at least two reports (one report in a survey names its sender).
    """
    minimum = manifest.min_anonymity_set
    promise = f" (the round's signed minimum is {minimum})" if minimum else ""
    if smallest is None:
        return f": each report will hide among the reports of its survey{promise}.", None
    if smallest >= max(minimum, 2):
        return (f": the aggregator cannot tell which of the senders of a survey sent each report, and the smallest "
                f"survey closed with {smallest} reports{promise}."), None
    short = f", below the round's minimum anonymity set of {minimum}" if smallest < minimum else ""
    exposure = "its one report names its sender" if smallest == 1 else f"each of its reports hides among {smallest} senders only"
    return ".", f"The smallest survey closed with {smallest} report(s){short}: {exposure}."


def privacy_statement(manifest: RoundManifest, shuffled: list[int] | None, smallest: int | None = None) -> dict[str, Any]:
    """The privacy promise in plain words, with the figures it rests on and a warning where one is weak.

    ``shuffled``: the accepted reports of each data survey that has any
    (:meth:`RoundState.shuffled_reports`); the shuffle figure is stated for the fewest.
    ``smallest``: the smallest anonymity set measured (:meth:`RoundState.smallest_anonymity_set`).
    """
    anonymity, anonymity_warning = _anonymity_clause(manifest, smallest)
    sentences = [
        f"Each peer is promised epsilon {manifest.eps_total:.3g} in total for this round (record level: every "
        "median answer and data report it sends, added up); its own ledger refuses to send anything beyond that.",
        epsilon_in_words(manifest.eps_total),
        f"Each data report is perturbed on the peer's machine with the {manifest.oracle!r} frequency oracle at epsilon "
        f"{manifest.eps_data:.3g}" + _median_clause(manifest),
        "Reports travel through the relays as identical fixed-size packets with anonymous tokens" + anonymity,
    ]
    figures: dict[str, Any] = {
        "eps_total": manifest.eps_total, "eps_data": manifest.eps_data, "eps_median": manifest.eps_median,
        "oracle": manifest.oracle, "min_anonymity_set": manifest.min_anonymity_set, "anonymity_set_min": smallest,
    }
    warnings: list[str] = [anonymity_warning] if anonymity_warning else []
    if shuffled:
        from anonml.mechanisms import shuffle_central_privacy

        n = min(shuffled)
        # The bound is stated only where it holds (mechanisms.shuffle_central_privacy).
        central = shuffle_central_privacy(manifest.eps_data, n)
        delta = central.delta
        figures.update({"n": n, "delta": delta})
        if central.epsilon is not None:
            figures["central_epsilon"] = central.epsilon
            sentences.append(
                f"Shuffled among the n = {n} reports of its survey (the fewest of any data survey), each data report is also "
                f"(epsilon {central.epsilon:.3g}, delta {delta:.2g})-private towards the aggregator (Feldman, McMillan and Talwar's bound)."
            )
        else:
            warnings.append(f"No shuffle bound applies to surveys of {n} reports: {central.describe()}; only the local epsilon above holds.")
        if delta > DELTA_TOO_LARGE:
            warnings.append(
                f"delta = {delta:.2g} (surveys of only {n} reports) is large: the shuffled figure is a weak "
                "guarantee at this size; rely on the local epsilon above."
            )
    return {"sentences": sentences, "warnings": warnings, "figures": figures}


def _series(state: RoundState, now: int) -> dict[str, Any]:
    """Cumulative counts over time: registered, credentials, and accepted per survey.

    Each curve starts at 0 where its first bucket begins and is carried to
    ``now``, so a count reached in one bucket still draws as a step.
    """
    schedule = state.manifest.schedule
    span = max(1, schedule.end - schedule.t_register_end)
    bucket = max(1, math.ceil(span / _SERIES_POINTS))
    raw = state.store.timeline(bucket)
    series: dict[str, Any] = {"bucket_seconds": bucket, "registered": [], "credentials": [], "accepted": {}}
    for key, points in raw.items():
        total, cumulative = 0, [[points[0][0], 0]] if points else []
        for t, n in points:
            total += n
            cumulative.append([t + bucket, total])
        if cumulative and cumulative[-1][0] < now:
            cumulative.append([now, total])
        if key in ("registered", "credentials"):
            series[key] = cumulative
        else:
            series["accepted"][survey_label(SurveyId.from_bytes(bytes.fromhex(key)))] = cumulative
    return series


def dashboard_data(
    state: RoundState, relays: list[dict[str, Any]] | None, report: dict[str, Any] | None = None, *, now: int | None = None
) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready figures (no secrets), at ``now`` (default: the round's clock)."""
    status = state.status(now)
    manifest = state.manifest
    if report is None:
        stored = state.store.get_result("report")
        report = json.loads(stored) if stored is not None else None
    # Partitions exist once the roster is final and every listed relay has revealed its beacon value
    # (DESIGN.md §3 step 3): between the two the page shows none.
    sizes = state.partition_sizes() if state.plan is not None else None
    # The report is written while the round is "learning"; the page it becomes shows how the round ended.
    phase = str(report.get("status", status.phase)) if report is not None else status.phase
    return {
        "round": {"id": state.round_id.hex(), "name": manifest.name, "url": manifest.aggregator_url,
                  "k_p": manifest.k_p, "k_h": manifest.k_h, "k_s": manifest.k_s, "plan": manifest.plan,
                  "learner": manifest.learner, "vote": manifest.vote, "path_length": manifest.path_length,
                  "comparison_pool": manifest.comparison_pool / 1000},
        "phase": phase,
        "sub_round": status.sub_round if report is None else None,
        "now": status.now,
        "steps": schedule_steps(manifest),
        "min_participation": manifest.min_participation,
        "counts": dict(status.counts),
        "rejected": dict(status.rejected),
        "series": _series(state, status.now),
        "partition_sizes": sizes,
        "relays": relays,
        "privacy": privacy_statement(manifest, state.shuffled_reports(), state.smallest_anonymity_set(status.now)),
        "report": report,
    }


def _asset(name: str) -> str:
    return (_ASSETS / name).read_text(encoding="utf-8")


def _plotly_js() -> str:
    """plotly.js as the installed plotly package ships it (no network, no copy in this repository)."""
    return (importlib.resources.files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")


def render_page(data: dict[str, Any] | None, *, standalone: bool) -> str:
    """The page: live (``data`` None: it polls the API) or standalone (the figures, script and plotly.js inlined)."""
    page = _asset("page.html")
    style = _asset("page.css")
    script = _asset("page.js")
    if standalone:
        # "</" must not end the script element early: JSON and scripts escape it.
        embedded = json.dumps(data).replace("</", "<\\/")
        plotly = f"<script>{_plotly_js()}</script>"
        boot = f'<script id="report-data" type="application/json">{embedded}</script>'
    else:
        plotly = f'<script src="{PLOTLY_PATH}"></script>'
        boot = f'<script id="live-source" type="application/json">{json.dumps({"url": DASHBOARD_DATA_PATH, "every": POLL_SECONDS})}</script>'
    return (
        page.replace("/*STYLE*/", style)
        .replace("<!--PLOTLY-->", plotly)
        .replace("<!--DATA-->", boot)
        .replace("/*SCRIPT*/", script.replace("</", "<\\/"))
    )


def dashboard_routes(state: RoundState, relays: RelayWatch) -> list[Route]:
    """``/dashboard`` (the page), ``/dashboard/plotly.min.js`` and ``/v1/dashboard`` (its figures); all read-only."""
    page = render_page(None, standalone=False)

    async def dashboard(request: Request) -> Response:
        return HTMLResponse(page, headers={"cache-control": "no-store"})

    async def plotly(request: Request) -> Response:
        return Response(_plotly_js(), media_type="text/javascript", headers={"cache-control": "max-age=3600"})

    def encoded(relays_now: list[dict[str, Any]] | None, now: int) -> str:
        return json.dumps(dashboard_data(state, relays_now, now=now))

    async def figures(request: Request) -> Response:
        # Off the event loop, which serves the sink: the figures count every registration and accepted packet.
        now = state.now()  # on the loop: trio's MockClock is only readable here
        body = await run_blocking(encoded, relays.snapshot(), now)
        return Response(body, media_type="application/json", headers={"cache-control": "no-store"})

    return [
        Route(DASHBOARD_PATH, dashboard, methods=["GET"]),
        Route(PLOTLY_PATH, plotly, methods=["GET"]),
        Route(DASHBOARD_DATA_PATH, figures, methods=["GET"]),
    ]
