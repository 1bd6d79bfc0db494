"""Survey identifiers: what one anonymous token is "the only message" for.

A survey is one question asked of one partition in one round (DESIGN.md §3):
``(round, "median", partition, s)`` for a partition's answer in median
sub-round ``s`` and ``(round, "data", partition, subset)`` for one feature
subset. Every partition answers in exactly one median sub-round
(``RoundManifest.median_sub_round``), so each step of the quantile search
hears from a whole share of the peers rather than from one partition. Its
canonical byte encoding is the context ``ctx`` that tokens bind to, so every
role must derive it from here and nowhere else.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from anonml.base.errors import InputError

ROUND_ID_BYTES = 32
_DOMAIN = b"anonml/survey/v1"
_LAYOUT = struct.Struct(">16s32sBHH")


class SurveyKind(enum.IntEnum):
    """The phase a survey belongs to."""

    MEDIAN = 1
    DATA = 2


class InvalidSurveyId(InputError):
    """Raised by :meth:`SurveyId.from_bytes` and the constructor for a malformed id."""


@dataclass(frozen=True, order=True)
class SurveyId:
    """One survey of one round.

    ``round_id`` is the round manifest's hash. For a median survey
    ``subset`` is the median sub-round the partition answers in; which
    sub-round that is, is the manifest's rule
    (:meth:`RoundManifest.median_survey`), checked by whoever reads the id.
    """

    round_id: bytes
    kind: SurveyKind
    partition: int
    subset: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.round_id, bytes) or len(self.round_id) != ROUND_ID_BYTES:
            raise InvalidSurveyId(f"round_id must be {ROUND_ID_BYTES} bytes, got {self.round_id!r}")
        if not 0 <= self.partition < 2**16:
            raise InvalidSurveyId(f"partition out of range: {self.partition!r}")
        if not 0 <= self.subset < 2**16:
            raise InvalidSurveyId(f"subset out of range: {self.subset!r}")
        object.__setattr__(self, "kind", SurveyKind(self.kind))

    @classmethod
    def median(cls, round_id: bytes, partition: int, sub_round: int) -> SurveyId:
        return cls(round_id, SurveyKind.MEDIAN, partition, sub_round)

    @property
    def sub_round(self) -> int:
        """The median sub-round of a median survey."""
        if self.kind != SurveyKind.MEDIAN:
            raise InvalidSurveyId(f"a {self.kind.name.lower()} survey has no median sub-round")
        return self.subset

    @classmethod
    def data(cls, round_id: bytes, partition: int, subset: int) -> SurveyId:
        return cls(round_id, SurveyKind.DATA, partition, subset)

    def to_bytes(self) -> bytes:
        """The canonical encoding, used as the token context ``ctx``."""
        return _LAYOUT.pack(_DOMAIN, self.round_id, self.kind, self.partition, self.subset)

    @classmethod
    def from_bytes(cls, data: bytes) -> SurveyId:
        if len(data) != _LAYOUT.size:
            raise InvalidSurveyId(f"survey id must be {_LAYOUT.size} bytes, got {len(data)}")
        domain, round_id, kind, partition, subset = _LAYOUT.unpack(data)
        if domain != _DOMAIN:
            raise InvalidSurveyId("survey id has the wrong domain tag")
        try:
            survey_kind = SurveyKind(kind)
        except ValueError:
            raise InvalidSurveyId(f"unknown survey kind {kind!r}") from None
        return cls(round_id, survey_kind, partition, subset)

    def __str__(self) -> str:
        return f"{self.round_id.hex()[:12]}:{self.kind.name.lower()}:{self.partition}/{self.subset}"


SURVEY_ID_BYTES = _LAYOUT.size
