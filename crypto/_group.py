"""P-256 helpers for the token recipe (DESIGN.md §6): the group, its two
independent generators, strict encodings, the two kinds of scalar
multiplication, Fiat–Shamir transcripts and hedged randomness.

Nothing here knows about credentials; ``_credential.py`` composes these
helpers and does no raw group arithmetic of its own beyond point addition.

Two multiplication helpers exist on purpose:

* :func:`secret_mul` multiplies one point by one scalar with OpenSSL's
  single-point ``EC_POINT_mul``, which for P-256 runs a fixed-window,
  constant-time ladder. Every secret scalar (keys, attributes, nonces,
  blinding factors) goes through it.
* :func:`public_lincomb` is petlib's ``wsum`` (``EC_POINTs_mul``), a
  variable-time multi-scalar multiplication. It is faster and is only ever
  given public scalars (proof responses, challenges, the public partition).

Both multiply the two fixed generators ``G`` and ``H`` from a table of their
precomputed multiples (:class:`_GeneratorTable`): a copy of the curve's group
whose generator is that point, after OpenSSL's ``EC_GROUP_precompute_mult``.
A scalar times a group's generator is OpenSSL's fixed-base path (the one its
ECDSA signing nonces take): for P-256 ``ecp_nistz256``'s table of 7-bit
windows read with a constant-time gather (the generic code's Montgomery
ladder elsewhere), so secret scalars stay constant time, at a fraction of
the cost of a multiplication of an arbitrary point (half the issuer's
multiplications and most of the peer's are by ``G`` or ``H``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, Union

import numpy as np
import petlib._petlib
from petlib.bindings import _C, _FFI
from petlib.bn import Bn, get_ctx
from petlib.ec import EcGroup, EcPt

from anonml.base.errors import InputError

# NIST P-256 (OpenSSL nid 415, "prime256v1"); DESIGN.md §6 fixes the curve.
# petlib's default curve is P-224, so the nid is always passed explicitly.
CURVE_NID = 415
CURVE_ID = b"P-256"
GROUP = EcGroup(CURVE_NID)
ORDER: int = int(GROUP.order())
FIELD_PRIME: int = int(GROUP.parameters()["p"])

SCALAR_BYTES = 32
POINT_BYTES = 33  # SEC1 compressed: 0x02/0x03 prefix and the 32-byte x
_COMPRESSED_PREFIXES = (2, 3)
# Wide reduction: 64 uniform bytes mod q leave a bias below 2**-256.
_WIDE_BYTES = 64

_H2C_DOMAIN = b"anonml/hash-to-point/v1"



class Point(Protocol):
    """What the recipes use of a petlib ``EcPt`` (petlib ships no types, so
    this protocol is what lets mypy check point arithmetic)."""

    pt: Any

    def __add__(self, other: Point) -> Point: ...

    def __sub__(self, other: Point) -> Point: ...

    def pt_mul(self, scalar: Bn) -> Point: ...

    def export(self) -> bytes: ...


RandomSource = Union[Callable[[int], bytes], np.random.Generator]
"""Where fresh randomness comes from: a ``n -> n bytes`` callable (default
``os.urandom``) or a numpy Generator. Recipes hedge it with their secrets
(:func:`hedged_scalars`), so a weak or repeating source cannot leak a key."""


class GroupEncodingError(InputError):
    """Raised by :func:`decode_point` and :func:`decode_scalar` for bytes that
    are not a canonical encoding. ``reason`` is a short counter label:
    ``"bad-point"`` or ``"scalar-range"``; recipes re-raise it as their own
    opaque exception with the same reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def length_prefixed(*items: bytes) -> bytes:
    """Concatenate ``items``, each preceded by its 4-byte big-endian length,
    so that no two different item lists encode to the same bytes."""
    return b"".join(struct.pack(">I", len(item)) + item for item in items)


def hash_to_point(domain: bytes, data: bytes) -> Point:
    """A point with no known discrete logarithm to any other generator.

    petlib's try-and-increment (SHA-512 of the input until the value is a
    valid x-coordinate) applied to a length-prefixed, domain-separated input.
    It is variable time, which is fine: it is only applied to public data
    (generator labels and survey contexts). Never replace this by ``k·g``
    for a hashed ``k``: a known logarithm makes all survey tags linkable
    (DESIGN.md §6 pitfalls).
    """
    point: Point = GROUP.hash_to_point(length_prefixed(_H2C_DOMAIN, domain, data))
    return point


