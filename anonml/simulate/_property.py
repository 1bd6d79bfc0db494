"""The anonymity property, and the program that checks it against a strategy.

The aggregator's best guess. From what the adversary saw — its own store
(every accepted report with its survey and arrival time), its HTTP log and
its colluding relays' records — linking estimators guess, for a target peer
and each survey it answered, which report is the target's. Each estimator
is a fixed rule; the verdict keeps the one whose mean success over the
trials is highest (the adversary picks its best rule after the fact, which
only favours it):

* ``second-window``: guess among the reports that arrived in the
  second-chance delivery window when there are any (a resend stands out
  there if every other peer sends a cover), else among all;
* ``uniform``: any report of the survey.

A guess among a set ``C`` succeeds with probability ``1/|C|`` if the target's
report is in ``C``; the estimator is scored by that exact probability, not by
a drawn guess, so the figures carry no extra sampling noise.

The property (DESIGN.md §2): for every strategy, either the mean success over
trials is within ``z`` standard errors of the promised bound, or the attack
is detected — the target holds a stored proof, or refused before sending
anything that identifies it. The promised bound is one over the report's
stated anonymity set: every report's set is the peers of its partition that
sent a real report in the same delivery window, half the partition in
expectation (a peer sends its report in one of the two windows at random and
a cover in the other, so a resend is one report among those of the second
window). The bound used is ``1 / floor(|partition| / 2)``; plain chance,
``1 / |partition|``, is printed beside it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from anonml.protocol import RoundManifest, SurveyId, SurveyKind
from anonml.simulate._adversary import Adversary
from anonml.simulate._world import RoundTrace, SimulationConfig, peer_ip, simulate_round

# Standard errors of slack before a strategy's mean success counts as above the bound.
Z = 3.0


@dataclass(frozen=True)
class TrialScore:
    """One round under one strategy: the estimator's success for its target, and whether the attack was detected."""

    seed: int
    target: int
    success: dict[str, float]
    """Per estimator, its mean probability of naming the target's accepted reports (0 if none reached the aggregator)."""
    chance: float
    bound: float
    detected: str | None
    """The target's refusal reason when it stopped (proof stored, or before sending anything identifying)."""
    reports: int
    outcome: str


def _phase(manifest: RoundManifest, survey: SurveyId) -> tuple[float, float]:
    """The survey's phase: when its second send window opens (t_2) and when it closes for good (t_r)."""
    if survey.kind is SurveyKind.DATA:
        phase = manifest.schedule.data
    else:
        phase = manifest.schedule.median[survey.sub_round]
    return float(phase.t_2), float(phase.t_r)


def _among(candidates: Sequence[bytes], receipt: bytes) -> float:
    """The probability that a uniform guess among ``candidates`` names ``receipt``."""
    return 1.0 / len(candidates) if receipt in candidates else 0.0


ESTIMATORS: dict[str, Callable[[list[tuple[bytes, float]], float], list[bytes]]] = {
    "uniform": lambda entries, t_2: [r for r, _ in entries],
    "second-window": lambda entries, t_2: [r for r, at in entries if at >= t_2] or [r for r, _ in entries],
}
"""Each estimator: from a survey's reports (receipt, arrival) and its second window's start, the set it guesses among."""


def estimate(trace: RoundTrace, target: int) -> tuple[dict[str, float], int]:
    """Each estimator's mean probability of naming ``target``'s report, over its accepted reports; and their count."""
    manifest = trace.manifest.manifest
    by_survey: dict[SurveyId, list[tuple[bytes, float]]] = defaultdict(list)
    for survey, receipt, arrived in trace.arrivals:
        by_survey[survey].append((receipt, arrived))
    mine = [(survey, receipt) for survey, entries in by_survey.items() for receipt, _ in entries
            if trace.senders.get(receipt) == target]
    if not mine:
        return dict.fromkeys(ESTIMATORS, 0.0), 0
    totals = dict.fromkeys(ESTIMATORS, 0.0)
    for survey, receipt in mine:
        t_2, _ = _phase(manifest, survey)
        for name, rule in ESTIMATORS.items():
            totals[name] += _among(rule(by_survey[survey], t_2), receipt)
    return {name: total / len(mine) for name, total in totals.items()}, len(mine)


