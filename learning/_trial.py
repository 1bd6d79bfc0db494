"""One private trial, in process: private quantiles → binning → release plan
→ every peer perturbs its subsets → histogram estimation and post-processing
→ partition ensemble → AUC, with every release recorded in the ledgers of
the peers that made it (record-level: the sum of every release)."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from anonml.learning._binning import bin_table, exact_cut_points, private_cut_points
from anonml.learning._data import Table
from anonml.learning._ensemble import PartitionEnsemble, SubsetHistogram, estimate_histogram, exact_histogram
from anonml.learning._metrics import roc_auc
from anonml.mechanisms import PostprocessMethod, PrivacyLedger, make_oracle
from anonml.protocol import Assignment, Combiner, FeatureSpec, Learner, ReleasePlan, row_keys

IntArray = npt.NDArray[np.int64]


@dataclass
class TrialResult:
    """What one trial measured: one AUC per combiner."""

    aucs: dict[str, float]
    epsilon_total: float  # record-level: the costliest peer's ledger sum (0 when noise-free)
    per_attribute: float  # eq. 7.4 of the same ledger, a secondary figure
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
    method: str = PostprocessMethod.NORM_SUB,
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
        if rows.size == 0:
            continue
        for subset in plan.subsets[p]:
            columns = np.asarray([spec.index(n) for n in subset], dtype=np.int64)
            codes = spec.encode(subset, X[np.ix_(rows, columns)], y[rows])
            oracle = make_oracle(plan.oracle, plan.release_epsilon, spec.domain_size(subset), n=rows.size)
            if oracles_used is not None:
                oracles_used[oracle.name] = oracles_used.get(oracle.name, 0) + 1
            if ledgers is not None:
                ledgers[p].record_subset(subset, plan.release_epsilon)
            reports = oracle.privatize(codes, rng)
            histograms.append(estimate_histogram(spec, subset, oracle, reports, partition=p, method=method))
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


def fit_combiners(
    histograms: Sequence[SubsetHistogram], n_bins: Sequence[int], combiners: Sequence[str], *, base: str, scoring: str, random_state: int
) -> dict[str, PartitionEnsemble]:
    """One fitted ensemble per combiner on the same histograms; the two votes
    share one set of members (they differ only in how they combine them)."""
    out: dict[str, PartitionEnsemble] = {}
    voting: PartitionEnsemble | None = None
    for combiner in combiners:
        if combiner == Combiner.NAIVE_BAYES:
            out[combiner] = PartitionEnsemble(combiner=combiner, random_state=random_state).fit_histograms(histograms, n_bins=n_bins)
            continue
        if voting is None:
            voting = PartitionEnsemble(base=base, scoring=scoring, combiner=combiner, random_state=random_state).fit_histograms(histograms, n_bins=n_bins)
            out[combiner] = voting
        else:
            out[combiner] = copy.copy(voting).set_params(combiner=combiner)
    return out


def _record_comparisons(spec: FeatureSpec, plan: ReleasePlan, assignment: Assignment, ledgers: dict[object, PrivacyLedger], budget: float) -> None:
    """Each peer's comparison answers, recorded before they happen: a data
    partition's peers answer once for each feature they are asked about; a
    pool peer answers once, about the feature it is dealt to."""
    for name in spec.numeric_names:
        answering = np.concatenate(plan.median_groups(name, assignment))
        for p in np.unique(assignment.partition[answering]).tolist():
            key: object = ("pool", name) if p == Assignment.COMPARISON_POOL else p
            ledgers.setdefault(key, PrivacyLedger(budget)).record_median(name, plan.median_epsilon)


def run_trial(
    spec: FeatureSpec,
    train: Table,
    test: Table,
    plan: ReleasePlan,
    rng: np.random.Generator,
    *,
    combiners: Sequence[str] = (Combiner.WEIGHTED,),
    base: str = Learner.LOGREG,
    scoring: str = "f1",
    method: str = PostprocessMethod.NORM_SUB,
    noise_free: bool = False,
    epsilon_budget: float | None = None,
) -> TrialResult:
    """One trial; every combiner is fit on the same histograms. ``noise_free``
    uses exact cut points and exact histograms (same plan, same partitions)
    instead of the private pipeline. ``epsilon_budget`` is the record-level
    ε_T promised to every peer (default: the plan's own); a release beyond it
    raises ``BudgetExceeded``."""
    started = time.perf_counter()
    assignment = plan.assign(row_keys(train.n_rows))
    oracles: dict[str, int] = {}
    spent = per_attribute = 0.0
    if noise_free:
        cuts = exact_cut_points(spec, train)
        X, y = bin_table(spec, train, cuts)
        histograms = exact_histograms(spec, plan, assignment, X, y)
    else:
        budget = plan.epsilon_total if epsilon_budget is None else epsilon_budget
        ledgers: dict[object, PrivacyLedger] = {p: PrivacyLedger(budget) for p in range(plan.k_p)}
        _record_comparisons(spec, plan, assignment, ledgers, budget)
        cuts = private_cut_points(spec, train, plan, assignment, rng)
        X, y = bin_table(spec, train, cuts)
        data_ledgers = {p: ledgers[p] for p in range(plan.k_p)}
        histograms = estimate_histograms(spec, plan, assignment, X, y, rng, method=method, oracles_used=oracles, ledgers=data_ledgers)
        spent = max(ledger.spent() for ledger in ledgers.values())
        per_attribute = max(ledger.per_attribute() for ledger in ledgers.values())
    X_test, y_test = bin_table(spec, test, cuts)
    models = fit_combiners(histograms, spec.n_bins, combiners, base=base, scoring=scoring, random_state=int(rng.integers(2**31)))
    aucs = {combiner: roc_auc(y_test, model.decision_function(X_test)) for combiner, model in models.items()}
    return TrialResult(
        aucs=aucs,
        epsilon_total=spent,
        per_attribute=per_attribute,
        seconds=time.perf_counter() - started,
        oracles=oracles,
        cut_points={k: [float(c) for c in v] for k, v in cuts.items()},
    )
