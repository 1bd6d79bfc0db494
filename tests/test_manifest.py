"""The round manifest and schedule: canonical encoding, signatures, strict parsing."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from anonml.protocol import (
    Attempt,
    AggregatorHop,
    InvalidManifest,
    InvalidSchedule,
    PhaseTimes,
    RelayEntry,
    RoundManifest,
    RoundSchedule,
    SignedManifest,
    SurveyId,
    acceptance_window,
    check_seed,
    hop_windows,
    phase_at,
    seed_commitment,
)

SIGNING_KEY = SigningKey(bytes(range(32)))
T0 = 1_800_000_000


def fixed_schedule() -> RoundSchedule:
    return RoundSchedule(
        t_register_end=T0 + 60,
        t_issue_end=T0 + 120,
        median=(PhaseTimes(T0 + 120, 10, T0 + 135, T0 + 137, 10, T0 + 150), PhaseTimes(T0 + 150, 10, T0 + 165, T0 + 167, 10, T0 + 180)),
        data=PhaseTimes(T0 + 200, 20, T0 + 230, T0 + 232, 20, T0 + 260),
    )


def fixed_manifest(**changes: Any) -> RoundManifest:
    values: dict[str, Any] = dict(
        name="adult-income",
        label="income",
        features={
            "features": [{"name": "age", "type": "numeric", "low": 17, "high": 90}],
            "label": {"name": "income", "positive": [">50K"], "negative": ["<=50K"]},
        },
        k_p=4,
        k_h=2,
        k_s=2,
        plan="split",
        learner="logistic",
        eps_median=0.5,
        eps_data=1.25,
        eps_total=3.0,
        oracle="auto",
        schedule=fixed_schedule(),
        relays=tuple(
            RelayEntry(node_id=bytes([i]) * 32, host="127.0.0.1", port=7000 + i, public_key=bytes([0x40 + i]) * 32, key_epoch=1)
            for i in range(3)
        ),
        aggregator_hop=AggregatorHop(node_id=b"\xaa" * 32, host="127.0.0.1", port=7100, public_key=b"\xbb" * 32),
        aggregator_url="http://127.0.0.1:8080",
        path_length=3,
        geometry={"max_hops": 5, "packet_size": 2048},
        token_public_key=b"\x01\x02\x03",
        token_kid=b"\x04" * 32,
        seed_commitment=seed_commitment(b"\x05" * 32),
        min_participation=8,
        registration="invitation",
        identity_key=bytes(SIGNING_KEY.verify_key),
    )
    values.update(changes)
    return RoundManifest(**values)


def test_canonical_encoding_is_pinned() -> None:
    manifest = fixed_manifest()
    encoded = manifest.canonical_bytes()
    # Canonical: sorted keys, no whitespace, epsilons as decimal strings.
    assert b" " not in encoded.replace(b"adult-income", b"")
    assert b'"eps_data":"1.25"' in encoded
    assert encoded == json.dumps(json.loads(encoded), sort_keys=True, separators=(",", ":")).encode()
    assert manifest.round_id == hashlib.sha256(encoded).digest()
    # Pinned: changing the encoding changes every round id, so it must be deliberate.
    assert manifest.round_id.hex() == PINNED_ROUND_ID


PINNED_ROUND_ID = "d0a367e5d83c83f54e9536bb82369fe1850b8263a7ab579fbd23690951d62ec7"


def test_round_trip_and_hash_stable() -> None:
    manifest = fixed_manifest()
    again = RoundManifest.from_json(manifest.canonical_bytes())
    assert again == manifest
    assert again.round_id == manifest.round_id
    # Key order and whitespace in the input do not matter; the canonical form does.
    shuffled = json.dumps(manifest.to_dict(), indent=3, sort_keys=False)
    assert RoundManifest.from_json(shuffled).round_id == manifest.round_id


def test_every_field_changes_the_round_id() -> None:
    base = fixed_manifest().round_id
    for change in (
        {"name": "other"},
        {"eps_total": 3.5},
        {"k_p": 5},
        {"min_participation": 9},
        {"registration": "allow-list"},
        {"purpose": "test"},
        {"max_roster": 1000},
        {"token_kid": b"\x05" * 32},
    ):
        assert fixed_manifest(**change).round_id != base, change


def test_the_vote_is_signed_and_the_default_vote_encodes_as_before_the_field() -> None:
    # A manifest that leaves the vote at eq. 6.2's weighted vote hashes to the
    # pinned id above: rounds made before the field existed keep their ids.
    assert fixed_manifest(vote="weighted").round_id.hex() == PINNED_ROUND_ID
    assert b"vote" not in fixed_manifest().canonical_bytes()
    bayes = fixed_manifest(vote="naive-bayes")
    assert bayes.round_id.hex() != PINNED_ROUND_ID
    assert RoundManifest.from_json(bayes.canonical_bytes()) == bayes
    signed = SignedManifest.sign(bayes, SIGNING_KEY)
    assert SignedManifest.from_json(signed.to_json(), expected_identity=bytes(SIGNING_KEY.verify_key)).manifest.vote == "naive-bayes"
    for bad in ("majority", "weighted"):  # unknown, and the default spelled out (a second encoding of one manifest)
        document = fixed_manifest().to_dict()
        document["learning"]["vote"] = bad
        with pytest.raises(InvalidManifest) as info:
            RoundManifest.from_dict(document)
        assert info.value.field == "learning.vote"


def test_sign_and_verify() -> None:
    manifest = fixed_manifest()
    signed = SignedManifest.sign(manifest, SIGNING_KEY)
    parsed = SignedManifest.from_json(signed.to_json(), expected_identity=bytes(SIGNING_KEY.verify_key))
    assert parsed.manifest == manifest
    assert parsed.round_id == manifest.round_id


def test_signature_by_another_key_is_rejected() -> None:
    other = SigningKey(b"\x09" * 32)
    with pytest.raises(InvalidManifest) as info:
        SignedManifest.sign(fixed_manifest(), other)
    assert info.value.field == "identity_key"
    # A manifest naming another identity verifies, but not against the pinned key.
    signed = SignedManifest.sign(fixed_manifest(identity_key=bytes(other.verify_key)), other)
    with pytest.raises(InvalidManifest) as info:
        SignedManifest.from_json(signed.to_json(), expected_identity=bytes(SIGNING_KEY.verify_key))
    assert info.value.field == "identity_key"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("manifest", "privacy", "eps_total"), "9.0", "round_id"),
        (("manifest", "schedule", "data", "t_r"), T0 + 999, "round_id"),
        (("signature",), "00" * 64, "signature"),
        (("round_id",), "11" * 32, "round_id"),
    ],
)
def test_tampering_is_rejected(path: tuple[str, ...], value: object, field: str) -> None:
    document = SignedManifest.sign(fixed_manifest(), SIGNING_KEY).to_dict()
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(InvalidManifest) as info:
        SignedManifest.from_dict(document)
    assert info.value.field == field


def test_tampering_with_round_id_recomputed_fails_the_signature() -> None:
    document = SignedManifest.sign(fixed_manifest(), SIGNING_KEY).to_dict()
    document["manifest"]["participation"]["min_participation"] = 1
    document["round_id"] = RoundManifest.from_dict(document["manifest"]).round_id.hex()
    with pytest.raises(InvalidManifest) as info:
        SignedManifest.from_dict(document)
    assert info.value.field == "signature"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["privacy"].__setitem__("eps_data", 1.25), "privacy.eps_data"),
        (lambda d: d["privacy"].__setitem__("eps_data", "1.250"), "privacy.eps_data"),
        (lambda d: d["privacy"].__setitem__("eps_data", "nan"), "privacy.eps_data"),
        (lambda d: d["learning"].__setitem__("k_p", 0), "learning.k_p"),
        (lambda d: d["learning"].__setitem__("plan", "many"), "learning.plan"),
        (lambda d: d["learning"].__setitem__("k_h", True), "learning.k_h"),
        (lambda d: d["schedule"]["data"].__setitem__("t_r", T0 + 210), "schedule.data.t_r"),
        (lambda d: d["schedule"]["median"][1].__setitem__("t_s", T0 + 140), "schedule.median[1].t_s"),
        (lambda d: d["network"]["relays"][1].__setitem__("public_key", "zz"), "network.relays[1].public_key"),
        (lambda d: d["network"]["relays"][2].__setitem__("port", 70000), "network.relays[2].port"),
        (lambda d: d["network"].__setitem__("path_length", 4), "network.path_length"),
        (lambda d: d.__setitem__("seed_commitment", "AB" * 32), "seed_commitment"),
        (lambda d: d.__setitem__("registration", "maybe"), "registration"),
        (lambda d: d.__setitem__("extra", 1), "extra"),
        (lambda d: d["participation"].pop("min_participation"), "participation.min_participation"),
        (lambda d: d["token"].pop("kid"), "token.kid"),
        (lambda d: d.__setitem__("aggregator_url", "ftp://x"), "aggregator_url"),
    ],
)
def test_strict_parsing_names_the_bad_field(mutate: Any, field: str) -> None:
    document = copy.deepcopy(fixed_manifest().to_dict())
    mutate(document)
    with pytest.raises(InvalidManifest) as info:
        RoundManifest.from_dict(document)
    assert info.value.field == field, info.value


def test_oversized_and_non_json_input_is_rejected() -> None:
    with pytest.raises(InvalidManifest):
        RoundManifest.from_json(b"{" * 10)
    with pytest.raises(InvalidManifest):
        RoundManifest.from_json(b" " * (600 * 1024))
    with pytest.raises(InvalidManifest):
        RoundManifest.from_json(b"[1, 2]")
    with pytest.raises(InvalidManifest):
        RoundManifest.from_json(b"[" * 100_000)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_from_json_is_total(data: bytes | str) -> None:
    try:
        SignedManifest.from_json(data)
    except InvalidManifest:
        pass


def test_seed_commitment() -> None:
    seed = b"\x05" * 32
    assert check_seed(seed, fixed_manifest().seed_commitment)
    assert not check_seed(b"\x06" * 32, fixed_manifest().seed_commitment)
    assert not check_seed(seed[:31], fixed_manifest().seed_commitment)


def test_schedule_rejects_overlapping_phases() -> None:
    with pytest.raises(InvalidSchedule):
        RoundSchedule(T0 + 60, T0 + 50, (), PhaseTimes(T0 + 100, 10, T0 + 115, T0 + 117, 5, T0 + 130))
    with pytest.raises(InvalidSchedule):
        RoundSchedule(T0, T0 + 50, (), PhaseTimes(T0 + 40, 10, T0 + 115, T0 + 117, 5, T0 + 130))
    with pytest.raises(InvalidSchedule):
        PhaseTimes(T0, 10, T0 + 10, T0 + 12, 5, T0 + 20)
    with pytest.raises(InvalidSchedule):  # no time to check the log before the second chance
        PhaseTimes(T0, 10, T0 + 15, T0 + 15, 5, T0 + 30)
    with pytest.raises(InvalidSchedule):  # the second chance must be delivered before t_r
        PhaseTimes(T0, 10, T0 + 15, T0 + 17, 5, T0 + 22)


def test_open_registration_is_refused_outside_demos_and_tests() -> None:
    with pytest.raises(InvalidManifest) as info:
        fixed_manifest(registration="open")
    assert info.value.field == "participation.registration"
    assert fixed_manifest(registration="open", purpose="demo").registration == "open"
    with pytest.raises(InvalidManifest):
        fixed_manifest(max_roster=10**9)


def test_phase_at() -> None:
    schedule = fixed_schedule()
    assert phase_at(schedule, T0) == ("registration", None)
    assert phase_at(schedule, T0 + 60) == ("issuance", None)
    assert phase_at(schedule, T0 + 120) == ("median", 0)
    assert phase_at(schedule, T0 + 179) == ("median", 1)
    assert phase_at(schedule, T0 + 190) == ("waiting", None)
    assert phase_at(schedule, T0 + 200) == ("data", None)
    assert phase_at(schedule, T0 + 260) == ("learning", None)


def test_hop_windows_stagger_after_the_send_window() -> None:
    from anonml.crypto import ReleaseWindow

    schedule = fixed_schedule()
    round_id = fixed_manifest().round_id
    survey = SurveyId.data(round_id, 1, 0)
    windows = hop_windows(schedule, survey, 3)
    assert len(windows) == 4
    send_end = schedule.data.t_s + schedule.data.delta
    relays, aggregator = windows[:-1], windows[-1]
    # Every relay holds until the send window has closed; each opens after the previous closes.
    assert relays[0].start >= send_end
    for earlier, later in zip(relays, relays[1:]):
        assert earlier.end <= later.start
    assert relays[-1].end < schedule.data.t_r
    assert aggregator == ReleaseWindow(*acceptance_window(schedule, survey))
    assert (aggregator.start, aggregator.end) == (send_end, schedule.data.t_r)
    # The second chance: the same rule over the second delivery window.
    second = hop_windows(schedule, survey, 3, Attempt.SECOND)
    assert second[0].start >= schedule.data.second_send_end and second[-2].end < schedule.data.t_r
    assert second[-1] == aggregator
    assert windows[-2].end <= schedule.data.t_c
    # Median sub-round i uses its own phase, whichever partition answers in it.
    median = hop_windows(schedule, SurveyId.median(round_id, 3, 1), 3)
    assert median[0].start >= schedule.median[1].t_s + schedule.median[1].delta
    assert median[-1].end == schedule.median[1].t_r
    with pytest.raises(InvalidSchedule):
        hop_windows(schedule, SurveyId.median(round_id, 0, 2), 3)
    with pytest.raises(InvalidSchedule):
        hop_windows(schedule, survey, 60)


def test_a_comparison_pool_has_a_partition_per_sub_round_after_the_data_partitions() -> None:
    """Issue 11: with ``comparison_pool`` (per mille) the pool answers the median search in partitions
    ``k_p …``, one per sub-round, and the data partitions answer none; without it every data partition
    answers in sub-round ``p % median_rounds`` as before. The field is signed, and a manifest without a
    pool encodes (and hashes) as before the field existed."""
    assert fixed_manifest(comparison_pool=0).round_id.hex() == PINNED_ROUND_ID
    pooled = fixed_manifest(comparison_pool=100)
    assert pooled.round_id.hex() != PINNED_ROUND_ID
    assert RoundManifest.from_json(pooled.canonical_bytes()) == pooled
    assert (pooled.k_p, pooled.median_rounds, pooled.partitions) == (4, 2, 6)
    assert [pooled.answers_median(p) for p in range(7)] == [False, False, False, False, True, True, False]
    assert [pooled.is_pool_partition(p) for p in range(7)] == [False, False, False, False, True, True, False]
    assert [pooled.median_sub_round(p) for p in (4, 5)] == [0, 1]
    assert [list(pooled.median_partitions(s)) for s in (0, 1)] == [[4], [5]]
    assert pooled.median_survey(5) == SurveyId.median(pooled.round_id, 5, 1)
    with pytest.raises(ValueError, match="answer no median sub-round"):
        pooled.median_sub_round(0)
    plain = fixed_manifest()
    assert plain.partitions == 4 and [plain.median_sub_round(p) for p in range(4)] == [0, 1, 0, 1]
    assert [list(plain.median_partitions(s)) for s in (0, 1)] == [[0, 2], [1, 3]]
    # The pool's size: its share of the final roster, halves rounded up, at least one peer per sub-round.
    assert [pooled.comparison_pool_size(n) for n in (0, 1, 2, 14, 15, 25, 1000)] == [0, 1, 2, 2, 2, 3, 100]
    assert fixed_manifest(comparison_pool=250).comparison_pool_size(10) == 3
    assert plain.comparison_pool_size(1000) == 0
    # A pool needs a median phase; its sub-rounds need no data partition of their own.
    schedule = fixed_schedule()
    no_median = RoundSchedule(schedule.t_register_end, schedule.t_issue_end, (), schedule.data)
    with pytest.raises(InvalidManifest) as info:
        fixed_manifest(comparison_pool=100, schedule=no_median)
    assert info.value.field == "learning.comparison_pool"
    assert fixed_manifest(comparison_pool=100, k_p=1, k_h=1).partitions == 3
    with pytest.raises(InvalidManifest):
        fixed_manifest(k_p=1, k_h=1)
    for bad in (0, 1000, 0.5, "100"):
        document = pooled.to_dict()
        document["learning"]["comparison_pool"] = bad
        with pytest.raises(InvalidManifest) as info:
            RoundManifest.from_dict(document)
        assert info.value.field == "learning.comparison_pool"


def test_partition_plan_deals_the_first_of_the_seeded_order_into_the_pool_partitions() -> None:
    """Every role derives the same pool from public values: the first ``comparison_pool_size`` peers of
    the seeded order, dealt round-robin over the sub-rounds' pool partitions; a pool peer sends no
    subset. Without a pool the deal is :func:`assign_partitions`'s, unchanged."""
    from anonml.protocol import FeatureSpec, PartitionPlan, assign_partitions, partition_seed

    keys = [hashlib.sha256(bytes([i])).digest() for i in range(40)]
    seed, root = b"\x07" * 32, b"\x08" * 32
    pooled = fixed_manifest(comparison_pool=100, k_h=1, k_s=1)
    spec = FeatureSpec.from_dict(dict(pooled.features))
    plan = PartitionPlan.derive(pooled, spec, keys, seed, root)
    assert plan.sizes == (9, 9, 9, 9, 2, 2)
    order = assign_partitions(partition_seed(seed, root), keys, pooled.k_p, pool=4)
    for index, key in enumerate(keys):
        rank = int(order.rank[index])
        expected = pooled.k_p + rank % 2 if rank < 4 else int(order.partition[index])
        assert plan.partition_of[key] == expected
    assert plan.subsets_of(4) == plan.subsets_of(5) == ()
    assert plan.subsets_of(0) == plan.subsets[0] and len(plan.subsets) == pooled.k_p
    plain = fixed_manifest(k_h=1, k_s=1)
    unpooled = PartitionPlan.derive(plain, spec, keys, seed, root)
    everyone = assign_partitions(partition_seed(seed, root), keys, plain.k_p)
    assert [unpooled.partition_of[key] for key in keys] == everyone.partition.tolist()


