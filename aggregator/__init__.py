"""The aggregator: runs a round, verifies tokens, estimates histograms and
trains the partition-ensemble learner.

Names load with their module on first use: the service pulls in the HTTP
stack, the learner scikit-learn, and the issuer's worker processes (spawned,
so they import this package) need neither (~50 MB and 0.2 s each, not
~150 MB and 1.5 s).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below resolve to, for type checkers (`X as X`: re-exported)
    from aggregator._adult import (
        adult_spec as adult_spec,
    )
    from aggregator._binning import (
        bin_table as bin_table,
        exact_cut_points as exact_cut_points,
        private_cut_points as private_cut_points,
    )
    from aggregator._data import (
        DataError as DataError,
        Table as Table,
        load_adult as load_adult,
        read_adult_file as read_adult_file,
    )
    from aggregator._ensemble import (
        PartitionEnsemble as PartitionEnsemble,
        SubsetHistogram as SubsetHistogram,
        exact_histogram as exact_histogram,
    )
    from aggregator._planner import (
        PlanScore as PlanScore,
        choose_plan as choose_plan,
        plan_objective as plan_objective,
    )
    from aggregator._report import (
        learn as learn,
        write_report as write_report,
    )
    from aggregator._round import (
        ApiRefused as ApiRefused,
        RoundSecrets as RoundSecrets,
        RoundSpec as RoundSpec,
        RoundSpecError as RoundSpecError,
        RoundState as RoundState,
        create_round as create_round,
        open_round as open_round,
        parse_round_spec as parse_round_spec,
    )
    from aggregator._service import (
        AggregatorConfig as AggregatorConfig,
        BoundAddresses as BoundAddresses,
        build_app as build_app,
        drive_round as drive_round,
        serve_aggregator as serve_aggregator,
    )
    from aggregator._sink import (
        PacketSink as PacketSink,
    )
    from aggregator._store import (
        AggregatorHome as AggregatorHome,
        RoundStore as RoundStore,
    )
    from aggregator._trial import (
        TrialResult as TrialResult,
        estimate_histograms as estimate_histograms,
        exact_histograms as exact_histograms,
        run_trial as run_trial,
    )
    from aggregator._verify import (
        REJECTION_REASONS as REJECTION_REASONS,
        process_batch as process_batch,
    )
    from aggregator._workers import (
        IssuerWorkers as IssuerWorkers,
    )

_HOME: dict[str, str] = {
    "REJECTION_REASONS": "aggregator._verify",
    "AggregatorConfig": "aggregator._service",
    "AggregatorHome": "aggregator._store",
    "ApiRefused": "aggregator._round",
    "BoundAddresses": "aggregator._service",
    "IssuerWorkers": "aggregator._workers",
    "PacketSink": "aggregator._sink",
    "RoundSecrets": "aggregator._round",
    "RoundSpec": "aggregator._round",
    "RoundSpecError": "aggregator._round",
    "RoundState": "aggregator._round",
    "RoundStore": "aggregator._store",
    "build_app": "aggregator._service",
    "create_round": "aggregator._round",
    "drive_round": "aggregator._service",
    "learn": "aggregator._report",
    "open_round": "aggregator._round",
    "parse_round_spec": "aggregator._round",
    "process_batch": "aggregator._verify",
    "serve_aggregator": "aggregator._service",
    "write_report": "aggregator._report",
    "DataError": "aggregator._data",
    "PartitionEnsemble": "aggregator._ensemble",
    "PlanScore": "aggregator._planner",
    "SubsetHistogram": "aggregator._ensemble",
    "Table": "aggregator._data",
    "TrialResult": "aggregator._trial",
    "adult_spec": "aggregator._adult",
    "bin_table": "aggregator._binning",
    "choose_plan": "aggregator._planner",
    "estimate_histograms": "aggregator._trial",
    "exact_cut_points": "aggregator._binning",
    "exact_histogram": "aggregator._ensemble",
    "exact_histograms": "aggregator._trial",
    "load_adult": "aggregator._data",
    "plan_objective": "aggregator._planner",
    "private_cut_points": "aggregator._binning",
    "read_adult_file": "aggregator._data",
    "run_trial": "aggregator._trial",
}

__all__: list[str] = list(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'aggregator' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