# The two independent generators of MAC_GGM (CMZ14 §4; DESIGN.md §6: "g, h
# from hash-to-point with domain separation"). Nobody knows log_g(h).
G = hash_to_point(b"generator", b"g")
H = hash_to_point(b"generator", b"h")
IDENTITY: Point = GROUP.infinite()


def is_identity(point: Point) -> bool:
    # petlib's ``is_infinite`` builds and compares against a second point;
    # OpenSSL's own predicate is ten times cheaper and this runs per point.
    return bool(_C.EC_POINT_is_at_infinity(GROUP.ecg, point.pt) == 1)


def _to_bn(scalar: int) -> Bn:
    return Bn.from_binary(scalar.to_bytes(SCALAR_BYTES, "big"))


def _address(pointer: Any) -> int:
    return int(_FFI.cast("uintptr_t", pointer))


class _GeneratorTable:
    """OpenSSL's precomputed multiples of one fixed point: a copy of :data:`GROUP` with that point
    as its generator, made on first use (a fraction of a second; one per process and point).

    ``EC_GROUP_set_generator`` is not in petlib's bindings: it is looked up
    through petlib's own extension (``dlsym`` on it searches the libcrypto it
    was linked with), so the group it changes is one that library made.
    """

    def __init__(self, point: Point) -> None:
        self.point = point
        self._group: EcGroup | None = None
        self._lock = threading.Lock()

    def _ready(self) -> EcGroup:
        group = self._group
        if group is None:
            with self._lock:
                if self._group is None:
                    self._group = self._build()
                group = self._group
        return group

    def _build(self) -> EcGroup:
        group = EcGroup(CURVE_NID)
        set_generator = ctypes.CDLL(petlib._petlib.__file__).EC_GROUP_set_generator
        set_generator.argtypes = [ctypes.c_void_p] * 4
        set_generator.restype = ctypes.c_int
        order, cofactor = GROUP.order(), Bn(1)  # kept alive across the call: OpenSSL copies them
        if set_generator(_address(group.ecg), _address(self.point.pt), _address(order.bn), _address(cofactor.bn)) != 1:
            raise RuntimeError("OpenSSL refused EC_GROUP_set_generator for a fixed P-256 point")
        if _C.EC_GROUP_precompute_mult(group.ecg, get_ctx().bnctx) != 1:
            raise RuntimeError("OpenSSL could not precompute the multiples of a fixed P-256 point")
        return group

    def mul(self, scalar: Bn) -> Point:
        """``scalar·point`` from the table: constant time (module docstring)."""
        result: Point = EcPt(GROUP)
        if _C.EC_POINT_mul(self._ready().ecg, result.pt, scalar.bn, _FFI.NULL, _FFI.NULL, get_ctx().bnctx) != 1:
            raise RuntimeError("OpenSSL failed a fixed-base P-256 multiplication")
        return result

    def mul_plus(self, scalar: Bn, scalars: Sequence[Bn], points: Sequence[Point]) -> Point:
        """``scalar·point + Σ scalars[i]·points[i]`` in one ``EC_POINTs_mul`` (variable time: PUBLIC scalars only)."""
        result: Point = EcPt(GROUP)
        err = _C.EC_POINTs_mul(self._ready().ecg, result.pt, scalar.bn, len(points), [p.pt for p in points],
                               [k.bn for k in scalars], get_ctx().bnctx)
        if err != 1:
            raise RuntimeError("OpenSSL failed a P-256 multi-scalar multiplication")
        return result


def _table_of(point: Point) -> _GeneratorTable | None:
    """The table of ``G`` or ``H`` (by identity: the module's own two points), else None."""
    return _FIXED_TABLES.get(id(point))