def test_the_minimum_anonymity_set_is_signed_and_a_manifest_without_one_hashes_as_before() -> None:
    """Issue 24: the minimum is a field of the signed manifest, written only when stated, so the
    manifests made before it existed keep their round ids; stated, it changes the id and round-trips."""
    assert fixed_manifest(min_anonymity_set=0).round_id.hex() == PINNED_ROUND_ID
    assert b"min_anonymity_set" not in fixed_manifest().canonical_bytes()
    stated = fixed_manifest(min_anonymity_set=5)
    assert stated.round_id.hex() != PINNED_ROUND_ID
    assert RoundManifest.from_json(stated.canonical_bytes()) == stated
    assert stated.to_dict()["participation"]["min_anonymity_set"] == 5
    # One encoding per manifest: 0 is written by leaving the field out.
    document = fixed_manifest().to_dict()
    document["participation"]["min_anonymity_set"] = 0
    with pytest.raises(InvalidManifest) as refused:
        RoundManifest.from_dict(document)
    assert refused.value.field == "participation.min_anonymity_set"


def test_a_sinks_worker_addresses_are_signed_and_a_manifest_without_them_hashes_as_before() -> None:
    """Issue 27: the final hop lists its ingest workers' addresses (relays deliver to any of them); written
    only when there are some, so earlier manifests keep their round ids."""
    hop = fixed_manifest().aggregator_hop
    assert hop.endpoints == (("127.0.0.1", 7100),) and b"workers" not in fixed_manifest().canonical_bytes()
    workers = (("127.0.0.2", 7100), ("10.0.0.3", 7101))
    listed = fixed_manifest(aggregator_hop=AggregatorHop(hop.node_id, hop.host, hop.port, hop.public_key, workers=workers))
    assert listed.round_id.hex() != PINNED_ROUND_ID
    assert RoundManifest.from_json(listed.canonical_bytes()) == listed
    assert listed.aggregator_hop.endpoints == (("127.0.0.1", 7100), *workers)
    for bad in ([], [{"host": "127.0.0.1", "port": 7100}], [{"host": "127.0.0.2", "port": 7100}] * 2,
                [{"host": "127.0.0.2", "port": 0}], [{"host": "127.0.0.2", "port": 7100, "node_id": "aa"}],
                [{"host": "127.0.0.2", "port": 7000 + i} for i in range(17)], "127.0.0.2:7100"):
        document = listed.to_dict()
        document["network"]["aggregator"]["workers"] = bad
        with pytest.raises(InvalidManifest) as refused:
            RoundManifest.from_dict(document)
        assert refused.value.field.startswith("network.aggregator.workers"), (bad, refused.value)
