"""``anonml bench netns`` without root: the namespace plan and its commands, the stale-namespace check, the
user-space link emulator's switching, delay and loss, the round trip probe, the planner's windows with a
round trip, and the anonymity verdict. The round itself is tests/test_netns_round.py (system, root)."""

from __future__ import annotations

import math
import random
import socket
import threading
from types import SimpleNamespace

import pytest

from anonml.bench._links import Switch
from anonml.bench._netns import NETEM_LIMIT, PREFIX, SUBNET, plan_namespaces, stale_namespaces
from anonml.bench.netns import RoundConfig, host_roles, round_trips, summarise_round_trips, verdict
from anonml.demo._calibrate import PhaseCosts
from anonml.demo._schedule import HEADROOM, plan_round
from anonml.demo._summary import anonymity_problems
from anonml.demo._swarm import SwarmConfig

ROLES = host_roles(5)


def test_every_role_gets_its_own_namespace_address_and_bridge_port() -> None:
    plan = plan_namespaces(ROLES, 25, 1, tag="abc123", pid=4242)
    assert [h.role for h in plan.hosts] == ["ctl", "aggregator", "relay-0", "relay-1", "relay-2", "relay-3", "relay-4", "peers"]
    assert len(set(plan.namespaces)) == len(ROLES) + 1
    assert all(name.startswith(f"{PREFIX}4242-abc123-") for name in plan.namespaces)
    addresses = [h.address for h in plan.hosts]
    assert len(set(addresses)) == len(addresses) and all(a.startswith(SUBNET + ".") for a in addresses)
    # Interface names are at most 15 characters (IFNAMSIZ - 1), and unique on the bridge.
    assert len({h.port for h in plan.hosts}) == len(ROLES) and all(len(h.port) <= 15 for h in plan.hosts)
    assert plan.exec_prefix("relay-3") == ["ip", "netns", "exec", f"{PREFIX}4242-abc123-relay-3"]
    assert plan.host("aggregator").address == f"{SUBNET}.3"
    with pytest.raises(KeyError, match="no host 'relay-9'"):
        plan.host("relay-9")


def test_two_plans_never_share_a_namespace_name() -> None:
    first, second = plan_namespaces(ROLES, 25, 1), plan_namespaces(ROLES, 25, 1)
    assert not set(first.namespaces) & set(second.namespaces)


@pytest.mark.parametrize("roles, delay, loss, tag", [
    ([], 25, 1, None), (["a", "a"], 25, 1, None), (["a"], -1, 1, None), (["a"], 25, 101, None), (["a"], 25, 1, "NOT-HEX"),
    ([f"h{i}" for i in range(251)], 25, 1, None),
])
def test_a_bad_plan_is_refused_with_a_reason(roles: list[str], delay: float, loss: float, tag: str | None) -> None:
    with pytest.raises(ValueError):
        plan_namespaces(roles, delay, loss, tag=tag)


def test_every_bridge_port_carries_netem_with_the_stated_delay_and_loss() -> None:
    plan = plan_namespaces(ROLES, 25, 1, tag="ab")
    qdiscs = [c for c in plan.netem_commands() if c[0] == "tc"]
    assert len(qdiscs) == len(ROLES)
    for host, command in zip(plan.hosts, qdiscs, strict=True):
        assert command == ["tc", "-n", plan.bridge_namespace, "qdisc", "add", "dev", host.port, "root",
                           "netem", "delay", "25ms", "loss", "1%", "limit", str(NETEM_LIMIT)]
    # Every host namespace is made before any link, and each address goes on its own eth0.
    setup = plan.setup_commands()
    assert setup[: len(plan.namespaces)] == [["ip", "netns", "add", name] for name in plan.namespaces]
    assert ["ip", "-n", plan.host("peers").namespace, "addr", "add", f"{plan.host('peers').address}/24", "dev", "eth0"] in plan.address_commands()
    assert "round trip 50 ms, 1% loss each way" in plan.describe("netem")


def test_only_namespaces_whose_creating_process_is_gone_are_stale() -> None:
    names = [f"{PREFIX}100-ab12-ctl", f"{PREFIX}100-ab12-bridge", f"{PREFIX}200-cd-peers", "someone-elses", f"{PREFIX}x-ab-ctl"]
    assert stale_namespaces(names, lambda pid: pid == 200) == [f"{PREFIX}100-ab12-ctl", f"{PREFIX}100-ab12-bridge"]
    assert stale_namespaces(names, lambda pid: True) == []


def frame(destination: bytes, source: bytes, payload: bytes = b"x" * 50) -> bytes:
    return destination + source + b"\x08\x00" + payload


MAC = [bytes([2, 0, 0, 0, 0, i]) for i in range(4)]
BROADCAST = b"\xff" * 6


def test_the_switch_floods_unknown_frames_then_sends_each_to_its_learned_port_after_the_delay() -> None:
    switch = Switch(delay=0.025, loss=0.0, rng=random.Random(0), ports=4)
    switch.frame_in(0, frame(BROADCAST, MAC[0]), now=10.0)
    assert switch.due(10.024) == []
    assert sorted(port for port, _ in switch.due(10.025)) == [1, 2, 3]
    # Port 2 answers port 0: port 0's address is known now, so only port 0 gets it.
    switch.frame_in(2, frame(MAC[0], MAC[2]), now=11.0)
    assert switch.wait(11.0) == pytest.approx(0.025)
    assert [port for port, _ in switch.due(11.025)] == [0]
    # Frames keep their order.
    for i in range(5):
        switch.frame_in(0, frame(MAC[2], MAC[0], bytes([i])), now=12.0 + i * 1e-4)
    assert [f[14] for _, f in switch.due(13.0)] == [0, 1, 2, 3, 4]
    assert switch.wait(13.0) is None


