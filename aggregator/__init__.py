"""The aggregator: runs a round, verifies tokens, estimates histograms and
trains the partition-ensemble learner."""

from __future__ import annotations

from aggregator._adult import adult_spec
from aggregator._binning import bin_table, exact_cut_points, private_cut_points
from aggregator._data import DataError, Table, load_adult, read_adult_file
from aggregator._ensemble import PartitionEnsemble, SubsetHistogram, exact_histogram
from aggregator._planner import PlanScore, choose_plan, plan_objective
from aggregator._report import learn, write_report
from aggregator._round import (
    ApiRefused,
    RoundSecrets,
    RoundSpec,
    RoundSpecError,
    RoundState,
    create_round,
    open_round,
    parse_round_spec,
)
from aggregator._service import AggregatorConfig, BoundAddresses, build_app, drive_round, serve_aggregator
from aggregator._sink import PacketSink
from aggregator._store import AggregatorHome, RoundStore
from aggregator._trial import TrialResult, estimate_histograms, exact_histograms, run_trial
from aggregator._verify import REJECTION_REASONS, process_batch
from aggregator._workers import IssuerWorkers

__all__: list[str] = [
    "REJECTION_REASONS",
    "AggregatorConfig",
    "AggregatorHome",
    "ApiRefused",
    "BoundAddresses",
    "IssuerWorkers",
    "PacketSink",
    "RoundSecrets",
    "RoundSpec",
    "RoundSpecError",
    "RoundState",
    "RoundStore",
    "build_app",
    "create_round",
    "drive_round",
    "learn",
    "open_round",
    "parse_round_spec",
    "process_batch",
    "serve_aggregator",
    "write_report",
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
