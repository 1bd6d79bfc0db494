"""Where a correlation between send and arrival times comes from: the demo's per-message anonymity trace.

The demo plays every peer and relay, so it can follow each message along its
path. Each worker writes what its peers sent (``worker-N.sent.jsonl``:
survey, receipt, the drawn send time, when the first relay acknowledged it,
the window, and the SHA-256 of the packet), each relay what it took in and
sent on (``traces/relay-N.jsonl``, :mod:`anonml.relay._trace`: the hash of
each packet in and of the packet out, when it was taken in, its drawn
release time and when the next hop acknowledged it), and the aggregator its
arrivals and guesses (``links.json``). Chaining packet hashes gives one
:class:`TracedMessage` per message, written to ``anonymity-trace.jsonl``.

:func:`stage_correlations` then splits Spearman's rho by stage: the drawn
send time against the first relay's ack, each hop's intake, drawn release
and forwarding, and the arrival, each ranked within its (survey, window) as
the summary's headline figure is; and each relay's own mixing, its intake
against its drawn release. Where rho first departs from zero is the stage
that carries the correlation. It also states how often the aggregator put a
message in another window than the peer sent it in (the headline groups by
the aggregator's window) and how many arrivals tie.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import rankdata, spearmanr

TRACE_FILE = "anonymity-trace.jsonl"
_MAX_HOPS = 32  # a hash chain longer than any path is a loop in the records, not a path


def relay_trace_file(work: Path, relay: int) -> Path:
    """Where relay ``relay`` of the demo in ``work`` writes its packet trace."""
    return work / "traces" / f"relay-{relay}.jsonl"


def deliveries_to(work: Path, relays: int, addresses: Sequence[str]) -> dict[str, int]:
    """How many packets the relays' traces show each of ``addresses`` (``host:port``) acknowledged: a sink's own
    and its ingest workers' (``anonml demo --sink-workers``)."""
    counts = dict.fromkeys(addresses, 0)
    for relay in range(relays):
        path = relay_trace_file(work, relay)
        for record in _read_lines(path) if path.is_file() else ():
            if record.get("to") in counts:
                counts[record["to"]] += 1
    return counts


@dataclass(frozen=True)
class Hop:
    """One relay's handling of one message: when it took the packet in, the release time it drew, and
    when the next hop acknowledged it (None if the trace has no acknowledgement)."""

    relay: int
    taken_in: float
    release_at: float
    forwarded: float | None
    window_start: float
    """When this hop's release window opened: a packet taken in later draws its release from what is left."""


@dataclass
class TracedMessage:
    """One message from its peer to the aggregator (module docstring)."""

    survey: str
    receipt: str
    window: int
    """The window its peer sent it in (1 or 2)."""
    drawn_at: float
    sent_at: float
    hops: list[Hop] = field(default_factory=list)
    arrived: float | None = None
    aggregator_window: int | None = None
    """The window the aggregator put it in (links.json), None if it did not arrive."""
    guessed_right: bool | None = None


def group_quantiles(groups: Sequence[Hashable], times: Sequence[float]) -> list[float]:
    """Each time's rank within its group as a quantile in (0, 1), ties sharing their mean rank."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    quantiles = [0.0] * len(times)
    for indices in members.values():
        ranks = rankdata([times[i] for i in indices])
        for i, rank in zip(indices, ranks):
            quantiles[i] = float((rank - 0.5) / len(indices))
    return quantiles


def grouped_rho(groups: Sequence[Hashable], x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho of ``x`` and ``y`` each ranked within its group (nan with fewer than 3 pairs or no spread)."""
    if len(x) != len(y) or len(x) != len(groups):
        raise ValueError(f"groups, x and y differ in length: {len(groups)}, {len(x)}, {len(y)}")
    if len(x) < 3:
        return math.nan
    qx, qy = group_quantiles(groups, x), group_quantiles(groups, y)
    if np.ptp(qx) == 0 or np.ptp(qy) == 0:
        return math.nan
    return float(spearmanr(qx, qy).statistic)


