"""The round spec as a typed schema (issue 29) and the refusals ``round new`` owes (issues 24, 29).

Each TOML table is read into a record whose fields are named as the table's
keys, so the spec is built by name and two swapped values cannot pass; a
spec whose smallest survey at its minimum participation falls below its
minimum anonymity set, a sink on the HTTP port, or more median sub-rounds
than partitions without a pool are refused with one line naming the numbers.
"""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from anonml.aggregator._spec import RoundSpecError, parse_round_spec
from anonml.aggregator._spec_tables import LearningTable, NetworkTable, ParticipationTable, PrivacyTable, ScheduleTable
from anonml.protocol import DEFAULT_MIN_ANONYMITY_SET, PartitionPlan, smallest_anonymity_set
from anonml.protocol._features import FeatureSpec
from test_aggregator import spec_document, with_median
from test_manifest import fixed_manifest
from test_rounds_cli import agg, round_new  # noqa: F401 - agg is a fixture
from test_aggregator_cli import write_spec

ROOT = Path(__file__).resolve().parents[1]


def every_key() -> dict[str, Any]:
    """A spec that writes out every key of every table (``expected_peers`` aside: only ``plan = "auto"`` takes it),
    each integer a different value, so a value read under another key's name shows."""
    document = with_median(spec_document(), median_rounds=2)
    document["learning"] = {"k_p": 3, "k_h": 1, "k_s": 2, "plan": "split", "learner": "tree", "vote": "soft", "comparison_pool": 0}
    document["privacy"] = {"eps_total": 3.0, "oracle": "grr", "median_share": 0.3}
    document["schedule"] = {
        "start": 1_900_000_000, "register": 101, "issue": 102, "median_rounds": 2, "median_send": 103, "median_delivery": 104,
        "data_send": 105, "data_delivery": 106, "check": 107, "median_second_send": 108, "median_second_delivery": 109,
        "data_second_send": 110, "data_second_delivery": 111, "publish_gap": 112,
    }
    document["network"].update({"packet_size": 2048, "max_hops": 5, "sink_host": "127.0.0.2", "http_port": 8090, "sink_port": 8091,
                                "sink_workers": [{"host": "127.0.0.3", "port": 8091}]})
    document["participation"] = {
        "min_participation": 21, "registration": "allow-list", "purpose": "production", "max_roster": 1000, "max_per_client": 3,
        "invitations": 7, "allow_list": ["ab" * 32], "min_reports_per_survey": 4, "on_shortfall": "fail", "min_anonymity_set": 6,
    }
    return document


def test_each_table_is_read_by_name_into_fields_named_as_its_keys() -> None:
    document = every_key()
    spec = parse_round_spec(copy.deepcopy(document))
    for table, record, schema in (
        ("learning", spec.learning, LearningTable), ("privacy", spec.privacy, PrivacyTable),
        ("schedule", spec.schedule, ScheduleTable), ("network", spec.network, NetworkTable),
        ("participation", spec.participation, ParticipationTable),
    ):
        assert {field.name for field in fields(schema)} - {"expected_peers"} == set(document[table]), table
        for key, value in document[table].items():
            read = getattr(record, key)
            if key == "relays":
                assert [relay.node_id.hex() for relay in read] == [relay["node_id"] for relay in value]
            elif key == "allow_list":
                assert read == tuple(bytes.fromhex(item) for item in value)
            elif key == "sink_workers":
                assert read == tuple((item["host"], item["port"]) for item in value)
            else:
                assert read == value, (table, key)
    assert spec.task.quantiles is None and spec.task.features.names == ("colour", "shape", "size")
    # Swapping two integers of one table swaps them in the spec: each is read under its own name.
    swapped = copy.deepcopy(document)
    schedule = swapped["schedule"]
    schedule["median_send"], schedule["data_send"] = schedule["data_send"], schedule["median_send"]
    assert (parse_round_spec(swapped).schedule.median_send, parse_round_spec(swapped).schedule.data_send) == (105, 103)


