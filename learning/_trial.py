"""One in-process trial of the whole private pipeline (thesis §8.2.1):
private medians → binning → release plan → every peer perturbs its subsets →
histogram estimation and post-processing → partition ensemble → AUC."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.metrics import roc_auc_score

from anonml.learning._binning import bin_table, exact_cut_points, private_cut_points
from anonml.learning._data import Table
from anonml.learning._ensemble import PartitionEnsemble, SubsetHistogram, exact_histogram
from anonml.mechanisms import PrivacyLedger, make_oracle, postprocess
from anonml.protocol import Assignment, FeatureSpec, ReleasePlan, assign_partitions, row_keys

IntArray = npt.NDArray[np.int64]


@dataclass
class TrialResult:
    """What one trial measured: one AUC per ensemble configuration."""

    aucs: list[float]
    epsilon_total: float  # eq. 7.4 as recorded in the peers' ledgers (0 when noise-free)
    seconds: float
    oracles: dict[str, int] = field(default_factory=dict)
    cut_points: dict[str, list[float]] = field(default_factory=dict)


def estimate_histograms(
    spec: FeatureSpec,
    plan: ReleasePlan,
    assignment: Assignment,
    X: IntArray,
    y: IntArray,
    rng: np.random.Generator,
    *,
    method: str = "norm-sub",
    oracles_used: dict[str, int] | None = None,
    ledgers: Mapping[int, PrivacyLedger] | None = None,
) -> list[SubsetHistogram]:
    """Every peer of every partition encodes and perturbs each of its subsets
    (vectorised over the partition's peers), and the aggregator estimates and
    post-processes one histogram per (partition, subset). Each release is
    recorded in the partition's peer ledger, if given, before it happens."""
    histograms = []
    for p in range(plan.k_p):
        rows = assignment.members(p)
        for subset in plan.subsets[p]:
            columns = np.asarray([spec.index(n) for n in subset], dtype=np.int64)
            codes = spec.encode(subset, X[np.ix_(rows, columns)], y[rows])
            m = spec.domain_size(subset)
            oracle = make_oracle(plan.oracle, plan.release_epsilon, m, n=max(1, rows.size))
            if oracles_used is not None:
                oracles_used[oracle.name] = oracles_used.get(oracle.name, 0) + 1
            if ledgers is not None:
                ledgers[p].record_subset(subset, plan.release_epsilon)
            reports = oracle.privatize(codes, rng)
            estimate = oracle.estimate(reports)
            counts = postprocess(estimate, int(rows.size), method, oracle=oracle, reports=reports)
            histograms.append(SubsetHistogram.from_spec(spec, subset, counts, p))
    return histograms


def exact_histograms(spec: FeatureSpec, plan: ReleasePlan, assignment: Assignment, X: IntArray, y: IntArray) -> list[SubsetHistogram]:
    """The plan's histograms without perturbation (the noise-free ensemble)."""
    out = []
    for p in range(plan.k_p):
        rows = assignment.members(p)
        for subset in plan.subsets[p]:
            columns = [spec.index(n) for n in subset]
            out.append(exact_histogram(columns, [spec.n_bins[c] for c in columns], X[rows], y[rows], p))
    return out


def run_trial(
    spec: FeatureSpec,
    train: Table,
    test: Table,
    plan: ReleasePlan,
    rng: np.random.Generator,
    *,
    ensembles: Sequence[Mapping[str, Any]] = ({},),
    method: str = "norm-sub",
    noise_free: bool = False,
    epsilon_budget: float | None = None,
) -> TrialResult:
    """One trial; each of ``ensembles`` (PartitionEnsemble parameters) is fit
    on the same histograms. ``noise_free`` uses exact cut points and exact
    histograms (same plan, same partitions) instead of the private pipeline.
    ``epsilon_budget`` is the ε_T promised to every peer (default: the
    plan's own total); a release beyond it raises ``BudgetExceeded``."""
    started = time.perf_counter()
    assignment = assign_partitions(plan.seed, row_keys(train.n_rows), plan.k_p)
    oracles: dict[str, int] = {}
    if noise_free:
        cuts = exact_cut_points(spec, train)
        X, y = bin_table(spec, train, cuts)
        histograms = exact_histograms(spec, plan, assignment, X, y)
        spent = 0.0
    else:
        # One ledger per partition (all its peers release the same things):
        # the cost is recorded from the queries actually made, and a release
        # past the promised ε_T is refused (BudgetExceeded).
        budget = plan.epsilon_total if epsilon_budget is None else epsilon_budget
        ledgers = {p: PrivacyLedger(budget) for p in range(plan.k_p)}
        for name in spec.numeric_names:
            asked = np.unique(assignment.partition[np.concatenate(plan.median_groups(name, assignment))])
            for p in asked.tolist():
                ledgers[p].record_median(name, plan.median_epsilon)
        cuts = private_cut_points(spec, train, plan, assignment, rng)
        X, y = bin_table(spec, train, cuts)
        histograms = estimate_histograms(spec, plan, assignment, X, y, rng, method=method, oracles_used=oracles, ledgers=ledgers)
        spent = max(ledger.spent() for ledger in ledgers.values())
    X_test, y_test = bin_table(spec, test, cuts)
    aucs = []
    for params in ensembles:
        model = PartitionEnsemble(**{"random_state": int(rng.integers(2**31)), **params})
        model.fit_histograms(histograms, n_bins=spec.n_bins)
        aucs.append(float(roc_auc_score(y_test, model.decision_function(X_test))))
    return TrialResult(
        aucs=aucs,
        epsilon_total=spent,
        seconds=time.perf_counter() - started,
        oracles=oracles,
        cut_points={k: [float(c) for c in v] for k, v in cuts.items()},
    )
