"""Link authentication: who is on the other end of a relay link (transport/_link.py).

A recipe over the primitives (STYLE.md 7): each side holds a static X25519
key whose public half names it (``node_id_of``, the id every relay directory
and round manifest lists), and the two sides of one link session derive

    K = HKDF-SHA256(ikm = X25519(own private, peer public),
                    salt = SHA-256(transcript), info = "anonml/link/v2/auth")

where the transcript is the session's hello and hello reply, which carry a
fresh 32-byte nonce from each side. A side proves it holds its private key by
sending ``HMAC-SHA256(K, role || transcript)``: only the two key holders can
compute K, and the nonces make every session's proofs new, so a recorded
proof is useless on another connection. The static-static agreement needs no
signature keys and no certificates: the directory (signed by the aggregator)
already binds each node id to one X25519 public key by hashing it.
"""

from __future__ import annotations

import hashlib

from anonml.crypto._primitives import InvalidGroupElement, ct_equal, hkdf_sha256, hmac_sha256, x25519
from anonml.crypto._sphinx import InvalidKey

_INFO = b"anonml/link/v2/auth"
LINK_PROOF_BYTES = 32
CLIENT_ROLE = b"anonml/link/v2/client\x00"
SERVER_ROLE = b"anonml/link/v2/server\x00"


def link_session_key(private_key: bytes, peer_public_key: bytes, transcript: bytes) -> bytes:
    """The session key K of the module docstring; :class:`InvalidKey` for a small-order peer key."""
    try:
        shared = x25519(private_key, peer_public_key)
    except (InvalidGroupElement, ValueError) as exc:
        raise InvalidKey(f"unusable link peer key {peer_public_key.hex()!r}") from exc
    return hkdf_sha256(shared, salt=hashlib.sha256(transcript).digest(), info=_INFO, length=32)


def link_proof(session_key: bytes, role: bytes, transcript: bytes) -> bytes:
    """``role``'s proof of holding its key in the session named by ``transcript``."""
    return hmac_sha256(session_key, role + transcript)


def link_proof_valid(session_key: bytes, role: bytes, transcript: bytes, proof: bytes) -> bool:
    """Whether ``proof`` is ``role``'s proof for this session (constant time)."""
    return ct_equal(link_proof(session_key, role, transcript), proof)
