"""``anonml simulate``: every named strategy and a randomised search, each checked against the anonymity property."""

from __future__ import annotations

import json
import logging
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from anonml.base.process import exit_with_parent
from anonml.simulate._names import StrategyName

if TYPE_CHECKING:
    from anonml.simulate._property import StrategyVerdict, TrialScore
    from anonml.simulate._world import SimulationConfig

# The simulated world is imported when a round runs, so `anonml simulate --help` loads click alone (issue 29).


def run_trial(strategy: str, config: SimulationConfig) -> TrialScore:
    """One round under ``strategy`` against the target the seed names (``random``: a strategy drawn from the seed)."""
    from anonml.simulate._adversary import STRATEGIES, RandomStrategy
    from anonml.simulate._property import score_trial
    from anonml.simulate._world import peer_ip, simulate_round

    logging.disable(logging.WARNING)  # the roles log every refused connection; the verdict is what matters here
    target = config.seed % config.peers
    targets = [peer_ip(target)]
    adversary = RandomStrategy(targets, config.seed) if strategy == "random" else STRATEGIES[StrategyName(strategy)](targets)
    return score_trial(simulate_round(config, adversary), target)


def _row(verdict: StrategyVerdict) -> str:
    worst = verdict.worst
    return (f"{verdict.strategy:<30} {len(verdict.trials):>6} {worst.name:<18} {worst.reports:>7} {worst.success:>8.3f} "
            f"{verdict.chance:>7.3f} {worst.bound:>7.3f} {worst.standard_error:>7.3f} {verdict.detected:>8} "
            f"{'holds' if verdict.holds else 'BROKEN':>7}")


@click.command(name="simulate")
@click.option("--peers", type=click.IntRange(min=4), default=40, show_default=True, help="Peers in each simulated round.")
@click.option("--relays", type=click.IntRange(3, 16), default=4, show_default=True,
              help="Relays in each round (each path crosses 3 of them).")
@click.option("--trials", type=click.IntRange(min=1), default=6, show_default=True,
              help="Rounds per named strategy (each with its own seed and target).")
@click.option("--random", "random_trials", type=click.IntRange(min=0), default=12, show_default=True,
              help="Randomly drawn strategies (one round each), checked together.")
@click.option("--strategy", "strategies", multiple=True, type=click.Choice(sorted(name.value for name in StrategyName)),
              help="Only these named strategies (repeatable; default: all).")
@click.option("--seed", type=int, default=0, show_default=True, help="The first seed; trial i uses seed + i.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="Processes running rounds.")
@click.option("--clock-skew", type=click.FloatRange(0, 3600, max_open=True), default=0.0, show_default=True,
              help="Seconds the target's clock runs slow; every other peer's is off by a uniform draw within as much.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
def simulate(peers: int, relays: int, trials: int, random_trials: int, strategies: tuple[str, ...], seed: int, workers: int,
             clock_skew: float, as_json: bool) -> None:
    """Run whole rounds in process on a virtual clock, each against an adversarial aggregator and relays.

    Every role runs its real code over an in-memory network. For each
    strategy, a linking estimator makes the adversary's best guess of one
    target peer's reports from everything the adversary saw; the property
    holds when that guess is no better than the protocol's stated anonymity
    set allows (within 3 standard errors), or the target detected the
    attack. Exits 1 if any strategy breaks it.
    """
    from anonml.simulate._property import StrategyVerdict
    from anonml.simulate._world import SimulationConfig

    base = SimulationConfig(peers=peers, relays=relays, clock_skew=clock_skew)
    plan: list[tuple[str, SimulationConfig]] = []
    for name in strategies or tuple(StrategyName):
        plan += [(name, replace(base, seed=seed + i)) for i in range(trials)]
    plan += [("random", replace(base, seed=seed + i)) for i in range(random_trials)]
    started = time.monotonic()
    # Each worker ends with this process (exit_with_parent): a SIGKILLed `anonml simulate` shuts no pool down.
    with ProcessPoolExecutor(max_workers=workers, initializer=exit_with_parent) as pool:
        scores = list(pool.map(run_trial, [name for name, _ in plan], [config for _, config in plan]))
    by_strategy: dict[str, list[TrialScore]] = {}
    for (name, _), score in zip(plan, scores, strict=True):
        by_strategy.setdefault(name, []).append(score)
    verdicts = [StrategyVerdict(name, trial_scores) for name, trial_scores in by_strategy.items()]
    seconds = time.monotonic() - started
    if as_json:
        document: dict[str, Any] = {"peers": peers, "relays": relays, "clock_skew": clock_skew,
                                    "seconds": round(seconds, 1), "rounds": len(plan),
                                    "verdicts": [v.as_dict() for v in verdicts]}
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(f"{len(plan)} simulated rounds of {peers} peers and {relays} relays in {seconds:.0f} s")
        click.echo(f"{'strategy':<30} {'trials':>6} {'worst estimator':<18} {'reports':>7} {'success':>8} {'chance':>7} "
                   f"{'bound':>7} {'s.e.':>7} {'detected':>8} {'verdict':>7}")
        for verdict in verdicts:
            click.echo(_row(verdict))
    if not all(v.holds for v in verdicts):
        sys.exit(1)
