"""Record-level privacy in a whole round (issue 11), simulated: the real aggregator service, relays and
every peer's ``join_round`` in one process on a virtual clock (``anonml.simulate``).

For every peer, the epsilon of every release it made (each comparison bit of
its median answer, each subset report, read back from the messages it sealed)
sums to its ledger entry, and that sum never exceeds the record-level epsilon
the manifest promises. The ledger is durable (a reopened store refuses any
further release), the consent text of a peer resuming after it spent counts
each release once, a later round's consent states what earlier rounds spent,
and the report states the promise as record-level, eq. 7.4 only as a labelled
per-attribute figure.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anonml.aggregator import AggregatorHome, create_round, parse_round_spec
from anonml.aggregator._report import summarise
from anonml.mechanisms import BudgetExceeded
from anonml.peer import PeerIdentity, PeerStore, RoundPipeline, describe_release
from anonml.peer._framework import Dataset, Event, FeatureVector
from anonml.peer._join import JoinResult
from anonml.peer._ledger import PeerLedger
from anonml.peer._store import DEFAULT_LIFETIME_EPSILON
from anonml.protocol import FeatureSpec, SignedManifest, SurveyId, SurveyKind, SurveyMessage, decode_median_report, decode_pool_answer
from anonml.simulate import RoundSetup, RoundTrace, SimulationConfig, simulate_round

PEERS = 6
EPS_TOTAL = 2.0


def two_numeric_features(document: dict[str, Any]) -> None:
    """The simulated round with two numeric features, so a median answer is two comparison bits; both
    partitions are queried, and each data subset holds two features. Each numeric feature gets two cut
    points (three bins), found by the median search: a bit answers about one of them."""
    document["name"] = "privacy"
    document["task"]["features"].insert(1, {"name": "hours", "type": "numeric", "low": 0, "high": 100})
    document["task"]["quantiles"] = 2
    document["learning"].update({"k_p": 2, "k_h": 1, "k_s": 2})
    document["privacy"] = {"eps_total": EPS_TOTAL, "oracle": "grr"}


def with_comparison_pool(document: dict[str, Any]) -> None:
    """The one-release plan with a reserved comparison pool of a third of the peers (4 of 12, two per
    sub-round): a pool peer answers one comparison bit at the full ε_T, a data peer sends one report
    of two features at the full ε_T."""
    two_numeric_features(document)
    document["learning"].update({"plan": "one", "k_p": 2, "k_h": 1, "k_s": 2, "comparison_pool": 0.34})
    # A pool partition holds one peer at the simulator's minimum participation (4): this test is about
    # ledgers, and states the smallest set it can meet.
    document["participation"]["min_anonymity_set"] = 1


def row(i: int, _: np.random.Generator | None = None) -> dict[str, Any]:
    """Peer ``i``'s data: spread over both numeric features' ranges, every colour, both labels."""
    return {"age": float(20 + 7 * i), "hours": float(10 + 9 * i), "colour": ("red", "green", "blue")[i % 3], "y": str(i % 2)}


def vector(manifest: SignedManifest, i: int) -> FeatureVector:
    """Peer ``i``'s feature vector as its pipeline computed it for the round."""
    pipeline = RoundPipeline.for_spec(FeatureSpec.from_dict(dict(manifest.manifest.features)))
    return pipeline.vector_of(Dataset((Event(row(i), None, 1),)))


def run_round(keep: Path, peers: int, adjust: Any, seed: int) -> tuple[RoundTrace, dict[str, Any]]:
    """A simulated round of ``peers`` honest peers with :func:`row`'s data and ``adjust``'s spec, its files kept
    in ``keep``; also the spec document it ran (so a later round can use the same relays)."""
    document: dict[str, Any] = {}

    def adjust_and_keep(spec: dict[str, Any]) -> None:
        adjust(spec)
        document.update(copy.deepcopy(spec))

    trace = simulate_round(SimulationConfig(peers=peers, seed=seed), setup=RoundSetup(adjust_spec=adjust_and_keep, peer_data=row), keep=keep)
    assert trace.outcome == "done"
    assert all(p.result is not None for p in trace.peers), [p.error or p.refused for p in trace.peers]
    assert trace.peer_store is not None
    return trace, document


def result_of(trace: RoundTrace, key: bytes) -> JoinResult:
    (result,) = [p.result for p in trace.peers if p.key == key and p.result is not None]
    return result


