"""Choosing a release plan, ``k_p``, ``k_h``, ``k_s`` and the oracle for given
``n``, features and ``ε_T`` (DESIGN.md §9).

Objective. The ensemble's members are (near-)additive in their features, so
what the ensemble learns about feature ``f`` is, to first order, its joint
distribution with the label. Each histogram holding ``f`` gives an unbiased
estimate of that (feature, label) marginal, by summing cells; with
independent cell errors the summed cells' total squared error equals the
histogram's (thesis eq. 7.2, squared). Averaging the ``r_f`` histograms that
hold ``f`` divides it by ``r_f`` (their peers are disjoint). The planner
minimises the mean over features of

    J_f = (1 / r_f²) · Σ_{h ∋ f} Var_h / n_h²,

where ``Var_h`` is the oracle's exact expected total squared error over the
``m_h`` counts from ``n_h`` peers (``FrequencyOracle.variance``), for the
oracle the mechanisms policy picks (``"auto"``: lowest variance). A feature no
histogram holds makes the plan infeasible. Among plans within a relative
``NEAR_TIE`` (0.1%: partition sizes differ by rounding) of the best, the
one with the fewest histograms wins, then the smaller ``k_s``. The objective
is flat in ``k_p`` (each histogram's error grows as ``1/n_h`` while the pool
grows as ``k_p``), but it leaves out the bias of post-processing (clipping
negative counts), which is larger relative to smaller partitions: on Adult,
20 trials at ε_T = 1 gave AUC 0.8654 ± 0.0047 with 12 partitions and
0.8623 ± 0.0046 with 36 for the same ``k_s = 1`` plan.

What the objective does not see: the value of joint feature information
(larger ``k_s``). It therefore prefers ``k_s = 1``, which the thesis found
usually best (§8.4). On Adult (10 trials, ε_T = 1, 2, 4) ``k_s = 1`` is best
under eq. 6.2's vote by 0.015–0.03 AUC, while under the soft vote
``k_s = 2–3`` is ahead by at most 0.003; ``anonml experiment --ks`` measures it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from anonml.mechanisms import make_oracle
from anonml.protocol import DEFAULT_MEDIAN_STEPS, FeatureSpec, PlanError, ReleasePlan

MIN_PEERS_PER_PARTITION = 20
SPLIT_PARTITIONS = (1, 2, 4, 5, 8, 10, 16, 20)
NEAR_TIE = 1e-3


@dataclass(frozen=True)
class PlanScore:
    """One candidate and its objective value (lower is better)."""

    plan: ReleasePlan
    objective: float
    n_histograms: int


@lru_cache(maxsize=4096)
def _type_error(epsilon: float, m: int, n: int) -> tuple[str, float]:
    """(oracle name, expected squared L2 error of the type estimate)."""
    oracle = make_oracle("auto", epsilon, m, n=n)
    return oracle.name, float(oracle.variance(n)) / (n * n)


def plan_objective(spec: FeatureSpec, plan: ReleasePlan, n: int) -> float:
    """The module docstring's objective for ``plan`` on ``n`` peers."""
    sizes = [n // plan.k_p + (1 if p < n % plan.k_p else 0) for p in range(plan.k_p)]
    if min(sizes) < 1:
        return math.inf
    error_sum = {name: 0.0 for name in spec.names}
    holders = {name: 0 for name in spec.names}
    for p, subsets in enumerate(plan.subsets):
        for subset in subsets:
            _, error = _type_error(plan.release_epsilon, spec.domain_size(subset), sizes[p])
            for name in subset:
                error_sum[name] += error
                holders[name] += 1
    if min(holders.values()) == 0:
        return math.inf
    return sum(error_sum[f] / holders[f] ** 2 for f in spec.names) / len(spec.names)


def candidate_plans(
    spec: FeatureSpec,
    n: int,
    epsilon_total: float,
    seed: bytes,
    *,
    kinds: Sequence[str] = ("split", "one"),
    k_s_values: Sequence[int] | None = None,
    k_p_values: Sequence[int] | None = None,
    median_peers: Sequence[str] = ("all", "disjoint"),
) -> list[ReleasePlan]:
    """Every satisfiable plan in the search grid (``k_s`` up to 4, ``k_p``
    from a grid, every ``k_h`` for the split plan), with at least
    ``MIN_PEERS_PER_PARTITION`` peers per partition."""
    k_f = len(spec.names)
    k_s_grid = list(k_s_values) if k_s_values else list(range(1, min(4, k_f) + 1))
    plans = []
    for kind in kinds:
        for k_s in k_s_grid:
            if kind == "one":
                cover = math.ceil(k_f / k_s)
                k_p_grid = list(k_p_values) if k_p_values else sorted({cover, 2 * cover, 3 * cover})
                k_h_grid = [1]
            else:
                k_p_grid = list(k_p_values) if k_p_values else list(SPLIT_PARTITIONS)
                k_h_grid = list(range(1, k_f // k_s + 1))
            for k_p in k_p_grid:
                if n // k_p < MIN_PEERS_PER_PARTITION:
                    continue
                for k_h in k_h_grid:
                    for mode in median_peers:
                        try:
                            plans.append(ReleasePlan.build(
                                kind=kind, features=spec.names, numeric_features=spec.numeric_names, k_p=k_p, k_h=k_h,
                                k_s=k_s, epsilon_total=epsilon_total, seed=seed, median_peers=mode,
                            ))
                        except PlanError:
                            continue
    return plans


def choose_plan(
    spec: FeatureSpec,
    n: int,
    epsilon_total: float,
    seed: bytes,
    *,
    kinds: Sequence[str] = ("split", "one"),
    k_s_values: Sequence[int] | None = None,
    k_p_values: Sequence[int] | None = None,
    median_peers: Sequence[str] = ("all", "disjoint"),
    median_steps: int = DEFAULT_MEDIAN_STEPS,
) -> PlanScore:
    """The plan with the lowest objective; its ``oracle`` names the concrete
    mechanism chosen for its histograms (the most frequent one when sizes
    differ), and it searches medians in ``median_steps`` steps (they do not
    change the objective). Raises :class:`PlanError` if nothing in the grid is
    satisfiable."""
    scored = []
    for plan in candidate_plans(spec, n, epsilon_total, seed, kinds=kinds, k_s_values=k_s_values, k_p_values=k_p_values, median_peers=median_peers):
        objective = plan_objective(spec, plan, n)
        if math.isfinite(objective):
            scored.append(PlanScore(plan, objective, plan.k_p * len(plan.subsets[0])))
    if not scored:
        raise PlanError(f"no satisfiable plan for n={n!r}, {len(spec.names)} features, kinds={list(kinds)!r}, k_s={k_s_values!r}, k_p={k_p_values!r}")
    best_value = min(s.objective for s in scored)
    near = [s for s in scored if s.objective <= best_value * (1 + NEAR_TIE)]
    best = min(near, key=lambda s: (s.n_histograms, s.plan.k_s, s.plan.kind, s.plan.median_peers))
    plan = best.plan
    oracle, _ = _type_error(plan.release_epsilon, spec.domain_size(plan.subsets[0][0]), n // plan.k_p)
    chosen = ReleasePlan.build(
        kind=plan.kind, features=plan.features, numeric_features=plan.numeric_features, k_p=plan.k_p, k_h=plan.k_h,
        k_s=plan.k_s, epsilon_total=epsilon_total, seed=seed, median_peers=plan.median_peers, oracle=oracle,
        median_steps=median_steps,
    )
    return PlanScore(chosen, best.objective, best.n_histograms)