def secret_mul(scalar: int, point: Point) -> Point:
    """``scalar·point`` in constant time, for secret scalars in ``[0, q)``.

    petlib's ``EcPt.pt_mul`` calls ``EC_POINT_mul`` with a single point and
    no generator scalar; for P-256 OpenSSL dispatches that to its
    constant-time windowed multiplication (``ecp_nistz256``, or the Montgomery
    ladder in the generic code). ``G`` and ``H`` go through their tables
    (constant time too, module docstring). ``wsum`` must never see these scalars.
    """
    table = _table_of(point)
    if table is not None:
        return table.mul(_to_bn(scalar))
    return point.pt_mul(_to_bn(scalar))


def public_lincomb(scalars: Sequence[int], points: Sequence[Point]) -> Point:
    """``Σ scalars[i]·points[i]`` in variable time; PUBLIC scalars only (the terms on ``G`` and ``H``
    from their tables)."""
    fixed: list[tuple[_GeneratorTable, Bn]] = []
    rest: list[Point] = []
    weights: list[Bn] = []
    for k, point in zip(scalars, points, strict=True):
        table = _table_of(point)
        if table is None:
            rest.append(point)
            weights.append(_to_bn(k % ORDER))
        else:
            fixed.append((table, _to_bn(k % ORDER)))
    if not fixed:
        result: Point = GROUP.wsum(weights, rest)
        return result
    # The first table's term rides in the same call, as that group's generator scalar.
    (table, k), *others = fixed
    result = table.mul_plus(k, weights, rest)
    for table, k in others:
        result = result + table.mul(k)
    return result


# Keyed by identity: G and H live as long as the module, so their ids are never reused.
_FIXED_TABLES: dict[int, _GeneratorTable] = {id(point): _GeneratorTable(point) for point in (G, H)}


def encode_point(point: Point) -> bytes:
    """The 33-byte compressed SEC1 encoding. The identity has none."""
    encoded: bytes = point.export()
    if len(encoded) != POINT_BYTES:  # SEC1 encodes the identity as one 0x00 byte
        raise ValueError(f"the identity point has no encoding: {encoded!r}")
    return encoded


def decode_point(data: bytes) -> Point:
    """Parse a compressed point strictly: exactly 33 bytes, prefix 2 or 3,
    ``x < p``, on the curve and not the identity.

    These checks make the encoding canonical: with ``x < p`` and the prefix
    fixing the parity of ``y`` (never 0 on P-256, whose order is prime), each
    point has exactly one accepted encoding, so equal tags have equal bytes.
    """
    if len(data) != POINT_BYTES:
        raise GroupEncodingError("bad-point", f"a point is {POINT_BYTES} bytes, got {len(data)}")
    if data[0] not in _COMPRESSED_PREFIXES:
        raise GroupEncodingError("bad-point", f"point prefix must be 2 or 3, got {data[0]!r}")
    if int.from_bytes(data[1:], "big") >= FIELD_PRIME:
        raise GroupEncodingError("bad-point", f"x-coordinate not below p: {data.hex()!r}")
    # OpenSSL decompresses by taking a checked square root of x³ - 3x + b and
    # refuses x when there is none, so a decoded point lies on the curve by
    # construction: no separate on-curve check (tests/test_tokens.py feeds an
    # x off the curve).
    try:
        point: Point = EcPt.from_binary(data, GROUP)
    except Exception:  # petlib raises a bare Exception when OpenSSL refuses
        raise GroupEncodingError("bad-point", f"not a point on P-256: {data.hex()!r}") from None
    if is_identity(point):
        raise GroupEncodingError("bad-point", f"the identity point: {data.hex()!r}")
    return point


def encode_scalar(scalar: int) -> bytes:
    if not 0 <= scalar < ORDER:
        raise ValueError(f"scalar out of range: {scalar!r}")
    return scalar.to_bytes(SCALAR_BYTES, "big")


def decode_scalar(data: bytes, *, nonzero: bool = False) -> int:
    """Parse a 32-byte big-endian scalar; reject values ``>= q`` (and 0 when
    ``nonzero``) rather than reducing them, so encodings are unique."""
    if len(data) != SCALAR_BYTES:
        raise GroupEncodingError("scalar-range", f"a scalar is {SCALAR_BYTES} bytes, got {len(data)}")
    value = int.from_bytes(data, "big")
    if value >= ORDER or (nonzero and value == 0):
        raise GroupEncodingError("scalar-range", f"scalar out of range: {data.hex()!r}")
    return value


