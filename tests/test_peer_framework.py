"""The chapter-3 framework on the peer: importer -> events, instancer ->
training examples, featurizer -> feature vector, driven by a feature spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from anonml.peer._features import RoundPipeline
from anonml.peer._framework import (
    CsvImporter,
    Dataset,
    Event,
    FeatureError,
    MalformedData,
)
from anonml.protocol._features import (
    CategoricalFeature,
    FeatureSpec,
    LabelSpec,
    NumericFeature,
)

SPEC = FeatureSpec(
    (
        NumericFeature("age", 17.0, 90.0),
        CategoricalFeature("sex", ("Female", "Male")),
        NumericFeature("hours", 1.0, 99.0, quantiles=3),
    ),
    LabelSpec("income", (">50K",), ("<=50K",)),
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "data.csv"
    path.write_text(text)
    return path


def test_a_csv_row_becomes_one_feature_vector(tmp_path: Path) -> None:
    pipeline = RoundPipeline.for_spec(SPEC)
    vector = pipeline.vector_from_file(write(tmp_path, "age,sex,hours,income,extra\n39, Male ,40,>50K,ignored\n"))
    assert vector.features == {"age": 39.0, "sex": "Male", "hours": 40.0}
    assert vector.label == 1
    bins = pipeline.bins(vector, {"age": [37.0], "hours": [30.0, 40.0, 45.0]})
    # 39 > 37 -> bin 1; 40 is not > 40 -> bin 1 of 4 (one cut point below it)
    assert bins == {"age": 1, "sex": 1, "hours": 1}
    # mixed radix, label least significant: ((age)*2 + sex)*2 + label
    assert pipeline.encode_subset(("age", "sex"), bins, vector.label) == ((1 * 2 + 1) * 2 + 1)


def test_the_latest_event_wins_and_static_properties_rank_first() -> None:
    dataset = Dataset(
        (
            Event({"hours": 10.0}, timestamp=5.0, line=2),
            Event({"hours": 20.0}, timestamp=None, line=3),
            Event({"hours": 30.0}, timestamp=7.0, line=4),
            Event({"hours": 40.0}, timestamp=6.0, line=5),
        )
    )
    assert dataset.latest("hours").fields["hours"] == 30.0
    with pytest.raises(FeatureError, match="'age'"):
        dataset.latest("age")


def test_timestamps_come_from_the_named_column(tmp_path: Path) -> None:
    importer = CsvImporter(numeric=frozenset({"hours"}), timestamp_column="at")
    dataset = importer.import_file(write(tmp_path, "at,hours\n100,5\n,7\n50,9\n"))
    assert [e.timestamp for e in dataset.events] == [100.0, None, 50.0]
    assert dataset.latest("hours").fields["hours"] == 5.0


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("age,sex,hours,income\n39,Male,40,>50K\n\n41,Male,40\n", 4, "expected 4 fields"),
        ("age,sex,hours,income\n39,Male,forty,>50K\n", 2, "'forty' is not a number"),
        ("age,sex,hours,income\n39,Male,nan,>50K\n", 2, "not a finite number"),
        ('age,sex,hours,income\n39,"Ma"le,40,>50K\n', 2, "quoting"),
        ("age,sex,income\n39,Male,>50K\n", 1, "lacks the required columns ['hours']"),
        ("age,age,sex,hours,income\n", 1, "duplicate column"),
        ("", 0, "empty"),
    ],
)
def test_a_malformed_row_is_reported_with_its_line_number(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    pipeline = RoundPipeline.for_spec(SPEC)
    with pytest.raises(MalformedData) as caught:
        pipeline.vector_from_file(write(tmp_path, text))
    assert caught.value.line == line
    assert fragment in str(caught.value)
    if line:
        assert str(caught.value).startswith(f"line {line}: ")


def test_non_utf8_bytes_are_reported_with_their_line(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_bytes(b"age,sex,hours,income\n39,M\xffle,40,>50K\n")
    with pytest.raises(MalformedData) as caught:
        RoundPipeline.for_spec(SPEC).vector_from_file(path)
    assert caught.value.line == 2


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ("39,Other,40,>50K", "'Other' is not one of the declared categories"),
        ("39,Male,40,maybe", "'maybe' is neither positive"),
        ("39,,40,>50K", "no event in the dataset has the field 'sex'"),
    ],
)
def test_values_outside_the_spec_are_feature_errors_naming_the_line(tmp_path: Path, row: str, fragment: str) -> None:
    with pytest.raises(FeatureError) as caught:
        RoundPipeline.for_spec(SPEC).vector_from_file(write(tmp_path, f"age,sex,hours,income\n{row}\n"))
    assert fragment in str(caught.value)
    if "declared" in fragment or "neither" in fragment:
        assert "(line 2)" in str(caught.value)


def test_a_missing_file_is_malformed_data_not_os_error(tmp_path: Path) -> None:
    with pytest.raises(MalformedData, match="cannot read"):
        CsvImporter().import_file(tmp_path / "absent.csv")
