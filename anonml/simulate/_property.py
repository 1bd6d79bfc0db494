"""The anonymity property, and the program that checks it against a strategy.

The aggregator's best guess. From what the adversary saw and did — its own
store (every accepted report with its survey and arrival time), its HTTP log
with the answers it held back, and its colluding relays' records — linking
estimators guess, for a target peer and each survey it answered, which
report is the target's. Each is a fixed rule, and some speak only when the
adversary's own observations say the rule applies (conditioning on what it
saw is its right):

* ``uniform``: any report of the survey;
* ``second-window``: the reports that arrived in the second-chance delivery
  window when there are any (a resend stands out there if every other peer
  sends a cover), else any;
* ``after-drop``: the second window's reports, for a phase in which a
  colluding relay dropped one of the target's packets;
* ``after-late-answer``: the second window's reports, for a phase whose
  document the aggregator answered the target only after its first send
  window had closed;
* ``after-work``: the second window's reports, for a phase in which a
  colluding first relay asked the target for work in the first window
  (``_work``: the target's report moved out of it, if anything moved it);
* ``late-after-work``: the latest-arriving quarter of the first delivery
  window's reports, for such a phase (a send the work made late, if the
  hops after the first did not re-time it);
* ``isolated``: certainty, when the target went on in a round the adversary
  ran for it alone (:attr:`AdversaryView.isolated`): every report it sends
  there is its own. It scores the round once, as one report named.

A guess among a set ``C`` succeeds with probability ``1/|C|`` if the target's
report is in ``C``; each report is scored by that exact probability, not by
a drawn guess, so the figures carry no extra sampling noise. Every rule's
mean over the reports it spoke on is checked; the verdict names the worst.

The property (DESIGN.md §2): for every strategy, either the mean success over
trials is within ``z`` standard errors of the promised bound, or the attack
is detected — the target holds a stored proof, or refused before sending
anything that identifies it. The promised bound is one over the report's
stated anonymity set: every report's set is the peers of its partition that
sent a real report in the same delivery window, half the partition in
expectation (a peer sends its report in one of the two windows at random and
a cover in the other, so a resend is one report among those of the second
window). The bound used is ``1 / floor(|partition| / 2)``; plain chance,
``1 / |partition|``, is printed beside it. ``|partition|`` counts honest
peers only, and is their even share (the round's honest peers over its
partitions), not the size the target's partition came to: Sybil
registrations the adversary ground into it must show as a success above the
bound, not as a smaller promise. (An even share assumes partitions of one
size: a round with a comparison pool would need each partition's own share.)
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from anonml.protocol import PATH_MEDIANS, PhaseTimes, RoundManifest, SurveyId, SurveyKind
from anonml.simulate._world import RoundTrace

# Standard errors of slack before a strategy's mean success counts as above the bound.
Z = 3.0


@dataclass(frozen=True)
class TrialScore:
    """One round under one strategy: each estimator's success on the target's reports, and whether it detected the attack."""

    seed: int
    target: int
    success: dict[str, list[float]]
    """Per estimator, its probability of naming each of the target's accepted reports it spoke on."""
    chance: float
    bound: float
    detected: str | None
    """The target's refusal reason when it stopped (proof stored, or before sending anything identifying)."""
    reports: int
    outcome: str


def _phase(manifest: RoundManifest, survey: SurveyId) -> PhaseTimes:
    return manifest.schedule.data if survey.kind is SurveyKind.DATA else manifest.schedule.median[survey.sub_round]


def _document_phase(manifest: RoundManifest, path: str) -> PhaseTimes | None:
    """The phase whose reports depend on the document at ``path`` (thresholds or medians), if any."""
    schedule = manifest.schedule
    if path == PATH_MEDIANS:
        return schedule.data
    head, _, index = path.rpartition("/")
    if head == "/v1/median" and index.isdecimal() and int(index) < len(schedule.median):
        return schedule.median[int(index)]
    return None


