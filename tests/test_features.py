"""The declared feature specification: validation, binning, subset encoding."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

from anonml.learning import adult_spec
from anonml.protocol import (
    CategoricalFeature,
    FeatureSpec,
    FeatureSpecError,
    LabelSpec,
    NumericFeature,
)


def small_spec() -> FeatureSpec:
    return FeatureSpec(
        features=(
            NumericFeature("age", 17, 90),
            NumericFeature("hours", 1, 99, quantiles=2),
            CategoricalFeature("colour", ("red", "green", "blue", "?"), (("warm", ("red",)), ("cold", ("green", "blue", "?")))),
            CategoricalFeature("sex", ("M", "F")),
        ),
        label=LabelSpec("rich", positive=(">50K",), negative=("<=50K",)),
    )


def test_round_trip_through_dict() -> None:
    for spec in (small_spec(), adult_spec(), adult_spec(quantiles=3)):
        assert FeatureSpec.from_dict(spec.to_dict()) == spec


def test_domain_size_is_product_of_bins_times_two() -> None:
    spec = small_spec()
    assert spec.n_bins == (2, 3, 2, 2)
    assert spec.domain_size(["age"]) == 4
    assert spec.domain_size(["age", "colour", "sex"]) == 2 ** 4  # 2^(k_s+1) for binary features
    assert spec.domain_size(["hours", "age"]) == 3 * 2 * 2


def test_encode_decode_is_a_bijection_onto_the_domain() -> None:
    spec = small_spec()
    subset = ["hours", "colour", "age"]
    cells = np.array(list(itertools.product(range(3), range(2), range(2), range(2))))
    codes = spec.encode(subset, cells[:, :3], cells[:, 3])
    assert sorted(codes.tolist()) == list(range(spec.domain_size(subset)))
    bins, labels = spec.decode(subset, codes)
    assert np.array_equal(bins, cells[:, :3]) and np.array_equal(labels, cells[:, 3])
    assert np.array_equal(codes % 2, cells[:, 3])  # label is the least significant digit


def test_binning_rules() -> None:
    spec = small_spec()
    binned = spec.bin_columns(
        {"age": [17, 37, 37.5, 90], "hours": [1, 40, 41, 99], "colour": ["red", "blue", "?", "green"], "sex": ["M", "F", "F", "M"]},
        {"age": [37.0], "hours": [40.0, 45.0]},
    )
    # A value equal to the cut point answers "not greater" (Algorithm 1's ISGREATER).
    assert binned.tolist() == [[0, 0, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1], [1, 2, 1, 0]]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["features"][0].update(quantiles=0), "quantiles"),
        (lambda d: d["features"][0].update(low=100), "high"),
        (lambda d: d["features"][0].update(low="x"), "low"),
        (lambda d: d["features"][2]["buckets"][0][1].append("purple"), "purple"),
        (lambda d: d["features"][2]["buckets"][1][1].remove("?"), "in no bucket"),
        (lambda d: d["features"][2]["buckets"][1][1].append("red"), "'red' is in both"),
        (lambda d: d["features"][1].update(type="ordinal"), "features[1].type"),
        (lambda d: d["features"][1].update(colour="x"), "features[1]"),
        (lambda d: d["features"][3].pop("categories"), "features[3]"),
        (lambda d: d["features"].append(dict(d["features"][0])), "duplicate feature names"),
        (lambda d: d["label"].update(negative=[">50K"]), "label.negative"),
        (lambda d: d.pop("label"), "label"),
        (lambda d: d["features"][3].update(name=""), "feature.name"),
    ],
)
def test_invalid_spec_errors_name_the_field(mutate: object, field: str) -> None:
    data = copy.deepcopy(small_spec().to_dict())
    mutate(data)  # type: ignore[operator]
    with pytest.raises(FeatureSpecError, match=field.replace("[", r"\[").replace("]", r"\]").replace("?", r"\?")):
        FeatureSpec.from_dict(data)


def test_bad_values_and_subsets_are_rejected_with_the_value() -> None:
    spec = small_spec()
    with pytest.raises(FeatureSpecError, match="unknown category 'purple'"):
        spec.feature("colour").bin(np.array(["red", "purple"]))  # type: ignore[call-arg]
    with pytest.raises(FeatureSpecError, match="unknown feature 'height'"):
        spec.domain_size(["age", "height"])
    with pytest.raises(FeatureSpecError, match="repeated feature"):
        spec.domain_size(["age", "age"])
    with pytest.raises(FeatureSpecError, match="bin indices in"):
        spec.encode(["hours"], np.array([[3]]), np.array([0]))
    with pytest.raises(FeatureSpecError, match="unknown value 'maybe'"):
        spec.label.encode(["<=50K", "maybe"])
    with pytest.raises(FeatureSpecError, match="cut points"):
        spec.feature("hours").bin([1.0], [50.0, 40.0])  # type: ignore[call-arg]
