"""First-hop work stamps: the proof of work a peer attaches to each packet it sends to its first relay.

Issue 25 ("junk that costs the attacker, not the honest"). Relay keys are
public, so anyone can build valid Sphinx packets carrying junk tokens; every
one costs the first relay a Sphinx unwrap and the aggregator a token
verification. A first relay may therefore ask for work before it unwraps
anything: a frame from a sender that is not an authenticated neighbour
carries an :data:`STAMP_BYTES` stamp after the packet, and the frame's work is
the number of leading zero bits of::

    BLAKE2b-256(DOMAIN | context | packet | stamp)

where ``context`` is the 32-byte nonce the relay sent in this link
session's hello reply. So a stamp is bound to one packet (a stamp copied onto
another packet does no work, and the same packet again is a Sphinx replay)
and to one session (it cannot be computed before the relay chose the
nonce, nor carried to another connection). Checking costs one hash of the
frame (microseconds, against ~380 µs for the unwrap); finding a stamp of ``k``
bits costs ``2**k`` hashes on average. The relay asks for ``k = 0`` (any
stamp) while it keeps up and more as its first-hop intake falls behind
(relay._work), in the same way Tor's onion-service defence raises its
suggested effort with load.

Privacy. The stamp travels only on the peer-to-first-relay link and is
stripped there: the packet the relay forwards is the same whatever work was
done, so no later relay nor the aggregator sees it. The effort asked is one
relay-wide level, the same for every sender at a time; a malicious first relay
could ask one peer for more, but it knows that peer's address already and can
delay or drop its packets anyway, so the effort gives it nothing new (the
round simulator's ``first-hop-work`` strategies play that relay, with each
stamp taking :func:`stamp_seconds` on its clock). What
another party could observe is only the peer's timing on that link (its
frames have one fixed size, stamped or not): a peer computes at most
``2**max_bits`` hashes (its client's cap, the same for every peer) before it
sends, and a relay asking more is treated as busy (the peer's ordinary retry
and second path apply), so no peer does anything on a channel the
aggregator sees that every peer of that relay would not do too.
"""

from __future__ import annotations

import hashlib

STAMP_BYTES = 8
"""Bytes of the stamp after each packet in a frame from a sender that must do work."""
WORK_CONTEXT_BYTES = 32
MAX_WORK_BITS = 63
"""The most work a level can name on the wire (6 bits of an ack byte)."""
DOMAIN = b"anonml-first-hop-work-v1"
REFERENCE_HASHES_PER_SECOND = 2**20
"""The hash rate a stamp's wall time is reckoned at: a slow peer's one core in Python (~1.7 million a second
measured on this project's 2-core machine; a phone's or an old laptop's is less). The round simulator charges
a stamp this time on its virtual clock (:func:`stamp_seconds`), where hashing itself takes none."""


_LAST_BYTE = tuple(bytes([value]) for value in range(256))


def _check(context: bytes, bits: int) -> None:
    if not (isinstance(context, bytes) and len(context) == WORK_CONTEXT_BYTES):
        raise ValueError(f"a work context is {WORK_CONTEXT_BYTES} bytes, got {context!r}")
    if not (isinstance(bits, int) and 0 <= bits <= MAX_WORK_BITS):
        raise ValueError(f"work bits must be an integer in 0..{MAX_WORK_BITS}, got {bits!r}")


def _leading_zero_bits(digest: bytes) -> int:
    return 64 - int.from_bytes(digest[:8], "big").bit_length()


def stamp_work(context: bytes, packet: bytes, stamp: bytes) -> int:
    """The work (leading zero bits, at most 64) that ``stamp`` proves for ``packet`` in the session ``context``."""
    if len(stamp) != STAMP_BYTES:
        raise ValueError(f"a stamp is {STAMP_BYTES} bytes, got {len(stamp)}")
    return _leading_zero_bits(hashlib.blake2b(DOMAIN + context + packet + stamp, digest_size=32).digest())


def solve_stamp(context: bytes, packet: bytes, bits: int) -> bytes:
    """A stamp proving at least ``bits`` of work for ``packet`` in the session ``context`` (``2**bits`` hashes on
    average; the first candidate when ``bits`` is 0)."""
    _check(context, bits)
    if bits == 0:
        return bytes(STAMP_BYTES)
    prefix = hashlib.blake2b(DOMAIN + context + packet, digest_size=32)
    # A digest with at least ``bits`` leading zero bits is below this bound, compared as bytes (big-endian).
    bound = (1 << (64 - bits)).to_bytes(8, "big")
    # Stamps in counting order, the last byte varied innermost on a copy of the hash of the other seven:
    # the loop body is a copy, an update and a digest (0.75 µs a try against 1.35 µs counting in ints).
    high = 0
    while True:
        head = high.to_bytes(STAMP_BYTES - 1, "big")
        partial = prefix.copy()
        partial.update(head)
        for low in _LAST_BYTE:
            attempt = partial.copy()
            attempt.update(low)
            if attempt.digest() < bound:
                return head + low
        high += 1


def stamp_seconds(bits: int) -> float:
    """The wall time one stamp of ``bits`` takes a peer hashing at :data:`REFERENCE_HASHES_PER_SECOND` (the
    mean of its ``2**bits`` tries; none when ``bits`` is 0, whose stamp is the first candidate)."""
    if not (isinstance(bits, int) and 0 <= bits <= MAX_WORK_BITS):
        raise ValueError(f"work bits must be an integer in 0..{MAX_WORK_BITS}, got {bits!r}")
    return 0.0 if bits == 0 else 2**bits / REFERENCE_HASHES_PER_SECOND