def _read_lines(path: Path) -> Iterable[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                # A process killed mid-write leaves its last line short: that one line is lost, not the file.
                if line.endswith("\n"):
                    raise ValueError(f"{path}:{number}: not a JSON line") from None


def trace_messages(sent_files: Sequence[Path], relay_files: dict[int, Path], links: Sequence[dict[str, Any]],
                   senders: dict[str, str] | None = None) -> list[TracedMessage]:
    """Every message the workers sent, followed through the relays' traces to its arrival (module docstring).

    ``senders`` (receipt -> identity) scores the aggregator's guesses when given; the sent files carry it too.
    """
    taken: dict[str, tuple[int, dict[str, Any]]] = {}
    forwarded: dict[str, float] = {}
    for relay, path in relay_files.items():
        if not path.is_file():
            continue
        for record in _read_lines(path):
            if "in" in record:
                taken[record["in"]] = (relay, record)  # a batch resent after a failed commit: the last intake
            else:
                forwarded[record["out"]] = float(record["forwarded"])
    arrivals = {link["receipt"]: link for link in links}
    messages: list[TracedMessage] = []
    truth = dict(senders or {})
    for path in sent_files:
        if not path.is_file():
            continue
        for sent in _read_lines(path):
            truth.setdefault(sent["receipt"], sent["identity"])
            message = TracedMessage(sent["survey"], sent["receipt"], int(sent["window"]), float(sent["drawn_at"]),
                                    float(sent["sent_at"]))
            packet = sent["packet"]
            while packet in taken and len(message.hops) < _MAX_HOPS:
                relay, record = taken[packet]
                packet = record["out"]
                message.hops.append(Hop(relay, float(record["taken_in"]), float(record["release_at"]), forwarded.get(packet),
                                        float(record["window_start"])))
            link = arrivals.get(message.receipt)
            if link is not None:
                message.arrived = float(link["arrived"])
                message.aggregator_window = int(link.get("window", 1))
                message.guessed_right = link["guess"] == truth.get(message.receipt)
            messages.append(message)
    return messages


def write_trace(messages: Sequence[TracedMessage], path: Path) -> None:
    """One JSON line per message."""
    path.write_text("".join(json.dumps(asdict(message)) + "\n" for message in messages))


def _stage_times(message: TracedMessage) -> list[tuple[str, float]]:
    """Each stage's name and time (nan where the trace lacks it: callers pass complete messages)."""
    times = [("first relay's ack", message.sent_at)]
    for k, hop in enumerate(message.hops, 1):
        times += [(f"hop {k} taken in", hop.taken_in), (f"hop {k} release drawn", hop.release_at),
                  (f"hop {k} forwarded", math.nan if hop.forwarded is None else hop.forwarded)]
    times.append(("arrived", math.nan if message.arrived is None else message.arrived))
    return times


def stage_correlations(messages: Sequence[TracedMessage]) -> dict[str, Any]:
    """Rho of the drawn send time against each later stage's time, and of each hop's intake against its
    drawn release, every time ranked within its (survey, window); over the messages that arrived with
    the most common hop count (module docstring). Also: the headline's rho (ack vs arrival, grouped by
    the aggregator's window) on the same messages, window mismatches, and tied arrivals."""
    arrived = [m for m in messages if m.arrived is not None]
    hop_counts = Counter(len(m.hops) for m in arrived)
    figures: dict[str, Any] = {"messages": len(messages), "arrived": len(arrived), "hop_counts": dict(sorted(hop_counts.items()))}
    if not arrived:
        return figures
    hops = hop_counts.most_common(1)[0][0]
    complete = [m for m in arrived if len(m.hops) == hops and all(h.forwarded is not None for h in m.hops)]
    figures["traced"] = len(complete)
    if len(complete) < 3:
        return figures
    groups = [(m.survey, m.window) for m in complete]
    drawn = [m.drawn_at for m in complete]
    stage_times = [_stage_times(m) for m in complete]
    figures["rho_drawn_send_vs"] = {
        name: grouped_rho(groups, drawn, [times[index][1] for times in stage_times])
        for index, (name, _) in enumerate(stage_times[0])
    }
    figures["rho_intake_vs_release"] = {
        f"hop {k + 1}": grouped_rho(groups, [m.hops[k].taken_in for m in complete], [m.hops[k].release_at for m in complete])
        for k in range(hops)
    }
    figures["rho_headline_way"] = grouped_rho([(m.survey, m.aggregator_window) for m in complete],
                                              [m.sent_at for m in complete], [float(m.arrived or 0.0) for m in complete])
    figures["taken_in_after_window_opened"] = {
        f"hop {k + 1}": sum(1 for m in complete if m.hops[k].taken_in > m.hops[k].window_start) for k in range(hops)
    }
    figures["standard_error_if_independent"] = 1.0 / math.sqrt(len(complete) - 1)
    figures["window_mismatches"] = sum(1 for m in arrived if m.aggregator_window != m.window)
    figures["tied_arrivals"] = len(arrived) - len({(m.survey, m.arrived) for m in arrived})
    return figures


def explain_lines(figures: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary table's rows for :func:`stage_correlations`."""
    if "rho_drawn_send_vs" not in figures:
        return [("anonymity by stage", f"{figures.get('traced', 0)} of {figures['messages']} messages traced: too few")]
    se = figures["standard_error_if_independent"]
    stages = ", ".join(f"{name} {rho:+.3f}" for name, rho in figures["rho_drawn_send_vs"].items())
    mixing = ", ".join(f"{name} {rho:+.3f}" for name, rho in figures["rho_intake_vs_release"].items())
    return [
        (f"anonymity by stage: rho of the drawn send time vs ({figures['traced']} messages traced; ±{se:.3f} if independent)", stages),
        ("anonymity by stage: rho of each relay's intake vs its drawn release", mixing),
        ("anonymity by stage: packets taken in after their hop window opened",
         ", ".join(f"{name} {count}" for name, count in figures["taken_in_after_window_opened"].items())),
        ("anonymity by stage: the headline's rho on these messages / window mismatches / tied arrivals",
         f"{figures['rho_headline_way']:+.3f} / {figures['window_mismatches']} / {figures['tied_arrivals']}"),
    ]


def explain_work_dir(work: Path, relays: int, links_path: Path | None = None) -> dict[str, Any]:
    """Trace a finished demo's messages from the files in ``work``; write ``anonymity-trace.jsonl`` there.

    ``links_path`` is the round's ``links.json`` (default: the one round under ``work``)."""
    if links_path is None:
        found = sorted((work / "aggregator" / "rounds").glob("*/links.json"))
        if len(found) != 1:
            raise FileNotFoundError(f"{work}: {len(found)} aggregator/rounds/*/links.json files, not one (the round "
                                    "did not learn, this is no demo work dir, or it holds several rounds)")
        links_path = found[0]
    links = json.loads(links_path.read_text())
    messages = trace_messages(sorted((work / "peers").glob("worker-*.sent.jsonl")),
                              {i: relay_trace_file(work, i) for i in range(relays)}, links)
    write_trace(messages, work / TRACE_FILE)
    return stage_correlations(messages)