def released_epsilon(store: PeerStore, peer: bytes, signed: SignedManifest) -> float:
    """The record-level epsilon of every message ``peer`` sealed in the round, from the messages themselves:
    ``eps_median`` per comparison bit of a median answer, ``eps_data`` per subset report."""
    manifest = signed.manifest
    epsilons = []
    for message in sealed_messages(store, peer, signed):
        if message.survey.kind == SurveyKind.DATA:
            epsilons.append(manifest.eps_data)
        elif manifest.comparison_pool:
            # A pool peer's one bit, naming its feature and one of that feature's two cut points.
            decode_pool_answer(message.report, [2, 2])
            epsilons.append(manifest.eps_median)
        else:
            # One byte per comparison bit, naming which of the feature's two cut points it answers
            # (decoding raises otherwise).
            decode_median_report(message.report, [2, 2])
            epsilons += [manifest.eps_median] * len(message.report)
    return math.fsum(epsilons)


def sealed_messages(store: PeerStore, peer: bytes, signed: SignedManifest) -> list[SurveyMessage]:
    """Every message ``peer`` sealed in the round, each of which it sent."""
    messages = []
    for key, packet in store.packets(signed.round_id):
        if key == peer:
            assert packet.sends >= 1, "a sealed message was never sent"
            messages.append(SurveyMessage.from_bytes(packet.message))
    return messages


def test_every_peer_releases_exactly_its_ledger_within_the_record_level_promise(tmp_path: Path) -> None:
    trace, document = run_round(tmp_path / "round", PEERS, two_numeric_features, seed=11)
    signed, report = trace.manifest, trace.report
    manifest = signed.manifest
    # The promise is record level: two comparison bits and one report, summed.
    assert manifest.eps_total == pytest.approx(EPS_TOTAL)
    assert 2 * manifest.eps_median + manifest.k_h * manifest.eps_data == pytest.approx(manifest.eps_total)

    spec_ = FeatureSpec.from_dict(dict(manifest.features))
    # Several cut points per numeric feature, end to end: the search published two for each,
    # ascending, the peers binned with them (their data reports decoded in three bins), and the
    # report and its model carry them.
    assert [spec_.feature(name).n_bins for name in spec_.numeric_names] == [3, 3]
    cut_points = report["cut_points"]
    assert set(cut_points) == set(spec_.numeric_names)
    assert all(len(values) == 2 and values == sorted(values) for values in cut_points.values()), cut_points
    assert any(line.startswith("cut points (private median search): ") and "age " in line and "hours " in line for line in summarise(report))
    assert sum(report["accepted_by_survey"].values()) == PEERS
    assert trace.peer_store is not None
    reopened = PeerStore(trace.peer_store)  # the ledger is what the disk holds
    for outcome in trace.peers:
        key = outcome.key
        released = released_epsilon(reopened, key, signed)
        ledger = PeerLedger(reopened, key, signed.round_id, manifest.eps_total)
        assert released == pytest.approx(ledger.spent())
        assert released == pytest.approx(result_of(trace, key).epsilon_spent)
        assert released <= manifest.eps_total * (1 + 1e-12)
        # Both partitions were queried, so every peer spent the whole promise ...
        assert released == pytest.approx(manifest.eps_total)
        # ... and its ledger, rebuilt from disk, refuses anything more in this round.
        with pytest.raises(BudgetExceeded):
            ledger.spend_labelled(SurveyId.data(signed.round_id, 0, 7), ("colour",), 1e-3)
        # A resumed join after spending counts each release once (before: spent + planned, 2·ε_T, refused).
        text, cost, _, _ = describe_release(signed, spec_, vector(signed, outcome.index), reopened, key)
        assert cost == pytest.approx(manifest.eps_total), text
        assert "record level" in text and "per-attribute figure, thesis eq. 7.4" in text.lower()

    # A later round over the same relays: its consent states what the earlier round spent, and its own cost alone.
    home = AggregatorHome(tmp_path / "round" / "aggregator")
    later, _ = create_round(home, parse_round_spec({**document, "name": "privacy-2"}), now=manifest.schedule.data.t_r)
    first = trace.peers[0]
    key, first_vector = first.key, vector(signed, first.index)
    text, cost, lifetime_total, lifetime = describe_release(later.signed, spec_, first_vector, reopened, key)
    assert cost == pytest.approx(later.manifest.eps_total)
    assert f"records {manifest.eps_total:.4g} in 1 earlier round(s)" in text, text
    # Epsilons add up across rounds, and the lifetime budget caps the sum (DESIGN.md §8).
    assert lifetime_total == pytest.approx(manifest.eps_total + later.manifest.eps_total)
    assert lifetime == DEFAULT_LIFETIME_EPSILON and "within it" in text
    reopened.set_lifetime_epsilon(lifetime_total - 0.01)
    assert "OVER it: the round is refused" in describe_release(later.signed, spec_, first_vector, reopened, key).text
    later_ledger = PeerLedger(reopened, key, later.signed.round_id, later.manifest.eps_total)
    with pytest.raises(BudgetExceeded, match="lifetime budget"):
        later_ledger.spend_labelled(SurveyId.data(later.signed.round_id, 0, 0), ("colour",), later.manifest.eps_total)
    assert reopened.spends(key, later.signed.round_id) == []
    reopened.close()

    privacy = report["privacy"]
    assert privacy["eps_total_local"] == pytest.approx(manifest.eps_total)
    assert privacy["eps_total_meaning"].startswith("record-level")
    # eq. 7.4 would call this round max(age: 0.5 + 1, label: 1) = 1.5, labelled as per-attribute only
    assert privacy["eps_per_attribute_secondary"] == pytest.approx(manifest.eps_median + manifest.eps_data)
    assert any("record-level" in line and "eq. 7.4" in line for line in summarise(report))


