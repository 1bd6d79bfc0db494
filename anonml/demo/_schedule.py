"""The demo's round: its parameters, its windows sized from measured costs, its spec.

Every window is the phase's measured work (:class:`PhaseCosts` times the
number of units) times :data:`SLACK`, plus :func:`recovery_seconds`: the time
to notice that a relay or the aggregator died, start it again and let the
peers' retries reach it. A round planned this way finishes on a loaded
machine and survives a restart inside any phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, NamedTuple

import tomli_w

from anonml.demo._calibrate import PhaseCosts
from anonml.demo._data import DemoData
from anonml.demo._ports import HOST
from anonml.protocol import DEFAULT_MIN_ANONYMITY_SET, comparison_pool_size, smallest_anonymity_set
from anonml.transport import HttpLimits

RELAYS = 3
AGGREGATOR_PROCESSES = 2
# Measured work is multiplied by this. The costs are timed one call after
# another in one process, under the machine's load at the time; in the round
# the same work is spread over the peers' worker processes, the aggregator
# and its issuer processes, so the serial figure already overstates the
# round's wall time on two cores. The factor covers the load rising during
# the round (measured here: one credential took 9 ms at load 4 and 114 ms
# at load 16, with four CPU hogs and other tests running).
SLACK = 2.0
# The peers' HTTP client waits up to this long between retries of a request
# to an aggregator that is down (peer._client.retry_delay's cap).
PEER_RETRY_GAP = 2.0


@dataclass(frozen=True)
class DemoParams:
    """The round the demo runs: learning parameters and every window, in seconds."""

    peers: int
    epsilon: float
    workers: int
    seed: int
    k_p: int
    k_h: int
    k_s: int
    plan: str
    vote: str
    median_rounds: int
    quantiles: int
    """Cut points per numeric feature, found by the median search (1: the median)."""
    comparison_pool: float
    """The share of peers reserved for the median search (0: every peer answers it)."""
    start_seconds: int
    """From ``round new`` until registration opens: time for ``aggregator run`` to be serving."""
    register_seconds: int
    issue_seconds: int
    send_window: int
    delivery_window: int
    data_send_window: int
    data_delivery_window: int
    check_seconds: int
    """After each delivery window: the aggregator signs the log heads, relays mirror them, peers compare."""

    def total_seconds(self) -> int:
        """From ``round new`` until the data phase's second delivery window closes (publish gaps included).

        Each phase runs twice, the second time as the uniform second chance
        (every peer sends one packet per survey), with the check between.
        """
        return self.start_seconds + schedule_seconds(round_spec_schedule(self))


def recovery_seconds(costs: PhaseCosts) -> float:
    """Time for one restart inside a phase: the supervisor notices and waits
    its restart delay (a second), the process starts again and the
    aggregator then starts its issuer processes (each as long as an operator
    command took, measured), and the peers' next retry reaches it."""
    return 1.0 + 2 * costs.process_start + PEER_RETRY_GAP


class DemoLearning(NamedTuple):
    """The learning half of the demo's round spec."""

    k_p: int
    k_h: int
    k_s: int
    plan: str
    median_rounds: int
    vote: str
    quantiles: int
    comparison_pool: float


def learning_parameters(data: DemoData) -> DemoLearning:
    """The demo's plan for the dataset: one data packet per peer (the "one"
    plan), combined by naive Bayes over the partitions' noisy histograms.

    ``anonml experiment`` scores the same plan without the network (the
    demo's summary prints that command, :func:`experiment_command`). At
    ε_T = 2 over 20 trials, on the demo's twelve breast-cancer features and
    its split, the thesis's split plan (k_p=4, k_h=2, k_s=2) with the
    weighted vote scored AUC 0.757 ± 0.154; this plan with naive Bayes
    0.909 ± 0.049, and the same four partitions of about 100 peers keep each
    token's anonymity set. Median sub-rounds: three (breast cancer) or four
    (Adult) steps of the binary search.

    Breast cancer: every peer answers the search once, in its partition's
    sub-round (``RoundManifest.median_sub_round``), one bit per numeric
    feature. One cut point (the median): at ε_T = 2 over 20 trials, two
    scored 0.875 ± 0.093 (each median bit costs ε_e = 0.083 there, twelve
    numeric features). A comparison pool is no use at 398 peers: 40 pool
    peers over three steps of twelve searches leave about one answer a step.

    Adult: each peer makes one release at the full ε_T. A comparison pool of
    10% answers the search (one bit each about one of the five numeric
    features and one of its three cut points), the others send one report of
    one feature. At ε_T = 2 over 20 trials on 8,000 training rows, this plan
    scored 0.871 ± 0.007 against 0.866 ± 0.009 for every peer answering the
    search (one cut point, ``median_share`` 0.5).
    """
    if data.name == "breast-cancer":
        return DemoLearning(k_p=4, k_h=1, k_s=3, plan="one", median_rounds=3, vote="naive-bayes", quantiles=1, comparison_pool=0.0)
    return DemoLearning(k_p=12, k_h=1, k_s=1, plan="one", median_rounds=4, vote="naive-bayes", quantiles=3, comparison_pool=0.1)