def score_trial(trace: RoundTrace, target: int) -> TrialScore:
    partition_size = _partition_size(trace, target)
    outcome = trace.peers[target]
    detected = outcome.refused.reason if outcome.refused is not None else None
    success, reports = estimate(trace, target)
    return TrialScore(trace.config.seed, target, success, 1.0 / max(1, partition_size),
                      1.0 / max(1, partition_size // 2), detected, reports, trace.outcome)


def _partition_size(trace: RoundTrace, target: int) -> int:
    result = trace.peers[target].result
    partitions = [p.result.partition for p in trace.peers if p.result is not None and p.result.partition is not None]
    if result is None or result.partition is None:
        return max(1, len(partitions) // max(1, trace.manifest.manifest.partitions))
    return partitions.count(result.partition)


@dataclass(frozen=True)
class StrategyVerdict:
    """A strategy's trials and whether the property held for it."""

    strategy: str
    trials: list[TrialScore]

    @property
    def best(self) -> str:
        """The estimator with the highest mean success over the trials."""
        return max(ESTIMATORS, key=lambda name: sum(t.success[name] for t in self.trials))

    @property
    def success(self) -> float:
        """The best estimator's mean success."""
        best = self.best
        return sum(t.success[best] for t in self.trials) / len(self.trials)

    @property
    def bound(self) -> float:
        return sum(t.bound for t in self.trials) / len(self.trials)

    @property
    def chance(self) -> float:
        return sum(t.chance for t in self.trials) / len(self.trials)

    @property
    def standard_error(self) -> float:
        """Of the mean success; each trial's success lies in [0, 1], so its variance is at most mean·(1 − mean)."""
        n = len(self.trials)
        mean = self.success
        best = self.best
        spread = sum((t.success[best] - mean) ** 2 for t in self.trials) / max(1, n - 1)
        return math.sqrt(max(spread, mean * (1 - mean) / max(1, n)) / n) if n > 1 else math.sqrt(mean * (1 - mean))

    @property
    def detected(self) -> int:
        return sum(1 for t in self.trials if t.detected is not None)

    @property
    def certain_links(self) -> int:
        """Trials in which the best estimator named the target's every report for sure, undetected."""
        best = self.best
        return sum(1 for t in self.trials if t.success[best] >= 1.0 - 1e-9 and t.detected is None)

    @property
    def holds(self) -> bool:
        """Linking within the bound (``Z`` standard errors of slack) and never certain, or every trial detected."""
        within = self.success <= self.bound + Z * self.standard_error and self.certain_links == 0
        return within or self.detected == len(self.trials)

    def as_dict(self) -> dict[str, object]:
        return {
            "strategy": self.strategy, "trials": len(self.trials), "estimator": self.best, "success": round(self.success, 4),
            "chance": round(self.chance, 4), "bound": round(self.bound, 4),
            "standard_error": round(self.standard_error, 4), "detected": self.detected,
            "certain_links": self.certain_links, "holds": self.holds,
            "outcomes": sorted({t.outcome for t in self.trials}),
        }


def check_strategy(name: str, build: Callable[[Sequence[str]], Adversary], config: SimulationConfig,
                   seeds: Sequence[int]) -> StrategyVerdict:
    """Run ``build``'s strategy once per seed, each time against one target peer drawn from the seed."""
    trials = []
    for seed in seeds:
        trial_config = SimulationConfig(**{**config.__dict__, "seed": seed})
        target = seed % trial_config.peers
        trace = simulate_round(trial_config, build([peer_ip(target)]))
        trials.append(score_trial(trace, target))
    return StrategyVerdict(name, trials)
