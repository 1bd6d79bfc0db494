"""The named adversary strategies: a module of its own so that ``anonml simulate --help`` lists them without loading the roles."""

from __future__ import annotations

from enum import StrEnum


class StrategyName(StrEnum):
    """Each named strategy of ``anonml simulate`` (``_adversary.STRATEGIES`` builds one per name)."""

    HONEST = "honest"
    LATE_DOCUMENTS = "late-documents"
    DROPPING_RELAY = "dropping-relay"
    LATE_DOCUMENTS_DROPPING_RELAY = "late-documents+dropping-relay"
    TAILORED_LOG = "tailored-log"
    TAILORED_THRESHOLDS = "tailored-thresholds"
    STARVED_MIRRORS = "starved-mirrors"
    ROUND_OF_ITS_OWN = "round-of-its-own"
    GRIND_PARTITIONS = "grind-partitions"
    FIRST_HOP_WORK = "first-hop-work"
    FIRST_HOP_WORK_HELD = "first-hop-work-held"
    LYING_MIRROR_CLOCKS = "lying-mirror-clocks"
