"""The aggregator: runs a round, verifies tokens, estimates histograms and
trains the partition-ensemble learner."""

from __future__ import annotations

from aggregator._adult import adult_spec
from aggregator._binning import bin_table, exact_cut_points, private_cut_points
from aggregator._data import DataError, Table, load_adult, read_adult_file
from aggregator._ensemble import PartitionEnsemble, SubsetHistogram, exact_histogram
from aggregator._planner import PlanScore, choose_plan, plan_objective
from aggregator._trial import TrialResult, estimate_histograms, exact_histograms, run_trial

__all__: list[str] = [
    "DataError",
    "PartitionEnsemble",
    "PlanScore",
    "SubsetHistogram",
    "Table",
    "TrialResult",
    "adult_spec",
    "bin_table",
    "choose_plan",
    "estimate_histograms",
    "exact_cut_points",
    "exact_histogram",
    "exact_histograms",
    "load_adult",
    "plan_objective",
    "private_cut_points",
    "read_adult_file",
    "run_trial",
]
