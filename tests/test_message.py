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
    ReceiptSegment,
    RegisterRequest,
    RosterEntry,
    RosterResponse,
    RoundPhase,
    RoundSchedule,
    RoundStatus,
    Check,
    CoverMessage,
    DocumentKind,
    InvalidSignedDocument,
    SignedDocument,
    SurveyId,
    SurveyMessage,
    TreeHead,
    bound_bytes,
    decode_median_report,
    decode_pool_answer,
    encode_median_report,
    encode_pool_answer,
    message_overhead,
    parse_message,
    receipt_digest,
    receipt_leaves_root,
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
    message = SurveyMessage(SurveyId.median(ROUND, 0, 0), b"T" * 250, b"\x01" * 900)
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
    # One cut point per feature: each byte is the bit (level 0).
    assert encode_median_report([(0, 1), (0, 0), (0, 1)]) == b"\x01\x00\x01"
    assert decode_median_report(b"\x01\x00\x01", [1, 1, 1]) == [(0, 1), (0, 0), (0, 1)]
    # Several cut points: the byte names the one answered about (2·level + bit).
    answers = [(2, 1), (0, 0), (1, 1)]
    assert decode_median_report(encode_median_report(answers), [3, 1, 2]) == answers
    for report, counts in [(b"\x01\x02", [1, 1]), (b"\x01", [1, 1]), (b"\x06", [3]), (b"\x07", [3]), (b"\x02\x00", [1, 4])]:
        with pytest.raises(InvalidMessage):
            decode_median_report(report, counts)
    for bad in ([(0, 2)], [(-1, 0)], [(64, 0)], [(True, 0)], []):
        with pytest.raises(InvalidMessage):
            encode_median_report(bad)


def test_pool_answer_names_its_feature_and_one_of_its_cut_points() -> None:
    # A comparison-pool peer's one bit: the feature's index, then the 2·level + bit byte.
    assert encode_pool_answer(1, 2, 1) == b"\x01\x05"
    assert decode_pool_answer(b"\x01\x05", [1, 3]) == (1, 2, 1)
    assert decode_pool_answer(encode_pool_answer(0, 0, 0), [1]) == (0, 0, 0)
    # A feature that does not exist, a cut point its feature lacks, or the wrong length: malformed.
    for report, counts in [(b"\x02\x01", [1, 3]), (b"\x00\x02", [1, 3]), (b"\x01", [1, 3]), (b"\x01\x01\x01", [1, 3]), (b"", [1])]:
        with pytest.raises(InvalidMessage):
            decode_pool_answer(report, counts)
    for feature in (-1, 256, True):
        with pytest.raises(InvalidMessage):
            encode_pool_answer(feature, 0, 1)


@given(st.binary(max_size=8), st.lists(st.integers(1, 8), min_size=1, max_size=5))
@settings(max_examples=300, deadline=None)
def test_pool_answer_decoding_is_total(report: bytes, counts: list[int]) -> None:
    try:
        feature, level, bit = decode_pool_answer(report, counts)
    except InvalidMessage:
        return
    assert 0 <= feature < len(counts) and 0 <= level < counts[feature] and bit in (0, 1)
    assert encode_pool_answer(feature, level, bit) == report


def test_register_request_signature() -> None:
    key = SigningKey(b"\x07" * 32)
    request = RegisterRequest.create(key, ROUND, "code-1")
    parsed = RegisterRequest.from_json(request.to_json())
    parsed.verify()
    assert len(parsed.entry.nonce) == 32 and parsed.entry.nonce != RegisterRequest.create(key, ROUND).entry.nonce
    forged = RegisterRequest(RosterEntry(parsed.identity_key, b"\x00" * 32, parsed.entry.signature), "code-1", ROUND)
    with pytest.raises(InvalidApiMessage) as info:
        forged.verify()
    assert info.value.field == "signature"


