"""Local differential privacy: frequency oracles, post-processing, private
quantiles, numeric mechanisms and the privacy-budget ledger."""

from __future__ import annotations

from anonml.mechanisms._accounting import PrivacyLedger, shuffle_amplified_epsilon, total_epsilon
from anonml.mechanisms._errors import BudgetExceeded, InvalidReport
from anonml.mechanisms._numeric import OneBitMean, gaussian_mechanism, gaussian_sigma, laplace_mechanism
from anonml.mechanisms._oracles import (
    ORACLE_NAMES,
    FrequencyOracle,
    GeneralizedRandomResponse,
    HadamardResponse,
    OptimizedLocalHashing,
    OptimizedPQEncoding,
    OptimizedUnaryEncoding,
    SubsetSelection,
    SymmetricUnaryEncoding,
    UnaryEncoding,
    make_oracle,
    optimal_pq_p,
)
from anonml.mechanisms._postprocess import POSTPROCESS_METHODS, postprocess
from anonml.mechanisms._quantiles import (
    QuantileSearch,
    answer_is_greater,
    answers_are_greater,
    assign_quantiles,
    estimate_quantiles,
)

__all__ = [
    "ORACLE_NAMES",
    "POSTPROCESS_METHODS",
    "BudgetExceeded",
    "FrequencyOracle",
    "GeneralizedRandomResponse",
    "HadamardResponse",
    "InvalidReport",
    "OneBitMean",
    "OptimizedLocalHashing",
    "OptimizedPQEncoding",
    "OptimizedUnaryEncoding",
    "PrivacyLedger",
    "QuantileSearch",
    "SubsetSelection",
    "SymmetricUnaryEncoding",
    "UnaryEncoding",
    "answer_is_greater",
    "answers_are_greater",
    "assign_quantiles",
    "estimate_quantiles",
    "gaussian_mechanism",
    "gaussian_sigma",
    "laplace_mechanism",
    "make_oracle",
    "optimal_pq_p",
    "postprocess",
    "shuffle_amplified_epsilon",
    "total_epsilon",
]