def test_the_spec_module_makes_no_long_function_and_no_long_positional_call() -> None:
    """Issue 29: ``parse_round_spec`` was 198 lines ending in a call of 43 positional arguments."""
    for name in ("_spec.py", "_spec_tables.py"):
        tree = ast.parse((ROOT / "aggregator" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None and node.end_lineno - node.lineno < 100, (name, node.name)
            if isinstance(node, ast.Call):
                assert len(node.args) <= 8, (name, node.lineno)


def test_smallest_anonymity_set_is_the_smallest_partition_a_round_deals() -> None:
    """The figure ``round new`` checks is the smallest non-empty partition the peers and the aggregator derive."""
    spec = FeatureSpec.from_dict(dict(fixed_manifest().features))
    for pool in (0, 100, 340):
        manifest = fixed_manifest(comparison_pool=pool, k_h=1, k_s=1)
        previous = 0
        for peers in range(1, 60):
            keys = [i.to_bytes(32, "big") for i in range(peers)]
            sizes = PartitionPlan.derive(manifest, spec, keys, bytes(32), bytes(32)).sizes
            smallest = smallest_anonymity_set(peers, manifest.k_p, pool, manifest.median_rounds)
            assert smallest == min(size for size in sizes if size), (pool, peers, sizes)
            # Never smaller with more peers: a round that meets its minimum at min_participation meets it above.
            assert smallest >= previous
            previous = smallest


def test_a_round_whose_smallest_survey_falls_below_the_minimum_anonymity_set_is_refused() -> None:
    """Issue 24: a 16-peer round with a 10% pool put one peer in each pool partition, and round new accepted it."""
    def document(min_participation: int, **learning: Any) -> dict[str, Any]:
        spec = with_median(spec_document(min_participation=min_participation), median_rounds=4)
        del spec["participation"]["min_anonymity_set"]  # the default
        spec["learning"].update(learning)
        return spec

    pooled = {"plan": "one", "k_p": 4, "k_h": 1, "k_s": 1}  # the "one" plan's 10% comparison pool
    with pytest.raises(RoundSpecError) as refused:
        parse_round_spec(document(16, **pooled))
    assert refused.value.field == "participation.min_anonymity_set"
    message = str(refused.value)
    assert "\n" not in message and "min_participation = 16" in message and "holds 1 peer(s)" in message
    assert "comparison-pool partition (4 pool peers over 4 sub-rounds)" in message and f"min_anonymity_set = {DEFAULT_MIN_ANONYMITY_SET}" in message
    # 200 peers: 20 in the pool, 5 per sub-round (and 45 per data partition) meet the default of 5.
    assert parse_round_spec(document(200, **pooled)).participation.min_anonymity_set == 5
    with pytest.raises(RoundSpecError, match=r"holds 4 peer\(s\), a comparison-pool partition"):
        parse_round_spec(document(180, **pooled))
    # Without a pool a data partition is the smallest: 9 peers over k_p = 4 leave 2.
    with pytest.raises(RoundSpecError, match=r"holds 2 peer\(s\), a data partition \(9 peers over k_p = 4\)"):
        parse_round_spec(document(9, k_p=4))
    assert parse_round_spec(document(20, k_p=4)).participation.min_anonymity_set == 5
    # A round may promise more, and is held to it.
    stronger = document(20, k_p=4)
    stronger["participation"]["min_anonymity_set"] = 6
    with pytest.raises(RoundSpecError, match="fewer than min_anonymity_set = 6"):
        parse_round_spec(stronger)


def test_median_rounds_above_k_p_is_refused_without_a_pool_and_allowed_with_one() -> None:
    """The help said "needs <= k_p"; that holds without a comparison pool, whose partitions answer otherwise."""
    document = with_median(spec_document(min_participation=100), median_rounds=9)
    document["learning"]["k_p"] = 4
    with pytest.raises(RoundSpecError) as refused:
        parse_round_spec(copy.deepcopy(document))
    assert refused.value.field == "schedule.median_rounds"
    assert "9 median sub-rounds" in str(refused.value) and "learning.k_p = 4" in str(refused.value)
    document["learning"]["comparison_pool"] = 0.1
    assert parse_round_spec(document).schedule.median_rounds == 9


def test_round_new_refuses_a_sink_on_the_http_port_in_one_line(agg: Path, tmp_path: Path) -> None:  # noqa: F811
    spec = write_spec(tmp_path / "round.toml")
    http_port = re.search(r"http_port = (\d+)", spec.read_text())
    assert http_port is not None
    spec.write_text(re.sub(r"sink_port = \d+", f"sink_port = {http_port.group(1)}", spec.read_text()))
    code, output = round_new(agg, spec)
    assert code == 1 and "Traceback" not in output
    (line,) = output.strip().splitlines()
    assert "network.sink_port" in line and f"{http_port.group(1)} is also http_port" in line
    assert not (agg / "rounds").exists() or not any((agg / "rounds").iterdir())


def test_sink_workers_are_signed_in_the_manifest_and_a_clash_is_refused() -> None:
    """Issue 27: `sink_workers` lists where `aggregator worker` processes take packets; the manifest's final hop
    lists them, and an address listed twice or taken by the sink or the HTTP API is refused by name."""
    document = spec_document()
    network = document["network"]
    network["sink_workers"] = [{"host": "127.0.0.2", "port": network["sink_port"]}]
    assert parse_round_spec(copy.deepcopy(document)).network.sink_workers == (("127.0.0.2", network["sink_port"]),)
    for clash in ({"host": network["sink_host"], "port": network["sink_port"]},
                  {"host": network["http_host"], "port": network["http_port"]},
                  {"host": "127.0.0.2", "port": network["sink_port"]}):
        clashing = copy.deepcopy(document)
        clashing["network"]["sink_workers"].append(clash)
        with pytest.raises(RoundSpecError) as refused:
            parse_round_spec(clashing)
        assert refused.value.field.startswith("network.sink_workers"), refused.value


def test_round_new_states_the_smallest_survey_and_the_signed_minimum(agg: Path, tmp_path: Path) -> None:  # noqa: F811
    code, output = round_new(agg, write_spec(tmp_path / "round.toml"))  # 3 peers at minimum, k_p = 2, a minimum of 1
    assert code == 0, output
    assert "at its minimum participation (3 peers) the smallest survey holds 1; the signed minimum anonymity set is 1" in output


def test_a_delivery_window_without_room_for_the_first_hops_guard_is_refused_in_one_line() -> None:
    """Each delivery window holds the first hop's guard and a second per relay and for the slack slice
    (protocol.hop_windows): path_length + 2 seconds at least."""
    document = spec_document()
    path_length = document["network"]["path_length"]
    document["schedule"]["data_delivery"] = path_length + 1
    with pytest.raises(RoundSpecError) as refused:
        parse_round_spec(copy.deepcopy(document))
    assert refused.value.field == "schedule.data_delivery" and "\n" not in str(refused.value)
    assert f"cannot hold the first hop's guard, {path_length} relay windows and the slack slice (needs {path_length + 2})" in str(refused.value)
    document["schedule"]["data_delivery"] = path_length + 2
    assert parse_round_spec(document).schedule.data_delivery == path_length + 2
