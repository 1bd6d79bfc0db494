"""The end-to-end message a peer sends the aggregator inside a Sphinx payload.

DESIGN.md §5: "inside it, the end-to-end message for the aggregator (version,
survey context, token, report, padding)". Layout, big-endian::

    version      1 byte   (MESSAGE_VERSION)
    survey       SURVEY_ID_BYTES   (SurveyId.to_bytes(), the token context)
    token_len    2 bytes, then the token
    report_len   2 bytes, then the report
    padding      random bytes up to the round's geometry.message_size

A cover packet (DESIGN.md §3.7: the second-chance packet of a peer whose
receipt is in the log) carries ``COVER_VERSION`` and the survey it stands
for, then random bytes. Only the aggregator, after the last Sphinx layer,
can tell it from a message; relays see one more packet of the same size in
the same windows. The aggregator counts covers by reason and drops them.

Padding is random, not zeros, so a message's length never shows through any
layer (DESIGN.md §5). The token is bound to :meth:`SurveyMessage.bound_bytes`:
the survey and the report, so a relay or anyone else cannot move a token to
another report.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from anonml.crypto import TOKEN_BYTES, Credential, IssuerPublicKey, made_tag_digest, make_token
from anonml.base.errors import InputError
from anonml.protocol._api import receipt_digest
from anonml.protocol._features import MAX_QUANTILES
from anonml.protocol._survey import SURVEY_ID_BYTES, InvalidSurveyId, SurveyId

MESSAGE_VERSION = 1
COVER_VERSION = 2
MAX_TOKEN_BYTES = 1024
MAX_REPORT_BYTES = 8192
MAX_MESSAGE_BYTES = 16384
_LENGTH = struct.Struct(">H")
_HEADER_BYTES = 1 + SURVEY_ID_BYTES
_BOUND_DOMAIN = b"anonml/message/v1"


class InvalidMessage(InputError):
    """Raised by :meth:`SurveyMessage.from_bytes` (and ``to_bytes``) for a malformed or oversized message."""


def message_overhead(token_bytes: int) -> int:
    """Bytes a message needs besides its report, for a token of ``token_bytes``."""
    return _HEADER_BYTES + _LENGTH.size + token_bytes + _LENGTH.size


def report_capacity(message_size: int) -> int:
    """The most report bytes one message of ``message_size`` carries beside a token (``TOKEN_BYTES``):
    the payload limit a task whose report is longer must split over several surveys."""
    return min(message_size - message_overhead(TOKEN_BYTES), MAX_REPORT_BYTES)


@dataclass(frozen=True)
class SurveyMessage:
    """One anonymous answer: a report for one survey and the token that authorises it."""

    survey: SurveyId
    token: bytes
    report: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.survey, SurveyId):
            raise InvalidMessage(f"survey must be a SurveyId, got {self.survey!r}")
        if not isinstance(self.token, bytes) or not 0 < len(self.token) <= MAX_TOKEN_BYTES:
            raise InvalidMessage(f"token must be 1..{MAX_TOKEN_BYTES} bytes, got {len(self.token)!r}")
        if not isinstance(self.report, bytes) or not 0 < len(self.report) <= MAX_REPORT_BYTES:
            raise InvalidMessage(f"report must be 1..{MAX_REPORT_BYTES} bytes, got {len(self.report)!r}")

    def bound_bytes(self) -> bytes:
        """The message ``m`` a token is bound to (DESIGN.md §6): survey ‖ report, length-prefixed.

        Peers pass this to ``make_token`` and the aggregator to ``verify_token``;
        it is defined here once so the two cannot drift apart.
        """
        return bound_bytes(self.survey, self.report)

    def to_bytes(self, size: int, *, random_bytes: Callable[[int], bytes] = os.urandom) -> bytes:
        """Encode and pad with ``random_bytes`` to exactly ``size`` (the geometry's message size)."""
        body = b"".join(
            (
                bytes([MESSAGE_VERSION]),
                self.survey.to_bytes(),
                _LENGTH.pack(len(self.token)),
                self.token,
                _LENGTH.pack(len(self.report)),
                self.report,
            )
        )
        if not len(body) <= size <= MAX_MESSAGE_BYTES:
            raise InvalidMessage(f"message of {len(body)} bytes does not fit the message size {size!r}")
        padding = random_bytes(size - len(body))
        if len(padding) != size - len(body):
            raise InvalidMessage(f"random_bytes returned {len(padding)} bytes, expected {size - len(body)}")
        return body + padding

    @classmethod
    def from_bytes(cls, data: bytes) -> SurveyMessage:
        """Parse a padded message; total: any input either parses or raises InvalidMessage."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidMessage(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        if not _HEADER_BYTES + 2 * _LENGTH.size <= len(data) <= MAX_MESSAGE_BYTES:
            raise InvalidMessage(f"message length {len(data)!r} is out of range")
        if data[0] != MESSAGE_VERSION:
            raise InvalidMessage(f"unknown message version {data[0]!r}")
        try:
            survey = SurveyId.from_bytes(data[1:_HEADER_BYTES])
        except InvalidSurveyId as exc:
            raise InvalidMessage(f"bad survey id: {exc}") from None
        offset = _HEADER_BYTES
        (token_len,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if not 0 < token_len <= MAX_TOKEN_BYTES or offset + token_len + _LENGTH.size > len(data):
            raise InvalidMessage(f"token length {token_len!r} does not fit")
        token = data[offset : offset + token_len]
        offset += token_len
        (report_len,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if not 0 < report_len <= MAX_REPORT_BYTES or offset + report_len > len(data):
            raise InvalidMessage(f"report length {report_len!r} does not fit")
        return cls(survey, token, data[offset : offset + report_len])


@dataclass(frozen=True)
class CoverMessage:
    """A second-chance packet that repairs nothing: the survey it stands for, padded (DESIGN.md §3.7)."""

    survey: SurveyId

    def to_bytes(self, size: int, *, random_bytes: Callable[[int], bytes] = os.urandom) -> bytes:
        head = bytes([COVER_VERSION]) + self.survey.to_bytes()
        if not len(head) <= size <= MAX_MESSAGE_BYTES:
            raise InvalidMessage(f"a cover does not fit the message size {size!r}")
        return head + random_bytes(size - len(head))


def parse_message(data: bytes) -> SurveyMessage | CoverMessage:
    """A message or a cover, by its first byte; raises InvalidMessage for anything else."""
    if isinstance(data, (bytes, bytearray, memoryview)) and len(data) >= _HEADER_BYTES and data[0] == COVER_VERSION:
        try:
            return CoverMessage(SurveyId.from_bytes(bytes(data[1:_HEADER_BYTES])))
        except InvalidSurveyId as exc:
            raise InvalidMessage(f"bad survey id: {exc}") from None
    return SurveyMessage.from_bytes(data)


@dataclass(frozen=True)
class SealedReport:
    """A report ready to send: the padded message and the receipt digest the log will list for it."""

    survey: SurveyId
    message: bytes
    receipt: bytes


def seal_report(
    issuer: IssuerPublicKey, credential: Credential, survey: SurveyId, report: bytes, message_size: int
) -> SealedReport:
    """Token for ``report`` bound to ``survey`` (DESIGN.md §6), the padded message, and its receipt digest.

    The one place a report becomes a message, for the peer, the test stand-ins and the benchmarks.
    """
    ctx = survey.to_bytes()
    token = make_token(issuer, credential, ctx, bound_bytes(survey, report))
    message = SurveyMessage(survey, token, report).to_bytes(message_size)
    # The receipt from the tag the token holds: one P-256 multiplication fewer than crypto.tag_digest.
    return SealedReport(survey, message, receipt_digest(made_tag_digest(token)))


def bound_bytes(survey: SurveyId, report: bytes) -> bytes:
    """Module-level form of :meth:`SurveyMessage.bound_bytes` (before a token exists)."""
    return b"".join((_BOUND_DOMAIN, survey.to_bytes(), struct.pack(">I", len(report)), report))


def encode_median_report(answers: Sequence[tuple[int, int]]) -> bytes:
    """One median answer: for each numeric feature, the index of the cut point
    it answers about and its (already perturbed) bit, one byte ``2·level + bit``
    each.

    The order is the order of ``MedianThresholds.features`` for the sub-round.
    With one cut point per feature the level is always 0, so each byte is the bit.
    """
    if not 0 < len(answers) <= MAX_REPORT_BYTES or any(
        bit not in (0, 1) or isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < MAX_QUANTILES
        for level, bit in answers
    ):
        raise InvalidMessage(f"median report must be 1..{MAX_REPORT_BYTES} (level, bit) pairs, got {list(answers)[:16]!r}")
    return bytes(2 * level + bit for level, bit in answers)


def decode_median_report(report: bytes, cut_points: Sequence[int]) -> list[tuple[int, int]]:
    """Inverse of :func:`encode_median_report`: ``(level, bit)`` per feature.

    ``cut_points[i]`` is feature ``i``'s number of cut points; raises
    InvalidMessage unless there is one byte per feature and each names one of
    its feature's cut points.
    """
    if len(report) != len(cut_points) or any(byte // 2 >= count for byte, count in zip(report, cut_points)):
        raise InvalidMessage(f"median report must be one (level, bit) byte for each of {len(cut_points)} features with levels below {list(cut_points)[:16]!r}, got {report[:16]!r}")
    return [(byte // 2, byte % 2) for byte in report]


def encode_pool_answer(feature: int, level: int, bit: int) -> bytes:
    """A comparison-pool peer's one answer: the index of the numeric feature it
    answers about (in the order of ``MedianThresholds.features``), then the
    ``2·level + bit`` byte of :func:`encode_median_report`."""
    if isinstance(feature, bool) or not isinstance(feature, int) or not 0 <= feature < 256:
        raise InvalidMessage(f"a pool answer names a feature index in [0, 256), got {feature!r}")
    return bytes([feature]) + encode_median_report([(level, bit)])


def decode_pool_answer(report: bytes, cut_points: Sequence[int]) -> tuple[int, int, int]:
    """Inverse of :func:`encode_pool_answer`: ``(feature, level, bit)``.

    ``cut_points[i]`` is feature ``i``'s number of cut points; raises
    InvalidMessage unless the report is two bytes naming one feature and one
    of its cut points.
    """
    if len(report) != 2 or report[0] >= len(cut_points):
        raise InvalidMessage(f"a pool answer is a feature index below {len(cut_points)} and one (level, bit) byte, got {report[:16]!r}")
    [(level, bit)] = decode_median_report(report[1:], [cut_points[report[0]]])
    return report[0], level, bit
