"""A round's schedule and the per-hop release windows derived from it.

All times are absolute UTC seconds (integers) in the signed manifest
(DESIGN.md §3). Each query phase — every median sub-round and the data phase —
has a send window ``[t_s, t_s + δ]`` and a delivery window ``(t_s + δ, t_r)``:
peers send at a uniformly random time in the first, relays release so every
packet reaches the aggregator inside the second, at a time independent of when
it was sent (thesis §5, "staggering"; DESIGN.md §7). :func:`hop_windows` turns
one phase into the window every Sphinx hop is told, so the peer (who writes the
windows into the header), the relays and the aggregator all agree without
talking to each other.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from anonml.crypto import ReleaseWindow
from anonml.protocol._canonical import FieldReader, InvalidDocument
from anonml.protocol._survey import SurveyId, SurveyKind

# Far enough in the future for any round, small enough that every role's
# integer arithmetic on times stays exact.
MAX_TIME = 2**40
MAX_MEDIAN_ROUNDS = 64


class InvalidSchedule(InvalidDocument):
    """Raised by :meth:`RoundSchedule.from_dict` and the constructors for an inconsistent schedule."""


class Attempt(enum.IntEnum):
    """Which of a phase's two sending windows a packet travels in (DESIGN.md §3.7)."""

    FIRST = 0
    SECOND = 1
    """The second-chance window: every peer sends one packet per survey, its resend or a cover."""


class Check(enum.IntEnum):
    """A phase's scheduled receipt-log checks: one signed head per survey at each (DESIGN.md §5)."""

    FIRST = 0
    """At ``t_c``, when the first delivery window closes; decides resend or cover."""
    FINAL = 1
    """At ``t_r``, when the second delivery window closes; what counted."""


