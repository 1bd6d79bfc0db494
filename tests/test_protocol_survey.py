from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anonml.protocol import SURVEY_ID_BYTES, InvalidSurveyId, SurveyId, SurveyKind

ROUND = bytes(range(32))


def test_round_trip_and_fixed_length() -> None:
    for survey in (SurveyId.median(ROUND, 7, 3), SurveyId.data(ROUND, 2, 5)):
        encoded = survey.to_bytes()
        assert len(encoded) == SURVEY_ID_BYTES
        assert SurveyId.from_bytes(encoded) == survey


def test_distinct_surveys_have_distinct_contexts() -> None:
    contexts = {
        SurveyId.median(ROUND, 0, 0).to_bytes(),
        SurveyId.median(ROUND, 1, 0).to_bytes(),
        SurveyId.data(ROUND, 0, 0).to_bytes(),
        SurveyId.data(ROUND, 0, 1).to_bytes(),
        SurveyId.data(ROUND, 1, 0).to_bytes(),
        SurveyId.data(bytes(32), 0, 0).to_bytes(),
    }
    assert len(contexts) == 6


@pytest.mark.parametrize(
    "args",
    [
        (b"short", SurveyKind.DATA, 0, 0),
        (ROUND, SurveyKind.DATA, -1, 0),
        (ROUND, SurveyKind.DATA, 0, 2**16),
        (ROUND, SurveyKind.MEDIAN, 2**16, 0),
    ],
)
def test_constructor_rejects_bad_fields(args: tuple) -> None:
    with pytest.raises(InvalidSurveyId):
        SurveyId(*args)


@given(st.binary(max_size=2 * SURVEY_ID_BYTES))
def test_parser_is_total(data: bytes) -> None:
    try:
        survey = SurveyId.from_bytes(data)
    except InvalidSurveyId:
        return
    assert survey.to_bytes() == data