def plan_round(data: DemoData, peers: int, epsilon: float, workers: int, seed: int, costs: PhaseCosts) -> DemoParams:
    """The demo's round with every window sized from ``costs`` (see the module docstring)."""
    k_p, k_h, k_s, plan, median_rounds, vote, quantiles, pool = learning_parameters(data)
    recovery = recovery_seconds(costs)

    def window(units: float, per_unit: float, *, floor: float = 1.0) -> int:
        return math.ceil(max(floor, units * per_unit * SLACK) + recovery)

    def delivery(messages: float) -> int:
        # Each relay has its own slice of the delivery window, and the last
        # slice carries the final hop and the aggregator's verification
        # (protocol.hop_windows): each slice must hold its work and a restart.
        per_slice = max(window(messages, costs.relay_hop), window(messages, costs.verify))
        return per_slice * (RELAYS + 1)

    # Every peer here comes from one address, which the aggregator's HTTP server
    # (and each relay's mirror) paces to HttpLimits.request_rate requests a second.
    http = max(costs.http, 1 / HttpLimits().request_rate)
    # One HTTP exchange per peer to register, two to fetch the roster and
    # get the credential; the workers start while registration is open.
    register = math.ceil(costs.process_start) + window(peers, costs.register + http)
    issue = window(peers, costs.issue + 2 * http)
    # A median sub-round asks its pool partition, or without a pool every partition p with
    # p % median_rounds equal to its index (at most ceil(k_p / median_rounds) of them);
    # the data phase every peer k_h times.
    if not median_rounds:
        median_messages = 0
    elif pool:
        median_messages = math.ceil(comparison_pool_size(round(pool * 1000), peers, median_rounds) / median_rounds)
    else:
        median_messages = math.ceil(peers / k_p) * math.ceil(k_p / median_rounds)
    data_messages = peers * k_h
    return DemoParams(
        peers=peers, epsilon=epsilon, workers=workers, seed=seed, k_p=k_p, k_h=k_h, k_s=k_s, plan=plan,
        vote=vote, median_rounds=median_rounds, quantiles=quantiles, comparison_pool=pool,
        # `aggregator run` starts, then starts its issuer processes, before it
        # takes registrations: both after `round new`, measured, with slack.
        start_seconds=math.ceil(2 * costs.process_start * SLACK) + 1,
        register_seconds=register,
        issue_seconds=issue,
        # A sender fetches the thresholds, makes its token and packet, and hands it to a relay.
        send_window=window(median_messages, costs.token + http),
        delivery_window=delivery(median_messages),
        data_send_window=window(data_messages, costs.token + http),
        data_delivery_window=delivery(data_messages),
        # The verification backlog is inside the last delivery slice; the check itself is the heads'
        # signing, one mirror refresh (1 s) and every peer's fetch of its partition's segment.
        check_seconds=window(peers, http, floor=3.0),
    )


def round_spec_schedule(params: DemoParams) -> dict[str, int]:
    """The ``[schedule]`` table of the round spec."""
    return {
        "register": params.register_seconds,
        "issue": params.issue_seconds,
        "median_rounds": params.median_rounds,
        "median_send": params.send_window,
        "median_delivery": params.delivery_window,
        "data_send": params.data_send_window,
        "data_delivery": params.data_delivery_window,
        "check": params.check_seconds,
    }


def schedule_seconds(schedule: Mapping[str, int]) -> int:
    """How long a spec's ``[schedule]`` runs, from registration opening to the
    data phase's second delivery window closing, with the spec's defaults
    (``aggregator.build_schedule``: each phase sends, delivers, checks, then
    sends and delivers its second chance; a publish gap before every phase
    that waits for published results)."""
    gap = schedule.get("publish_gap", 2)
    check = schedule.get("check", 4)

    def phase(kind: str) -> int:
        send, delivery = schedule[f"{kind}_send"], schedule[f"{kind}_delivery"]
        second = schedule.get(f"{kind}_second_send", send) + schedule.get(f"{kind}_second_delivery", delivery)
        return send + delivery + check + second

    rounds = schedule.get("median_rounds", 0)
    median = rounds * phase("median") + max(0, rounds - 1) * gap
    return schedule["register"] + schedule["issue"] + median + (gap if rounds else 0) + phase("data")


def round_spec(data: DemoData, params: DemoParams, relays: list[dict[str, Any]], http_port: int, sink_port: int) -> dict[str, Any]:
    """The round spec for ``anonml aggregator round new`` (durations count from that command)."""
    relay_fields = ("node_id", "host", "port", "public_key", "key_epoch", "mirror_port")
    spec = data.spec.to_dict()
    min_participation = max(1, params.peers // 2)
    # The demo runs at any --peers: it signs the minimum anonymity set its own
    # minimum participation meets (the default at most), so a small demo round
    # states how small its surveys are instead of being refused.
    smallest = smallest_anonymity_set(min_participation, params.k_p, round(params.comparison_pool * 1000), params.median_rounds)
    return {
        "name": f"demo-{data.name}",
        "task": {"features": spec["features"], "label": spec["label"], "quantiles": params.quantiles},
        "learning": {"k_p": params.k_p, "k_h": params.k_h, "k_s": params.k_s, "plan": params.plan, "learner": "logreg",
                     "vote": params.vote, "comparison_pool": params.comparison_pool},
        "privacy": {"eps_total": params.epsilon, "oracle": "auto"},
        "schedule": round_spec_schedule(params),
        "network": {
            "relays": [{k: relay[k] for k in relay_fields} for relay in relays],
            "path_length": RELAYS,
            "http_host": HOST,
            "http_port": http_port,
            "sink_host": HOST,
            "sink_port": sink_port,
        },
        # A demo: open registration, and every peer comes from this machine's one address.
        "participation": {
            "min_participation": min_participation, "registration": "open", "purpose": "demo",
            "max_per_client": params.peers, "min_anonymity_set": min(DEFAULT_MIN_ANONYMITY_SET, smallest),
        },
    }


def to_toml(document: dict[str, Any]) -> str:
    """The round spec as TOML."""
    return tomli_w.dumps(document)
