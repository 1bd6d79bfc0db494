"""Relay counters, structured log lines, and the Prometheus endpoint.

Counters are plain integers on the trio thread (no locks needed). The optional
endpoint serves them in the Prometheus text exposition format (version 0.0.4)
at ``GET /metrics``; it reads at most one bounded request per connection with
a timeout, so it is as hostile-input-safe as the link.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import trio

_REQUEST_LIMIT = 8192
_REQUEST_TIMEOUT = 5.0


def log_event(logger: logging.Logger, level: int, event: str, **context: object) -> None:
    """One structured line: ``event=NAME key=value ...`` (values repr'd if they contain spaces)."""
    if logger.isEnabledFor(level):
        parts = [f"event={event}"]
        for key, value in context.items():
            text = str(value)
            parts.append(f"{key}={text!r}" if (" " in text or not text) else f"{key}={text}")
        logger.log(level, " ".join(parts))


@dataclass
class RelayCounters:
    """What the relay did since it started (DESIGN.md §11 "robustness")."""

    received: int = 0
    accepted: int = 0
    forwarded: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    link_errors: Counter[str] = field(default_factory=Counter)
    connections_accepted: int = 0
    connections_refused: int = 0
    connections_open: int = 0
    forward_retries: int = 0
    held: int = 0
    # Where the time goes (``anonml bench relay``): CPU seconds of intake
    # (Sphinx processing, replay tags and stores, commits), and wall seconds
    # inside SQLite (fsync waits included).
    intake_cpu_seconds: float = 0.0
    store_seconds: float = 0.0

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] += count


def render_prometheus(counters: RelayCounters) -> str:
    """The counters in the Prometheus text format."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, int | float]]) -> None:
        lines.append(f"# HELP anonml_relay_{name} {help_text}")
        lines.append(f"# TYPE anonml_relay_{name} {kind}")
        lines.extend(f"anonml_relay_{name}{labels} {value}" for labels, value in samples)

    def by_reason(counter: Counter[str]) -> list[tuple[str, int | float]]:
        return [(f'{{reason="{reason}"}}', value) for reason, value in sorted(counter.items())]

    metric("packets_received_total", "counter", "Frames received on link connections.", [("", counters.received)])
    metric("packets_accepted_total", "counter", "Packets stored for release.", [("", counters.accepted)])
    metric("packets_forwarded_total", "counter", "Packets acknowledged by the next hop.", [("", counters.forwarded)])
    metric("packets_dropped_total", "counter", "Packets not forwarded, by reason.", by_reason(counters.dropped))
    metric("link_errors_total", "counter", "Link sessions ended by an error, by reason.", by_reason(counters.link_errors))
    metric("connections_accepted_total", "counter", "Link connections served.", [("", counters.connections_accepted)])
    metric("connections_refused_total", "counter", "Link connections closed at once (limit).",
           [("", counters.connections_refused)])
    metric("forward_retries_total", "counter", "Forwarding batches retried later.", [("", counters.forward_retries)])
    metric("intake_cpu_seconds_total", "counter", "CPU seconds of intake: Sphinx processing and SQLite writes.",
           [("", counters.intake_cpu_seconds)])
    metric("store_seconds_total", "counter", "Seconds spent in SQLite writes and commits.",
           [("", counters.store_seconds)])
    metric("process_cpu_seconds_total", "counter", "CPU seconds used by the relay process.",
           [("", time.process_time())])
    metric("connections_open", "gauge", "Link connections open now.", [("", counters.connections_open)])
    metric("packets_held", "gauge", "Packets held now.", [("", counters.held)])
    return "\n".join(lines) + "\n"


async def _handle_metrics(stream: trio.SocketStream, counters: RelayCounters) -> None:
    try:
        request = b""
        with trio.move_on_after(_REQUEST_TIMEOUT):
            while b"\r\n\r\n" not in request and len(request) < _REQUEST_LIMIT:
                chunk = await stream.receive_some(_REQUEST_LIMIT - len(request))
                if not chunk:
                    break
                request += chunk
        if request.startswith(b"GET /metrics ") or request.startswith(b"GET / "):
            body = render_prometheus(counters).encode()
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
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
    host: str,
    port: int,
    counters: RelayCounters,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/metrics`` on ``host:port``; reports the bound address when listening."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    task_status.started((str(bound[0]), int(bound[1])))

    async def handler(stream: trio.SocketStream) -> None:
        await _handle_metrics(stream, counters)

    await trio.serve_listeners(handler, listeners)
