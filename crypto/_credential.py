"""One-per-survey anonymous tokens from keyed-verification anonymous
credentials (DESIGN.md §6).

The construction is MAC_GGM of Chase, Meiklejohn and Zaverucha, "Algebraic
MACs and Keyed-Verification Anonymous Credentials" (CCS 2014; "CMZ14"), over
P-256, with the same shape as the IETF Privacy Pass ARC draft:

* issuer key ``(x0, x̃0, x1, x2)``, public ``Cx0 = x0·g + x̃0·h``,
  ``X1 = x1·h``, ``X2 = x2·h``;
* a credential on the peer's hidden secret ``s`` and public partition ``j``
  is ``(U, U' = (x0 + x1·s + x2·j)·U)``, issued blindly (CMZ14 §4.3): the peer
  sends an ElGamal encryption of ``s`` under a fresh key with a proof of
  knowledge, the issuer answers with an encrypted MAC and a proof that it used
  its published key;
* a token for survey context ``ctx`` and message ``m`` (module
  :mod:`crypto._token`) is a re-randomised presentation ``(U, Cs, Cu')``
  (CMZ14 §4.2 "Show"), the disclosed ``j``, the tag ``T = s·H(ctx)`` and one
  Schnorr proof that the same ``s`` sits in the credential and in the tag.

This module holds the keys, the credential and blind issuance, and the
encoding helpers the token module shares.

All group arithmetic goes through :mod:`crypto._group`; secret scalars only
ever meet :func:`~crypto._group.secret_mul`.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from anonml.base.errors import InputError
from anonml.crypto._group import (
    CURVE_ID,
    G,
    H,
    ORDER,
    POINT_BYTES,
    SCALAR_BYTES,
    GroupEncodingError,
    Point,
    RandomSource,
    Transcript,
    decode_point,
    decode_scalar,
    encode_point,
    encode_scalar,
    hedged_scalars,
    is_identity,
    length_prefixed,
    public_lincomb,
    random_scalar,
    secret_mul,
    system_rng,
)
from anonml.crypto._primitives import ct_equal

VERSION = 1
KID_BYTES = 32
TAG_DIGEST_BYTES = 32  # SHA-256 of the tag's encoding
PARTITION_LIMIT = 2**16  # partitions are uint16, as in protocol.SurveyId

_PROTOCOL = b"anonml/token/v1"
_PARTITION = struct.Struct(">H")
_HEADER = struct.Struct(f">B{KID_BYTES}sH")  # version, kid, partition

PUBLIC_KEY_BYTES = 1 + 3 * POINT_BYTES
SECRET_KEY_BYTES = 1 + 4 * SCALAR_BYTES
CREDENTIAL_SECRET_BYTES = 1 + SCALAR_BYTES
CREDENTIAL_BYTES = _HEADER.size + 2 * POINT_BYTES + SCALAR_BYTES
ISSUANCE_REQUEST_BYTES = _HEADER.size + 3 * POINT_BYTES + 4 * SCALAR_BYTES
ISSUANCE_RESPONSE_BYTES = _HEADER.size + 4 * POINT_BYTES + 7 * SCALAR_BYTES


REJECTION_REASONS = frozenset(
    {"malformed", "bad-point", "scalar-range", "wrong-partition", "wrong-kid", "identity-point", "bad-proof"}
)
"""Every ``reason`` a :class:`CredentialError` can carry, for pre-created counters."""


class CredentialError(InputError):
    """Base of the token recipe's errors. ``reason`` (one of
    :data:`REJECTION_REASONS`) is a short label for counters and logs; the
    message is for logs only and is never sent back to a peer."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REJECTION_REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}")
        super().__init__(message)
        self.reason = reason


class InvalidToken(CredentialError):
    """Raised by :func:`verify_token` and :meth:`Token.from_bytes` for any
    token that must not be counted; one opaque type at the boundary."""


class InvalidIssuance(CredentialError):
    """Raised by :func:`issue_credential` (a bad request, on the issuer) and
    :func:`finish_issuance` (a bad response, on the peer), and by the
    request/response parsers."""


class InvalidKeyMaterial(CredentialError):
    """Raised by the parsers of issuer keys, peer secrets and credentials
    (bytes read back from a key file or a peer's local database)."""


_E = TypeVar("_E", bound=CredentialError)


