"""What every long-running command shows a person: times in local time, and live status.

:class:`StatusBoard` keeps one small table of ``(what, figure)`` rows up to
date: on a terminal it redraws in place (rich's ``Live``); when the output is
piped or redirected it prints the rows as one line whenever they change,
at most once per ``interval`` seconds (a phase change is always printed), so
a log file shows progress while it happens instead of a table at the end.
"""

from __future__ import annotations

import datetime
import math
import sys
import time
from collections.abc import Iterable, Sequence
from typing import IO, Any

__all__ = ["StatusBoard", "clock_time", "duration", "epsilon_in_words", "local_time"]

Rows = Sequence[tuple[str, str]]


def one_of(options: Iterable[object]) -> str:
    """Options as a reader types them (``grr, sue, pq``): an enum's values, never its reprs (``<OracleName.GRR: 'grr'>``)."""
    return ", ".join(str(option) for option in options)


def local_time(unix_seconds: float) -> str:
    """``2026-11-24 14:02:10 CET``: this machine's local time, with its zone's name."""
    moment = datetime.datetime.fromtimestamp(unix_seconds).astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z")


def clock_time(unix_seconds: float) -> str:
    """``14:02:10``: local time of day, for times within the next day."""
    return datetime.datetime.fromtimestamp(unix_seconds).astimezone().strftime("%H:%M:%S")


def duration(seconds: float) -> str:
    """``2 h 5 min``, ``3 min 20 s``, ``45 s``: a span of time in words."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


def epsilon_in_words(epsilon: float) -> str:
    """One plain sentence on what a local-DP epsilon promises (the definition, with e^ε worked out)."""
    return (
        f"Epsilon {epsilon:.3g} means that whatever the aggregator sees from a peer, it is at most "
        f"{math.exp(epsilon):.3g} times (e^{epsilon:.3g}) more likely to see it with the peer's real data than with any "
        "other values in its place, so it can never be sure of anyone's values; smaller epsilon, stronger protection."
    )


class StatusBoard:
    """A live ``(what, figure)`` table on a terminal, periodic one-line summaries otherwise.

    Use as a context manager; call :meth:`update` as often as the figures
    change (cheap: a line is printed only when due).
    """

    def __init__(self, title: str, *, stream: IO[str] | None = None, interval: float = 10.0, live: bool | None = None) -> None:
        self.title = title
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.live = self.stream.isatty() if live is None else live
        self._live: Any = None
        self._last_line: str | None = None
        self._last_key: str | None = None
        self._last_printed = 0.0

    def __enter__(self) -> StatusBoard:
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._table([]), console=Console(file=self.stream), refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def _table(self, rows: Rows) -> Any:
        from rich.table import Table

        table = Table(title=self.title, show_header=False, title_justify="left")
        table.add_column("what", style="bold")
        table.add_column("figure")
        for what, figure in rows:
            table.add_row(what, figure)
        return table

    def update(self, rows: Rows, *, key: str = "") -> None:
        """Show ``rows``; ``key`` (e.g. the phase) forces a printed line whenever it changes."""
        if self._live is not None:
            self._live.update(self._table(rows))
            return
        line = "; ".join(f"{what} {figure}" for what, figure in rows)
        now = time.monotonic()
        changed_key = key != self._last_key
        if changed_key or (line != self._last_line and now - self._last_printed >= self.interval):
            print(f"[{clock_time(time.time())}] {line}", file=self.stream, flush=True)
            self._last_line, self._last_key, self._last_printed = line, key, now

    def note(self, message: str) -> None:
        """A message that stays (an event), printed above the live table or as its own line."""
        if self._live is not None:
            self._live.console.print(message, markup=False, highlight=False)
        else:
            print(f"[{clock_time(time.time())}] {message}", file=self.stream, flush=True)
