"""The demo's round: its parameters, its windows sized from what each must achieve, its spec.

The rule (:func:`plan_round`; README "Before it opens the round"): a window is
as long as its work at the throughput measured now, across the machine's cores,
times :data:`HEADROOM` — not a serial per-peer cost times a slack factor.

* A send window holds the phase's messages (token and Sphinx packet, made by
  the peers' workers) and their first relays' intake (a Sphinx hop each), all
  on the same cores, at that rate. A first relay that is down costs no window
  time: the peer hands its packet to another first relay.
* Each relay's slice of a delivery window holds every packet of the attempt
  at one relay's measured Sphinx rate (the second attempt's: each message
  over ``protocol.SECOND_WINDOW_PATHS`` paths); the last slice holds the aggregator's
  verification on its worker processes. Relays release each packet at a
  uniformly random time of their slice, and the first slice opens a guard
  after the send window has closed (at least a second,
  ``protocol.first_hop_guard``), so arrival is independent of send time
  whatever the slice's length for every packet that reaches its first relay
  within the guard (``protocol.hop_windows``).
* The check holds the mirrors' poll for the signed heads and the peers' polls
  for the log and the mirrors' heads (one request each per worker process).
* Registration and issuance hold their work and one restart of the
  aggregator (:func:`recovery_seconds`): nothing after them repairs a peer
  that missed them. A query phase does not pad every window with a restart:
  a packet lost to a restart in the first attempt is missing at the first
  check and its peer resends it in the second attempt.
* Across a network with latency (``plan_round(round_trip=)``, measured;
  ``anonml bench netns``), a peer's HTTP exchange waits a round trip too:
  each worker process keeps ``SwarmConfig.max_connections`` requests in
  flight, so registration and issuance hold every exchange's round trip
  spread over those connections, and a check or publication holds each of
  its polls' round trips one after another.
* Under planned kills (``anonml bench faults``) each delivery slice also
  holds one kill's outage and a link retry's gap (``plan_round(outage=)``):
  a report sent in the second window has no later repair, so a relay killed
  there must be back inside the window of the packets held for it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import tomli_w

from anonml.aggregator import CREDENTIAL_HOLD_SECONDS, REVEAL_POLL_SECONDS
from anonml.demo._calibrate import PhaseCosts, allowed_cpus
from anonml.demo._children import RESTART_DELAY
from anonml.demo._data import DemoData
from anonml.demo._ports import HOST
from anonml.demo._swarm import SwarmConfig
from anonml.mechanisms import OracleName
from anonml.peer import RETRY_GAP_CAP, retry_delay
from anonml.protocol import (
    DEFAULT_MIN_ANONYMITY_SET,
    SECOND_WINDOW_PATHS,
    RelayEntry,
    TaskKind,
    check_queries,
    comparison_pool_size,
    queried_features,
    shortest_delivery,
    smallest_anonymity_set,
)
from anonml.relay import DUE_POLL_SECONDS
from anonml.transport import MAX_BACKOFF, HttpLimits

# More relays than a path is long: a relay that dies for good leaves paths
# that avoid it, so peers route a resend around it (issue 27; with 3 of 3, one
# relay that never came back lost every data report of the round).
RELAYS = 5
PATH_LENGTH = 3
AGGREGATOR_PROCESSES = 2
# The costs are timed one call after another under the machine's load at the
# time; in the round the same work is spread over the cores. Windows hold the
# work at half the measured rate, so the round still fits when the load
# doubles while it runs (measured here: one credential took 9 ms at load 4
# and 114 ms at load 16; the planner measures just before the round).
HEADROOM = 2.0
# The share of the pacing rate (HttpLimits.request_rate, one source: 127.0.0.1) left to the peers' own
# requests: the relays' mirrors (each polls up to 1 / DUE_POLL_SECONDS a second while it waits for a
# document, 25 a second for 5 relays) and the demo's status polls come from the same address.
PACED_SHARE = 0.9
# A peer's first two polls for a document not served yet.
PEER_POLL_SECONDS = retry_delay(0) + retry_delay(1)
# Requests a worker process makes in a check, one after another: the log segment and each mirror's heads (polled).
CHECK_REQUESTS = 2 + 2 * RELAYS
# The shortest check: heads signed at t_c, the mirrors' poll, the peers' polls.
MIN_CHECK_SECONDS = 2
# The shortest gap before a phase that needs a published document (the spec's default).
MIN_PUBLISH_GAP = 2


def cores() -> int:
    """The cores this process may run on (the peers' workers, relays and aggregator share them)."""
    allowed = allowed_cpus()
    return len(allowed) if allowed != [None] else max(1, os.cpu_count() or 1)


def requests_in_flight(workers: int) -> int:
    """HTTP requests the peers' ``workers`` worker processes keep in flight at once (each its
    ``SwarmConfig.max_connections``): their round trips overlap, and each costs more CPU than one alone."""
    return workers * SwarmConfig.max_connections


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
    second_delivery_window: int
    """A median sub-round's second delivery window: each message over ``protocol.SECOND_WINDOW_PATHS`` paths."""
    data_send_window: int
    data_delivery_window: int
    data_second_delivery_window: int
    check_seconds: int
    """After each delivery window: the aggregator signs the log heads, relays mirror them, peers compare."""
    publish_gap: int
    """Before each phase that needs a published document (thresholds, medians): mirrors copy it, peers confirm it."""
    task: TaskKind = TaskKind.ENSEMBLE
    """What the round computes (``[task] kind``): the ensemble, statistic answers, an SGD model or an averaged model."""
    queries: tuple[str, ...] = ()
    """A statistics task's ``[task] queries`` (none: the default set)."""
    rows_per_peer: int = 1
    """Rows each peer holds (a model-averaging round's ``[task] rows_per_peer``; 1 otherwise)."""
    sgd_learning_rate: float | None = None
    """An SGD round's signed γ0 (``[task] learning_rate``); None: the learner's default, and no field."""
    sgd_loss: str | None = None
    """An SGD round's loss (``[task] loss``); None: no field, so the spec's default (logistic)."""
    regularization_rule: float | None = None
    """A model-averaging round's λ rule (``[task] regularization_rule``); None: no field, so the spec's default."""
    categorical_weight: float | None = None
    """A model-averaging round's categorical weight (``[task] categorical_weight``); None: no field, so the spec's default."""

    @property
    def rows_held(self) -> int:
        """The training rows the peers hold between them (``run_demo`` deals them the first ones)."""
        return self.peers * self.rows_per_peer

    def total_seconds(self) -> int:
        """From ``round new`` until the data phase's second delivery window closes (publish gaps included).

        Each phase runs twice, the second time as the uniform second chance
        (every peer sends each survey's message over two paths), with the check between.
        """
        return self.start_seconds + schedule_seconds(round_spec_schedule(self))


def recovery_seconds(costs: PhaseCosts, *, restart_delay: float = RESTART_DELAY, issuing: bool = True) -> float:
    """Time for one restart of the aggregator: the supervisor notices at once
    and waits ``restart_delay``, ``aggregator run`` imports its stack until
    it answers (``serving_start``, measured: 3.8-10 s at load 15, where
    ``aggregator init``'s whole run, ``process_start``, took 0.3-0.8 s), for
    ``issuing`` its issuer processes start (as long as an operator command
    took, measured; registration does not wait for them:
    ``aggregator.serve_aggregator`` answers before it warms them), and the
    peers' next retry reaches it."""
    return restart_delay + costs.serving_start + (costs.process_start if issuing else 0.0) + RETRY_GAP_CAP


def reveals_seconds(round_trip: float) -> float:
    """From registration's close until credentials can be issued: the signed roster head reaches each
    relay's mirror (its poll), the relay reveals its beacon value, the aggregator's next poll fetches each in
    turn (a round trip each). A credential request that comes meanwhile is held that long
    (``aggregator.CREDENTIAL_HOLD_SECONDS``); past it, it is answered 503 and its peer comes back within its
    client's longest retry gap (issue 27: reveals in 1.7 s and the retries of a worker's 20 peers 3.6 s
    later, after a 5 s window had closed)."""
    reveals = HEADROOM * (DUE_POLL_SECONDS + REVEAL_POLL_SECONDS + RELAYS * round_trip)
    return reveals if reveals <= CREDENTIAL_HOLD_SECONDS else reveals + RETRY_GAP_CAP


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


SGD_STEPS = 4
"""The SGD demo's gradient steps by default (``--sgd-steps``): Harmony's group size ``max(2 d log d / ε², n / 1000)``
asks for fewer, larger groups at the demo's few hundred peers; 4 keeps each step's mean over ~50-100 gradients."""


def learning_parameters(data: DemoData, task: TaskKind = TaskKind.ENSEMBLE, queries: Sequence[str] = (),
                        sgd_steps: int = SGD_STEPS) -> DemoLearning:
    """The demo's plan for the dataset and task: one data packet per peer (the "one"
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

    A statistics task sends one feature per report (``k_s = 1``) in at least one
    partition per feature, with the ensemble's median search and pool; with
    ``queries`` that read no numeric feature, no search and no pool.

    An SGD task takes ``sgd_steps`` gradient steps, one partition each.
    """
    if task == TaskKind.SGD:
        # sgd_steps gradient steps (the median sub-rounds), one partition each: every peer sends one gradient. The
        # partitions' feature subsets go unused, but the spec still checks that they cover every feature.
        if sgd_steps < 1:
            raise ValueError(f"an SGD round takes at least one gradient step, got {sgd_steps!r}")
        return DemoLearning(k_p=sgd_steps, k_h=1, k_s=math.ceil(len(data.spec.features) / sgd_steps), plan="one",
                            median_rounds=sgd_steps, vote="naive-bayes", quantiles=1, comparison_pool=0.0)
    if task == TaskKind.MODEL_AVERAGING:
        # One partition (every peer's blocks hide among all peers'), one data survey per block of the
        # model, no median search (rows are encoded from the features' public bounds).
        return DemoLearning(k_p=1, k_h=model_blocks(data), k_s=1, plan="split", median_rounds=0, vote="naive-bayes", quantiles=1,
                            comparison_pool=0.0)
    if task == TaskKind.STATISTICS:
        # One feature per report (k_s = 1), a partition per feature so "one" deals every feature;
        # the search as the ensemble's demo runs it.
        ensemble = learning_parameters(data)
        spec = data.spec
        read = queried_features(check_queries(list(queries), spec), spec.names) if queries else spec.names
        if not any(name in spec.numeric_names for name in read):
            ensemble = ensemble._replace(median_rounds=0, comparison_pool=0.0)
        # Three cut points: four bins per numeric feature, so its median and mean say more than one cut point.
        return ensemble._replace(k_p=max(ensemble.k_p, len(read)), k_s=1, quantiles=3)
    if data.name == "breast-cancer":
        return DemoLearning(k_p=4, k_h=1, k_s=3, plan="one", median_rounds=3, vote="naive-bayes", quantiles=1, comparison_pool=0.0)
    return DemoLearning(k_p=12, k_h=1, k_s=1, plan="one", median_rounds=4, vote="naive-bayes", quantiles=3, comparison_pool=0.1)


def model_blocks(data: DemoData) -> int:
    """How many data surveys a model of the dataset's encoding needs at the demo's packet size (``learning.RoundModel``)."""
    from anonml.crypto import SphinxGeometry
    from anonml.learning import MIN_ROWS_PER_PEER, RoundModel
    from anonml.protocol import report_capacity

    return RoundModel.of(data.spec, 1.0, MIN_ROWS_PER_PEER, report_capacity(SphinxGeometry.create().message_size)).blocks.blocks


def plan_round(data: DemoData, peers: int, epsilon: float, workers: int, seed: int, costs: PhaseCosts,
               n_cores: int | None = None, outage: float = 0.0, task: TaskKind = TaskKind.ENSEMBLE, queries: Sequence[str] = (),
               rows_per_peer: int = 1, round_trip: float = 0.0, sgd_steps: int = SGD_STEPS,
               sgd_learning_rate: float | None = None, sgd_loss: str | None = None,
               regularization_rule: float | None = None, categorical_weight: float | None = None,
               restart_delay: float = RESTART_DELAY) -> DemoParams:
    """The demo's round with every window sized by the rule of the module docstring from ``costs``.

    ``sgd_learning_rate`` and ``sgd_loss`` (an SGD task), ``regularization_rule`` and ``categorical_weight`` (a
    model-averaging task): the round spec's ``[task]`` fields, None to leave each to the spec's default.

    ``outage``: the longest a killed relay or aggregator stays away (the fault bench's downtime and restart;
    0: no kills planned). Each delivery slice then holds one outage and a link retry's gap, so a hop killed
    in the slice before its own is back, and takes the packets held for it, while its window is still open,
    and one killed in its own slice releases what it held into the next hop's window.

    ``restart_delay``: how long the supervisor waits before it starts a dead process again (the demo's
    :data:`RESTART_DELAY`, the fault bench's downtime); registration and issuance hold one such restart."""
    k_p, k_h, k_s, plan, median_rounds, vote, quantiles, pool = learning_parameters(data, task, queries, sgd_steps)
    spread = n_cores or cores()
    # Every peer here comes from one address, which the aggregator's HTTP server
    # (and each relay's mirror) paces to HttpLimits.request_rate requests a second.
    request_rate = HttpLimits().request_rate
    # Requests in flight at once across the peers' workers: their round trips overlap.
    in_flight = requests_in_flight(workers)

    def seconds(work: float, parallel: int, requests: float = 0.0) -> float:
        """``work`` CPU seconds on ``parallel`` processes (at most the cores), or their ``requests``' round
        trips ``in_flight`` at a time, with headroom; or ``requests`` at the peers' share of the pacing rate
        if that is slower. The pacer's rate does not change with the machine's load (a request over it
        waits, costing no CPU), so it gets no headroom."""
        return max(HEADROOM * max(work / max(1, min(parallel, spread)), requests * round_trip / in_flight),
                   requests / (request_rate * PACED_SHARE))

    def send(messages: int) -> int:
        return math.ceil(max(1.0, seconds(messages * (costs.token + costs.relay_hop), workers + RELAYS)))

    def delivery(messages: int) -> int:
        # protocol.hop_windows cuts the window, after the first hop's guard, into PATH_LENGTH + 1 equal
        # slices: each hop's (one relay process each) and the last, where the aggregator verifies on its processes.
        # A relay's slice holds every packet of the phase: with RELAYS > PATH_LENGTH a relay
        # sees fewer on average, but one random relay may be on most paths.
        # ``costs.verify`` is every hop of a path and the token check; the aggregator does the last hop and the check.
        relay_slice = seconds(messages * costs.relay_hop, 1)
        final_slice = seconds(messages * max(costs.relay_hop, costs.verify - PATH_LENGTH * costs.relay_hop), AGGREGATOR_PROCESSES)
        outage_slice = outage + MAX_BACKOFF if outage > 0 else 0.0
        return shortest_delivery(math.ceil(max(1.0, relay_slice, final_slice, outage_slice)), PATH_LENGTH)

    # One HTTP exchange per peer to register (the peer signs in its worker, the aggregator checks).
    register_restart = recovery_seconds(costs, restart_delay=restart_delay, issuing=False)
    register = seconds(peers * (costs.register + costs.http), workers, peers) + register_restart
    # One exchange per peer for its credential, issued on the aggregator's processes (each worker
    # process fetches the roster once for all its peers: peer.RoundSession), once the relays' reveals are in.
    issue_restart = recovery_seconds(costs, restart_delay=restart_delay)  # its issuer processes start too
    # Each worker first reads the whole roster (peer.RoundSession.roster): 32,561 Adult peers asked 11-14 s late.
    issue = (seconds(peers * (costs.issue + costs.http), AGGREGATOR_PROCESSES, peers) + seconds(peers * costs.roster_entry, 1)
             + reveals_seconds(round_trip) + issue_restart)
    # A median sub-round asks its pool partition, or without a pool every partition p with
    # p % median_rounds equal to its index (at most ceil(k_p / median_rounds) of them);
    # the data phase every peer k_h times.
    if not median_rounds:
        median_messages = 0
    elif pool:
        median_messages = math.ceil(comparison_pool_size(round(pool * 1000), peers, median_rounds) / median_rounds)
    else:
        median_messages = math.ceil(peers / k_p) * math.ceil(k_p / median_rounds)
    # An SGD round's one message per peer is its gradient, in a median sub-round: nothing in the data phase.
    data_messages = 0 if task == TaskKind.SGD else peers * k_h
    # A published document (the log heads at a check; thresholds and medians in the gap before the
    # phase that needs them) reaches every peer through one mirror refresh and a poll (a round trip each), and
    # a worker's check makes its requests one after another (a round trip each).
    publication = (HEADROOM * (DUE_POLL_SECONDS + PEER_POLL_SECONDS + (2 + CHECK_REQUESTS) * round_trip)
                   + seconds(CHECK_REQUESTS * costs.http, 1))
    return DemoParams(
        peers=peers, epsilon=epsilon, workers=workers, seed=seed, k_p=k_p, k_h=k_h, k_s=k_s, plan=plan,
        vote=vote, median_rounds=median_rounds, quantiles=quantiles, comparison_pool=pool,
        # `aggregator run` starts after `round new` and takes registrations once it
        # has imported its stack (measured: serving_start; its issuer processes
        # start in the background), with as much again for the load to change
        # (issue 27: timed by `aggregator init`, 0.3-0.8 s against 4-8 s to
        # serve at load 12-17, registration had closed or nearly before it
        # answered). A slower start is held by the registration window's room
        # for a restart.
        start_seconds=math.ceil(2 * costs.serving_start) + 1,
        register_seconds=math.ceil(register),
        issue_seconds=math.ceil(issue),
        send_window=send(median_messages),
        # The second attempt carries every message over SECOND_WINDOW_PATHS paths: its delivery
        # window holds that many packets per message (the send window's work is the messages').
        delivery_window=delivery(median_messages),
        second_delivery_window=delivery(SECOND_WINDOW_PATHS * median_messages),
        data_send_window=send(data_messages),
        data_delivery_window=delivery(data_messages),
        data_second_delivery_window=delivery(SECOND_WINDOW_PATHS * data_messages),
        check_seconds=max(MIN_CHECK_SECONDS, math.ceil(publication)),
        publish_gap=max(MIN_PUBLISH_GAP, math.ceil(publication)), task=task, queries=tuple(queries), rows_per_peer=rows_per_peer,
        sgd_learning_rate=sgd_learning_rate if task == TaskKind.SGD else None, sgd_loss=sgd_loss if task == TaskKind.SGD else None,
        regularization_rule=regularization_rule if task == TaskKind.MODEL_AVERAGING else None,
        categorical_weight=categorical_weight if task == TaskKind.MODEL_AVERAGING else None,
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
        "median_second_delivery": params.second_delivery_window,
        "data_second_delivery": params.data_second_delivery_window,
        "check": params.check_seconds,
        "publish_gap": params.publish_gap,
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


def round_spec(data: DemoData, params: DemoParams, relays: list[dict[str, Any]], http_port: int, sink_port: int,
               host: str = HOST, sink_workers: Sequence[int] = ()) -> dict[str, Any]:
    """The round spec for ``anonml aggregator round new`` (durations count from that command); the aggregator
    serves its HTTP API and packet sink at ``host``, its ingest workers at the ports ``sink_workers``."""
    spec = data.spec.to_dict()
    min_participation = max(1, params.peers // 2)
    # The demo runs at any --peers: it signs the minimum anonymity set its own
    # minimum participation meets (the default at most), so a small demo round
    # states how small its surveys are instead of being refused.
    smallest = smallest_anonymity_set(min_participation, params.k_p, round(params.comparison_pool * 1000), params.median_rounds)
    return {
        "name": f"demo-{data.name}",
        "task": {"kind": str(params.task), "features": spec["features"], "label": spec["label"], "quantiles": params.quantiles,
                 **({"queries": list(params.queries)} if params.queries else {}),
                 **({"rows_per_peer": params.rows_per_peer} if params.task == TaskKind.MODEL_AVERAGING else {}),
                 **{key: value for key, value in (("learning_rate", params.sgd_learning_rate), ("loss", params.sgd_loss),
                                                  ("regularization_rule", params.regularization_rule),
                                                  ("categorical_weight", params.categorical_weight)) if value is not None}},
        "learning": {"k_p": params.k_p, "k_h": params.k_h, "k_s": params.k_s, "plan": params.plan, "learner": "logreg",
                     "vote": params.vote, "comparison_pool": params.comparison_pool},
        # A statistics task needs a unary encoding (aggregator._spec): optimized unary encoding, the least variance of them.
        "privacy": {"eps_total": params.epsilon, "oracle": str(OracleName.OUE) if params.task == TaskKind.STATISTICS else "auto"},
        "schedule": round_spec_schedule(params),
        "network": {
            "relays": [{k: relay[k] for k in RelayEntry.FIELDS} for relay in relays],
            "path_length": PATH_LENGTH,
            "http_host": host,
            "http_port": http_port,
            "sink_host": host,
            "sink_port": sink_port,
            **({"sink_workers": [{"host": host, "port": port} for port in sink_workers]} if sink_workers else {}),
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