class _Reader:
    """Splits a fixed-length encoding into fields, turning every encoding
    failure into the recipe's own exception type with its reason."""

    def __init__(
        self, data: bytes, expected_length: int, error: type[_E], what: str, *, version: int = VERSION
    ) -> None:
        if not isinstance(data, bytes) or len(data) != expected_length:
            size = len(data) if isinstance(data, (bytes, bytearray)) else type(data).__name__
            raise error("malformed", f"{what} must be {expected_length} bytes, got {size!r}")
        if data[0] != version:
            raise error("malformed", f"unknown {what} version {data[0]!r}")
        self._data = data
        self._offset = 1
        self._error: type[CredentialError] = error

    def raw(self, n: int) -> bytes:
        chunk = self._data[self._offset : self._offset + n]
        self._offset += n
        return chunk

    def partition(self) -> int:
        (value,) = _PARTITION.unpack(self.raw(_PARTITION.size))
        return int(value)

    def header(self) -> tuple[bytes, int]:
        """The key id and partition after the version byte (see :func:`_header`)."""
        return self.raw(KID_BYTES), self.partition()

    def points(self, count: int) -> tuple[Point, ...]:
        return tuple(self.point() for _ in range(count))

    def scalars(self, count: int) -> tuple[int, ...]:
        return tuple(self.scalar() for _ in range(count))

    def point(self) -> Point:
        try:
            return decode_point(self.raw(POINT_BYTES))
        except GroupEncodingError as exc:
            raise self._error(exc.reason, str(exc)) from None

    def scalar(self, *, nonzero: bool = False) -> int:
        try:
            return decode_scalar(self.raw(SCALAR_BYTES), nonzero=nonzero)
        except GroupEncodingError as exc:
            raise self._error(exc.reason, str(exc)) from None


def _check_partition(partition: int, error: type[CredentialError]) -> None:
    if not isinstance(partition, int) or not 0 <= partition < PARTITION_LIMIT:
        raise error("wrong-partition", f"partition out of range: {partition!r}")


def _same_scalar(left: int, right: int) -> bool:
    """Challenge comparison through the one constant-time helper (STYLE.md §9)."""
    return ct_equal(encode_scalar(left), encode_scalar(right))


def _header(kid: bytes, partition: int, version: int = VERSION) -> bytes:
    return _HEADER.pack(version, kid, partition)


def _encode_proof_message(
    kid: bytes, partition: int, points: Sequence[Point], scalars: Sequence[int], *, version: int = VERSION
) -> bytes:
    """The layout of every message carrying a proof (issuance request and
    response, token): header, statement points (and, in a token, the
    commitment), then the scalars (challenge and responses, or responses)."""
    return (
        _header(kid, partition, version)
        + b"".join(encode_point(p) for p in points)
        + b"".join(encode_scalar(k) for k in scalars)
    )


# --------------------------------------------------------------------- keys


class IssuerPublicKey:
    """The published issuer parameters ``(Cx0, X1, X2)`` of one key epoch.

    Immutable; its encoding, key id and transcript heads are computed once,
    since the aggregator verifies thousands of tokens under one key."""

    __slots__ = ("cx0", "x1_pub", "x2_pub", "_encoding", "_kid", "_heads")

    def __init__(self, cx0: Point, x1_pub: Point, x2_pub: Point) -> None:
        self.cx0, self.x1_pub, self.x2_pub = cx0, x1_pub, x2_pub
        self._encoding = bytes((VERSION,)) + b"".join(encode_point(p) for p in (cx0, x1_pub, x2_pub))
        self._kid = hashlib.sha256(length_prefixed(_PROTOCOL + b"/kid", CURVE_ID, self._encoding)).digest()
        self._heads: dict[bytes, Transcript] = {}

    def to_bytes(self) -> bytes:
        return self._encoding

    @classmethod
    def from_bytes(cls, data: bytes) -> IssuerPublicKey:
        reader = _Reader(data, PUBLIC_KEY_BYTES, InvalidKeyMaterial, "issuer public key")
        return cls(reader.point(), reader.point(), reader.point())

    @property
    def kid(self) -> bytes:
        """SHA-256 of the curve id and the canonical public parameters: names
        one key epoch; a token is only verified under the key it names."""
        return self._kid

    def transcript(self, label: bytes, partition: int, *, version: int = VERSION) -> Transcript:
        """A fresh Fiat–Shamir transcript for proof type ``label``, opened
        with the common head of DESIGN.md §6: version, curve, g, h, Cx0, X1,
        X2, kid; then the partition. Each ``label`` has one ``version``."""
        head = self._heads.get(label)
        if head is None:
            head = Transcript(_PROTOCOL + b"/" + label)
            head.append(b"version", bytes((version,)))
            head.append(b"curve", CURVE_ID)
            head.append(b"g", _G_BYTES)
            head.append(b"h", _H_BYTES)
            head.append_point(b"Cx0", self.cx0)
            head.append_point(b"X1", self.x1_pub)
            head.append_point(b"X2", self.x2_pub)
            head.append(b"kid", self._kid)
            self._heads[label] = head
        transcript = head.copy()
        transcript.append(b"partition", _PARTITION.pack(partition))
        return transcript

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IssuerPublicKey) and self._encoding == other._encoding

    def __hash__(self) -> int:
        return hash(self._encoding)

    def __repr__(self) -> str:
        return f"IssuerPublicKey(kid={self._kid.hex()[:16]}…)"