ENTRY = '{"key": "' + "ab" * 32 + '", "nonce": "' + "00" * 32 + '", "signature": "' + "00" * 64 + '"}'


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "$"),
        (b"[]", "$"),
        (b'{"entry": {"key": "00", "nonce": "00", "signature": "00"}, "invitation": null, "round_id": "00"}', "entry.key"),
        (('{"entry": ' + ENTRY + ', "round_id": "' + "00" * 32 + '"}').encode(), "invitation"),
        (('{"entry": ' + ENTRY + ', "invitation": 5, "round_id": "' + "00" * 32 + '"}').encode(), "invitation"),
        (('{"entry": ' + ENTRY.replace("ab", "AB") + ', "invitation": null, "round_id": "' + "00" * 32 + '"}').encode(), "entry.key"),
        (('{"entry": ' + ENTRY + ', "invitation": null, "round_id": "' + "00" * 32 + '", "x": 1}').encode(), "x"),
        (b"{" + b" " * 20_000 + b"}", "$"),
    ],
)
def test_register_request_strict(body: bytes, field: str) -> None:
    with pytest.raises(InvalidApiMessage) as info:
        RegisterRequest.from_json(body)
    assert info.value.field == field


def test_roster_entries_are_each_signed_by_their_peer_and_hash_to_the_signed_head() -> None:
    aggregator = SigningKey(b"\x01" * 32)
    peers = [SigningKey(bytes([i]) * 32) for i in (2, 3)]
    entries = [RegisterRequest.create(key, ROUND).entry for key in peers]
    roster = RosterResponse.create(aggregator, ROUND, entries, b"\x05" * 32)
    parsed = RosterResponse.from_json(roster.to_json())
    assert parsed.keys == tuple(sorted(bytes(k.verify_key) for k in peers))
    head = parsed.verify(bytes(aggregator.verify_key), ROUND)
    assert head.seed == b"\x05" * 32 and head.size == 2
    with pytest.raises(InvalidSignedDocument):
        parsed.verify(bytes(aggregator.verify_key), bytes(32))
    # the aggregator cannot list an entry the peer did not sign: a changed nonce breaks its signature
    tampered = [RosterEntry(entries[0].identity_key, b"\x09" * 32, entries[0].signature), entries[1]]
    with pytest.raises(InvalidApiMessage):
        RosterResponse.create(aggregator, ROUND, tampered, b"\x05" * 32).verify(bytes(aggregator.verify_key), ROUND)
    # nor serve entries other than those its signed head commits to
    swapped = RosterResponse(roster.head, (entries[0],))
    with pytest.raises(InvalidApiMessage):
        swapped.verify(bytes(aggregator.verify_key), ROUND)
    peer = SigningKey(b"\x03" * 32)
    credential = CredentialRequest.from_json(CredentialRequest.create(peer, ROUND, b"blind").to_json())
    credential.verify()
    with pytest.raises(InvalidApiMessage):
        CredentialRequest(credential.identity_key, ROUND, b"other", credential.signature).verify()


def test_signed_documents_bind_kind_round_and_body() -> None:
    aggregator = SigningKey(b"\x01" * 32)
    identity = bytes(aggregator.verify_key)
    thresholds = MedianThresholds(1, ("age", "hours"), ((30.25, 45.5, 61.0), (40.0,)))
    document = SignedDocument.from_json(thresholds.sign(aggregator, ROUND).to_json(), max_bytes=4096)
    document.verify(identity, kind=DocumentKind.THRESHOLDS, round_id=ROUND)
    assert MedianThresholds.from_document(document) == thresholds
    with pytest.raises(InvalidSignedDocument):
        document.verify(identity, kind=DocumentKind.MEDIANS, round_id=ROUND)
    with pytest.raises(InvalidSignedDocument):
        document.verify(bytes(SigningKey(b"\x02" * 32).verify_key), kind=DocumentKind.THRESHOLDS, round_id=ROUND)
    altered = json.loads(document.to_json())
    altered["body"]["thresholds"] = [[1.0], [40.0]]
    with pytest.raises(InvalidSignedDocument) as info:
        SignedDocument.from_json(json.dumps(altered), max_bytes=4096).verify(identity, kind=DocumentKind.THRESHOLDS, round_id=ROUND)
    assert info.value.field == "signature"
    for thresholds, field in [([[1.0]], "body.thresholds"), ([1.0, 40.0], "body.thresholds[0]"), ([[], [40.0]], "body.thresholds[0]"),
                              ([[1.0] * 65, [40.0]], "body.thresholds[0]"), ([[1.0], ["x"]], "body.thresholds[1][0]")]:
        altered["body"]["thresholds"] = thresholds
        with pytest.raises(InvalidApiMessage) as bad:
            MedianThresholds.from_document(SignedDocument.from_json(json.dumps(altered), max_bytes=8192))
        assert bad.value.field == field


