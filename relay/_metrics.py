"""Relay counters, drop reasons, structured log lines, and the Prometheus endpoint.

Counters are plain integers on the trio thread (no locks needed); at each
scrape a prometheus_client collector turns them into metric families and
``generate_latest`` writes the text exposition format. The endpoint reads at
most one bounded request per connection with a timeout, and admits at most
:data:`METRICS_CONNECTIONS` connections at once (:data:`METRICS_PER_SOURCE`
from one address once half are taken) through a :class:`transport.ConnectionGate`:
a flood of idle scrapers cannot hold the file descriptors the link listener
needs. It is off by default and belongs on 127.0.0.1 or behind a firewall.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from anonml.crypto import InvalidPacket
from anonml.transport import ConnectionGate, GateRefusal, Listeners, listening_address, peer_address

_REQUEST_LIMIT = 8192
_REQUEST_TIMEOUT = 5.0
# A scraper makes one short request every few seconds; these leave room for
# several scrapers and a person with curl, and bound the endpoint's file descriptors.
METRICS_CONNECTIONS = 16
METRICS_PER_SOURCE = 4
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "anonml_relay_"


class DropReason(enum.StrEnum):
    """Every reason a relay drops (or refuses) a packet: the one spelling of each
    ``anonml_relay_packets_dropped_total{reason=...}`` label."""

    # The Sphinx layer (crypto's InvalidPacket subclasses, see from_packet_error).
    WRONG_LENGTH = "wrong-length"
    BAD_MAC = "bad-mac"
    BAD_GROUP_ELEMENT = "bad-group-element"
    BAD_ROUTING_INFO = "bad-routing-info"
    BAD_PAYLOAD = "bad-payload"
    INVALID_PACKET = "invalid-packet"
    REPLAY = "replay"
    NOT_FOR_RELAY = "not-for-relay"
    # Its window: closed, too far ahead, or in no known round's phases; at the first hop, already open.
    LATE = "late"
    LATE_FIRST_HOP = "late-first-hop"
    WINDOW_TOO_FAR = "window-too-far"
    UNKNOWN_WINDOW = "unknown-window"
    # Its next hop.
    UNKNOWN_NEXT_HOP = "unknown-next-hop"
    NEXT_HOP_ADDRESS_MISMATCH = "next-hop-address-mismatch"
    TOO_MANY_NEIGHBOURS = "too-many-neighbours"
    # The relay's own limits and failures.
    CAPACITY = "capacity"
    SOURCE_SHARE = "source-share"  # the sending address holds its share of the held packets (relay._shares)
    PREFIX_SHARE = "prefix-share"  # its /24 (or /48) holds its share
    NEIGHBOUR_SHARE = "neighbour-share"  # an authenticated neighbour (by node id) holds its share
    REPLAY_CACHE_FULL = "replay-cache-full"
    INSUFFICIENT_WORK = "insufficient-work"  # a first-hop frame's stamp did less work than asked (relay._work)
    STORE_ERROR = "store-error"
    EXPIRED_WHILE_DOWN = "expired-while-down"
    # Forwarding.
    NEXT_HOP_REJECTED = "next-hop-rejected"
    NEXT_HOP_BUSY = "next-hop-busy"
    NEXT_HOP_UNREACHABLE = "next-hop-unreachable"

    @classmethod
    def from_packet_error(cls, error: InvalidPacket) -> DropReason:
        """The label of a Sphinx refusal (crypto spells its reasons with underscores)."""
        try:
            return cls(error.reason.replace("_", "-"))
        except ValueError:
            return cls.INVALID_PACKET


def log_event(logger: logging.Logger, level: int, event: str, **context: object) -> None:
    """One structured line: ``event=NAME key=value ...`` (values repr'd if they contain spaces)."""
    if logger.isEnabledFor(level):
        parts = [f"event={event}"]
        for key, value in context.items():
            text = str(value)
            parts.append(f"{key}={text!r}" if (" " in text or not text) else f"{key}={text}")
        logger.log(level, " ".join(parts))


@dataclass
class LateIntake:
    """Packets accepted after their hop window had opened (``relay._server``, step 3): later hops only.

    Each one's release time is drawn from what was left of its window, so it
    follows the packet's intake time. At a later hop, intake follows the
    previous hop's release, which is already independent of the send, so
    this changes how releases spread over the window, not their independence.
    At a packet's first hop, intake follows its send, and such packets'
    arrival at the aggregator would follow their send order: the relay
    refuses them ("late-first-hop"), and ``protocol.hop_windows`` opens the
    first relay's window a guard after the send window
    (``protocol.first_hop_guard``) so that a punctual peer's packet is in by then.
    """

    packets: int = 0
    seconds_open: float = 0.0
    """How long their windows had been open when they were accepted, summed."""
    due_before_stored: int = 0
    """Accepted packets (late or not) whose drawn release time had passed when their batch was stored:
    released at once, in the order they were stored, which at a first hop is their send order."""

    def add(self, seconds_open: float) -> None:
        self.packets += 1
        self.seconds_open += seconds_open

    def merge(self, other: LateIntake) -> None:
        self.packets += other.packets
        self.seconds_open += other.seconds_open
        self.due_before_stored += other.due_before_stored


@dataclass
class RelayCounters:
    """What the relay did since it started (DESIGN.md §11 "robustness")."""

    received: int = 0
    accepted: int = 0
    forwarded: int = 0
    dropped: Counter[DropReason] = field(default_factory=Counter)
    link_errors: Counter[str] = field(default_factory=Counter)
    mirror_http: Counter[str] = field(default_factory=Counter)
    """The mirror's HTTP server: connections refused by its caps, clients gone, failures."""
    metrics_refused: Counter[GateRefusal] = field(default_factory=Counter)
    """Connections to the metrics endpoint closed at once by its caps."""
    connections_accepted: int = 0
    connections_refused: Counter[GateRefusal] = field(default_factory=Counter)
    connections_open: int = 0
    neighbour_connections_open: int = 0
    forward_retries: int = 0
    throttled_batches: int = 0
    held: int = 0
    replay_tags: int = 0
    late_intake: LateIntake = field(default_factory=LateIntake)
    store_failing: bool = False
    store_failures: int = 0
    # Where the time goes (``anonml bench relay``): CPU seconds of intake
    # (Sphinx processing, replay tags and stores, commits), and wall seconds
    # inside SQLite (fsync waits included).
    intake_cpu_seconds: float = 0.0
    store_seconds: float = 0.0
    work_bits: int = 0
    """The work asked of first-hop frames now (relay._work)."""

    def drop(self, reason: DropReason, count: int = 1) -> None:
        self.dropped[reason] += count


class _CountersCollector(Collector):
    """The counters as Prometheus metric families, read at each scrape."""

    def __init__(self, counters: RelayCounters) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self._counters

        def counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(PREFIX + name, help_text, value=value)

        def gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, help_text, value=value)

        def by_reason(name: str, help_text: str, values: Iterable[tuple[str, int]]) -> CounterMetricFamily:
            family = CounterMetricFamily(PREFIX + name, help_text, labels=["reason"])
            for reason, value in sorted(values):
                family.add_metric([str(reason)], value)
            return family

        yield counter("packets_received", "Frames received on link connections.", c.received)
        yield counter("packets_accepted", "Packets stored for release.", c.accepted)
        yield counter("packets_forwarded", "Packets acknowledged by the next hop.", c.forwarded)
        late = c.late_intake
        yield counter("packets_held_after_window_opened",
                      "Packets accepted after their window had opened: released in what was left of it.", late.packets)
        yield counter("packets_held_after_window_opened_seconds",
                      "How long those packets' windows had been open when they were accepted, summed.", late.seconds_open)
        yield counter("packets_due_before_stored",
                      "Packets whose drawn release time had passed when their batch was stored: released at once.",
                      late.due_before_stored)
        yield by_reason("packets_dropped", "Packets not forwarded, by reason.", c.dropped.items())
        yield by_reason("metrics_connections_refused", "Metrics endpoint connections closed at once, by limit.",
                        c.metrics_refused.items())
        yield by_reason("link_errors", "Link sessions ended by an error, by reason.", c.link_errors.items())
        yield by_reason("mirror_http", "Mirror HTTP connections refused, clients gone and failures.",
                        c.mirror_http.items())
        yield counter("connections_accepted", "Link connections served.", c.connections_accepted)
        yield by_reason("connections_refused", "Link connections closed at once, by limit.", c.connections_refused.items())
        yield counter("forward_retries", "Forwarding batches retried later.", c.forward_retries)
        yield counter("throttled_batches", "Batches delayed: their source had spent its budget of refused frames.",
                      c.throttled_batches)
        yield counter("store_failures", "SQLite commits that failed (disk full, read-only, I/O).", c.store_failures)
        yield counter("intake_cpu_seconds", "CPU seconds of intake: Sphinx processing and SQLite writes.",
                      c.intake_cpu_seconds)
        yield counter("store_seconds", "Seconds spent in SQLite writes and commits.", c.store_seconds)
        yield counter("process_cpu_seconds", "CPU seconds used by the relay process.", time.process_time())
        yield gauge("work_bits", "Bits of work asked of each first-hop frame now (2**bits hashes).", c.work_bits)
        yield gauge("connections_open", "Link connections open now.", c.connections_open)
        yield gauge("neighbour_connections_open", "Link connections from authenticated directory neighbours.",
                    c.neighbour_connections_open)
        yield gauge("packets_held", "Packets held now.", c.held)
        yield gauge("replay_tags", "Replay tags kept now (each until its packet's window ends).", c.replay_tags)
        yield gauge("healthy", "1 while the store commits; 0 while commits fail (packets are refused BUSY).",
                    0 if c.store_failing else 1)


