"""Learning from noisy histograms: the partition-ensemble learner (thesis
chapter 6), the planner that chooses a release plan, its bins and its
combiner by simulation, binning, the one histogram estimator, tables and
feature specs, the published model's format, and the in-process experiments
(thesis chapter 8).

The aggregator's round service imports it to learn once a round's reports
are in; ``anonml experiment`` runs it alone, with no network.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    from anonml.learning._binning import (
        QuantileBinner,
        SpecBinner,
        balanced_cuts,
        bin_table,
        exact_cut_points,
        private_cut_points,
        table_matrix,
    )
    from anonml.learning._averaging import (
        MIN_ROWS_PER_PEER,
        ModelAveraging,
        NotConverged,
        OutputPerturbation,
        TooFewRows,
        fit_regularized_logistic,
        local_model,
        unit_ball_rows,
    )
    from anonml.learning._compare import EncodedSplit, linear_encoding, linear_trial, run_comparison
    from anonml.learning._data import (
        DataError,
        Table,
        clip_table,
        finite_number,
        load_adult,
        read_adult_file,
        read_csv_table,
        split_table,
    )
    from anonml.learning._ensemble import PartitionEnsemble, SubsetHistogram, estimate_histogram, exact_histogram
    from anonml.learning._command import experiment
    from anonml.learning._linear import (
        LDPGradientDescent,
        LinearEncoding,
        Loss,
        fit_logistic_reference,
        harmony_group_size,
        loss_gradients,
        wide_range_features,
    )
    from anonml.learning._model import MODEL_FORMAT, model_from_json, model_to_json, published_model
    from anonml.learning._planner import (
        PLANNER_MAX_PEERS,
        PlanChoice,
        candidate_choices,
        choose_plan,
        choose_round_plan,
        round_candidates,
        synthetic_table,
    )
    from anonml.learning._round_sgd import SGD_LEARNING_RATE, SgdRule, averaged_model, sgd_encoding, sgd_iteration
    from anonml.learning._round_averaging import (
        AveragedModel,
        InvalidModelReport,
        ModelBlocks,
        RoundModel,
        average_blocks,
        model_reports,
    )
    from anonml.learning._round_statistics import SurveyCells, describe_answer, round_statistics, survey_cells
    from anonml.learning._round_statistics_trials import round_statistic_errors
    from anonml.learning._statistics import (
        StatisticAnswer,
        cdf_variances,
        count_task,
        count_variance,
        histogram_task,
        mean_task,
        mean_variance,
        quantile_task,
    )
    from anonml.learning._tables import adult_spec, builtin_spec, load_builtin
    from anonml.learning._vocabulary import ROUND_CATEGORICAL_WEIGHT, ROUND_REGULARIZATION_RULE, SGD_LEARNER_LOSS, LearnerName, LinearSettings, TableName
    from anonml.learning._trial import TrialResult, estimate_histograms, exact_histograms, fit_combiners, run_trial
    from anonml.learning._mixed import MixedAnswer, MixedReport, hadamard_entries, hadamard_order, mixed_statistics
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "ROUND_CATEGORICAL_WEIGHT",
    "ROUND_REGULARIZATION_RULE",
    "SGD_LEARNER_LOSS",
    "DataError",
    "LDPGradientDescent",
    "LearnerName",
    "LinearEncoding",
    "LinearSettings",
    "Loss",
    "MODEL_FORMAT",
    "MIN_ROWS_PER_PEER",
    "ModelAveraging",
    "NotConverged",
    "OutputPerturbation",
    "TooFewRows",
    "PLANNER_MAX_PEERS",
    "PartitionEnsemble",
    "PlanChoice",
    "QuantileBinner",
    "SpecBinner",
    "StatisticAnswer",
    "SubsetHistogram",
    "SurveyCells",
    "Table",
    "TableName",
    "TrialResult",
    "adult_spec",
    "balanced_cuts",
    "bin_table",
    "builtin_spec",
    "candidate_choices",
    "cdf_variances",
    "describe_answer",
    "choose_plan",
    "choose_round_plan",
    "clip_table",
    "count_task",
    "count_variance",
    "estimate_histogram",
    "estimate_histograms",
    "exact_cut_points",
    "exact_histogram",
    "exact_histograms",
    "experiment",
    "finite_number",
    "fit_combiners",
    "fit_logistic_reference",
    "fit_regularized_logistic",
    "local_model",
    "harmony_group_size",
    "histogram_task",
    "linear_encoding",
    "linear_trial",
    "load_adult",
    "load_builtin",
    "loss_gradients",
    "mean_task",
    "mean_variance",
    "model_from_json",
    "model_to_json",
    "private_cut_points",
    "published_model",
    "quantile_task",
    "read_adult_file",
    "read_csv_table",
    "round_candidates",
    "round_statistic_errors",
    "round_statistics",
    "SGD_LEARNING_RATE",
    "SgdRule",
    "averaged_model",
    "sgd_encoding",
    "sgd_iteration",
    "AveragedModel",
    "InvalidModelReport",
    "ModelBlocks",
    "RoundModel",
    "average_blocks",
    "model_reports",
    "run_comparison",
    "run_trial",
    "split_table",
    "survey_cells",
    "synthetic_table",
    "table_matrix",
    "unit_ball_rows",
    "EncodedSplit",
    "MixedAnswer",
    "MixedReport",
    "hadamard_entries",
    "hadamard_order",
    "mixed_statistics",
    "wide_range_features",
]
