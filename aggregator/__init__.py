"""The aggregator: runs a round, verifies tokens, estimates histograms and
trains the learner (``anonml.learning``) on them."""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    from anonml.aggregator._anonymity import LINKS_JSON, FullView, RequestLog, linking_report, timing_guesses
    from anonml.aggregator._linking import LinkScore, rank_link, score_links, timing_figures
    from anonml.aggregator._report import learn, write_report
    from anonml.aggregator._report import summarise as summarise_report
    from anonml.aggregator._round import ApiRefused, RoundSecrets, RoundState
    from anonml.aggregator._beacon import REVEAL_POLL_SECONDS
    from anonml.aggregator._service import CREDENTIAL_HOLD_SECONDS, AggregatorConfig, BoundAddresses, build_app, drive_round, serve_aggregator
    from anonml.aggregator._setup import create_round, open_round, postgres_location
    from anonml.aggregator._sink import InboxLimits, PacketSink
    from anonml.aggregator._spec import RoundSpec, RoundSpecError, parse_round_spec, read_round_spec
    from anonml.aggregator._home import AggregatorHome
    from anonml.aggregator._store import (
        RoundStore,
        ROSTER_FINAL,
        BatchTaken,
        Registration,
        VerifiedPacket,
    )
    from anonml.aggregator._rejections import REJECTION_REASONS, RejectionReason
    from anonml.aggregator._verify import process_batch
    from anonml.aggregator._workers import IssuerWorkers
    # The role's click group (``anonml aggregator ...``), which ``anonml.cli`` mounts.
    from anonml.aggregator._cli import aggregator as command
    from anonml.aggregator._engines import PostgresLocation
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)


__all__ = [
    "command",
    "summarise_report",
    "CREDENTIAL_HOLD_SECONDS",
    "REVEAL_POLL_SECONDS",
    "LINKS_JSON",
    "REJECTION_REASONS",
    "RejectionReason",
    "AggregatorConfig",
    "AggregatorHome",
    "ApiRefused",
    "BoundAddresses",
    "FullView",
    "InboxLimits",
    "IssuerWorkers",
    "LinkScore",
    "PacketSink",
    "RoundSecrets",
    "RoundSpec",
    "RoundSpecError",
    "RoundState",
    "RequestLog",
    "RoundStore",
    "build_app",
    "create_round",
    "drive_round",
    "learn",
    "linking_report",
    "open_round",
    "postgres_location",
    "parse_round_spec",
    "read_round_spec",
    "process_batch",
    "rank_link",
    "score_links",
    "serve_aggregator",
    "timing_guesses",
    "timing_figures",
    "write_report",
    "BatchTaken",
    "ROSTER_FINAL",
    "PostgresLocation",
    "VerifiedPacket",
    "Registration",
]