def render_prometheus(counters: RelayCounters) -> bytes:
    """The counters in the Prometheus text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_CountersCollector(counters))
    return generate_latest(registry)


def parse_metrics(text: str) -> dict[str, float]:
    """A scrape of a relay's endpoint as ``{name: value}`` (prometheus_client's parser): names
    without the ``anonml_relay_`` prefix and ``_total`` suffix, ``name/reason`` for labelled samples."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        name = family.name.removeprefix(PREFIX)
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            reason = sample.labels.get("reason")
            values[f"{name}/{reason}" if reason else name] = float(sample.value)
    return values


async def _handle_metrics(stream: trio.abc.Stream, counters: RelayCounters) -> None:
    try:
        request = b""
        with trio.move_on_after(_REQUEST_TIMEOUT):
            while b"\r\n\r\n" not in request and len(request) < _REQUEST_LIMIT:
                chunk = await stream.receive_some(_REQUEST_LIMIT - len(request))
                if not chunk:
                    break
                request += chunk
        if request.startswith(b"GET /metrics ") or request.startswith(b"GET / "):
            body = render_prometheus(counters)
            head = f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\n".encode()
        else:
            body = b"not found\n"
            head = b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
        head += b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        with trio.move_on_after(_REQUEST_TIMEOUT):
            await stream.send_all(head + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the scraper went away; nothing to count
    finally:
        await trio.aclose_forcefully(stream)


async def serve_metrics(
    listeners: Listeners,
    counters: RelayCounters,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/metrics`` on ``listeners`` behind its connection caps; reports the bound address."""
    task_status.started(listening_address(listeners))
    gate = ConnectionGate(METRICS_CONNECTIONS, METRICS_PER_SOURCE, refused=counters.metrics_refused)

    async def handler(stream: trio.abc.Stream) -> None:
        slot = gate.open(peer_address(stream))
        if slot is None:
            await gate.turn_away(stream)
            return
        try:
            await _handle_metrics(stream, counters)
        finally:
            slot.close()

    await trio.serve_listeners(handler, listeners)
