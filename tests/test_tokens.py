"""One-per-survey tokens (DESIGN.md §6): behaviour and every listed pitfall.

Each pitfall test is written so that it fails if the check it names is
removed from crypto/_credential.py, crypto/_token.py or crypto/_group.py.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import petlib.ec
import pytest
from petlib.bn import Bn
from scipy import stats

import anonml.crypto._credential as credential_module
import anonml.crypto._group as group_module
import anonml.crypto._token as token_module
from anonml.crypto import (
    TAG_DIGEST_BYTES,
    TOKEN_BYTES,
    Credential,
    CredentialSecret,
    InvalidIssuance,
    InvalidKeyMaterial,
    InvalidToken,
    IssuanceRequest,
    IssuanceResponse,
    IssuerPublicKey,
    IssuerSecretKey,
    Token,
    begin_issuance,
    finish_issuance,
    issue_credential,
    make_token,
    survey_point,
    tag_digest,
    token_challenges,
    verify_parsed_token,
    verify_token,
)
from anonml.crypto._group import (
    GROUP,
    IDENTITY,
    ORDER,
    POINT_BYTES,
    G,
    H,
    Transcript,
    encode_point,
    is_identity,
    length_prefixed,
    public_lincomb,
    random_scalar,
    secret_mul,
    seeded_rng,
)
from anonml.protocol import SurveyId

ROUND = hashlib.sha256(b"round under test").digest()
CTX_A = SurveyId.data(ROUND, 3, 1).to_bytes()
CTX_B = SurveyId.data(ROUND, 3, 2).to_bytes()
MESSAGE = b"perturbed histogram of subset 1"
# Token layout (version 2): version(1) kid(32) partition(2) U Cs Cu' T A (33 each) rs rz rr (32 each).
_POINTS_AT = 35
_TOKEN_POINTS = 5
_TOKEN_SCALARS = 3
_SCALARS_AT = _POINTS_AT + _TOKEN_POINTS * POINT_BYTES


def _issue(secret_key: IssuerSecretKey, secret: CredentialSecret, partition: int, seed: bytes) -> Credential:
    rng = seeded_rng(seed)
    request, state = begin_issuance(secret_key.public_key(), secret, partition, rng=rng)
    response = issue_credential(secret_key, request.to_bytes(), partition, rng=rng)
    return finish_issuance(state, response.to_bytes())


@pytest.fixture(scope="module")
def secret_key() -> IssuerSecretKey:
    return IssuerSecretKey.generate(seeded_rng(b"issuer key, epoch 1"))


@pytest.fixture(scope="module")
def other_epoch_key() -> IssuerSecretKey:
    return IssuerSecretKey.generate(seeded_rng(b"issuer key, epoch 2"))


@pytest.fixture(scope="module")
def peer_a(secret_key: IssuerSecretKey) -> Credential:
    return _issue(secret_key, CredentialSecret.generate(seeded_rng(b"peer a")), 3, b"issuance a")


@pytest.fixture(scope="module")
def peer_b(secret_key: IssuerSecretKey) -> Credential:
    return _issue(secret_key, CredentialSecret.generate(seeded_rng(b"peer b")), 3, b"issuance b")


@pytest.fixture(scope="module")
def token_a(secret_key: IssuerSecretKey, peer_a: Credential) -> bytes:
    return make_token(secret_key.public_key(), peer_a, CTX_A, MESSAGE, rng=seeded_rng(b"token a"))


def _reason(call: Callable[[], object], error: type[Exception] = InvalidToken) -> str:
    with pytest.raises(error) as caught:
        call()
    reason: str = caught.value.reason  # type: ignore[attr-defined]
    return reason


def _replace(data: bytes, at: int, chunk: bytes) -> bytes:
    return data[:at] + chunk + data[at + len(chunk) :]


# ------------------------------------------------------------ behaviour


def test_token_verifies_and_fits_the_size_target(secret_key: IssuerSecretKey, peer_a: Credential, token_a: bytes) -> None:
    assert len(token_a) == TOKEN_BYTES <= 300
    digest = verify_token(secret_key, CTX_A, MESSAGE, token_a, expected_partition=3)
    assert len(digest) == TAG_DIGEST_BYTES
    assert digest == tag_digest(peer_a, CTX_A)


def test_tags_repeat_within_a_survey_and_differ_across_surveys(
    secret_key: IssuerSecretKey, peer_a: Credential, peer_b: Credential
) -> None:
    public_key = secret_key.public_key()

    def digest(credential: Credential, ctx: bytes, message: bytes) -> bytes:
        token = make_token(public_key, credential, ctx, message)
        return verify_token(secret_key, ctx, message, token, expected_partition=3)

    first, second = digest(peer_a, CTX_A, b"one"), digest(peer_a, CTX_A, b"one")
    assert first == second == digest(peer_a, CTX_A, b"another message")
    assert digest(peer_a, CTX_B, b"one") != first
    assert digest(peer_b, CTX_A, b"one") != first
    assert tag_digest(peer_a, CTX_B) != tag_digest(peer_a, CTX_A)


def test_tokens_of_one_credential_share_no_presentation_point(secret_key: IssuerSecretKey, peer_a: Credential) -> None:
    # Re-randomisation (CMZ14 §4.2): only the tag repeats within a survey.
    public_key = secret_key.public_key()
    one = Token.from_bytes(make_token(public_key, peer_a, CTX_A, MESSAGE))
    two = Token.from_bytes(make_token(public_key, peer_a, CTX_A, MESSAGE))
    first = {encode_point(p) for p in (one.u, one.cs, one.cu_prime)}
    assert first.isdisjoint({encode_point(p) for p in (two.u, two.cs, two.cu_prime)})
    assert encode_point(one.tag) == encode_point(two.tag)


def test_tag_reused_with_another_message_gives_the_same_digest(
    secret_key: IssuerSecretKey, peer_a: Credential
) -> None:
    # DESIGN.md §6 "Double submission": the aggregator's uniqueness constraint
    # on (survey, digest) catches the second token only if digests are equal.
    public_key = secret_key.public_key()
    first = make_token(public_key, peer_a, CTX_A, b"first report")
    second = make_token(public_key, peer_a, CTX_A, b"second, different report")
    assert verify_token(secret_key, CTX_A, b"first report", first, expected_partition=3) == verify_token(
        secret_key, CTX_A, b"second, different report", second, expected_partition=3
    )


def test_encodings_round_trip(secret_key: IssuerSecretKey, peer_a: Credential) -> None:
    public_key = secret_key.public_key()
    assert IssuerSecretKey.from_bytes(secret_key.to_bytes()).public_key() == public_key
    assert IssuerPublicKey.from_bytes(public_key.to_bytes()).kid == public_key.kid
    assert Credential.from_bytes(peer_a.to_bytes()).to_bytes() == peer_a.to_bytes()
    secret = CredentialSecret.generate(seeded_rng(b"round trip"))
    assert CredentialSecret.from_bytes(secret.to_bytes()).to_bytes() == secret.to_bytes()
    request, state = begin_issuance(public_key, secret, 9)
    assert IssuanceRequest.from_bytes(request.to_bytes()).to_bytes() == request.to_bytes()
    response = issue_credential(secret_key, request.to_bytes(), 9)
    assert IssuanceResponse.from_bytes(response.to_bytes()).to_bytes() == response.to_bytes()
    # Secrets never show up in a repr (logs).
    for secret_holder, hidden in ((secret_key, secret_key.to_bytes()), (secret, secret.to_bytes()), (state, secret.to_bytes())):
        assert hidden[1:].hex() not in repr(secret_holder)


# ----------------------------------------------------------- pitfalls


def test_payload_swapped_is_rejected(secret_key: IssuerSecretKey, token_a: bytes) -> None:
    assert _reason(lambda: verify_token(secret_key, CTX_A, MESSAGE + b" ", token_a, expected_partition=3)) == "bad-proof"
    assert _reason(lambda: verify_token(secret_key, CTX_B, MESSAGE, token_a, expected_partition=3)) == "bad-proof"


def test_wrong_partition_is_rejected(secret_key: IssuerSecretKey, token_a: bytes) -> None:
    assert _reason(lambda: verify_token(secret_key, CTX_A, MESSAGE, token_a, expected_partition=4)) == "wrong-partition"
    # Re-labelling the disclosed partition breaks the MAC, which includes x2·j.
    relabelled = _replace(token_a, 33, struct.pack(">H", 4))
    assert _reason(lambda: verify_token(secret_key, CTX_A, MESSAGE, relabelled, expected_partition=4)) == "bad-proof"


def test_a_second_key_epoch_is_never_accepted(
    secret_key: IssuerSecretKey, other_epoch_key: IssuerSecretKey, peer_a: Credential, token_a: bytes
) -> None:
    assert _reason(lambda: verify_token(other_epoch_key, CTX_A, MESSAGE, token_a, expected_partition=3)) == "wrong-kid"
    # Claiming the other epoch's kid does not help: the MAC is under epoch 1.
    other_kid = other_epoch_key.public_key().kid
    claimed = _replace(token_a, 1, other_kid)
    assert _reason(lambda: verify_token(other_epoch_key, CTX_A, MESSAGE, claimed, expected_partition=3)) == "bad-proof"
    with pytest.raises(ValueError, match="credential is for key"):
        make_token(other_epoch_key.public_key(), peer_a, CTX_A, MESSAGE)


def test_identity_point_is_rejected_on_the_wire(secret_key: IssuerSecretKey, token_a: bytes) -> None:
    for index in range(_TOKEN_POINTS):
        at = _POINTS_AT + index * POINT_BYTES
        zeroed = _replace(token_a, at, bytes(POINT_BYTES))
        assert _reason(lambda: verify_token(secret_key, CTX_A, MESSAGE, zeroed, expected_partition=3)) == "bad-point"


def test_identity_presentation_forgery_is_rejected(secret_key: IssuerSecretKey) -> None:
    # The forgery in petlib's example code: with U = identity the MAC check
    # V = (x0 + x2·j)·U + x1·Cs - Cu' collapses to V = z·X1 - Cu' for ANY s,
    # so someone with no credential can prove "knowledge" of any s and mint a
    # fresh tag per s. Build that forgery and check its relations hold...
    public_key = secret_key.public_key()
    rng = seeded_rng(b"forger")
    forged_s, z, r = random_scalar(rng), random_scalar(rng), random_scalar(rng)
    cs = secret_mul(z, H)  # = forged_s·identity + z·h
    cu_prime = secret_mul(r, G)
    tag = secret_mul(forged_s, survey_point(CTX_A))
    w = (secret_key._x0 + 3 * secret_key._x2) % ORDER
    verifier_v = secret_mul(w, IDENTITY) + secret_mul(secret_key._x1, cs) - cu_prime
    assert encode_point(verifier_v) == encode_point(secret_mul(z, public_key.x1_pub) - cu_prime)
    # ...so only the identity check stands between it and acceptance.
    forged = Token(public_key.kid, 3, IDENTITY, cs, cu_prime, tag, secret_mul(r, H), (1, 1, 1))
    reason = _reason(lambda: verify_parsed_token(secret_key, CTX_A, MESSAGE, forged, expected_partition=3))
    assert reason == "identity-point"


@pytest.mark.parametrize("bad", [ORDER, ORDER + 1, 2**256 - 1])
def test_scalars_out_of_range_are_rejected(secret_key: IssuerSecretKey, token_a: bytes, bad: int) -> None:
    for index in range(_TOKEN_SCALARS):
        at = _SCALARS_AT + index * 32
        token = _replace(token_a, at, bad.to_bytes(32, "big"))
        assert _reason(lambda: verify_token(secret_key, CTX_A, MESSAGE, token, expected_partition=3)) == "scalar-range"
    for scalar_index in range(4):
        key = _replace(secret_key.to_bytes(), 1 + 32 * scalar_index, bad.to_bytes(32, "big"))
        assert _reason(lambda: IssuerSecretKey.from_bytes(key), InvalidKeyMaterial) == "scalar-range"
    assert _reason(lambda: IssuerSecretKey.from_bytes(_replace(secret_key.to_bytes(), 1, bytes(32))), InvalidKeyMaterial) == "scalar-range"


def _x_not_on_curve() -> bytes:
    p = group_module.FIELD_PRIME
    for x in range(1, 100):
        rhs = (x**3 - 3 * x + int(GROUP.parameters()["b"])) % p
        if pow(rhs, (p - 1) // 2, p) != 1:  # not a square: no point has this x
            return x.to_bytes(32, "big")
    raise AssertionError("no non-residue found")


@pytest.mark.parametrize(
    "encoding",
    [
        b"\x02" + _x_not_on_curve(),
        b"\x02" + group_module.FIELD_PRIME.to_bytes(32, "big"),  # x = p (≡ 0): non-canonical
        b"\x04" + bytes(32),
        b"\x00" + bytes(32),
        b"\x05" + bytes(31) + b"\x01",
    ],
)
def test_bad_point_encodings_are_rejected(secret_key: IssuerSecretKey, token_a: bytes, encoding: bytes) -> None:
    for index in range(_TOKEN_POINTS):
        token = _replace(token_a, _POINTS_AT + index * POINT_BYTES, encoding)
        assert _reason(lambda: verify_token(secret_key, CTX_A, MESSAGE, token, expected_partition=3)) == "bad-point"


# The transcript DESIGN.md §6 prescribes, in order (token version 2; V is
# not hashed: it is a function of U, Cs, Cu', the partition and the key,
# which are). "gamma-V" and "gamma-T" mark where the composite coefficients
# are drawn. The test below builds tokens with its own prover from this
# list; the library must agree.
SPEC_TRANSCRIPT = [
    "version", "curve", "g", "h", "Cx0", "X1", "X2", "kid", "partition",
    "ctx", "H(ctx)", "SHA-256(m)", "U", "Cs", "Cu'", "T", "gamma-V", "gamma-T", "A",
]  # fmt: skip


def _independent_prover(
    secret_key: IssuerSecretKey, credential: Credential, ctx: bytes, message: bytes, omit: str | None
) -> bytes:
    """A second implementation of the presentation proof (CMZ14 §4.2 plus the
    tag relation, combined as in crypto/_token.py) whose transcript can leave
    out one element."""
    public_key = secret_key.public_key()
    a, z, r, ks, kz, kr = (random_scalar(seeded_rng(b"independent %d" % i)) for i in range(6))
    s, hc = credential.secret._s, survey_point(ctx)
    u, u_prime = secret_mul(a, credential.u), secret_mul(a, credential.u_prime)
    cs = secret_mul(s, u) + secret_mul(z, H)
    cu_prime = u_prime + secret_mul(r, G)
    tag = secret_mul(s, hc)
    a_cs = secret_mul(ks, u) + secret_mul(kz, H)
    a_v = secret_mul(kz, public_key.x1_pub) + secret_mul(kr, G)
    a_t = secret_mul(ks, hc)
    values = {
        "version": b"\x02",
        "curve": b"P-256",
        "g": encode_point(G),
        "h": encode_point(H),
        "Cx0": encode_point(public_key.cx0),
        "X1": encode_point(public_key.x1_pub),
        "X2": encode_point(public_key.x2_pub),
        "kid": public_key.kid,
        "partition": struct.pack(">H", credential.partition),
        "ctx": ctx,
        "H(ctx)": encode_point(hc),
        "SHA-256(m)": hashlib.sha256(message).digest(),
        "U": encode_point(u),
        "Cs": encode_point(cs),
        "Cu'": encode_point(cu_prime),
        "T": encode_point(tag),
    }
    transcript = Transcript(b"anonml/token/v1/presentation")
    gammas: dict[str, int] = {}
    commitment = None
    for label in SPEC_TRANSCRIPT:
        if label.startswith("gamma"):
            if label != omit:
                transcript.append(b"composite", label.encode())
            gammas[label] = transcript.challenge()
            continue
        if label == "A":
            commitment = a_cs + secret_mul(gammas["gamma-V"], a_v) + secret_mul(gammas["gamma-T"], a_t)
            values["A"] = encode_point(commitment)
        if label != omit:
            transcript.append(label.encode(), values[label])
    assert commitment is not None
    c = transcript.challenge()
    responses = ((ks - c * s) % ORDER, (kz - c * z) % ORDER, (kr + c * r) % ORDER)
    return Token(public_key.kid, credential.partition, u, cs, cu_prime, tag, commitment, responses).to_bytes()


def test_challenge_binds_every_statement_element(secret_key: IssuerSecretKey, peer_a: Credential) -> None:
    # The independent prover with the full transcript is accepted (so it and
    # the library agree on the spec)...
    full = _independent_prover(secret_key, peer_a, CTX_A, MESSAGE, omit=None)
    assert verify_token(secret_key, CTX_A, MESSAGE, full, expected_partition=3) == tag_digest(peer_a, CTX_A)
    # ...and a proof whose challenge leaves out any one element is not: a
    # verifier that skipped that element would accept it.
    for label in SPEC_TRANSCRIPT:
        token = _independent_prover(secret_key, peer_a, CTX_A, MESSAGE, omit=label)
        reason = _reason(lambda: verify_token(secret_key, CTX_A, MESSAGE, token, expected_partition=3))
        assert reason == "bad-proof", label


def _extract_secret(public_key: IssuerPublicKey, first: tuple[bytes, Token], second: tuple[bytes, Token]) -> int:
    # Two Schnorr proofs (of messages m_i) with the same nonce ks and
    # challenges c1 != c2: rs_i = ks - c_i·s, so s = (rs_1 - rs_2) / (c_2 - c_1).
    c1 = token_challenges(public_key, CTX_A, first[0], first[1])[2]
    c2 = token_challenges(public_key, CTX_A, second[0], second[1])[2]
    numerator = (first[1].responses[0] - second[1].responses[0]) % ORDER
    return numerator * pow((c2 - c1) % ORDER, -1, ORDER) % ORDER


def test_reused_nonces_would_reveal_the_secret(
    secret_key: IssuerSecretKey, peer_a: Credential, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The danger, demonstrated: force the same nonces into two proofs.
    fixed = [random_scalar(seeded_rng(b"fixed %d" % i)) for i in range(6)]
    monkeypatch.setattr(token_module, "hedged_scalars", lambda *args: list(fixed))
    public_key = secret_key.public_key()
    first = Token.from_bytes(make_token(public_key, peer_a, CTX_A, b"m1"))
    second = Token.from_bytes(make_token(public_key, peer_a, CTX_A, b"m2"))
    assert _extract_secret(public_key, (b"m1", first), (b"m2", second)) == peer_a.secret._s


def test_nonces_stay_fresh_under_a_repeating_rng(secret_key: IssuerSecretKey, peer_a: Credential) -> None:
    # A broken random source that always returns zeros: nonces are hedged
    # with the credential and the message, so two messages still get
    # independent nonces and the extraction above finds nothing.
    def stuck(n: int) -> bytes:
        return bytes(n)

    public_key = secret_key.public_key()
    first = Token.from_bytes(make_token(public_key, peer_a, CTX_A, b"m1", rng=stuck))
    second = Token.from_bytes(make_token(public_key, peer_a, CTX_A, b"m2", rng=stuck))
    assert _extract_secret(public_key, (b"m1", first), (b"m2", second)) != peer_a.secret._s
    assert encode_point(first.u) != encode_point(second.u)
    # Same message, same stuck source: the very same token, which leaks nothing new.
    again = Token.from_bytes(make_token(public_key, peer_a, CTX_A, b"m1", rng=stuck))
    assert again.to_bytes() == first.to_bytes()
    # And with the real source the same message gives a fresh proof.
    fresh = [Token.from_bytes(make_token(public_key, peer_a, CTX_A, b"m1")) for _ in range(2)]
    assert fresh[0].responses[0] != fresh[1].responses[0]


def test_survey_point_has_no_known_logarithm(
    secret_key: IssuerSecretKey, peer_a: Credential, monkeypatch: pytest.MonkeyPatch
) -> None:
    # H(ctx) is petlib's hash-to-point of a domain-separated input, computed
    # here independently, and none of the fixed generators.
    expected = GROUP.hash_to_point(length_prefixed(b"anonml/hash-to-point/v1", b"survey", CTX_A))
    assert encode_point(survey_point(CTX_A)) == encode_point(expected)
    known = {encode_point(p) for p in (G, H, GROUP.generator())}
    assert encode_point(survey_point(CTX_A)) not in known
    assert encode_point(survey_point(CTX_A)) != encode_point(survey_point(CTX_B))

    # Why it matters: with H(ctx) = k·g for a known k, k⁻¹·T = s·g is the same
    # in every survey, so the aggregator links all of a peer's tokens.
    def scalar_of(ctx: bytes) -> int:
        return int.from_bytes(hashlib.sha256(ctx).digest(), "big") % ORDER

    def normalised_tag(ctx: bytes) -> bytes:
        token = Token.from_bytes(make_token(secret_key.public_key(), peer_a, ctx, MESSAGE))
        return encode_point(secret_mul(pow(scalar_of(ctx), -1, ORDER), token.tag))

    honest = (normalised_tag(CTX_A), normalised_tag(CTX_B))
    assert honest[0] != honest[1]
    monkeypatch.setattr(token_module, "survey_point", lambda ctx: secret_mul(scalar_of(ctx), G))
    assert normalised_tag(CTX_A) == normalised_tag(CTX_B)


def test_secret_scalars_never_reach_wsum(secret_key: IssuerSecretKey, monkeypatch: pytest.MonkeyPatch) -> None:
    # wsum (EC_POINTs_mul) is variable time; every scalar that is secret must
    # go through secret_mul. Record both and check they never overlap.
    wsum_scalars: list[int] = []
    wsum_calls: list[str] = []
    secret_scalars: set[int] = {secret_key._x0, secret_key._x0_blind, secret_key._x1, secret_key._x2}
    phase = ["setup"]
    original_wsum = GROUP.wsum
    original_secret_mul = credential_module.secret_mul
    original_hedged = credential_module.hedged_scalars

    def recording_wsum(weights: list[Any], points: list[Any]) -> Any:
        wsum_calls.append(phase[0])
        wsum_scalars.extend(int(w) for w in weights)
        return original_wsum(weights, points)

    original_mul_plus = group_module._GeneratorTable.mul_plus

    def recording_mul_plus(table: Any, scalar: Any, weights: list[Any], points: list[Any]) -> Any:
        # The other variable-time sum: a term on g or h rides in EC_POINTs_mul as that table's generator.
        wsum_calls.append(phase[0])
        wsum_scalars.extend(int(w) for w in (scalar, *weights))
        return original_mul_plus(table, scalar, weights, points)

    def recording_secret_mul(scalar: int, point: Any) -> Any:
        secret_scalars.add(scalar)
        return original_secret_mul(scalar, point)

    def recording_hedged(*args: Any) -> list[int]:
        nonces: list[int] = original_hedged(*args)
        secret_scalars.update(nonces)
        return nonces

    monkeypatch.setattr(GROUP, "wsum", recording_wsum)
    monkeypatch.setattr(group_module._GeneratorTable, "mul_plus", recording_mul_plus)
    for module in (credential_module, token_module):
        monkeypatch.setattr(module, "secret_mul", recording_secret_mul)
        monkeypatch.setattr(module, "hedged_scalars", recording_hedged)

    public_key = secret_key.public_key()
    secret = CredentialSecret.generate(seeded_rng(b"wsum audit"))
    secret_scalars.add(secret._s)
    phase[0] = "peer: begin issuance"
    request, state = begin_issuance(public_key, secret, 5)
    phase[0] = "issuer"
    response = issue_credential(secret_key, request.to_bytes(), 5)
    phase[0] = "peer: finish issuance"
    credential = finish_issuance(state, response.to_bytes())
    phase[0] = "peer: make token"
    token = make_token(public_key, credential, CTX_A, MESSAGE)
    phase[0] = "issuer: verify"
    verify_token(secret_key, CTX_A, MESSAGE, token, expected_partition=5)

    # Provers never use wsum at all; verifiers use it on public scalars only.
    assert "peer: begin issuance" not in wsum_calls and "peer: make token" not in wsum_calls
    assert {"issuer", "peer: finish issuance", "issuer: verify"} <= set(wsum_calls)
    assert secret._s in secret_scalars and secret_key._x1 in secret_scalars
    assert secret_scalars.isdisjoint(wsum_scalars)


def test_issuer_view_is_independent_of_the_secret(secret_key: IssuerSecretKey) -> None:
    """The issuer sees ``(D, a1, a2)`` = ``(d·g, r·g, s·g + r·D)`` and a
    Schnorr proof. D and a1 are uniform; under DDH ``r·D = dr·g`` is
    indistinguishable from a uniform point, so ``a2`` is too, whatever ``s``;
    the proof's responses are uniform given the challenge (honest-verifier
    zero knowledge). So the view is (computationally) independent of ``s``.

    A test cannot prove a computational claim; it checks the two things that
    would break it in an implementation. (1) With the SAME random stream, the
    requests for two secrets must not be related: were ``d, r`` taken from the
    stream alone, ``D`` would repeat and ``a2' - a2 = (s' - s)·g`` would hand
    the issuer the difference of two secrets. Hedging (``hedged_scalars``)
    mixes ``s`` into ``d, r``. (2) Over many requests, every field's observable
    marginal (y parity, top nibble of x or of the scalar) has the same
    distribution for the two most different secrets (1 and q-1: ``s·g = ±g``)
    and matches the uniform one, by chi-square tests at a family-wise level of
    1e-3 (Bonferroni), with fixed seeds.
    """
    public_key = secret_key.public_key()
    low, high = CredentialSecret(1), CredentialSecret(ORDER - 1)
    samples = 800
    views: dict[str, list[bytes]] = {"low": [], "high": []}
    for index in range(samples):
        for name, secret in (("low", low), ("high", high)):
            request, _ = begin_issuance(public_key, secret, 3, rng=seeded_rng(b"same stream %d" % index))
            views[name].append(request.to_bytes())

    elgamal_at = 35  # D, a1, a2 follow version, kid and partition
    delta = encode_point(secret_mul((ORDER - 2) % ORDER, G))  # (s_high - s_low)·g
    for low_view, high_view in zip(views["low"], views["high"]):
        assert low_view[elgamal_at : elgamal_at + POINT_BYTES] != high_view[elgamal_at : elgamal_at + POINT_BYTES]
        a2_low = group_module.decode_point(low_view[elgamal_at + 66 : elgamal_at + 99])
        a2_high = group_module.decode_point(high_view[elgamal_at + 66 : elgamal_at + 99])
        assert encode_point(a2_high - a2_low) != delta

    def features(view: bytes) -> list[int]:
        points = [view[elgamal_at + i * POINT_BYTES : elgamal_at + (i + 1) * POINT_BYTES] for i in range(3)]
        scalars_at = elgamal_at + 3 * POINT_BYTES
        scalars = [view[scalars_at + i * 32 : scalars_at + (i + 1) * 32] for i in range(4)]
        parities = [p[0] - 2 for p in points]
        nibbles = [p[1] >> 4 for p in points] + [k[0] >> 4 for k in scalars]
        return parities + nibbles

    low_features = [features(v) for v in views["low"]]
    high_features = [features(v) for v in views["high"]]
    n_features = len(low_features[0])
    alpha = 1e-3 / (2 * n_features)
    for index in range(n_features):
        bins = 2 if index < 3 else 16
        low_counts = [sum(1 for f in low_features if f[index] == b) for b in range(bins)]
        high_counts = [sum(1 for f in high_features if f[index] == b) for b in range(bins)]
        _, p_same, _, _ = stats.chi2_contingency([low_counts, high_counts])
        assert p_same > alpha, (index, low_counts, high_counts)
        # q is just below 2**256, so a uniform scalar's top nibble is uniform
        # to within 2**-32; point x-coordinates likewise (p ≈ 2**256).
        _, p_uniform = stats.chisquare([a + b for a, b in zip(low_counts, high_counts)])
        assert p_uniform > alpha, (index, low_counts, high_counts)


def test_issuance_rejects_bad_requests_and_responses(
    secret_key: IssuerSecretKey, other_epoch_key: IssuerSecretKey
) -> None:
    public_key = secret_key.public_key()
    secret = CredentialSecret.generate(seeded_rng(b"issuance errors"))
    request, state = begin_issuance(public_key, secret, 3)
    request_bytes = request.to_bytes()

    def issue(data: bytes, partition: int = 3, key: IssuerSecretKey = secret_key) -> object:
        return issue_credential(key, data, partition)

    assert _reason(lambda: issue(request_bytes, partition=4), InvalidIssuance) == "wrong-partition"
    assert _reason(lambda: issue(request_bytes, key=other_epoch_key), InvalidIssuance) == "wrong-kid"
    tampered = request_bytes[:-1] + bytes((request_bytes[-1] ^ 1,))
    assert _reason(lambda: issue(tampered), InvalidIssuance) == "bad-proof"

    response = issue_credential(secret_key, request_bytes, 3).to_bytes()
    tampered_response = response[:-1] + bytes((response[-1] ^ 1,))
    assert _reason(lambda: finish_issuance(state, tampered_response), InvalidIssuance) == "bad-proof"
    # A response made for another peer's request does not finish this one.
    other_request, _ = begin_issuance(public_key, CredentialSecret.generate(), 3)
    foreign = issue_credential(secret_key, other_request.to_bytes(), 3).to_bytes()
    assert _reason(lambda: finish_issuance(state, foreign), InvalidIssuance) == "bad-proof"
    relabelled = _replace(response, 1, other_epoch_key.public_key().kid)
    assert _reason(lambda: finish_issuance(state, relabelled), InvalidIssuance) == "wrong-kid"
    # An issuer that MACs with a key other than the published one (to tag one
    # peer, say) while claiming the published kid is caught by its proof.
    cheat = IssuerSecretKey(
        (secret_key._x0 + 1) % ORDER, secret_key._x0_blind, secret_key._x1, secret_key._x2
    )
    cheat._public_key = public_key
    cheating = issue_credential(cheat, request_bytes, 3).to_bytes()
    assert _reason(lambda: finish_issuance(state, cheating), InvalidIssuance) == "bad-proof"
    assert finish_issuance(state, response).partition == 3


def test_a_numpy_generator_is_accepted_as_rng(secret_key: IssuerSecretKey, peer_a: Credential) -> None:
    # The project's other rng seam (STYLE.md §12); hedging keeps it safe to use.
    public_key = secret_key.public_key()
    one = make_token(public_key, peer_a, CTX_A, MESSAGE, rng=np.random.default_rng(7))
    two = make_token(public_key, peer_a, CTX_A, MESSAGE, rng=np.random.default_rng(7))
    three = make_token(public_key, peer_a, CTX_A, MESSAGE, rng=np.random.default_rng(8))
    assert one == two != three
    assert verify_token(secret_key, CTX_A, MESSAGE, three, expected_partition=3) == tag_digest(peer_a, CTX_A)


def test_multiples_of_g_and_h_come_from_their_tables_and_equal_the_ladder(monkeypatch: pytest.MonkeyPatch) -> None:
    # crypto._group multiplies g and h from OpenSSL's precomputed multiples (a copy of the group with that point
    # as generator): the same points as the arbitrary-point ladder, for secret and public scalars alike.
    rng = seeded_rng(b"generator tables")
    scalars = [1, 2, ORDER - 1, *(random_scalar(rng) for _ in range(8))]
    other = secret_mul(random_scalar(rng), G)

    def bn(k: int) -> Bn:
        return Bn.from_binary((k % ORDER).to_bytes(32, "big"))

    for base in (G, H):
        for k in scalars:
            assert encode_point(secret_mul(k, base)) == encode_point(base.pt_mul(bn(k)))
    for k in scalars:
        expected = GROUP.wsum([bn(k), bn(k + 1), bn(3)], [G, H, other])
        assert encode_point(public_lincomb([k, k + 1, 3], [G, H, other])) == encode_point(expected)
    # Two terms on g: one rides in EC_POINTs_mul as the table's generator, the other is added after.
    assert is_identity(public_lincomb([5, ORDER - 5], [G, G]))
    # Neither generator takes the ladder: a multiple of g or h never calls EcPt.pt_mul.
    calls: list[object] = []
    original = petlib.ec.EcPt.pt_mul
    monkeypatch.setattr(petlib.ec.EcPt, "pt_mul", lambda point, k: calls.append(point) or original(point, k))
    secret_mul(scalars[-1], G)
    secret_mul(scalars[-1], H)
    assert calls == []
    secret_mul(scalars[-1], other)
    assert calls == [other]


def test_a_made_token_gives_its_makers_tag_digest_without_the_credential(secret_key: IssuerSecretKey) -> None:
    # protocol.seal_report takes its receipt from the token it just made (one multiplication fewer): it must be the
    # digest tag_digest gives and verify_token returns, and differ between surveys.
    from anonml.crypto import made_tag_digest, tag_digest

    public_key = secret_key.public_key()
    request, state = begin_issuance(public_key, CredentialSecret.generate(seeded_rng(b"made tag")), 3)
    credential = finish_issuance(state, issue_credential(secret_key, request.to_bytes(), 3).to_bytes())
    token_a = make_token(public_key, credential, CTX_A, MESSAGE)
    assert made_tag_digest(token_a) == tag_digest(credential, CTX_A) == verify_token(secret_key, CTX_A, MESSAGE, token_a, expected_partition=3)
    assert made_tag_digest(make_token(public_key, credential, CTX_B, MESSAGE)) == tag_digest(credential, CTX_B) != made_tag_digest(token_a)
    with pytest.raises(ValueError, match="a token is"):
        made_tag_digest(token_a[:-1])
    # The peer's receipt for a sealed report is still the digest of its tag in that survey.
    from anonml.crypto import SphinxGeometry
    from anonml.protocol import receipt_digest, seal_report

    survey = SurveyId.data(ROUND, 3, 1)
    sealed = seal_report(public_key, credential, survey, b"report", SphinxGeometry.create().message_size)
    assert sealed.receipt == receipt_digest(tag_digest(credential, survey.to_bytes()))
