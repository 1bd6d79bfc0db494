"""Whether the aggregator's stores are committing, and what its listeners refused.

A failing commit (a full or read-only disk) never stops the service (issue
13): the part that failed retries with backoff, refuses what it cannot make
durable (BUSY on the link, 503 on the API), and marks itself here until a
commit succeeds again. ``GET /v1/status`` shows each failing part as a count
``unhealthy/<part>``, and ``GET /metrics`` as ``anonml_aggregator_healthy``.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


class Part(enum.StrEnum):
    """The parts of the service that commit to the round's store."""

    INBOX = "inbox"  # the packet sink's intake
    VERIFIER = "verifier"
    REGISTRATIONS = "registrations"
    CREDENTIALS = "credentials"


@dataclass
class Health:
    """Failing parts (with their last error), failures and refusals, by label."""

    failing: dict[Part, str] = field(default_factory=dict)
    failures: Counter[Part] = field(default_factory=Counter)
    http: Counter[str] = field(default_factory=Counter)
    """HTTP connections refused at the gate (``refused/<limit>``) and requests ended by the client."""

    @property
    def healthy(self) -> bool:
        return not self.failing

    def fail(self, part: Part, error: BaseException) -> None:
        if part not in self.failing:
            log.error("%s: commits fail (%s); retrying, and refusing what cannot be stored", part, error)
        self.failing[part] = str(error)
        self.failures[part] += 1

    def recover(self, part: Part) -> None:
        if self.failing.pop(part, None) is not None:
            log.warning("%s: commits succeed again", part)

    def status_counts(self) -> dict[str, int]:
        """What ``GET /v1/status`` adds to its counts."""
        return {
            **{f"unhealthy/{part}": 1 for part in sorted(self.failing)},
            **{f"http/{label}": count for label, count in sorted(self.http.items())},
        }


class _Collector(Collector):
    def __init__(self, health: Health, link_errors: Counter[str], inbox: int) -> None:
        self._health, self._link_errors, self._inbox = health, link_errors, inbox

    def collect(self) -> Iterator[Metric]:
        prefix = "anonml_aggregator_"
        yield GaugeMetricFamily(prefix + "healthy", "1 while every store commits.", value=int(self._health.healthy))
        failing = GaugeMetricFamily(prefix + "part_failing", "1 for each part whose commits fail.", labels=["part"])
        failures = CounterMetricFamily(prefix + "store_failures", "Failed commits, by part.", labels=["part"])
        for part in Part:
            failing.add_metric([part], int(part in self._health.failing))
            failures.add_metric([part], self._health.failures[part])
        yield failing
        yield failures
        link = CounterMetricFamily(prefix + "sink_link_errors", "Packet-sink sessions ended by an error, by reason.",
                                   labels=["reason"])
        for reason, count in sorted(self._link_errors.items()):
            link.add_metric([reason], count)
        yield link
        http = CounterMetricFamily(prefix + "http_events", "HTTP connections refused and requests ended by clients.",
                                   labels=["event"])
        for event, count in sorted(self._health.http.items()):
            http.add_metric([event], count)
        yield http
        yield GaugeMetricFamily(prefix + "inbox", "Messages stored and awaiting verification.", value=self._inbox)
        yield CounterMetricFamily(prefix + "process_cpu_seconds", "CPU seconds of the service process.",
                                  value=time.process_time())


def render_metrics(health: Health, link_errors: Counter[str], inbox: int) -> bytes:
    """The aggregator's health and refusals in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(health, link_errors, inbox))
    return generate_latest(registry)