@dataclass(frozen=True)
class Evidence:
    """What the adversary knows of one of the target's surveys: its reports, and what it did in that phase."""

    reports: list[tuple[bytes, float]]
    """Every accepted report of the survey: its receipt and when it arrived."""
    second_window: float
    dropped: bool
    """A colluding relay dropped a packet of the target's in this phase's first send or delivery window."""
    held: bool
    """The aggregator answered the target a document of this phase only after the phase's first send window."""
    worked: bool
    """A colluding first relay asked work of a frame of the target's in this phase's first send or delivery window."""

    def all(self) -> list[bytes]:
        return [receipt for receipt, _ in self.reports]

    def late(self) -> list[bytes]:
        """The second window's reports when there are any, else all."""
        return [receipt for receipt, arrived in self.reports if arrived >= self.second_window] or self.all()

    def latest_first(self) -> list[bytes]:
        """The latest-arriving quarter (at least one) of the first delivery window's reports, when there are any, else all."""
        first = sorted((arrived, receipt) for receipt, arrived in self.reports if arrived < self.second_window)
        return [receipt for _, receipt in first[-max(1, len(first) // 4):]] or self.all()


ESTIMATORS: dict[str, Callable[[Evidence], list[bytes] | None]] = {
    "uniform": Evidence.all,
    "second-window": Evidence.late,
    "after-drop": lambda e: e.late() if e.dropped else None,
    "after-late-answer": lambda e: e.late() if e.held else None,
    "after-work": lambda e: e.late() if e.worked else None,
    "late-after-work": lambda e: e.latest_first() if e.worked else None,
}
"""Each estimator: the set of reports it guesses among, or None where it does not speak."""
ISOLATED = "isolated"
ESTIMATOR_NAMES = (*ESTIMATORS, ISOLATED)
"""Every estimator a verdict weighs: the rules over reports, and ``isolated`` (a round run for the target alone)."""


def evidence(trace: RoundTrace, target: int) -> list[tuple[bytes, Evidence]]:
    """For each accepted report of ``target``: its receipt and what the adversary knows of its survey."""
    manifest = trace.manifest.manifest
    address = trace.peers[target].address
    by_survey: dict[SurveyId, list[tuple[bytes, float]]] = defaultdict(list)
    for survey, receipt, arrived in trace.arrivals:
        by_survey[survey].append((receipt, arrived))
    found = []
    for survey, reports in by_survey.items():
        for receipt, _ in reports:
            if trace.senders.get(receipt) != target:
                continue
            phase = _phase(manifest, survey)
            first_window = [f for f in trace.view.frames if f.source == address and phase.t_s <= f.at < phase.t_c]
            dropped = any(f.dropped for f in first_window)
            worked = any(f.work_bits > 0 for f in first_window)
            held = any(record.address == address and _document_phase(manifest, record.path) is phase
                       and answered > phase.send_end for record, answered in trace.view.held)
            found.append((receipt, Evidence(reports, float(phase.t_2), dropped, held, worked)))
    return found


def estimate(trace: RoundTrace, target: int) -> tuple[dict[str, list[float]], int]:
    """Per estimator, its probability of naming each of ``target``'s accepted reports it spoke on; and their count."""
    scores: dict[str, list[float]] = {name: [] for name in ESTIMATOR_NAMES}
    found = evidence(trace, target)
    scores[ISOLATED] = [1.0] if trace.peers[target].address in trace.view.isolated else []
    for receipt, known in found:
        for name, rule in ESTIMATORS.items():
            guess = rule(known)
            if guess is not None:
                scores[name].append(1.0 / len(guess) if receipt in guess else 0.0)
    return scores, len(found)


def score_trial(trace: RoundTrace, target: int) -> TrialScore:
    partition_size = _partition_size(trace)
    outcome = trace.peers[target]
    detected = outcome.refused.reason if outcome.refused is not None else None
    success, reports = estimate(trace, target)
    return TrialScore(trace.config.seed, target, success, 1.0 / max(1, partition_size),
                      1.0 / max(1, partition_size // 2), detected, reports, trace.outcome)


def _partition_size(trace: RoundTrace) -> int:
    """The honest peers' even share of a partition: what an unbiased deal of the round's peers gives the target."""
    return max(1, len(trace.peers) // max(1, trace.manifest.manifest.partitions))


@dataclass(frozen=True)
class EstimatorFigure:
    """One estimator over a strategy's trials: its mean success on the reports it spoke on, against the bound."""

    name: str
    reports: int
    success: float
    bound: float
    standard_error: float

    @property
    def margin(self) -> float:
        """How far above its allowance (bound plus ``Z`` standard errors) the success is; positive breaks the property."""
        return self.success - self.bound - Z * self.standard_error


@dataclass(frozen=True)
class StrategyVerdict:
    """A strategy's trials and whether the property held for it."""

    strategy: str
    trials: list[TrialScore]

    def figure(self, name: str) -> EstimatorFigure:
        scored = [(value, trial.bound) for trial in self.trials for value in trial.success.get(name, [])]
        n = len(scored)
        if n == 0:
            return EstimatorFigure(name, 0, 0.0, 0.0, 0.0)
        mean = sum(value for value, _ in scored) / n
        bound = sum(b for _, b in scored) / n
        # Each value lies in [0, 1]; the Bernoulli variance mean·(1 − mean) bounds the spread from below when the
        # sample's own is smaller (a run of identical values must not claim zero uncertainty unless it is 0 or 1).
        spread = sum((value - mean) ** 2 for value, _ in scored) / max(1, n - 1)
        return EstimatorFigure(name, n, mean, bound, math.sqrt(max(spread, mean * (1 - mean)) / n))

    @property
    def worst(self) -> EstimatorFigure:
        """The estimator that comes closest to (or furthest past) its allowance."""
        figures = [self.figure(name) for name in ESTIMATOR_NAMES]
        return max((f for f in figures if f.reports), key=lambda f: f.margin, default=figures[0])

    @property
    def chance(self) -> float:
        return sum(t.chance for t in self.trials) / len(self.trials)

    @property
    def detected(self) -> int:
        return sum(1 for t in self.trials if t.detected is not None)

    @property
    def holds(self) -> bool:
        """Every estimator within its allowance, or the attack detected in every trial."""
        return self.worst.margin <= 0 or self.detected == len(self.trials)

    def as_dict(self) -> dict[str, object]:
        worst = self.worst
        return {
            "strategy": self.strategy, "trials": len(self.trials), "estimator": worst.name, "reports": worst.reports,
            "success": round(worst.success, 4), "chance": round(self.chance, 4), "bound": round(worst.bound, 4),
            "standard_error": round(worst.standard_error, 4), "detected": self.detected, "holds": self.holds,
            "outcomes": sorted({t.outcome for t in self.trials}),
        }
