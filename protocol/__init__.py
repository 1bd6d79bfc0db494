"""The protocol's shared vocabulary: what every role must agree on.

Survey identifiers, the round manifest, and the wire formats (relay link
frames, the end-to-end message inside a Sphinx payload) live here and only
here; ``relay``, ``peer`` and ``aggregator`` import them.
"""

from __future__ import annotations

from protocol._features import (
    CategoricalFeature,
    Feature,
    FeatureSpec,
    FeatureSpecError,
    LabelSpec,
    NumericFeature,
)
from protocol._plan import (
    PLAN_KINDS,
    Assignment,
    PlanError,
    ReleasePlan,
    assign_partitions,
    derive_subsets,
    row_keys,
)
from protocol._survey import (
    ROUND_ID_BYTES,
    SURVEY_ID_BYTES,
    InvalidSurveyId,
    SurveyId,
    SurveyKind,
)

__all__ = [
    "PLAN_KINDS",
    "Assignment",
    "CategoricalFeature",
    "Feature",
    "FeatureSpec",
    "FeatureSpecError",
    "LabelSpec",
    "NumericFeature",
    "PlanError",
    "ReleasePlan",
    "assign_partitions",
    "derive_subsets",
    "row_keys",
    "ROUND_ID_BYTES",
    "SURVEY_ID_BYTES",
    "InvalidSurveyId",
    "SurveyId",
    "SurveyKind",
]