class Transcript:
    """A Fiat–Shamir transcript: every appended item is labelled and
    length-prefixed, and the challenge is SHA-512 of it all reduced mod q."""

    def __init__(self, protocol_label: bytes) -> None:
        self._hash = hashlib.sha512(length_prefixed(protocol_label))

    def copy(self) -> Transcript:
        """An independent transcript with the same items so far (lets a
        verifier hash the per-key head once and fork it per token)."""
        forked = Transcript.__new__(Transcript)
        forked._hash = self._hash.copy()
        return forked

    def append(self, label: bytes, data: bytes) -> None:
        self._hash.update(length_prefixed(label, data))

    def append_all(self, *items: tuple[bytes, bytes]) -> None:
        """Append each ``(label, data)`` in order, as :meth:`append` would
        (the same bytes reach the hash), in one update."""
        self._hash.update(length_prefixed(*(part for item in items for part in item)))

    def append_point(self, label: bytes, point: Point) -> None:
        self.append(label, encode_point(point))

    def challenge(self) -> int:
        return int.from_bytes(self._hash.digest(), "big") % ORDER


def random_bytes(rng: RandomSource, n: int) -> bytes:
    if isinstance(rng, np.random.Generator):
        return rng.bytes(n)
    data = rng(n)
    if len(data) != n:
        raise ValueError(f"random source returned {len(data)} bytes, wanted {n!r}")
    return data


def hedged_scalars(
    label: bytes, secret: bytes, public: bytes, rng: RandomSource, count: int
) -> list[int]:
    """``count`` nonzero scalars from fresh randomness hedged with the
    caller's secret and the statement being proven.

    A Schnorr proof whose nonce repeats across two challenges reveals the
    witness (``s = (r1 - r2)/(c2 - c1)``). Hashing the secret and the public
    statement (which includes the message) into the nonce, as in RFC 6979 §3.6
    "additional data" and XEdDSA, means a broken or repeating ``rng`` can at
    worst make a proof deterministic, never reuse a nonce across statements.
    """
    seed = length_prefixed(b"anonml/hedged-nonces/v1", label, secret, public, random_bytes(rng, 32))
    stream = hashlib.shake_256(seed).digest(_WIDE_BYTES * (count + 4))
    scalars: list[int] = []
    for offset in range(0, len(stream), _WIDE_BYTES):
        value = int.from_bytes(stream[offset : offset + _WIDE_BYTES], "big") % ORDER
        if value:  # zero has probability 2**-256; skip rather than bias
            scalars.append(value)
        if len(scalars) == count:
            return scalars
    raise RuntimeError("hedged nonce stream exhausted")  # pragma: no cover - probability 2**-1000


SMALL_COEFFICIENT_BYTES = 16  # 128-bit batch coefficients: a bad equation survives w.p. <= 2**-128


def small_coefficients(count: int, rng: RandomSource) -> list[int]:
    """``count`` uniform coefficients in ``[1, 2**128]`` for a small-exponent
    batch test (Bellare, Garay, Rabin 1998). Drawn fresh from ``rng`` (the
    system CSPRNG by default) and never disclosed: a prover that could
    predict them could make two bad equations cancel."""
    data = random_bytes(rng, SMALL_COEFFICIENT_BYTES * count)
    step = SMALL_COEFFICIENT_BYTES
    return [int.from_bytes(data[i : i + step], "big") + 1 for i in range(0, len(data), step)]


def random_scalar(rng: RandomSource) -> int:
    """A uniform nonzero scalar straight from ``rng`` (for long-term keys)."""
    while True:
        value = int.from_bytes(random_bytes(rng, _WIDE_BYTES), "big") % ORDER
        if value:
            return value


def seeded_rng(seed: bytes) -> Callable[[int], bytes]:
    """A deterministic byte stream (SHAKE-256 in counter mode) for
    known-answer vectors and reproducible tests. Never use it for real keys."""
    counter = 0

    def read(n: int) -> bytes:
        nonlocal counter
        counter += 1
        return hashlib.shake_256(length_prefixed(b"anonml/seeded-rng/v1", seed, struct.pack(">Q", counter))).digest(n)

    return read


def system_rng(n: int) -> bytes:
    """The default randomness: the operating system's CSPRNG."""
    return os.urandom(n)
