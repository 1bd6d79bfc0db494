"""Learning from noisy histograms: the partition-ensemble learner (thesis
chapter 6), the planner that chooses a release plan, binning, histogram
estimation, tables and the in-process experiments (thesis chapter 8).

The aggregator's round service imports it to learn once a round's reports
are in; ``anonml experiment`` runs it alone, with no network.
"""

from __future__ import annotations

from anonml.learning._adult import adult_spec
from anonml.learning._binning import bin_table, exact_cut_points, private_cut_points
from anonml.learning._data import DataError, Table, load_adult, read_adult_file
from anonml.learning._ensemble import PartitionEnsemble, SubsetHistogram, exact_histogram
from anonml.learning._planner import PlanScore, choose_plan, plan_objective
from anonml.learning._trial import TrialResult, estimate_histograms, exact_histograms, run_trial

__all__ = [
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
