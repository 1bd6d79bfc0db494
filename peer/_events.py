"""What a peer tells its person as a round goes on, and what the final check says of each message.

The values are the words the peer's listener receives and the reasons its
result counts (the demo's summary and its JSON read them); ``peer join``
prints each event as the sentence :data:`EVENT_WORDS` gives it.
"""

from __future__ import annotations

from enum import StrEnum


class MessageOutcome(StrEnum):
    """What the final receipt log says of one report."""

    ACKNOWLEDGED = "acknowledged"
    UNCONFIRMED = "unconfirmed"  # no final log to read
    NEVER_SENT = "never-sent"  # no first relay took it in either window
    NO_RECEIPT_AFTER_SECOND_CHANCE = "no-receipt-after-second-chance"  # a first relay took it; it was lost after


MISSING_REASONS = (MessageOutcome.NEVER_SENT, MessageOutcome.NO_RECEIPT_AFTER_SECOND_CHANCE)
"""Why a message's receipt is not in the final log."""


class RefusalReason(StrEnum):
    """Why a peer stops before the end of a round (:class:`JoinRefused`'s ``reason``; the demo counts them)."""

    MANIFEST_CHANGED = "manifest-changed"
    MANIFEST_UNCONFIRMED = "manifest-unconfirmed"
    SEED_MISMATCH = "seed-mismatch"
    NOT_ROSTERED = "not-rostered"
    BAD_ROSTER = "bad-roster"
    ANONYMITY_SET = "anonymity-set"
    PARTITION_MISMATCH = "partition-mismatch"
    BAD_SIGNATURE = "bad-signature"
    BAD_THRESHOLDS = "bad-thresholds"
    BAD_LOG = "bad-log"
    NO_MEDIAN = "no-median"
    BUDGET = "budget"
    EQUIVOCATION = "equivocation"
    BEACON_INCOMPLETE = "beacon-incomplete"
    BEACON_MISMATCH = "beacon-mismatch"
    BEACON_UNREVEALED = "beacon-unrevealed"
    TOO_FEW_ROWS = "too-few-rows"
    MODEL_LAYOUT = "model-layout"
    CLOCK_OFF = "clock-off"


class PeerEvent(StrEnum):
    """Each step or warning of a peer's run through a round."""

    REGISTERED = "registered"
    RESUMED = "resumed"
    CREDENTIAL = "credential"
    SENT = "sent"
    ACKNOWLEDGED = "acknowledged"
    RESENT = "resent"
    FIRST_HOP_FAILED = "first-hop-failed"
    MISSING = "missing"
    UNCONFIRMED = "unconfirmed"
    MEDIAN_MISSED = "median-missed"
    MEDIANS_MISSED = "medians-missed"
    MANIFEST_UNMIRRORED = "manifest-unmirrored"
    LOG_UNVERIFIED = "log-unverified"
    EQUIVOCATION = "equivocation"


EVENT_WORDS: dict[PeerEvent, str] = {
    PeerEvent.REGISTERED: "registered: your key is on the roster",
    PeerEvent.RESUMED: "resumed: registered with a credential before (stored here); continuing with them",
    PeerEvent.CREDENTIAL: "credential received (blind: the aggregator cannot link it to you)",
    PeerEvent.SENT: "a packet left for its first relay",
    PeerEvent.ACKNOWLEDGED: "receipt found: a packet was counted",
    PeerEvent.RESENT: "a receipt was missing: the same message was resent over another path",
    PeerEvent.FIRST_HOP_FAILED: "a first relay did not answer; trying another path",
    PeerEvent.MISSING: "a packet was not counted (its receipt is missing after the round)",
    PeerEvent.UNCONFIRMED: "the receipt log could not be read: a packet may or may not have counted",
    PeerEvent.MEDIAN_MISSED: "the median thresholds were not published in time: no median answer was sent",
    PeerEvent.MEDIANS_MISSED: "the cut points were not published in time: no data packet carried a report "
                              "(covers only, nothing spent)",
    PeerEvent.MANIFEST_UNMIRRORED: "no relay of this round mirrors its manifest, so nobody confirmed that other peers "
                                   "see the same round (relay operators: `relay init --mirror`)",
    PeerEvent.LOG_UNVERIFIED: "the receipt log could not be checked against the relays' mirrors: a log shown only to "
                              "this peer would go unnoticed",
    PeerEvent.EQUIVOCATION: "the aggregator signed two different documents for one slot: both are stored as proof, "
                            "and this peer stops",
}
"""Each event as ``peer join`` prints it."""
