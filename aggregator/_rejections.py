"""Every reason the aggregator counts a packet as rejected under: one enumeration, one spelling each."""

from __future__ import annotations

import enum


class RejectionReason(enum.StrEnum):
    """Every reason a packet is counted as rejected under: the one spelling of each.

    ``bad-token/<reason>`` names the token recipe's ``InvalidToken.reason``
    (crypto's ``REJECTION_REASONS``; :func:`aggregator._workers.token_rejection`).
    """

    BAD_PACKET = "bad-packet"
    REPLAY = "replay"
    BAD_MESSAGE = "bad-message"
    UNKNOWN_SURVEY = "unknown-survey"
    OUTSIDE_WINDOW = "outside-window"
    BAD_TOKEN_BAD_POINT = "bad-token/bad-point"
    BAD_TOKEN_BAD_PROOF = "bad-token/bad-proof"
    BAD_TOKEN_IDENTITY_POINT = "bad-token/identity-point"
    BAD_TOKEN_MALFORMED = "bad-token/malformed"
    BAD_TOKEN_SCALAR_RANGE = "bad-token/scalar-range"
    BAD_TOKEN_WRONG_KID = "bad-token/wrong-kid"
    WRONG_PARTITION = "wrong-partition"
    DOUBLE_SUBMISSION = "double-submission"
    DUPLICATE = "duplicate"


REJECTION_REASONS: tuple[str, ...] = tuple(RejectionReason)
"""Every rejection counter's name (:class:`RejectionReason`'s values)."""