def test_the_switch_drops_the_stated_share_of_frames() -> None:
    switch = Switch(delay=0.0, loss=0.01, rng=random.Random(1), ports=2)
    switch.frame_in(1, frame(MAC[0], MAC[1]), now=0.0)
    switch.due(0.0)
    switch.dropped = 0
    n = 40_000
    for i in range(n):
        switch.frame_in(0, frame(MAC[1], MAC[0]), now=float(i))
    delivered = len(switch.due(float(n)))
    assert delivered + switch.dropped == n
    # Binomial(n, 0.01): 4 standard errors either side.
    assert abs(switch.dropped - 0.01 * n) < 4 * math.sqrt(n * 0.01 * 0.99)


def test_round_trips_are_timed_tcp_handshakes_and_lost_ones_are_counted() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        stop = threading.Event()

        def accept() -> None:
            server.settimeout(0.1)
            while not stop.is_set():
                try:
                    server.accept()[0].close()
                except TimeoutError:
                    continue

        thread = threading.Thread(target=accept)
        thread.start()
        try:
            seconds = round_trips("127.0.0.1", port, 5, gap=0.0)
        finally:
            stop.set()
            thread.join()
    assert len(seconds) == 5 and all(0 < s < 1 for s in seconds)
    figures = summarise_round_trips([0.05, 0.051, 0.052, 1.05, 0.05])
    assert figures["median_ms"] == pytest.approx(51) and figures["retransmitted"] == 1 and figures["max_ms"] == pytest.approx(1050)
    with pytest.raises(ValueError):
        summarise_round_trips([])


def test_the_driver_config_starts_every_role_in_its_namespace_at_its_address() -> None:
    plan = plan_namespaces(ROLES, 25, 1, tag="ab")
    config = RoundConfig.for_plan(plan, 5, 0.05, peers=40, workers=2, seed=0, epsilon=2.0, work="w", summary_path="s")
    assert config.aggregator_host == plan.host("aggregator").address
    assert config.relay_hosts == [plan.host(f"relay-{i}").address for i in range(5)]
    assert config.prefixes["peers"] == plan.exec_prefix("peers") and config.prefixes["relay-4"] == plan.exec_prefix("relay-4")
    assert "ctl" not in config.prefixes


def costs() -> PhaseCosts:
    return PhaseCosts(register=1e-3, issue=10e-3, roster_entry=0.1e-3, token=10e-3, relay_hop=1.5e-3, verify=8e-3, http=8e-3, process_start=1.5, serving_start=3.0)


def test_the_planner_holds_the_round_trip_in_exchanges_and_checks() -> None:
    data = SimpleNamespace(name="breast-cancer")
    loopback = plan_round(data, 4000, 2.0, 2, 0, costs(), n_cores=2)  # type: ignore[arg-type]
    assert plan_round(data, 4000, 2.0, 2, 0, costs(), n_cores=2, round_trip=0.0) == loopback  # type: ignore[arg-type]
    rtt = 0.2
    far = plan_round(data, 4000, 2.0, 2, 0, costs(), n_cores=2, round_trip=rtt)  # type: ignore[arg-type]
    # 4,000 exchanges, each a round trip, SwarmConfig.max_connections at a time in each of 2 workers.
    waiting = HEADROOM * 4000 * rtt / (2 * SwarmConfig.max_connections)
    assert far.register_seconds >= waiting and far.issue_seconds >= waiting
    assert far.register_seconds > loopback.register_seconds
    # A check's polls, one after another: each waits a round trip.
    assert far.check_seconds > loopback.check_seconds and far.publish_gap > loopback.publish_gap
    # The relays' work does not wait on the peers' round trips.
    assert (far.data_send_window, far.data_delivery_window) == (loopback.data_send_window, loopback.data_delivery_window)


def figures(correct: int, rho: float) -> dict[str, object]:
    n, chance = 400, 0.1
    return {"aggregator_guess": {"accuracy": correct / n, "chance": chance, "standard_error_at_chance": math.sqrt(chance * 0.9 / n),
                                 "messages": n},
            "spearman_rho": rho, "rho_standard_error": 1 / math.sqrt(n - 1)}


def test_the_anonymity_report_is_at_chance_within_three_standard_errors() -> None:
    # chance 10% of 400: 40 right, 1 s.e. 6 messages.
    assert anonymity_problems(figures(40, 0.0)) == []
    assert anonymity_problems(figures(57, 0.14)) == []
    (guess,) = anonymity_problems(figures(59, 0.0))
    assert "timing guess" in guess
    (rho,) = anonymity_problems(figures(40, -0.2))
    assert "rho" in rho
    assert "no anonymity report" in anonymity_problems({"unavailable": "links.json was not written"})[0]


def test_the_verdict_is_the_demos_exit_code_then_the_anonymity_report() -> None:
    summary = {"phase": "done", "audit": {"accepted": 100, "prepared": 100, "counted_twice": 0, "peer_acknowledged_but_lost": 0},
               "anonymity": figures(40, 0.0), "peers": 50, "joined": 50}
    assert verdict({"summary": summary}) == (0, [])
    assert verdict({"summary": {**summary, "joined": 25}})[0] == 7  # half the peers shut out: the demo's 7
    assert verdict({"summary": {**summary, "anonymity": figures(80, 0.0)}})[0] == 6
    assert verdict({"summary": {**summary, "audit": {**summary["audit"], "accepted": 98}}})[0] == 4
    assert verdict({"driver_exit": 1})[0] == 3
