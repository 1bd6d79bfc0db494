"""One-per-survey tokens (DESIGN.md §6), shaped for batched verification.

A token for survey context ``ctx`` and message ``m`` is a re-randomised
MAC_GGM presentation ``(U, Cs, Cu')`` (CMZ14 §4.2 "Show"), the disclosed
partition ``j``, the tag ``T = s·H(ctx)`` and one Schnorr proof of
``(s, z, -r)`` for the three relations

* ``Cs = s·U + z·h``           (the hidden attribute is committed),
* ``V  = z·X1 - r·g``          (the MAC verifies; the issuer computes
  ``V = (x0 + x2·j)·U + x1·Cs - Cu'`` with its key),
* ``T  = s·H(ctx)``            (the tag carries the same ``s``).

Token version 2: one commitment, sent
-------------------------------------
Version 1 sent ``(c, rs, rz, rr)``: the verifier had to rebuild each of the
three commitments with its own multi-scalar multiplication before it could
hash them, and compute ``V`` with two constant-time multiplications — about
ten P-256 multiplications per token, none of it shareable across tokens.

Version 2 sends the commitment and lets the verifier recompute the challenge:

1. The transcript hashes the statement (head, ``ctx``, ``H(ctx)``,
   SHA-256(m), ``U, Cs, Cu', T``) and derives two composite coefficients
   ``γV, γT`` from it, the way RFC 9497 §2.2.1 derives the coefficients of a
   batched DLEQ proof from all its statements.
2. The prover proves the one combined relation
   ``Cs + γV·V + γT·T = s·(U + γT·H(ctx)) + z·(h + γV·X1) + (-r)·(γV·g)``
   with the single commitment ``A = A_Cs + γV·A_V + γT·A_T`` and the
   responses ``(rs, rz, rr)``; ``c`` hashes the transcript and then ``A``.
3. The verifier checks
   ``E = rs·U + rz·h + c·Cs + γV·(rz·X1 + rr·g + c·V) + γT·(rs·H(ctx) + c·T) - A = 0``.

Token: version, kid, partition, five points, three scalars: 296 bytes (the
budget is 300; three separate commitments would make it 362).

Why the combination is sound. ``γV, γT`` are random-oracle outputs on the
whole statement, fixed before ``A`` and ``c``. Special soundness extracts one
witness ``(s, z, -r)`` of the combined relation, chosen after ``γV, γT``. A
prover's points are combinations, with coefficients fixed before the
``γ``'s, of group elements whose mutual logarithms it does not know
(``g, h, H(ctx)`` hashed to the curve, ``X1 = x1·h`` with the issuer's
secret ``x1``, ``U`` from an issued credential; the algebraic argument of
CMZ14's generic-group proofs). Written in those bases, the combined relation
is one equation per basis element; the witness can absorb one of them each
(``s`` the ``U`` coordinate, ``z`` the ``h`` one, ``r`` the ``g`` one), and
what remains (the ``H(ctx)`` and ``X1`` coordinates, and every coordinate a
statement point has outside its own relation's bases) is a polynomial of
degree at most 2 in ``(γV, γT)`` that vanishes identically only when all
three relations hold with the same ``s`` and ``z``. So a statement breaking
one of them passes with probability at most ``2/q`` per random-oracle query
(Schwartz–Zippel). This is the technique of RFC 9497 §2.2.1's batched DLEQ
proofs, applied to the three relations of one presentation; it is this
project's construction, not a published one, and deserves review.
``V`` is no longer hashed: it is a function of
``U, Cs, Cu'``, ``j`` and the key, all of which are.

Batches: the small-exponent test
--------------------------------
For tokens ``1..n`` the verifier draws fresh uniform ``ρ_i`` in
``[1, 2^128]`` from the operating system's CSPRNG, never disclosed, and checks
``Σ ρ_i·E_i = 0`` (Bellare, Garay, Rabin, Eurocrypt 1998). If some
``E_i ≠ 0`` then, for any fixed other coefficients, exactly one value of
``ρ_i`` mod the prime ``q`` makes the sum vanish, so a batch holding a bad
token passes with probability at most ``2^-128``. An honest batch always
passes (completeness is exact). The whole sum is one multi-scalar
multiplication (OpenSSL's interleaved windowed method, ``EC_POINTs_mul``)
over ``U, Cs, Cu', T, A`` per token, with ``g, h, X1`` and each ``H(ctx)``
once per batch.

The floor of a batch (``BATCH_POINTS_PER_TOKEN``; ``anonml bench crypto``
prices it in each run): five decompressions per token (≈ 0.37 of a P-256
multiplication each: OpenSSL takes the square root with a generic
``BN_mod_exp``) and seven summed points (≈ 0.34 each: for P-256 OpenSSL's
``EC_POINTs_mul`` is the constant-time nistz256 window, whatever the
scalars' size), ≈ 4.2 multiplications per token before any hashing. The
five summed once are the format's minimum (the MAC needs ``U, Cs, Cu'``, the
survey ``T``, the batchable proof ``A``); the two summed again keep the key
out of the variable-time sum (DESIGN.md §6). The key enters
only as ``w_j·Σ_{i∈j} ρ_i c_i γV_i·U_i`` and ``x1·Σ ρ_i c_i γV_i·Cs_i``:
secret scalars go through :func:`~crypto._group.secret_mul` once per partition
and once per batch, never into the variable-time sum. A failing batch is
split in halves, each checked with fresh coefficients, until the bad tokens
stand alone: one bad token among ``n`` costs checks over fewer than ``3n``
tokens in all, and the good ones are accepted. When both halves of a failing
part fail, bad tokens are dense there and each of its tokens is checked
alone: plain bisection of a batch of junk (every proof false, as a flood
through an honest relay sends them) checked every level again, about
``log2 n`` passes, and a junk token cost ~7.5x an honest one (``verify_tokens``
on 256: 6.5 against 0.86 ms a token, load 9); with the rule it costs the
whole batch's check, its half's and a check alone, at most ``3n`` tokens'
checks in all (2.5 against 0.81 ms, load 8).

Per-token checks stay per token and come first: length and version, every
point on the curve, canonical and not the identity (petlib's example-code
forgery with ``U`` the identity), scalars below ``q``, key id, partition.
The other DESIGN.md §6 pitfalls: the challenge hashes every statement point
(tests/test_tokens.py drops each in turn); the nonces stay hedged; ``H(ctx)``
is hashed to the curve; the kid is in the transcript, so a token of another
key epoch fails. Version 1 also refused ``V = identity``; ``V`` is no longer
computed per token, and ``V = z·X1 - r·g`` is the identity only for
``z = r = 0``, which unblinds the prover's own presentation and forges
nothing.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

from anonml.crypto._credential import (
    _HEADER,
    _PROTOCOL,
    Credential,
    InvalidToken,
    IssuerPublicKey,
    IssuerSecretKey,
    _encode_proof_message,
    _Reader,
)
from anonml.crypto._group import (
    G,
    H,
    ORDER,
    POINT_BYTES,
    SCALAR_BYTES,
    Point,
    RandomSource,
    Transcript,
    encode_point,
    hash_to_point,
    hedged_scalars,
    is_identity,
    length_prefixed,
    public_lincomb,
    secret_mul,
    small_coefficients,
    system_rng,
)
from anonml.crypto._primitives import ct_equal

TOKEN_VERSION = 2
TOKEN_BYTES = _HEADER.size + 5 * POINT_BYTES + 3 * SCALAR_BYTES
BATCH_POINTS_PER_TOKEN = (5, 7)
"""The group work per token of a batch verification, as ``(decompressed,
summed)`` points: the token's five points are decompressed; ``U, Cs, Cu', T,
A`` enter the proofs' multi-scalar multiplication, and ``U`` and ``Cs`` enter
it once more in the sums the key multiplies (the key never enters the
variable-time sum itself). ``anonml bench crypto`` prices this as the floor
of ``token_verify_batch256_us``; tests/test_tokens_batch.py counts it."""
_TRANSCRIPT_LABEL = b"presentation"


@lru_cache(maxsize=4096)
def survey_point(ctx: bytes) -> Point:
    """``H(ctx)``: hash-to-point in its own domain, so that nobody knows its
    logarithm to ``g``, ``h`` or another survey's point (a known logarithm
    would make tags of different surveys linkable). Cached: the aggregator
    verifies many tokens per survey. Callers must not mutate the result."""
    return hash_to_point(b"survey", ctx)


@lru_cache(maxsize=4096)
def _survey_transcript(public_key: IssuerPublicKey, ctx: bytes, partition: int) -> Transcript:
    """The transcript's part shared by every token of one survey (head,
    partition, ``ctx``, ``H(ctx)``), hashed once and forked per token: the
    aggregator verifies many tokens per survey. Callers must :meth:`~Transcript.copy` it."""
    transcript = public_key.transcript(_TRANSCRIPT_LABEL, partition, version=TOKEN_VERSION)
    transcript.append_all((b"ctx", ctx), (b"H(ctx)", encode_point(survey_point(ctx))))
    return transcript


def _tag_digest(tag_encoding: bytes) -> bytes:
    return hashlib.sha256(length_prefixed(_PROTOCOL + b"/tag", tag_encoding)).digest()


def _point_encoding(token: bytes, index: int) -> bytes:
    """The encoding of a token's ``index``-th point (``U, Cs, Cu', T, A``), sliced from its bytes."""
    start = _HEADER.size + index * POINT_BYTES
    return token[start : start + POINT_BYTES]


def made_tag_digest(token: bytes) -> bytes:
    """The digest :func:`tag_digest` gives for the credential and survey ``token`` was made for, read
    from the token's own tag ``T``: the maker's receipt without multiplying ``s·H(ctx)`` a second time.

    For a token this process made with :func:`make_token` (nothing is checked but its length).
    """
    if len(token) != TOKEN_BYTES:
        raise ValueError(f"a token is {TOKEN_BYTES} bytes, got {len(token)}")
    return _tag_digest(_point_encoding(token, 3))


def tag_digest(credential: Credential, ctx: bytes) -> bytes:
    """The 32-byte digest of ``T = s·H(ctx)`` that :func:`verify_token`
    returns for any token of ``credential`` in survey ``ctx``.

    Same credential and same ``ctx`` → the same digest, whatever the message
    (that is how the aggregator's uniqueness constraint on ``(survey, digest)``
    catches a second submission); different ``ctx`` → unlinkable digests
    (DDH in P-256)."""
    return _tag_digest(encode_point(secret_mul(credential.secret._s, survey_point(ctx))))


@dataclass(frozen=True, eq=False)
class Token:
    """A parsed token: presentation ``(U, Cs, Cu')``, partition ``j``, tag
    ``T``, the combined commitment ``A`` and the responses ``(rs, rz, rr)``."""

    kid: bytes
    partition: int
    u: Point
    cs: Point
    cu_prime: Point
    tag: Point
    commitment: Point
    responses: tuple[int, int, int]  # for s, z, -r

    @cached_property
    def _encoding(self) -> bytes:
        points = (self.u, self.cs, self.cu_prime, self.tag, self.commitment)
        return _encode_proof_message(self.kid, self.partition, points, self.responses, version=TOKEN_VERSION)

    def to_bytes(self) -> bytes:
        return self._encoding

    def point_encodings(self) -> tuple[bytes, ...]:
        """The encodings of ``U, Cs, Cu', T, A``, sliced from the token rather
        than re-exported (the verifier hashes them on every token)."""
        return tuple(_point_encoding(self._encoding, i) for i in range(5))

    @classmethod
    def from_bytes(cls, data: bytes) -> Token:
        reader = _Reader(data, TOKEN_BYTES, InvalidToken, "token", version=TOKEN_VERSION)
        kid, partition = reader.header()
        u, cs, cu_prime, tag, commitment = reader.points(5)
        r_s, r_z, r_r = reader.scalars(3)
        token = cls(kid, partition, u, cs, cu_prime, tag, commitment, (r_s, r_z, r_r))
        token.__dict__["_encoding"] = data  # canonical: parsing accepts one encoding per value
        return token


def _statement_transcript(
    public_key: IssuerPublicKey, ctx: bytes, message: bytes, partition: int, statement: Sequence[bytes]
) -> tuple[Transcript, int, int]:
    """The transcript through the statement (DESIGN.md §6: head, partition,
    ctx, H(ctx), SHA-256(m), U, Cs, Cu', T) and the composite coefficients
    ``γV, γT`` drawn from it before any commitment."""
    transcript = _survey_transcript(public_key, ctx, partition).copy()
    u, cs, cu_prime, tag = statement
    transcript.append_all(
        (b"SHA-256(m)", hashlib.sha256(message).digest()),
        (b"U", u),
        (b"Cs", cs),
        (b"Cu'", cu_prime),
        (b"T", tag),
        (b"composite", b"gamma-V"),
    )
    gamma_v = transcript.challenge()
    transcript.append(b"composite", b"gamma-T")
    gamma_t = transcript.challenge()
    return transcript, gamma_v, gamma_t


def token_challenges(public_key: IssuerPublicKey, ctx: bytes, message: bytes, token: Token) -> tuple[int, int, int]:
    """``(γV, γT, c)`` of ``token``: the composite coefficients, then the
    challenge, which hashes the transcript and the commitment ``A``."""
    encodings = token.point_encodings()
    transcript, gamma_v, gamma_t = _statement_transcript(public_key, ctx, message, token.partition, encodings[:4])
    transcript.append(b"A", encodings[4])
    return gamma_v, gamma_t, transcript.challenge()


def make_token(
    public_key: IssuerPublicKey,
    credential: Credential,
    ctx: bytes,
    message: bytes,
    *,
    rng: RandomSource = system_rng,
) -> bytes:
    """A token (``TOKEN_BYTES`` long) binding ``credential`` to survey ``ctx``
    and ``message`` (CMZ14 §4.2 Show, extended by the tag relation).

    With fresh ``a, z, r``: ``U = a·U0``, ``Cs = s·U + z·h``,
    ``Cu' = a·U0' + r·g``, ``T = s·H(ctx)``; the proof is the combined one of
    the module docstring, every nonce and witness through ``secret_mul``.
    """
    if not ct_equal(credential.kid, public_key.kid):
        raise ValueError(f"credential is for key {credential.kid.hex()!r}, not {public_key.kid.hex()!r}")
    s = credential.secret._s
    hc = survey_point(ctx)
    public = length_prefixed(public_key.kid, ctx, hashlib.sha256(message).digest())
    a, z, r, ks, kz, kr = hedged_scalars(b"presentation", credential.to_bytes(), public, rng, 6)
    u = secret_mul(a, credential.u)
    cs = secret_mul(s, u) + secret_mul(z, H)
    cu_prime = secret_mul(a, credential.u_prime) + secret_mul(r, G)
    tag = secret_mul(s, hc)
    statement = [encode_point(p) for p in (u, cs, cu_prime, tag)]
    transcript, gamma_v, gamma_t = _statement_transcript(public_key, ctx, message, credential.partition, statement)
    # A = A_Cs + γV·A_V + γT·A_T, with A_Cs = ks·U + kz·h, A_V = kz·X1 + kr·g, A_T = ks·H(ctx)
    commitment = (
        secret_mul(ks, u)
        + secret_mul(kz, H)
        + secret_mul(gamma_v * kz % ORDER, public_key.x1_pub)
        + secret_mul(gamma_v * kr % ORDER, G)
        + secret_mul(gamma_t * ks % ORDER, hc)
    )
    transcript.append_point(b"A", commitment)
    c = transcript.challenge()
    responses = ((ks - c * s) % ORDER, (kz - c * z) % ORDER, (kr + c * r) % ORDER)
    token = Token(public_key.kid, credential.partition, u, cs, cu_prime, tag, commitment, responses)
    return token.to_bytes()


@dataclass(frozen=True, eq=False)
class CheckedToken:
    """A token that passed every per-token check, with its recomputed
    ``γV, γT, c``; only its proof equation ``E = 0`` is left (:func:`failing_proofs`)."""

    token: Token
    ctx: bytes
    gamma_v: int
    gamma_t: int
    challenge: int


def check_token(
    secret_key: IssuerSecretKey, ctx: bytes, message: bytes, token: Token, *, expected_partition: int
) -> CheckedToken:
    """Key id, partition and identity checks, then the challenges.

    Checks every point against the identity again although the parser
    already does: a :class:`Token` can be built directly, and with
    ``U = identity`` the MAC check is vacuous and any ``s`` "verifies" (the
    forgery in petlib's example code). Raises :class:`InvalidToken`.
    """
    public_key = secret_key.public_key()
    if not ct_equal(token.kid, public_key.kid):
        raise InvalidToken("wrong-kid", f"token names key {token.kid.hex()!r}")
    if token.partition != expected_partition:
        raise InvalidToken("wrong-partition", f"token for partition {token.partition!r}, survey is {expected_partition!r}")
    if any(is_identity(p) for p in (token.u, token.cs, token.cu_prime, token.tag, token.commitment)):
        raise InvalidToken("identity-point", "token contains the identity point")
    gamma_v, gamma_t, c = token_challenges(public_key, ctx, message, token)
    return CheckedToken(token, ctx, gamma_v, gamma_t, c)


def _secret_weighted(secret: int, scalars: list[int], points: list[Point]) -> tuple[int, Point]:
    """``secret·Σ scalars·points`` as one term ``(k, P)`` of the public sum,
    with ``secret`` only ever inside ``secret_mul``. A single point is
    multiplied by the secret first (one multiplication instead of two)."""
    if len(points) == 1:
        return scalars[0], secret_mul(secret, points[0])
    return 1, secret_mul(secret, public_lincomb(scalars, points))


def _proofs_hold(secret_key: IssuerSecretKey, batch: Sequence[CheckedToken], rng: RandomSource) -> bool:
    """``Σ ρ_i·E_i = 0`` for fresh secret 128-bit ``ρ_i`` (module docstring)."""
    public_key = secret_key.public_key()
    scalars: list[int] = []
    points: list[Point] = []
    h_k = x1_k = g_k = 0
    survey_k: dict[bytes, int] = defaultdict(int)
    u_by_partition: dict[int, tuple[list[int], list[Point]]] = defaultdict(lambda: ([], []))
    cs_scalars: list[int] = []
    cs_points: list[Point] = []
    for item, rho in zip(batch, small_coefficients(len(batch), rng)):
        token = item.token
        rs, rz, rr = token.responses
        rc = rho * item.challenge % ORDER
        rcv = rc * item.gamma_v % ORDER
        scalars += [rho * rs, rc, rc * item.gamma_t, -rcv, -rho]
        points += [token.u, token.cs, token.tag, token.cu_prime, token.commitment]
        h_k += rho * rz
        x1_k += rho * rz * item.gamma_v
        g_k += rho * rr * item.gamma_v
        survey_k[item.ctx] += rho * rs * item.gamma_t
        # c·γV·V = c·γV·((x0 + x2·j)·U + x1·Cs - Cu'): the key's part is summed apart.
        u_scalars, u_points = u_by_partition[token.partition]
        u_scalars.append(rcv)
        u_points.append(token.u)
        cs_scalars.append(rcv)
        cs_points.append(token.cs)
    scalars += [h_k, x1_k, g_k, *survey_k.values()]
    points += [H, public_key.x1_pub, G, *(survey_point(ctx) for ctx in survey_k)]
    for partition, (u_scalars, u_points) in u_by_partition.items():
        w = (secret_key._x0 + partition * secret_key._x2) % ORDER
        scalar, point = _secret_weighted(w, u_scalars, u_points)
        scalars.append(scalar)
        points.append(point)
    scalar, point = _secret_weighted(secret_key._x1, cs_scalars, cs_points)
    scalars.append(scalar)
    points.append(point)
    return is_identity(public_lincomb(scalars, points))


def failing_proofs(
    secret_key: IssuerSecretKey, batch: Sequence[CheckedToken], *, rng: RandomSource = system_rng
) -> list[int]:
    """Indices (ascending) of the tokens in ``batch`` whose proof fails.

    One combined check for the batch; when it fails, halves are checked with
    fresh coefficients until each bad token stands alone. When a failing
    half's first part passes, the second must hold a bad token and is split
    without being checked as a whole. When both halves of a failing part
    fail, each of their tokens is checked alone (module docstring: junk
    must not cost ``log2 n`` passes).
    """
    bad: list[int] = []

    def isolate(start: int, stop: int, known_bad: bool) -> None:
        if not known_bad and _proofs_hold(secret_key, batch[start:stop], rng):
            return
        if stop - start == 1:
            bad.append(start)
            return
        middle = (start + stop) // 2
        if _proofs_hold(secret_key, batch[start:middle], rng):
            isolate(middle, stop, True)
        elif _proofs_hold(secret_key, batch[middle:stop], rng):
            isolate(start, middle, True)
        else:
            bad.extend(i for i in range(start, stop) if not _proofs_hold(secret_key, batch[i : i + 1], rng))

    if batch:
        isolate(0, len(batch), False)
    return bad


def verify_parsed_token(
    secret_key: IssuerSecretKey,
    ctx: bytes,
    message: bytes,
    token: Token,
    *,
    expected_partition: int,
    rng: RandomSource = system_rng,
) -> bytes:
    """Verify an already-parsed :class:`Token`; see :func:`verify_token`."""
    checked = check_token(secret_key, ctx, message, token, expected_partition=expected_partition)
    if failing_proofs(secret_key, [checked], rng=rng):
        raise InvalidToken("bad-proof", "token proof does not verify")
    return tag_digest_of(token)


def verify_token(
    secret_key: IssuerSecretKey, ctx: bytes, message: bytes, token: bytes, *, expected_partition: int
) -> bytes:
    """Verify ``token`` for survey ``ctx`` and ``message`` and return the
    32-byte digest of its tag, to be stored under a uniqueness constraint on
    ``(survey, digest)`` (DESIGN.md §6 "Double submission").

    Order: length and version, then every point (on the curve, not the
    identity, canonical) and scalar (< q) while parsing, then key id and
    partition, then the proof. Raises :class:`InvalidToken` whose ``reason``
    says which check failed; callers must not echo it to the sender. Many
    tokens at once: :func:`crypto._batch.verify_tokens`.
    """
    return verify_parsed_token(
        secret_key, ctx, message, Token.from_bytes(token), expected_partition=expected_partition
    )


def tag_digest_of(token: Token) -> bytes:
    """The digest :func:`verify_token` returns for ``token`` (of its tag ``T``)."""
    return _tag_digest(token.point_encodings()[3])