def test_a_receipt_segment_verifies_only_with_the_leaves_its_signed_head_commits_to() -> None:
    aggregator = SigningKey(b"\x01" * 32)
    survey = SurveyId.data(ROUND, 1, 0)
    leaves = (receipt_digest(b"\x01" * 32), receipt_digest(b"\x02" * 32))
    head = TreeHead(survey, Check.FIRST, 2, receipt_leaves_root(leaves)).sign(aggregator)
    segment = ReceiptSegment.from_json(ReceiptSegment((head,), {survey: leaves}).to_json())
    verified = segment.verify(bytes(aggregator.verify_key), ROUND, Check.FIRST)
    assert verified[survey].size == 2
    with pytest.raises(InvalidApiMessage):
        segment.verify(bytes(aggregator.verify_key), ROUND, Check.FINAL)
    # a segment tailored to one peer (its receipt left out) does not match the signed head
    with pytest.raises(InvalidApiMessage):
        ReceiptSegment((head,), {survey: leaves[:1]}).verify(bytes(aggregator.verify_key), ROUND, Check.FIRST)


def test_a_cover_is_a_message_only_the_aggregator_tells_apart() -> None:
    survey = SurveyId.data(ROUND, 1, 0)
    cover = CoverMessage(survey).to_bytes(SIZE)
    assert len(cover) == SIZE and parse_message(cover) == CoverMessage(survey)
    real = SurveyMessage(survey, b"T" * 250, b"\x03").to_bytes(SIZE)
    assert isinstance(parse_message(real), SurveyMessage)


def test_status_round_trip() -> None:
    aggregator = SigningKey(b"\x01" * 32)
    schedule = RoundSchedule(100, 200, (PhaseTimes(200, 10, 230, 233, 10, 260),), PhaseTimes(260, 10, 290, 293, 10, 320))
    status = RoundStatus(ROUND, RoundPhase.MEDIAN, 1, 5, schedule.to_dict(), {"registered": 3}, {"bad-token/proof": 2})
    document = SignedDocument.from_json(status.sign(aggregator).to_json(), max_bytes=4096)
    document.verify(bytes(aggregator.verify_key), kind=DocumentKind.STATUS, round_id=ROUND)
    assert RoundStatus.from_document(document) == status


def test_published_cut_points_are_ascending_lists_per_feature() -> None:
    from anonml.protocol import MedianResults

    aggregator = SigningKey(b"\x01" * 32)
    results = MedianResults({"age": (30.5, 42.5, 51.0), "hours": (40.0,)})
    document = SignedDocument.from_json(results.sign(aggregator, ROUND).to_json(), max_bytes=4096)
    assert MedianResults.from_document(document) == results
    body = json.loads(document.to_json())
    for cut_points, field in [({"age": [51.0, 30.5]}, "body.cut_points.age"), ({"age": 42.5}, "body.cut_points.age"),
                              ({"age": []}, "body.cut_points.age"), ({"age": ["x"]}, "body.cut_points.age[0]")]:
        body["body"]["cut_points"] = cut_points
        with pytest.raises(InvalidApiMessage) as bad:
            MedianResults.from_document(SignedDocument.from_json(json.dumps(body), max_bytes=4096))
        assert bad.value.field == field
