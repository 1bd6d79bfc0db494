"""The peer: computes features locally, perturbs them, and sends each subset
as one anonymous packet.

:func:`join_round` is one peer's whole part in a round (DESIGN.md §3), callable
in process so many peers can run concurrently (``anonml demo``); ``anonml peer
init`` and ``anonml peer join`` wrap it for a person with one data file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    from anonml.peer._client import RETRY_GAP_CAP, AggregatorClient, AggregatorError, answer_by, mirror_clients, retry_delay
    from anonml.peer._disclosure import describe_release
    from anonml.peer._events import EVENT_WORDS, MISSING_REASONS, MessageOutcome, PeerEvent, RefusalReason
    from anonml.peer._features import RoundPipeline
    from anonml.peer._framework import (
        CsvImporter,
        Dataset,
        EntityIsPeerInstancer,
        Event,
        FeatureError,
        FeatureFunction,
        FeatureVector,
        Featurizer,
        Importer,
        Instancer,
        MalformedData,
        TrainingExample,
    )
    from anonml.peer._identity import IdentityError, PeerIdentity, init_identity, load_identity
    from anonml.peer._join import (
        JoinResult,
        SentMessage,
        Peer,
        PeerRound,
        check_manifest_unchanged,
        choose_path,
        join_round,
        peer_generator,
        planned_releases,
    )
    from anonml.peer._ledger import PeerLedger
    from anonml.peer._session import Equivocation, JoinRefused, RoundSession, mirror_quorum
    from anonml.peer._store import EquivocationProof, PeerStore, Registration, Spend, StoredPacket, StoreError
    from anonml.peer._transport import PacketTransport, open_transport
    # The role's click group (``anonml peer ...``), which ``anonml.cli`` mounts.
    from anonml.peer._cli import peer as command
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)


__all__ = [
    "command",
    "EVENT_WORDS",
    "MISSING_REASONS",
    "RETRY_GAP_CAP",
    "retry_delay",
    "MessageOutcome",
    "PeerEvent",
    "RefusalReason",
    "AggregatorClient",
    "AggregatorError",
    "CsvImporter",
    "Equivocation",
    "EquivocationProof",
    "Dataset",
    "EntityIsPeerInstancer",
    "Event",
    "FeatureError",
    "FeatureFunction",
    "FeatureVector",
    "Featurizer",
    "IdentityError",
    "Importer",
    "Instancer",
    "JoinRefused",
    "JoinResult",
    "SentMessage",
    "MalformedData",
    "PacketTransport",
    "Peer",
    "PeerIdentity",
    "PeerLedger",
    "PeerRound",
    "PeerStore",
    "Registration",
    "RoundPipeline",
    "RoundSession",
    "Spend",
    "StoreError",
    "StoredPacket",
    "TrainingExample",
    "answer_by",
    "check_manifest_unchanged",
    "choose_path",
    "describe_release",
    "init_identity",
    "join_round",
    "peer_generator",
    "load_identity",
    "mirror_quorum",
    "mirror_clients",
    "open_transport",
    "planned_releases",
]
