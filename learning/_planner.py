"""Choosing the plan, the bins and the combiner for a record-level ``ε_T``
and ``n`` peers, by simulation (DESIGN.md §9).

Candidates (``candidate_choices``): the default, one release per peer
(``kind="one"``, a reserved pool answering the quantile search, every peer
one comparison or one subset report at the full ε_T) with ``k_s`` of 1 or 2,
1 to 3 cut points per numeric feature and two pool sizes (a pool too small
to ask every step of every search runs fewer steps); and the thesis's
split plan (``k_p = 5``, ``k_h = 2``, ``k_s = 3``, every peer also answering
the quantile search) at the same cut points. Every candidate spends exactly
ε_T per peer, the quantile search included.

Simulation. The aggregator has no data before the round, so each candidate
runs the whole private pipeline (:func:`run_trial`) on a synthetic table of
``n`` peers drawn from the spec (:func:`synthetic_table`): numeric values
skewed towards the low end of their public bounds, categories uniform, and a
label that is logistic in every feature with seeded effects. The plan and
cut points with the best mean AUC over ``trials`` simulations win, and with
them the combiner that did best on that plan; within ``NEAR_TIE`` the
simpler candidate (fewer cut points, smaller ``k_s``) wins. The choice is a
:class:`PlanChoice`: the structure a round (or an experiment) builds its
:class:`~anonml.protocol.ReleasePlan` from, for any seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from anonml.learning._data import Table
from anonml.learning._trial import run_trial
from anonml.protocol import (
    DEFAULT_MEDIAN_STEPS,
    CategoricalFeature,
    Combiner,
    FeatureSpec,
    MedianPeers,
    NumericFeature,
    PlanError,
    PlanKind,
    ReleasePlan,
)

MIN_PEERS_PER_PARTITION = 20
# The most peers a round's planning simulates: each candidate trains its
# ensemble on that many synthetic rows per trial; more peers change the
# choice little and cost time at `round new`.
PLANNER_MAX_PEERS = 20_000
NEAR_TIE = 1e-3
QUANTILE_CHOICES = (1, 2, 3)
POOL_CHOICES = (0.1, 0.2)
THESIS_SPLIT = {"k_p": 5, "k_h": 2, "k_s": 3}
# The synthetic label's strength: the spread of the logit's feature part
# (Adult's binned logistic regression reaches AUC 0.885).
_SIGNAL = 3.5


@dataclass(frozen=True)
class PlanChoice:
    """A plan's structure, its bins and its combiner, without a seed."""

    kind: str
    k_p: int
    k_h: int
    k_s: int
    quantiles: int
    median_peers: str
    comparison_pool: float
    median_steps: int
    combiner: str
    oracle: str = "auto"
    simulated_auc: float | None = None  # set by choose_plan
    median_share: float = 0.5
    """The share of ε_T for the comparison answers when every peer answers the search (not a reserved pool)."""

    def spec_for(self, spec: FeatureSpec) -> FeatureSpec:
        """``spec`` with this choice's cut points per numeric feature."""
        return spec.with_quantiles(self.quantiles)

    def build(self, spec: FeatureSpec, epsilon_total: float, seed: bytes) -> ReleasePlan:
        """The release plan for this seed (``spec`` as :meth:`spec_for` returns it)."""
        return ReleasePlan.build(
            kind=self.kind, features=spec.names, numeric_features=spec.numeric_names, k_p=self.k_p, k_h=self.k_h,
            k_s=self.k_s, epsilon_total=epsilon_total, seed=seed, oracle=self.oracle, median_peers=self.median_peers,
            median_steps=self.median_steps, median_share=self.median_share,
            **({"comparison_pool": self.comparison_pool} if self.comparison_pool else {}),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        pool = f" pool={self.comparison_pool:g}" if self.comparison_pool else ""
        return f"{self.kind} kp={self.k_p} kh={self.k_h} ks={self.k_s} q={self.quantiles} {self.median_peers}{pool}"


def candidate_choices(
    spec: FeatureSpec,
    n: int,
    *,
    kinds: Sequence[str] = tuple(PlanKind),
    k_s_values: Sequence[int] = (1, 2),
    quantiles: Sequence[int] = QUANTILE_CHOICES,
    median_steps: int = DEFAULT_MEDIAN_STEPS,
    median_peers: str = MedianPeers.RESERVED,
    median_share: float = 0.5,
) -> list[PlanChoice]:
    """The module docstring's grid, without candidates that leave fewer than
    ``MIN_PEERS_PER_PARTITION`` peers in a partition or a quantile step.

    ``median_peers="all"`` gives the one-release candidates no reserved pool:
    every peer also answers the search, with ``median_share`` of ε_T (what a
    networked round runs today, :func:`choose_round_plan`)."""
    k_f = len(spec.names)
    n_numeric = len(spec.numeric_names)
    out = []
    for q in quantiles if n_numeric else (1,):
        if PlanKind.ONE in kinds:
            for k_s in k_s_values:
                if k_s > k_f:
                    continue
                k_p = math.ceil(k_f / k_s)
                if median_peers == MedianPeers.ALL:
                    if n // k_p >= MIN_PEERS_PER_PARTITION:
                        out.append(PlanChoice(
                            kind=PlanKind.ONE, k_p=k_p, k_h=1, k_s=k_s, quantiles=q, median_peers=MedianPeers.ALL, comparison_pool=0.0,
                            median_steps=median_steps, combiner=Combiner.NAIVE_BAYES, median_share=median_share,
                        ))
                    continue
                for pool in POOL_CHOICES if n_numeric else (0.0,):
                    pool_peers = int(round(pool * n))
                    if (n - pool_peers) // k_p < MIN_PEERS_PER_PARTITION:
                        continue
                    # Each pool peer answers one step of one feature's search about one
                    # cut point: a small pool runs fewer steps (coarser cut points)
                    # rather than leave a step with nobody to ask.
                    steps = min(median_steps, pool_peers // (n_numeric * q)) if n_numeric else median_steps
                    if steps < 1:
                        continue
                    out.append(PlanChoice(
                        kind=PlanKind.ONE, k_p=k_p, k_h=1, k_s=k_s, quantiles=q, median_peers=MedianPeers.RESERVED, comparison_pool=pool,
                        median_steps=steps, combiner=Combiner.NAIVE_BAYES,
                    ))
        if PlanKind.SPLIT in kinds and k_f >= THESIS_SPLIT["k_h"] * THESIS_SPLIT["k_s"] and n // THESIS_SPLIT["k_p"] >= MIN_PEERS_PER_PARTITION:
            out.append(PlanChoice(
                kind=PlanKind.SPLIT, k_p=THESIS_SPLIT["k_p"], k_h=THESIS_SPLIT["k_h"], k_s=THESIS_SPLIT["k_s"], quantiles=q,
                median_peers=MedianPeers.ALL, comparison_pool=0.0, median_steps=median_steps, combiner=Combiner.NAIVE_BAYES,
                median_share=median_share,
            ))
    return out


def round_candidates(
    spec: FeatureSpec, n: int, *, median_rounds: int, median_share: float = 0.5, oracle: str = "auto",
) -> list[PlanChoice]:
    """The plans a networked round of ``n`` peers runs in ``median_rounds`` sub-rounds:

    * every peer answers the quantile search in one sub-round with
      ``median_share`` of ε_T (``median_peers="all"``); each sub-round then
      needs a partition of its own (``k_p >= median_rounds``);
    * a reserved comparison pool (``median_peers="reserved"``): one release
      per peer at the full ε_T, the pool large enough that every step of
      every search has at least one answer per cut point. The simulation
      deals the pool evenly over the features; in a round each pool peer
      draws its feature at random, so the counts differ by sampling noise.
    """
    steps = max(median_rounds, 1)
    every_peer = [
        choice for choice in candidate_choices(
            spec, n, median_steps=steps, median_peers=MedianPeers.ALL, median_share=median_share,
        )
        if not spec.numeric_names or choice.k_p >= median_rounds
    ]
    pooled = [
        choice for choice in candidate_choices(spec, n, kinds=(PlanKind.ONE,), median_steps=steps)
        if choice.median_peers == MedianPeers.RESERVED and choice.median_steps == steps
    ]
    return [dataclasses.replace(choice, oracle=oracle) for choice in [*every_peer, *pooled]]


def choose_round_plan(
    spec: FeatureSpec,
    n: int,
    epsilon_total: float,
    *,
    median_rounds: int,
    median_share: float = 0.5,
    oracle: str = "auto",
    trials: int = 2,
    seed: int = 0,
) -> PlanChoice:
    """The planner's choice for a networked round of about ``n`` peers (a
    round spec's ``plan = "auto"``) among :func:`round_candidates`. Simulates
    at most :data:`PLANNER_MAX_PEERS` peers. Raises :class:`PlanError` when
    no plan fits."""
    simulated = min(n, PLANNER_MAX_PEERS)
    grid = round_candidates(spec, simulated, median_rounds=median_rounds, median_share=median_share, oracle=oracle)
    return choose_plan(spec, simulated, epsilon_total, candidates=grid, trials=trials, seed=seed)


def synthetic_table(spec: FeatureSpec, n: int, rng: np.random.Generator) -> Table:
    """``n`` synthetic rows for the spec (module docstring): numeric values
    ``low + (high - low)·Beta(1.5, 3)`` with a smooth effect, a categorical
    feature's bins equally likely (a category uniform within its bin) with
    one effect per bin, and a label with ``logit = Σ_f effect_f(x_f) + b``,
    ``b`` putting about a quarter of the rows in the positive class."""
    columns: dict[str, np.ndarray] = {}
    logit = np.zeros(n)
    scale = _SIGNAL / math.sqrt(len(spec.features))
    for feature in spec.features:
        if isinstance(feature, NumericFeature):
            position = rng.beta(1.5, 3.0, size=n)
            columns[feature.name] = feature.low + (feature.high - feature.low) * position
            # A random quadratic in the standardised value (the Beta's mean is
            # 1/3, its sd about 0.18): effects need not be monotone (Adult's
            # income rises with age, then falls).
            z = (position - 0.33) / 0.18
            linear, curved = rng.normal(size=2)
            logit += scale * (linear * z + curved * (z * z - 1) / 2)
        else:
            assert isinstance(feature, CategoricalFeature)
            members = [list(cats) for _, cats in feature.buckets] if feature.buckets else [[c] for c in feature.categories]
            bins = rng.integers(0, len(members), size=n)
            within = rng.random(n)
            columns[feature.name] = np.asarray([members[b][int(u * len(members[b]))] for b, u in zip(bins.tolist(), within.tolist())])
            logit += scale * rng.normal(size=len(members))[bins]
    # Shift the intercept so that about a quarter of the rows are positive (Adult: 24%).
    logit += -1.1 - float(np.median(logit))
    positive = rng.random(n) < 1 / (1 + np.exp(-logit))
    negative_value = spec.label.negative[0] if spec.label.negative else f"not {spec.label.positive[0]}"
    return Table(columns, np.where(positive, spec.label.positive[0], negative_value))


def choose_plan(
    spec: FeatureSpec,
    n: int,
    epsilon_total: float,
    *,
    candidates: Sequence[PlanChoice] | None = None,
    trials: int = 2,
    seed: int = 0,
    combiners: Sequence[str] = tuple(Combiner),
) -> PlanChoice:
    """The candidate (``candidate_choices`` by default) with the best mean
    simulated AUC, and its best combiner (module docstring). Raises
    :class:`PlanError` when nothing in the grid is satisfiable."""
    grid = list(candidates) if candidates is not None else candidate_choices(spec, n)
    if not grid:
        raise PlanError(f"no satisfiable plan for n={n!r} and {len(spec.names)} features")
    scored: list[tuple[float, int, PlanChoice]] = []
    for index, choice in enumerate(grid):
        choice_spec = choice.spec_for(spec)
        totals = {str(c): 0.0 for c in combiners}
        for trial in range(trials):
            # The same synthetic peers and the same random stream for every
            # candidate (common random numbers): differences are the plans'.
            rows = synthetic_table(spec, n + min(n, 5000), np.random.default_rng([seed, trial, 0]))
            train, test = rows.rows(np.arange(n)), rows.rows(np.arange(n, rows.n_rows))
            rng = np.random.default_rng([seed, trial, 1])
            plan = choice.build(choice_spec, epsilon_total, rng.bytes(16))
            result = run_trial(choice_spec, train, test, plan, rng, combiners=combiners, epsilon_budget=epsilon_total)
            for combiner, auc in result.aucs.items():
                totals[combiner] += auc / trials
        best_combiner = max(totals, key=lambda c: totals[c])
        scored.append((totals[best_combiner], index, PlanChoice(**{**choice.to_dict(), "combiner": best_combiner, "simulated_auc": totals[best_combiner]})))
    top = max(score for score, _, _ in scored)
    near = [entry for entry in scored if entry[0] >= top - NEAR_TIE]
    return min(near, key=lambda e: (e[2].quantiles, e[2].k_s, e[1]))[2]
