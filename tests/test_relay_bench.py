"""``anonml bench relay`` runs end to end (a smoke test: no timing is asserted;
speed targets are shown by the benchmark itself)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from anonml.cli import main


@pytest.mark.slow
def test_bench_relay_delivers_every_packet_and_reports_where_time_goes() -> None:
    result = CliRunner().invoke(main, ["bench", "relay", "--json", "--packets", "256", "--repeat", "10"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["delivered"] == figures["packets"] == 256
    assert figures["packets_per_second"] > 0 and figures["cpu_bound_capacity_packets_per_second"] > 0
    assert [r["forwarded"] for r in figures["per_relay"]] == [256, 256, 256]
    for relay in figures["per_relay"]:
        assert relay["cpu_us"] >= relay["intake_cpu_us"] > 0
    assert figures["isolated_process_hop_us"] is not None  # the bench crypto figure, same run
    # The floor: the Sphinx unwrapping of 3 hops and the final layer, isolated; the cascade does more.
    floor = figures["floor_sphinx_cpu_us_per_packet"]
    assert floor > 3 * figures["baseline_x25519_us"] and figures["floor_packets_per_second"] > 0
    assert figures["cpu_x_floor"] == pytest.approx(figures["cpu_us_per_packet_all_processes"] / floor, abs=0.01)
