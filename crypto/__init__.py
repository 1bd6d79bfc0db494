"""Cryptographic recipes: Sphinx packets and one-per-survey anonymous tokens.

Recipes compose the small primitive helpers kept in their own modules; nothing
here does raw cipher or group arithmetic inline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__: list[str] = []

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    # Sphinx packets (DESIGN.md §5).
    from anonml.crypto._geometry import DEFAULT_MAX_HOPS, DEFAULT_PACKET_SIZE, InvalidGeometry, SphinxGeometry
    from anonml.crypto._primitives import ct_equal
    from anonml.crypto._link_auth import (
        CLIENT_ROLE,
        LINK_PROOF_BYTES,
        SERVER_ROLE,
        link_proof,
        link_proof_valid,
        link_session_key,
    )
    from anonml.crypto._sphinx import (
        BadGroupElement,
        BadMac,
        BadPayload,
        BadRoutingInfo,
        FinalMessage,
        ForwardPacket,
        InvalidKey,
        InvalidPacket,
        REPLAY_TAG_SIZE,
        InvalidRoute,
        NodeAddress,
        PathHop,
        ReleaseWindow,
        ReplayedPacket,
        SurbReply,
        WrongLength,
        build_packet,
        generate_keypair,
        never_replayed,
        node_id_of,
        process_packet,
        public_key_of,
    )
    from anonml.crypto._surb import InvalidSurb, Surb, SurbKeys, create_surb, open_reply, package_reply
    # One-per-survey anonymous tokens (DESIGN.md §6).
    from anonml.crypto._credential import (
        REJECTION_REASONS,
        TAG_DIGEST_BYTES,
        Credential,
        CredentialError,
        CredentialSecret,
        InvalidIssuance,
        InvalidKeyMaterial,
        InvalidToken,
        IssuanceRequest,
        IssuanceResponse,
        IssuanceState,
        IssuerPublicKey,
        IssuerSecretKey,
        begin_issuance,
        finish_issuance,
        issue_credential,
    )
    from anonml.crypto._token import (
        BATCH_POINTS_PER_TOKEN,
        TOKEN_BYTES,
        TOKEN_VERSION,
        Token,
        made_tag_digest,
        make_token,
        survey_point,
        tag_digest,
        token_challenges,
        verify_parsed_token,
        verify_token,
    )
    # The issuer's work a batch at a time, also in worker processes.
    from anonml.crypto._batch import (
        IssueJob,
        TokenJob,
        init_worker,
        JobRefused,
        issue_credentials,
        issue_in_worker,
        verify_in_worker,
        verify_tokens,
    )
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ += [
    "CLIENT_ROLE",
    "LINK_PROOF_BYTES",
    "SERVER_ROLE",
    "link_proof",
    "link_proof_valid",
    "link_session_key",
    "DEFAULT_MAX_HOPS",
    "DEFAULT_PACKET_SIZE",
    "BadGroupElement",
    "BadMac",
    "BadPayload",
    "BadRoutingInfo",
    "FinalMessage",
    "ForwardPacket",
    "InvalidGeometry",
    "InvalidKey",
    "InvalidPacket",
    "InvalidRoute",
    "InvalidSurb",
    "NodeAddress",
    "PathHop",
    "REPLAY_TAG_SIZE",
    "ReleaseWindow",
    "ReplayedPacket",
    "SphinxGeometry",
    "Surb",
    "SurbKeys",
    "SurbReply",
    "WrongLength",
    "build_packet",
    "create_surb",
    "ct_equal",
    "generate_keypair",
    "never_replayed",
    "node_id_of",
    "open_reply",
    "package_reply",
    "process_packet",
    "public_key_of",
]


__all__ += [
    "BATCH_POINTS_PER_TOKEN",
    "REJECTION_REASONS",
    "TAG_DIGEST_BYTES",
    "TOKEN_BYTES",
    "TOKEN_VERSION",
    "Credential",
    "CredentialError",
    "CredentialSecret",
    "InvalidIssuance",
    "InvalidKeyMaterial",
    "InvalidToken",
    "IssuanceRequest",
    "IssuanceResponse",
    "IssuanceState",
    "IssuerPublicKey",
    "IssuerSecretKey",
    "Token",
    "begin_issuance",
    "finish_issuance",
    "issue_credential",
    "made_tag_digest",
    "make_token",
    "survey_point",
    "tag_digest",
    "token_challenges",
    "verify_parsed_token",
    "verify_token",
]


__all__ += [
    "IssueJob",
    "TokenJob",
    "init_worker",
    "JobRefused",
    "issue_credentials",
    "issue_in_worker",
    "verify_in_worker",
    "verify_tokens",
]
