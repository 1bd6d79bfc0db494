"""The end-to-end message inside a Sphinx payload, and the API bodies' strict parsing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from anonml.protocol import (
    MESSAGE_VERSION,
    SURVEY_ID_BYTES,
    CredentialRequest,
    InvalidApiMessage,
    InvalidMessage,
    MedianThresholds,
    PhaseTimes,
    ReceiptLog,
    RegisterRequest,
    RosterResponse,
    RoundSchedule,
    RoundStatus,
    SurveyId,
    SurveyMessage,
    bound_bytes,
    decode_median_report,
    encode_median_report,
    message_overhead,
    receipt_digest,
)

ROUND = bytes(range(32))
SIZE = 1800


def test_round_trip_pads_to_exact_size() -> None:
    message = SurveyMessage(SurveyId.data(ROUND, 2, 1), b"T" * 250, b"\x03\x04")
    first = message.to_bytes(SIZE)
    second = message.to_bytes(SIZE)
    assert len(first) == len(second) == SIZE
    # Random padding: two encodings of one message differ only after the body.
    body = message_overhead(250) + 2
    assert first[:body] == second[:body] and first[body:] != second[body:]
    assert first[0] == MESSAGE_VERSION
    assert first[1 : 1 + SURVEY_ID_BYTES] == message.survey.to_bytes()
    assert SurveyMessage.from_bytes(first) == message


def test_too_large_for_the_size_is_refused() -> None:
    message = SurveyMessage(SurveyId.median(ROUND, 0), b"T" * 250, b"\x01" * 900)
    with pytest.raises(InvalidMessage):
        message.to_bytes(1000)


def test_bound_bytes_bind_survey_and_report() -> None:
    survey = SurveyId.data(ROUND, 0, 0)
    message = SurveyMessage(survey, b"tok", b"report")
    assert message.bound_bytes() == bound_bytes(survey, b"report")
    assert bound_bytes(survey, b"report") != bound_bytes(SurveyId.data(ROUND, 0, 1), b"report")
    assert bound_bytes(survey, b"report") != bound_bytes(survey, b"reporT")
    # The token is not part of what it is bound to.
    assert message.bound_bytes() == SurveyMessage(survey, b"other", b"report").bound_bytes()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:10],
        lambda b: bytes([2]) + b[1:],
        lambda b: b[:1] + b"\x00" * SURVEY_ID_BYTES + b[1 + SURVEY_ID_BYTES :],
        lambda b: b[: 1 + SURVEY_ID_BYTES] + b"\xff\xff" + b[3 + SURVEY_ID_BYTES :],
        lambda b: b[: 1 + SURVEY_ID_BYTES] + b"\x00\x00" + b[3 + SURVEY_ID_BYTES :],
        lambda b: b"\x01" * 20_000,
    ],
)
def test_malformed_messages_are_rejected(mutate: object) -> None:
    encoded = SurveyMessage(SurveyId.data(ROUND, 2, 1), b"T" * 40, b"\x03").to_bytes(200)
    with pytest.raises(InvalidMessage):
        SurveyMessage.from_bytes(mutate(encoded))  # type: ignore[operator]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=600))
def test_from_bytes_is_total(data: bytes) -> None:
    try:
        SurveyMessage.from_bytes(data)
    except InvalidMessage:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=300), st.binary(min_size=1, max_size=300), st.integers(0, 5), st.integers(0, 5))
def test_round_trip_property(token: bytes, report: bytes, partition: int, subset: int) -> None:
    message = SurveyMessage(SurveyId.data(ROUND, partition, subset), token, report)
    assert SurveyMessage.from_bytes(message.to_bytes(message_overhead(len(token)) + len(report) + 7)) == message


def test_median_report() -> None:
    assert decode_median_report(encode_median_report([1, 0, 1]), 3) == [1, 0, 1]
    with pytest.raises(InvalidMessage):
        decode_median_report(b"\x01\x02", 2)
    with pytest.raises(InvalidMessage):
        decode_median_report(b"\x01", 2)
    with pytest.raises(InvalidMessage):
        encode_median_report([2])


def test_register_request_signature() -> None:
    key = SigningKey(b"\x07" * 32)
    request = RegisterRequest.create(key, ROUND, "code-1")
    parsed = RegisterRequest.from_json(request.to_json())
    parsed.verify()
    forged = RegisterRequest(parsed.identity_key, "code-2", ROUND, parsed.signature)
    with pytest.raises(InvalidApiMessage) as info:
        forged.verify()
    assert info.value.field == "signature"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "$"),
        (b"[]", "$"),
        (b'{"identity_key": "00", "invitation": null, "round_id": "00", "signature": "00"}', "identity_key"),
        (b'{"identity_key": "' + b"ab" * 32 + b'", "round_id": "' + b"00" * 32 + b'", "signature": "' + b"00" * 64 + b'"}', "invitation"),
        (b'{"identity_key": "' + b"ab" * 32 + b'", "invitation": 5, "round_id": "' + b"00" * 32 + b'", "signature": "' + b"00" * 64 + b'"}', "invitation"),
        (b'{"identity_key": "' + b"AB" * 32 + b'", "invitation": null, "round_id": "' + b"00" * 32 + b'", "signature": "' + b"00" * 64 + b'"}', "identity_key"),
        (b'{"identity_key": "' + b"ab" * 32 + b'", "invitation": null, "round_id": "' + b"00" * 32 + b'", "signature": "' + b"00" * 64 + b'", "x": 1}', "x"),
        (b"{" + b" " * 20_000 + b"}", "$"),
    ],
)
def test_register_request_strict(body: bytes, field: str) -> None:
    with pytest.raises(InvalidApiMessage) as info:
        RegisterRequest.from_json(body)
    assert info.value.field == field


def test_roster_and_credential_signatures() -> None:
    aggregator = SigningKey(b"\x01" * 32)
    roster = RosterResponse.create(aggregator, ROUND, [b"\x02" * 32, b"\x01" * 32], b"\x05" * 32)
    parsed = RosterResponse.from_json(roster.to_json())
    assert parsed.roster == (b"\x01" * 32, b"\x02" * 32)
    parsed.verify(bytes(aggregator.verify_key), ROUND)
    with pytest.raises(InvalidApiMessage):
        parsed.verify(bytes(aggregator.verify_key), bytes(32))
    unrevealed = RosterResponse.from_json(RosterResponse.create(aggregator, ROUND, [], None).to_json())
    assert unrevealed.seed is None
    peer = SigningKey(b"\x03" * 32)
    credential = CredentialRequest.from_json(CredentialRequest.create(peer, ROUND, b"blind").to_json())
    credential.verify()
    with pytest.raises(InvalidApiMessage):
        CredentialRequest(credential.identity_key, ROUND, b"other", credential.signature).verify()


def test_receipts_and_thresholds_round_trip() -> None:
    survey = SurveyId.data(ROUND, 1, 0)
    log = ReceiptLog({survey: (receipt_digest(b"\x01" * 32),)})
    parsed = ReceiptLog.from_json(log.to_json())
    assert parsed.contains(survey, b"\x01" * 32)
    assert not parsed.contains(survey, b"\x02" * 32)
    thresholds = MedianThresholds(1, SurveyId.median(ROUND, 1), ("age", "hours"), (45.5, 40.0))
    assert MedianThresholds.from_json(thresholds.to_json()) == thresholds
    bad = json.loads(thresholds.to_json())
    bad["thresholds"] = [1.0]
    with pytest.raises(InvalidApiMessage) as info:
        MedianThresholds.from_json(json.dumps(bad))
    assert info.value.field == "thresholds"


def test_status_round_trip() -> None:
    schedule = RoundSchedule(100, 200, (PhaseTimes(200, 10, 230),), PhaseTimes(230, 10, 260))
    status = RoundStatus(ROUND, "median", 1, 5, schedule.to_dict(), {"registered": 3}, {"bad-token/proof": 2})
    assert RoundStatus.from_json(status.to_json()) == status
