"""Local differential privacy: frequency oracles, post-processing, private
quantiles, numeric mechanisms and the privacy-budget ledger."""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    from anonml.mechanisms._accounting import (
        CentralPrivacy,
        PopulationLedgers,
        PrivacyLedger,
        Release,
        ReleaseKind,
        ledgers_of_one_release,
        per_attribute_epsilon,
        over_budget,
        record_level_epsilon,
        releases_from,
        shuffle_central_privacy,
        total_epsilon,
    )
    from anonml.mechanisms._errors import BudgetExceeded, EpsilonOutOfRange, InvalidReport
    from anonml.mechanisms._numeric import (
        DISCRETE_EPSILON_RANGE,
        OneBitMean,
        discrete_gaussian_delta,
        discrete_gaussian_mechanism,
        discrete_gaussian_sigma,
        discrete_laplace_epsilon,
        discrete_laplace_mechanism,
        discrete_laplace_pmf,
        one_bit_mean_variance,
        one_bit_report_variance,
    )
    from anonml.mechanisms._hashing import HadamardResponse, OptimizedLocalHashing
    from anonml.mechanisms._names import OracleName, PostprocessMethod
    from anonml.mechanisms._oracle_base import FrequencyOracle
    from anonml.mechanisms._oracles import DEFAULT_MAX_ESTIMATE_WORK, DEFAULT_MAX_REPORT_BYTES, ORACLE_NAMES, make_oracle
    from anonml.mechanisms._unary import (
        GeneralizedRandomResponse,
        OptimizedPQEncoding,
        OptimizedUnaryEncoding,
        SubsetSelection,
        SymmetricUnaryEncoding,
        UnaryEncoding,
        optimal_pq_p,
    )
    from anonml.mechanisms._sampling import MIN_PROBABILITY
    from anonml.mechanisms._postprocess import POSTPROCESS_METHODS, postprocess
    from anonml.mechanisms._quantiles import (
        QuantileSearch,
        comparison_epsilon_range,
        answer_is_greater,
        answers_are_greater,
        assign_quantiles,
        estimate_quantiles,
    )
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "DEFAULT_MAX_ESTIMATE_WORK",
    "DEFAULT_MAX_REPORT_BYTES",
    "DISCRETE_EPSILON_RANGE",
    "MIN_PROBABILITY",
    "ORACLE_NAMES",
    "EpsilonOutOfRange",
    "OracleName",
    "POSTPROCESS_METHODS",
    "PostprocessMethod",
    "BudgetExceeded",
    "CentralPrivacy",
    "Release",
    "ReleaseKind",
    "FrequencyOracle",
    "GeneralizedRandomResponse",
    "HadamardResponse",
    "InvalidReport",
    "OneBitMean",
    "OptimizedLocalHashing",
    "OptimizedPQEncoding",
    "OptimizedUnaryEncoding",
    "PopulationLedgers",
    "PrivacyLedger",
    "QuantileSearch",
    "SubsetSelection",
    "SymmetricUnaryEncoding",
    "UnaryEncoding",
    "answer_is_greater",
    "answers_are_greater",
    "assign_quantiles",
    "comparison_epsilon_range",
    "estimate_quantiles",
    "discrete_gaussian_delta",
    "discrete_gaussian_mechanism",
    "discrete_gaussian_sigma",
    "discrete_laplace_epsilon",
    "discrete_laplace_mechanism",
    "discrete_laplace_pmf",
    "make_oracle",
    "one_bit_mean_variance",
    "one_bit_report_variance",
    "optimal_pq_p",
    "postprocess",
    "ledgers_of_one_release",
    "per_attribute_epsilon",
    "over_budget",
    "record_level_epsilon",
    "releases_from",
    "shuffle_central_privacy",
    "total_epsilon",
]