POOL_PEERS = 12


def test_with_a_comparison_pool_every_peer_makes_one_release_at_the_full_promise(tmp_path: Path) -> None:
    """Issue 11, What to build 2: in a round, by default each peer answers exactly one question at the full
    ε_T. The pool's peers each seal one comparison bit (about a feature and a cut point they drew), the
    others one data report and no comparison; each sum equals the ledger and the promise; the search
    still finds both features' cut points from the pool's answers alone."""
    trace, _ = run_round(tmp_path / "round", POOL_PEERS, with_comparison_pool, seed=12)
    signed, report = trace.manifest, trace.report
    manifest = signed.manifest
    assert manifest.comparison_pool == 340 and manifest.partitions == manifest.k_p + manifest.median_rounds == 4
    # One release at the full promise either way: the pool's bit and a data report both cost ε_T.
    assert manifest.eps_median == pytest.approx(EPS_TOTAL) and manifest.eps_data == pytest.approx(EPS_TOTAL)
    assert manifest.eps_total == pytest.approx(EPS_TOTAL)

    assert trace.peer_store is not None
    reopened = PeerStore(trace.peer_store)
    pool = 0
    for outcome in trace.peers:
        key = outcome.key
        result = result_of(trace, key)
        assert result.partition is not None
        messages = sealed_messages(reopened, key, signed)
        (message,) = messages  # exactly one release, and the final receipt log holds it
        assert (result.acknowledged, result.missing) == (1, 0), result
        if manifest.is_pool_partition(result.partition):
            pool += 1
            assert message.survey == manifest.median_survey(result.partition)
            assert result.partition - manifest.k_p == message.survey.sub_round
        else:
            assert message.survey == SurveyId.data(signed.round_id, result.partition, 0)
        released = released_epsilon(reopened, key, signed)
        assert released == pytest.approx(PeerLedger(reopened, key, signed.round_id, manifest.eps_total).spent())
        assert released == pytest.approx(result.epsilon_spent) == pytest.approx(manifest.eps_total)
    assert pool == manifest.comparison_pool_size(POOL_PEERS) == 4
    accepted = report["accepted_by_survey"]
    assert sum(accepted.values()) == POOL_PEERS - pool  # the data reports, every one
    spec_ = FeatureSpec.from_dict(dict(manifest.features))
    cut_points = report["cut_points"]
    assert set(cut_points) == set(spec_.numeric_names)
    assert all(len(values) == 2 and values == sorted(values) for values in cut_points.values()), cut_points
    # The eq. 7.4 figure is the costlier kind's: a pool peer's one feature or a data peer's label, ε_T each.
    assert report["privacy"]["eps_per_attribute_secondary"] == pytest.approx(EPS_TOTAL)

    # Before the seed, a new peer is told it will be one kind or the other, and what each costs.
    newcomer = PeerIdentity.generate().public_key
    first_vector = vector(signed, trace.peers[0].index)
    text, cost, _, _ = describe_release(signed, spec_, first_vector, reopened, newcomer)
    assert cost == pytest.approx(EPS_TOTAL), text
    assert "if in the comparison pool:" in text and "otherwise:" in text and "about ONE numeric feature" in text, text
    # After, each sees only its own kind's release, counted once.
    for outcome in trace.peers:
        text, cost, _, _ = describe_release(signed, spec_, vector(signed, outcome.index), reopened, outcome.key)
        assert cost == pytest.approx(EPS_TOTAL) and "if in the comparison pool:" not in text, text
    reopened.close()