_G_BYTES = encode_point(G)
_H_BYTES = encode_point(H)


class IssuerSecretKey:
    """The issuer's MAC_GGM key ``(x0, x̃0, x1, x2)`` for one round (CMZ14 §4.1)."""

    __slots__ = ("_x0", "_x0_blind", "_x1", "_x2", "_public_key")

    def __init__(self, x0: int, x0_blind: int, x1: int, x2: int) -> None:
        for value in (x0, x0_blind, x1, x2):
            if not 0 < value < ORDER:
                raise InvalidKeyMaterial("scalar-range", "issuer secret scalars must lie in [1, q)")
        self._x0, self._x0_blind, self._x1, self._x2 = x0, x0_blind, x1, x2
        self._public_key = IssuerPublicKey(
            secret_mul(x0, G) + secret_mul(x0_blind, H), secret_mul(x1, H), secret_mul(x2, H)
        )

    @classmethod
    def generate(cls, rng: RandomSource = system_rng) -> IssuerSecretKey:
        return cls(random_scalar(rng), random_scalar(rng), random_scalar(rng), random_scalar(rng))

    def public_key(self) -> IssuerPublicKey:
        return self._public_key

    def to_bytes(self) -> bytes:
        scalars = (self._x0, self._x0_blind, self._x1, self._x2)
        return bytes((VERSION,)) + b"".join(encode_scalar(x) for x in scalars)

    @classmethod
    def from_bytes(cls, data: bytes) -> IssuerSecretKey:
        reader = _Reader(data, SECRET_KEY_BYTES, InvalidKeyMaterial, "issuer secret key")
        return cls(*(reader.scalar(nonzero=True) for _ in range(4)))

    def __repr__(self) -> str:  # never print the scalars
        return f"IssuerSecretKey(kid={self._public_key.kid.hex()[:16]}…)"


class CredentialSecret:
    """The peer's hidden attribute ``s``: whoever knows it can compute all of
    the peer's tags, so it never leaves the peer (blind issuance)."""

    __slots__ = ("_s",)

    def __init__(self, s: int) -> None:
        if not 0 < s < ORDER:
            raise InvalidKeyMaterial("scalar-range", "credential secret must lie in [1, q)")
        self._s = s

    @classmethod
    def generate(cls, rng: RandomSource = system_rng) -> CredentialSecret:
        return cls(random_scalar(rng))

    def to_bytes(self) -> bytes:
        return bytes((VERSION,)) + encode_scalar(self._s)

    @classmethod
    def from_bytes(cls, data: bytes) -> CredentialSecret:
        reader = _Reader(data, CREDENTIAL_SECRET_BYTES, InvalidKeyMaterial, "credential secret")
        return cls(reader.scalar(nonzero=True))

    def __repr__(self) -> str:
        return "CredentialSecret(…)"


# ------------------------------------------------------------- transcripts


def _challenge(transcript: Transcript, items: Sequence[tuple[bytes, Point]]) -> int:
    for label, point in items:
        transcript.append_point(label, point)
    return transcript.challenge()


# ----------------------------------------------------------- blind issuance


