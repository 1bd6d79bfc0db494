"""``anonml aggregator run``'s live status: phase, time left, counts per phase, rejections.

On a terminal a table redraws in place; piped, a line is printed when the
phase changes and at most every ten seconds while the counts change
(:class:`anonml.base.display.StatusBoard`).
"""

from __future__ import annotations

import trio

from anonml.aggregator._round import RoundState
from anonml.base.display import StatusBoard, clock_time, duration
from anonml.protocol import RoundSchedule, RoundStatus

_POLL_SECONDS = 1.0


def next_deadline(schedule: RoundSchedule, phase: str, sub_round: int | None, now: int) -> tuple[str, int] | None:
    """What ends next in ``phase`` and when: ``("registration closes", t)``."""
    if phase == "registration":
        return "registration closes", schedule.t_register_end
    if phase == "issuance":
        return "credential issuance closes", schedule.t_issue_end
    if phase == "median" and sub_round is not None:
        window = schedule.median[sub_round]
        return (f"median sub-round {sub_round} sending closes", window.send_end) if now < window.send_end else (
            f"median sub-round {sub_round} delivery closes", window.t_r)
    if phase == "data":
        window = schedule.data
        return ("data sending closes", window.send_end) if now < window.send_end else ("data delivery closes", window.t_r)
    if phase == "waiting":
        upcoming = [w.t_s for w in (*schedule.median, schedule.data) if w.t_s > now]
        return ("next send window opens", min(upcoming)) if upcoming else None
    return None


def status_rows(status: RoundStatus, schedule: RoundSchedule, min_participation: int) -> list[tuple[str, str]]:
    """The rows of the live table (also one piped line, joined)."""
    counts = status.counts
    phase = status.phase + (f" {status.sub_round}" if status.sub_round is not None else "")
    rows = [("phase", phase)]
    deadline = next_deadline(schedule, status.phase, status.sub_round, status.now)
    if deadline is not None:
        what, when = deadline
        rows.append(("next", f"{what} at {clock_time(when)} (in {duration(when - status.now)})"))
    rows += [
        ("registered", f"{counts.get('registered', 0)} (at least {min_participation} needed)"),
        ("credentials", str(counts.get("credentials", 0))),
        ("accepted packets", f"{counts.get('accepted', 0)} ({counts.get('awaiting-verification', 0)} awaiting verification)"),
        ("rejected", ", ".join(f"{reason} {n}" for reason, n in sorted(status.rejected.items())) or "none"),
    ]
    return rows


async def watch_round(state: RoundState, *, interval: float = 10.0) -> None:
    """Show the round's status until cancelled (the round's end cancels it)."""
    schedule, needed = state.manifest.schedule, state.manifest.min_participation
    with StatusBoard(f"round {state.manifest.name} ({state.round_id.hex()[:16]})", interval=interval) as board:
        try:
            while True:
                status = state.status()
                board.update(status_rows(status, schedule, needed), key=status.phase + str(status.sub_round))
                await trio.sleep(_POLL_SECONDS)
        finally:
            # The last figures stay on screen (or in the log) when the round ends.
            status = state.status()
            board.update(status_rows(status, schedule, needed), key="final")