@dataclass(frozen=True)
class PhaseTimes:
    """One query phase and its second chance (DESIGN.md §3.6-7).

    Peers send in ``[t_s, t_s + delta]``; relays deliver in ``(t_s + delta,
    t_c)``. At ``t_c`` the aggregator publishes one signed receipt-log head
    per survey; in ``[t_c, t_2)`` every peer fetches its partition's log and
    compares the head with a relay's mirror. In ``[t_2, t_2 + delta_2]``
    every peer sends one packet per survey it answered (its resend or a
    cover), delivered in ``(t_2 + delta_2, t_r)``; at ``t_r`` the final heads.
    """

    t_s: int
    delta: int
    t_c: int
    t_2: int
    delta_2: int
    t_r: int

    def __post_init__(self) -> None:
        for name in ("t_s", "delta", "t_c", "t_2", "delta_2", "t_r"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIME:
                raise InvalidSchedule(name, f"expected an integer in [0, {MAX_TIME}], got {value!r}")
        if self.delta < 1 or self.delta_2 < 1:
            raise InvalidSchedule("delta", f"send windows need delta >= 1, got {self!r}")
        if self.t_c <= self.send_end:
            raise InvalidSchedule("t_c", f"t_c={self.t_c!r} must be after the send window ends at {self.send_end!r}")
        if self.t_2 <= self.t_c:
            raise InvalidSchedule("t_2", f"t_2={self.t_2!r} must leave time to check the log after t_c={self.t_c!r}")
        if self.t_r <= self.second_send_end:
            raise InvalidSchedule("t_r", f"t_r={self.t_r!r} must be after the second send window ends at {self.second_send_end!r}")

    @property
    def send_end(self) -> int:
        return self.t_s + self.delta

    @property
    def second_send_end(self) -> int:
        return self.t_2 + self.delta_2

    def send_window(self, attempt: Attempt) -> tuple[int, int]:
        """``[start, end]``: when a peer hands the packet of ``attempt`` to its first relay."""
        return (self.t_s, self.send_end) if attempt is Attempt.FIRST else (self.t_2, self.second_send_end)

    def delivery_window(self, attempt: Attempt) -> tuple[int, int]:
        """``(start, end)``: when the relays deliver the packets of ``attempt``."""
        return (self.send_end, self.t_c) if attempt is Attempt.FIRST else (self.second_send_end, self.t_r)

    def check_time(self, check: Check) -> int:
        """When the aggregator's signed heads for ``check`` are due (they cover what arrived before it)."""
        return self.t_c if check is Check.FIRST else self.t_r

    def to_dict(self) -> dict[str, int]:
        return {"t_s": self.t_s, "delta": self.delta, "t_c": self.t_c, "t_2": self.t_2, "delta_2": self.delta_2, "t_r": self.t_r}

    @classmethod
    def read(cls, reader: FieldReader) -> PhaseTimes:
        values = [
            reader.integer(name, 1 if name.startswith("delta") else 0, MAX_TIME)
            for name in ("t_s", "delta", "t_c", "t_2", "delta_2", "t_r")
        ]
        reader.done()
        try:
            return cls(*values)
        except InvalidSchedule as exc:
            reader.fail(exc.field, str(exc).split(": ", 1)[1])


@dataclass(frozen=True)
class RoundSchedule:
    """When each phase of a round happens (DESIGN.md §3).

    ``median[i]`` is median sub-round ``i`` (partitions ``p`` with
    ``p % len(median) == i`` answer in it);
    thresholds for sub-round ``i`` are published when sub-round ``i-1``'s
    delivery window closes, so each sub-round starts no earlier than the
    previous one's ``t_r``. Registration ends before issuance ends, and
    issuance ends before the first query phase.
    """

    t_register_end: int
    t_issue_end: int
    median: tuple[PhaseTimes, ...]
    data: PhaseTimes

    def __post_init__(self) -> None:
        def fail(field: str, message: str) -> None:
            raise InvalidSchedule(f"schedule.{field}", message)

        for name in ("t_register_end", "t_issue_end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIME:
                fail(name, f"expected an integer time in [0, {MAX_TIME}], got {value!r}")
        if self.t_issue_end <= self.t_register_end:
            fail("t_issue_end", f"{self.t_issue_end!r} must be after t_register_end={self.t_register_end!r}")
        if len(self.median) > MAX_MEDIAN_ROUNDS:
            fail("median", f"{len(self.median)} sub-rounds exceed the limit of {MAX_MEDIAN_ROUNDS}")
        previous_end, previous_name = self.t_issue_end, "t_issue_end"
        for index, phase in enumerate(self.phases):
            name = f"median[{index}]" if index < len(self.median) else "data"
            if not isinstance(phase, PhaseTimes):
                fail(name, f"expected PhaseTimes, got {phase!r}")
            if phase.t_s < previous_end:
                fail(f"{name}.t_s", f"{phase.t_s!r} must not be before {previous_name}={previous_end!r}")
            previous_end, previous_name = phase.t_r, f"{name}.t_r"

    @property
    def phases(self) -> tuple[PhaseTimes, ...]:
        """Every query phase in time order: the median sub-rounds, then data."""
        return (*self.median, self.data)

    @property
    def end(self) -> int:
        """When the last delivery window closes and learning can start."""
        return self.data.t_r

    def phase_of(self, survey: SurveyId) -> PhaseTimes:
        """The phase whose windows apply to ``survey``; raises InvalidSchedule if there is none."""
        if survey.kind == SurveyKind.DATA:
            return self.data
        if survey.sub_round >= len(self.median):
            raise InvalidSchedule(
                "schedule.median", f"no median sub-round {survey.sub_round!r} (the round has {len(self.median)})"
            )
        return self.median[survey.sub_round]

    def to_dict(self) -> dict[str, Any]:
        return {
            "t_register_end": self.t_register_end,
            "t_issue_end": self.t_issue_end,
            "median": [phase.to_dict() for phase in self.median],
            "data": self.data.to_dict(),
        }

    @classmethod
    def from_dict(cls, value: object, *, path: str = "schedule") -> RoundSchedule:
        return cls.read(FieldReader(value, path, InvalidSchedule))

    @classmethod
    def read(cls, reader: FieldReader) -> RoundSchedule:
        """Read from an open reader; field errors are raised as the reader's exception type."""
        t_register_end = reader.integer("t_register_end", 0, MAX_TIME)
        t_issue_end = reader.integer("t_issue_end", 0, MAX_TIME)
        median = tuple(
            PhaseTimes.read(reader.nested(item, f"{reader.name('median')}[{index}]"))
            for index, item in enumerate(reader.items("median", max_items=MAX_MEDIAN_ROUNDS))
        )
        data = PhaseTimes.read(reader.child("data"))
        reader.done()
        try:
            return cls(t_register_end, t_issue_end, median, data)
        except InvalidSchedule as exc:
            # Re-raise as the caller's exception type, keeping the field name.
            reader.fail(exc.field.removeprefix("schedule."), str(exc).split(": ", 1)[1])


class RoundPhase(enum.StrEnum):
    """Where a round is, as ``GET /v1/status`` reports it.

    ``waiting`` is a gap between query phases; ``learning``, ``done``,
    ``degraded`` and ``failed`` come after the data phase (``failed``:
    minimum participation missed, or too few reports for a survey when the
    spec says so; ``degraded``: a model was learnt although some survey got
    fewer reports than the spec's minimum); ``done``, ``degraded`` and
    ``failed`` are the round's outcomes.
    """

    REGISTRATION = "registration"
    ISSUANCE = "issuance"
    MEDIAN = "median"
    WAITING = "waiting"
    DATA = "data"
    LEARNING = "learning"
    DONE = "done"
    DEGRADED = "degraded"
    FAILED = "failed"


PHASES = tuple(phase.value for phase in RoundPhase)


def phase_at(schedule: RoundSchedule, now: int) -> tuple[RoundPhase, int | None]:
    """The scheduled phase at time ``now`` and, in the median phase, its sub-round.

    A query phase lasts from its ``t_s`` until its ``t_r``; after the data
    phase's ``t_r`` the schedule says ``learning`` (the service reports
    ``done``/``degraded``/``failed`` once it knows).
    """
    if now < schedule.t_register_end:
        return RoundPhase.REGISTRATION, None
    if now < schedule.t_issue_end:
        return RoundPhase.ISSUANCE, None
    for index, phase in enumerate(schedule.median):
        if phase.t_s <= now < phase.t_r:
            return RoundPhase.MEDIAN, index
    if schedule.data.t_s <= now < schedule.data.t_r:
        return RoundPhase.DATA, None
    if now >= schedule.data.t_r:
        return RoundPhase.LEARNING, None
    return RoundPhase.WAITING, None


def acceptance_window(schedule: RoundSchedule, survey: SurveyId) -> tuple[int, int]:
    """``(start, end)``: the aggregator accepts a packet for ``survey`` when ``start <= now < end``.

    From the end of the first send window to ``t_r``: both delivery windows
    and the check gap between them (a first packet that arrives after
    ``t_c`` is late for the first check but still counts, once). At ``t_r``
    the phase's results are computed, so ``end`` itself is outside.
    """
    phase = schedule.phase_of(survey)
    return phase.send_end, phase.t_r


SECOND_WINDOW_PATHS = 2
"""Independent paths every packet of a phase's second send window takes, each its own Sphinx packet sent at its
own uniform time: the report kept for that window, a resend and a cover alike (DESIGN.md §3.7, §5: "every packet
goes over several paths"). Nothing after the second window repairs a report in it (the final check has no later
window), so a report lost there on one path arrives by the other. The count is the same for every peer and
survey, so it tells a relay or the aggregator nothing about which packet carries what; the aggregator counts
two copies of one message once (``duplicate``). The first window keeps one path: the first check repairs it."""


def first_hop_guard(delivery_seconds: int, n_relays: int) -> int:
    """Seconds between a send window's end and the opening of the first relay's window (:func:`hop_windows`).

    A quarter of an even slice of the delivery window, and at least one
    second (times are whole seconds). Why the first relay, and only it: a
    relay draws a packet's release time uniformly in ``[max(now, a), b]``
    (``relay._server``), so a packet it takes in after ``a``, or stores after
    its drawn time, is released in what is left of the window, later the
    later it came. At the first relay, intake follows the send: the packets
    of peers that sent near the end of the send window, whose clocks run
    slow, or that queued behind the relay's backlog or its commit would be
    the ones taken in late, and their arrival at the aggregator would follow
    their send order. At a later hop, intake follows the previous hop's
    release time, which was drawn independently of the send whenever the
    first relay held the packet from before its window opened; a late intake
    there changes how releases spread over the window, not their
    independence from the send. So a packet that reaches its first relay
    and is stored within the guard of the send window's end is released at a
    time independent of its send time all the way to the aggregator. Relays
    count the packets they take in after their window opened or store after
    their drawn time (``relay.LateIntake``), so a guard too short for the lag
    a round meets shows.
    """
    return max(1, delivery_seconds // (4 * (n_relays + 1)))


def hop_slice(delivery_seconds: int, n_relays: int) -> int:
    """Each relay's window length in a delivery window of ``delivery_seconds`` (:func:`hop_windows`): what is
    left after the first hop's guard, cut into ``n_relays + 1`` equal whole seconds (0: the window is too short)."""
    return (delivery_seconds - first_hop_guard(delivery_seconds, n_relays)) // (n_relays + 1)


def shortest_delivery(slice_seconds: int, n_relays: int) -> int:
    """The shortest delivery window whose relay windows last at least ``slice_seconds`` (:func:`hop_slice`)."""
    if slice_seconds < 1:
        raise ValueError(f"slice_seconds must be at least 1, got {slice_seconds!r}")
    delivery = slice_seconds * (n_relays + 1)
    # The guard is at most a quarter of a slice: a few steps at most.
    while hop_slice(delivery, n_relays) < slice_seconds:
        delivery += 1
    return delivery


def hop_windows(schedule: RoundSchedule, survey: SurveyId, n_relays: int, attempt: Attempt = Attempt.FIRST) -> list[ReleaseWindow]:
    """The release window of each Sphinx hop for ``survey``: ``n_relays`` relays, then the aggregator.

    The delivery window ``(start, end)`` of ``attempt`` begins with a guard
    (:func:`first_hop_guard`); the rest is cut into ``n_relays + 1`` equal
    integer slices. Relay ``k`` releases inside slice ``k``: no relay releases
    before the send window has closed and the guard passed, and each hop's
    window opens only when the previous hop's has closed, so a packet's
    arrival time is independent of its send time (DESIGN.md §7) as long as it
    reaches its first relay within the guard. The last slice is slack for
    link latency; the aggregator's window is the whole acceptance window
    (:func:`acceptance_window`). Resends and covers follow the same rule over
    the second delivery window.
    """
    if not 1 <= n_relays <= 16:
        raise InvalidSchedule("path_length", f"n_relays must be in [1, 16], got {n_relays!r}")
    start, end = schedule.phase_of(survey).delivery_window(attempt)
    slice_length = hop_slice(end - start, n_relays)
    if slice_length < 1:
        raise InvalidSchedule(
            "schedule",
            f"delivery window of {end - start!r} s is too short for {n_relays!r} relays (needs {n_relays + 2}: "
            "the first hop's guard and a second per slice)",
        )
    first = start + first_hop_guard(end - start, n_relays)
    windows = [ReleaseWindow(first + k * slice_length, first + (k + 1) * slice_length) for k in range(n_relays)]
    windows.append(ReleaseWindow(*acceptance_window(schedule, survey)))
    return windows