@dataclass(frozen=True, eq=False)
class IssuanceRequest:
    """Peer → issuer: ElGamal key ``D = d·g``, ciphertext ``(a1, a2) =
    (r·g, s·g + r·D)`` of ``s``, and a proof of knowledge of ``(d, s, r)``."""

    kid: bytes
    partition: int
    elgamal_key: Point
    a1: Point
    a2: Point
    challenge: int
    responses: tuple[int, int, int]  # for d, s, r

    def to_bytes(self) -> bytes:
        return _encode_proof_message(
            self.kid, self.partition, (self.elgamal_key, self.a1, self.a2), (self.challenge, *self.responses)
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> IssuanceRequest:
        reader = _Reader(data, ISSUANCE_REQUEST_BYTES, InvalidIssuance, "issuance request")
        kid, partition = reader.header()
        elgamal_key, a1, a2 = reader.points(3)
        challenge, r_d, r_s, r_r = reader.scalars(4)
        return cls(kid, partition, elgamal_key, a1, a2, challenge, (r_d, r_s, r_r))


@dataclass(frozen=True, eq=False)
class IssuanceState:
    """What the peer keeps between :func:`begin_issuance` and
    :func:`finish_issuance`: its secret, the ElGamal decryption key and the
    request it sent (the issuer's proof is checked against it)."""

    public_key: IssuerPublicKey
    secret: CredentialSecret
    elgamal_secret: int
    request: IssuanceRequest

    def __repr__(self) -> str:
        return f"IssuanceState(partition={self.request.partition!r})"


@dataclass(frozen=True, eq=False)
class IssuanceResponse:
    """Issuer → peer: ``U = b·g``, ``T1 = b·X1``, the encrypted MAC
    ``(e1, e2)`` and a proof that they were made with the published key."""

    kid: bytes
    partition: int
    u: Point
    t1: Point
    e1: Point
    e2: Point
    challenge: int
    responses: tuple[int, int, int, int, int, int]  # for x0, x̃0, x2, b, t1, r'

    def to_bytes(self) -> bytes:
        return _encode_proof_message(
            self.kid, self.partition, (self.u, self.t1, self.e1, self.e2), (self.challenge, *self.responses)
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> IssuanceResponse:
        reader = _Reader(data, ISSUANCE_RESPONSE_BYTES, InvalidIssuance, "issuance response")
        kid, partition = reader.header()
        u, t1, e1, e2 = reader.points(4)
        challenge, *r = reader.scalars(7)
        return cls(kid, partition, u, t1, e1, e2, challenge, (r[0], r[1], r[2], r[3], r[4], r[5]))


@dataclass(frozen=True, eq=False)
class Credential:
    """A MAC_GGM credential ``(U, U')`` on ``(s, j)`` under key ``kid``,
    together with ``s``: the peer's private record, stored locally."""

    kid: bytes
    partition: int
    u: Point
    u_prime: Point
    secret: CredentialSecret

    def to_bytes(self) -> bytes:
        return (
            _header(self.kid, self.partition)
            + encode_point(self.u)
            + encode_point(self.u_prime)
            + self.secret.to_bytes()[1:]
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Credential:
        reader = _Reader(data, CREDENTIAL_BYTES, InvalidKeyMaterial, "credential")
        kid, partition = reader.header()
        u, u_prime = reader.points(2)
        return cls(kid, partition, u, u_prime, CredentialSecret(reader.scalar(nonzero=True)))

    def __repr__(self) -> str:
        return f"Credential(kid={self.kid.hex()[:16]}…, partition={self.partition!r})"


def _request_commitments(
    request: IssuanceRequest, challenge: int
) -> tuple[Point, Point, Point]:
    """Recompute the request proof's commitments from its responses:
    ``A = Σ response·base + c·statement`` for
    ``D = d·g``, ``a1 = r·g``, ``a2 = s·g + r·D``."""
    rd, rs, rr = request.responses
    return (
        public_lincomb([rd, challenge], [G, request.elgamal_key]),
        public_lincomb([rr, challenge], [G, request.a1]),
        public_lincomb([rs, rr, challenge], [G, request.elgamal_key, request.a2]),
    )


def _request_challenge(public_key: IssuerPublicKey, request: IssuanceRequest, commitments: Sequence[Point]) -> int:
    statement = [(b"D", request.elgamal_key), (b"a1", request.a1), (b"a2", request.a2)]
    labelled = [(b"A_D", commitments[0]), (b"A_a1", commitments[1]), (b"A_a2", commitments[2])]
    return _challenge(public_key.transcript(b"issuance-request", request.partition), statement + labelled)


def begin_issuance(
    public_key: IssuerPublicKey,
    secret: CredentialSecret,
    partition: int,
    *,
    rng: RandomSource = system_rng,
) -> tuple[IssuanceRequest, IssuanceState]:
    """Start blind issuance (CMZ14 §4.3, user side): encrypt ``s`` under a
    fresh ElGamal key and prove knowledge of the plaintext and keys.

    The issuer's view is ``(D, r·g, s·g + r·D)`` with uniform ``d, r`` plus a
    zero-knowledge proof: under DDH the ciphertext is indistinguishable from
    a uniform pair whatever ``s`` is, so the issuer learns nothing about ``s``.
    """
    _check_partition(partition, InvalidIssuance)
    d, r, kd, ks, kr = hedged_scalars(
        b"issuance-request", secret.to_bytes(), public_key.kid + _PARTITION.pack(partition), rng, 5
    )
    s = secret._s
    elgamal_key = secret_mul(d, G)
    a1 = secret_mul(r, G)
    # The peer knows d, so s·g + r·D = (s + r·d)·g and ks·g + kr·D = (ks + kr·d)·g: the same points,
    # every multiplication here by g from its table (crypto._group).
    a2 = secret_mul((s + r * d) % ORDER, G)
    commitments = (secret_mul(kd, G), secret_mul(kr, G), secret_mul((ks + kr * d) % ORDER, G))
    unsigned = IssuanceRequest(public_key.kid, partition, elgamal_key, a1, a2, 0, (0, 0, 0))
    c = _request_challenge(public_key, unsigned, commitments)
    responses = ((kd - c * d) % ORDER, (ks - c * s) % ORDER, (kr - c * r) % ORDER)
    request = IssuanceRequest(public_key.kid, partition, elgamal_key, a1, a2, c, responses)
    return request, IssuanceState(public_key, secret, d, request)


def _response_commitments(
    public_key: IssuerPublicKey, request: IssuanceRequest, response: IssuanceResponse
) -> tuple[Point, ...]:
    """Recompute the issuer proof's commitments for the seven relations
    (CMZ14 §4.3, issuer side, with the auxiliary ``T1 = b·X1 = t1·h`` that
    linearises ``t1 = b·x1`` as in Lox/CMZ implementations):

    ``Cx0 = x0·g + x̃0·h``, ``X2 = x2·h``, ``U = b·g``, ``T1 = b·X1``,
    ``T1 = t1·h``, ``e1 = t1·a1 + r'·g``,
    ``e2 = x0·U + x2·(j·U) + t1·a2 + r'·D``.
    """
    r_x0, r_x0b, r_x2, r_b, r_t1, r_rp = response.responses
    c = response.challenge
    j = response.partition
    return (
        public_lincomb([r_x0, r_x0b, c], [G, H, public_key.cx0]),
        public_lincomb([r_x2, c], [H, public_key.x2_pub]),
        public_lincomb([r_b, c], [G, response.u]),
        public_lincomb([r_b, c], [public_key.x1_pub, response.t1]),
        public_lincomb([r_t1, c], [H, response.t1]),
        public_lincomb([r_t1, r_rp, c], [request.a1, G, response.e1]),
        # x0·U + x2·(j·U) = (x0 + j·x2)·U, so the response for U is r_x0 + j·r_x2
        public_lincomb(
            [r_x0 + j * r_x2, r_t1, r_rp, c], [response.u, request.a2, request.elgamal_key, response.e2]
        ),
    )


def _response_challenge(
    public_key: IssuerPublicKey,
    request: IssuanceRequest,
    response: IssuanceResponse,
    commitments: Sequence[Point],
) -> int:
    # The request's statement is bound in, so a response answers one request only.
    statement = [
        (b"D", request.elgamal_key),
        (b"a1", request.a1),
        (b"a2", request.a2),
        (b"U", response.u),
        (b"T1", response.t1),
        (b"e1", response.e1),
        (b"e2", response.e2),
    ]
    labelled = [(b"A%d" % (i + 1), point) for i, point in enumerate(commitments)]
    return _challenge(public_key.transcript(b"issuance-response", response.partition), statement + labelled)


def issue_credential(
    secret_key: IssuerSecretKey,
    request_bytes: bytes,
    partition: int,
    *,
    rng: RandomSource = system_rng,
) -> IssuanceResponse:
    """Issuer side of blind issuance: check the request's proof, then return
    ``U = b·g`` and the ElGamal encryption of ``U' = (x0 + x1·s + x2·j)·U``
    computed homomorphically from the encryption of ``s``, re-randomised by
    ``r'``, with a proof that ``(x0, x̃0, x1, x2)`` match the public key.

    ``partition`` comes from the issuer's roster, not from the peer.
    Raises :class:`InvalidIssuance`.
    """
    _check_partition(partition, InvalidIssuance)
    public_key = secret_key.public_key()
    request = IssuanceRequest.from_bytes(request_bytes)
    if not ct_equal(request.kid, public_key.kid):
        raise InvalidIssuance("wrong-kid", f"request names key {request.kid.hex()!r}")
    if request.partition != partition:
        raise InvalidIssuance("wrong-partition", f"request for partition {request.partition!r}, roster says {partition!r}")
    request_commitments = _request_commitments(request, request.challenge)
    if any(is_identity(a) for a in request_commitments) or not _same_scalar(
        request.challenge, _request_challenge(public_key, request, request_commitments)
    ):
        raise InvalidIssuance("bad-proof", "issuance request proof does not verify")

    x0, x0b, x1, x2 = secret_key._x0, secret_key._x0_blind, secret_key._x1, secret_key._x2
    b, rp, k_x0, k_x0b, k_x2, k_b, k_t1, k_rp = hedged_scalars(
        b"issuance-response", secret_key.to_bytes(), request_bytes, rng, 8
    )
    t1 = b * x1 % ORDER
    # The issuer knows the logarithms of its own points (U = b·g, X1 = x1·h), so every multiple of
    # U or X1 is a multiple of g or h by a product of scalars: the same points, from the generators'
    # tables (crypto._group) at a fraction of a multiplication of an arbitrary point.
    u = secret_mul(b, G)
    t1_point = secret_mul(t1, H)  # b·X1
    e1 = secret_mul(t1, request.a1) + secret_mul(rp, G)
    e2 = (
        secret_mul((x0 + partition * x2) * b % ORDER, G)  # (x0 + j·x2)·U
        + secret_mul(t1, request.a2)
        + secret_mul(rp, request.elgamal_key)
    )
    commitments = (
        secret_mul(k_x0, G) + secret_mul(k_x0b, H),
        secret_mul(k_x2, H),
        secret_mul(k_b, G),
        secret_mul(k_b * x1 % ORDER, H),  # k_b·X1
        secret_mul(k_t1, H),
        secret_mul(k_t1, request.a1) + secret_mul(k_rp, G),
        secret_mul((k_x0 + partition * k_x2) * b % ORDER, G)  # (k_x0 + j·k_x2)·U
        + secret_mul(k_t1, request.a2)
        + secret_mul(k_rp, request.elgamal_key),
    )
    unsigned = IssuanceResponse(public_key.kid, partition, u, t1_point, e1, e2, 0, (0, 0, 0, 0, 0, 0))
    c = _response_challenge(public_key, request, unsigned, commitments)
    witnesses = (x0, x0b, x2, b, t1, rp)
    nonces = (k_x0, k_x0b, k_x2, k_b, k_t1, k_rp)
    r = tuple((k - c * w) % ORDER for k, w in zip(nonces, witnesses))
    return IssuanceResponse(
        public_key.kid, partition, u, t1_point, e1, e2, c, (r[0], r[1], r[2], r[3], r[4], r[5])
    )


def finish_issuance(state: IssuanceState, response_bytes: bytes) -> Credential:
    """Peer side: check the issuer's proof, then decrypt ``U' = e2 - d·e1``.
    Raises :class:`InvalidIssuance`."""
    public_key, request = state.public_key, state.request
    response = IssuanceResponse.from_bytes(response_bytes)
    if not ct_equal(response.kid, public_key.kid):
        raise InvalidIssuance("wrong-kid", f"response names key {response.kid.hex()!r}")
    if response.partition != request.partition:
        raise InvalidIssuance("wrong-partition", f"response for partition {response.partition!r}")
    commitments = _response_commitments(public_key, request, response)
    if any(is_identity(a) for a in commitments) or not _same_scalar(
        response.challenge, _response_challenge(public_key, request, response, commitments)
    ):
        raise InvalidIssuance("bad-proof", "issuer proof does not verify")
    u_prime = response.e2 - secret_mul(state.elgamal_secret, response.e1)
    if is_identity(u_prime):  # only a key with x0 + x1·s + x2·j = 0; never use it
        raise InvalidIssuance("identity-point", "credential MAC is the identity")
    return Credential(public_key.kid, request.partition, response.u, u_prime, state.secret)
