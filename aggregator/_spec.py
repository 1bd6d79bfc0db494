"""The round spec (``round.toml``): its format, an example, and its validation.

:func:`parse_round_spec` turns a parsed TOML document into a :class:`RoundSpec`
or raises :class:`RoundSpecError` naming the offending field
(``learning.k_p``) and what it accepts; ``anonml aggregator round new``
prints the example. Each TOML table is read into its own typed record
(``aggregator._spec_tables``, fields named as the table's keys) and the spec
is built from them by keyword. Validation is complete: every name is checked
against the registry the round will use it with (oracles, plans, learners),
the release plan, the frequency oracles and the packet geometry are built
once from the spec, and the smallest survey at the minimum participation is
held to the spec's minimum anonymity set, so a spec ``round new`` accepts
cannot fail later in ``aggregator run`` or at the peers.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anonml.aggregator._spec_tables import (
    MAX_SPEC_BYTES,
    PLANNER,
    LearningTable,
    NetworkTable,
    ParticipationTable,
    PrivacyTable,
    ScheduleTable,
    TaskTable,
)
from anonml.mechanisms import ORACLE_NAMES, make_oracle
from anonml.protocol import (
    FeatureSpec,
    FieldReader,
    InvalidDocument,
    MedianPeers,
    PlanError,
    ReleasePlan,
    comparison_pool_size,
    derive_subsets,
    smallest_anonymity_set,
)

if TYPE_CHECKING:
    from anonml.learning import PlanChoice

RoundPlanner = Callable[["FeatureSpec", int, float, int, float, str], "PlanChoice"]
"""``(spec, peers, eps_total, median_rounds, median_share, oracle)`` to the plan a round runs; raises PlanError when none fits."""


def plan_by_simulation(
    spec: FeatureSpec, peers: int, eps_total: float, median_rounds: int, median_share: float, oracle: str
) -> PlanChoice:
    """:func:`learning.choose_round_plan` with its defaults (two simulations per
    candidate, seed 0: the same spec always gets the same plan)."""
    from anonml.learning import choose_round_plan

    return choose_round_plan(spec, peers, eps_total, median_rounds=median_rounds, median_share=median_share, oracle=oracle)


def default_min_reports(min_participation: int, k_p: int) -> int:
    """``min_reports_per_survey`` when the spec leaves it out: half a partition's share of ``min_participation``.

    Every survey is answered by one partition (a data survey by each of its
    peers, median sub-round ``i`` by partition ``i``), about
    ``min_participation / k_p`` peers in a round that just met its minimum;
    a survey left with under half of that lost more reports than a round
    that barely started should (at least 1: a survey with no report at all
    is always short).
    """
    return max(1, min_participation // (2 * k_p))


class RoundSpecError(InvalidDocument):
    """Raised by :func:`parse_round_spec` for a malformed round spec; ``field`` names the bad field."""


@dataclass(frozen=True)
class RoundSpec:
    """A validated ``round.toml``: one record per table, each field named as its TOML key.

    ``task.features`` and ``learning`` hold the planner's choice when the
    spec says ``plan = "auto"`` (``planned`` keeps it, with its simulated AUC).
    """

    name: str
    task: TaskTable
    learning: LearningTable
    privacy: PrivacyTable
    schedule: ScheduleTable
    network: NetworkTable
    participation: ParticipationTable
    planned: PlanChoice | None = None

    @property
    def min_reports_per_survey(self) -> int:
        """The spec's ``min_reports_per_survey``, or :func:`default_min_reports` when it leaves it out."""
        stated = self.participation.min_reports_per_survey
        return default_min_reports(self.participation.min_participation, self.learning.k_p) if stated is None else stated


ROUND_SPEC_EXAMPLE = """\
name = "adult-income"

[task]                      # builtin = "adult"; or spec_file = "people.toml", the feature spec `anonml experiment
builtin = "adult"           # csv --spec` reads (relative to this spec); or features + label written out here
quantiles = 3               # optional: cut points per numeric feature, found by the median search
                            # (default: each feature's own, 1 = the median; q cut points give q + 1 bins)

[learning]
k_p = 8                     # partitions
k_h = 2                     # subsets per partition ("one" plan: 1)
k_s = 2                     # features per subset
plan = "split"              # or "one"; or "auto": the planner simulates the round's plans (every peer answering the
                            # median search) for expected_peers and chooses k_p, k_h, k_s, vote and [task] quantiles
                            # (leave those out); `round new` prints its choice and simulated AUC
# expected_peers = 2000     # optional, with "auto": peers to plan for (default: min_participation)
learner = "logreg"          # or "tree"
vote = "weighted"           # optional: how partitions combine, "weighted" (eq. 6.2), "soft" or "naive-bayes"
# comparison_pool = 0.1     # optional (default 0.1 with plan = "one", else 0): this share of the peers answers the
                            # median search, one bit each at the full eps_total, and sends no data; the others send
                            # only data, each report at eps_total / k_h. 0: every peer answers it (median_share)

[privacy]
eps_total = 4.0             # promised to each peer, record level: the sum over every release, median bits included
oracle = "auto"             # or one of: {ORACLES}
median_share = 0.5          # optional: share of eps_total for the median search, without a comparison pool

[schedule]                  # durations in seconds from the round's start; each is optional
# start = 2026-12-01T09:00:00+01:00   # optional: when registration opens (a TOML date-time; without an
                            # offset it is local time); else when `round new` runs, or its --start
register = 1800             # default 30 min: peers join over minutes; `anonml aggregator run` must be serving by then
issue = 900                 # default 15 min
median_rounds = 4           # 0 without numeric features; without a comparison pool partition p answers in sub-round
                            # p % median_rounds (needs <= k_p); with one, pool partition k_p + s answers sub-round s
median_send = 300           # default 5 min: each sub-round's send window (delta) ...
median_delivery = 600       # default 10 min: ... then its delivery window (needs >= path_length + 1)
data_send = 900             # default 15 min
data_delivery = 1800        # default 30 min; every window must hold a relay or aggregator restart
check = 4                   # optional: after each delivery window, seconds to publish and compare receipt-log heads
# median_second_send, median_second_delivery, data_second_send, data_second_delivery: optional, each phase's
# second chance (every peer sends one packet per survey, its resend or a cover); default: the first windows' lengths
publish_gap = 2             # optional: seconds between publishing results and the next send window

[network]
path_length = 3             # relays per path
packet_size = 2048          # optional; relays must use the same geometry (their defaults match)
max_hops = 5                # optional: Sphinx routing slots, >= path_length + 1
http_host = "127.0.0.1"
http_port = 8080
sink_host = "127.0.0.1"     # where last relays deliver (the aggregator is the last Sphinx hop)
sink_port = 8081
relays = [                  # each: a file `anonml relay info --json > relay-1.json` wrote (relative to
  "relay-1.json",           # this spec), or its fields written out:
  { node_id = "<hex>", host = "127.0.0.1", port = 9001, public_key = "<hex>", key_epoch = 1 },
]

[participation]
min_participation = 100
registration = "invitation" # (invitations = N) or "allow-list" (allow_list = ["<hex identity key>", ...]) or "open"
invitations = 200
purpose = "production"      # optional: "demo" or "test" rounds may use open registration (Sybils cost nothing there)
max_roster = 100000         # optional: at most protocol.MAX_ROSTER, so every client can read the roster
max_per_client = 1          # optional, open registration only: identities one client address may register
min_reports_per_survey = 6  # optional: a survey with fewer accepted reports is short; default
                            # min_participation / k_p / 2 (at least 1), half a partition's share
on_shortfall = "degraded"   # optional: a round with a short survey still learns and ends "degraded";
                            # "fail": it ends "failed" when the short survey's phase closes, without a model
min_anonymity_set = 5       # optional (default 5), signed in the manifest: `round new` refuses a spec whose smallest
                            # survey (data or comparison-pool partition) at min_participation holds fewer peers,
                            # and a peer whose partition is smaller refuses to send
""".replace("{ORACLES}", ", ".join(name for name in ORACLE_NAMES if name != "auto"))


def read_round_spec(data: bytes, *, base_dir: Path | None = None, planner: RoundPlanner = plan_by_simulation) -> RoundSpec:
    """Parse ``round.toml``'s bytes (UTF-8 TOML) into a validated spec, or raise :class:`RoundSpecError`."""
    if len(data) > MAX_SPEC_BYTES:
        raise RoundSpecError("$", f"{len(data)} bytes, more than {MAX_SPEC_BYTES}")
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RoundSpecError("$", f"not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise RoundSpecError("$", f"not valid TOML: {exc}") from None
    return parse_round_spec(document, base_dir=base_dir, planner=planner)


def parse_round_spec(
    document: dict[str, Any], *, base_dir: Path | None = None, planner: RoundPlanner = plan_by_simulation
) -> RoundSpec:
    """Validate a parsed round.toml (see ROUND_SPEC_EXAMPLE); every error names its field (``learning.k_p``).

    Relay files named in ``network.relays`` are read relative to ``base_dir`` (the spec's directory).
    With ``plan = "auto"``, ``planner`` chooses the learning parameters and
    the cut points, for ``learning.expected_peers`` peers (default: the
    minimum participation); the spec is then validated as if they had been
    written out.
    """
    reader = FieldReader(document, "", RoundSpecError)
    name = reader.text("name", max_len=128, pattern=r"[A-Za-z0-9][A-Za-z0-9 ._\-]*")
    task = TaskTable.read(reader.child("task"), base_dir)
    numeric = bool(task.features.numeric_names)
    learning = LearningTable.read(reader.child("learning"), numeric=numeric)
    if learning.plan == PLANNER and task.quantiles is not None:
        reader.fail_at("task.quantiles", f'the planner chooses the cut points when learning.plan = "{PLANNER}": leave it out')
    privacy = PrivacyTable.read(reader.child("privacy"), pooled=bool(learning.comparison_pool))
    schedule = ScheduleTable.read(reader.child("schedule"), numeric=numeric)
    network = NetworkTable.read(reader.child("network"), base_dir)
    for key, delivery in schedule.deliveries().items():
        if delivery < network.path_length + 1:
            reader.fail_at(f"schedule.{key}", f"{delivery} s cannot hold {network.path_length} relay windows and the slack slice")
    participation = ParticipationTable.read(reader.child("participation"))
    reader.done()
    spec = RoundSpec(
        name=name, task=task, learning=learning, privacy=privacy, schedule=schedule, network=network,
        participation=participation,
    )
    if learning.plan == PLANNER:
        spec = _planned(reader, spec, planner)
    _check_round(reader, spec)
    return spec


def _planned(reader: FieldReader, spec: RoundSpec, planner: RoundPlanner) -> RoundSpec:
    """``spec`` with the planner's choice of plan, partitions, vote, pool and cut points written in."""
    peers = spec.learning.expected_peers or spec.participation.min_participation
    median_rounds = spec.schedule.median_rounds
    try:
        choice = planner(spec.task.features, peers, spec.privacy.eps_total, median_rounds, spec.privacy.median_share, spec.privacy.oracle)
    except PlanError as exc:
        reader.fail_at(
            "learning.plan",
            f"the planner found no plan for {peers} peers with {median_rounds} median "
            f"sub-rounds ({exc}): raise learning.expected_peers or lower schedule.median_rounds",
        )
    learning = replace(
        spec.learning, k_p=choice.k_p, k_h=choice.k_h, k_s=choice.k_s, plan=choice.kind, vote=choice.combiner,
        comparison_pool=choice.comparison_pool if choice.median_peers == MedianPeers.RESERVED else 0.0,
    )
    return replace(spec, task=replace(spec.task, features=choice.spec_for(spec.task.features)), learning=learning, planned=choice)


def _check_round(reader: FieldReader, spec: RoundSpec) -> None:
    """What spans tables: the median search's partitions, the subsets, the release plan, the anonymity set."""
    learning, median_rounds = spec.learning, spec.schedule.median_rounds
    if learning.comparison_pool and not spec.task.features.numeric_names:
        reader.fail_at("learning.comparison_pool", "a comparison pool answers the median search: the task has no numeric feature")
    if not learning.comparison_pool and median_rounds > learning.k_p:
        # Without a pool, data partition p answers sub-round p % median_rounds: a sub-round needs a partition of its own.
        reader.fail_at(
            "schedule.median_rounds",
            f"{median_rounds} median sub-rounds need a partition each to answer them, but learning.k_p = {learning.k_p}: "
            "lower median_rounds, raise k_p, or set learning.comparison_pool (its partitions answer instead)",
        )
    try:
        derive_subsets(bytes(32), spec.task.features.names, learning.plan, learning.k_p, learning.k_h, learning.k_s)
    except PlanError as exc:
        reader.fail_at("learning", str(exc))
    _check_buildable(reader, spec)
    _check_anonymity_set(reader, spec)


def _check_anonymity_set(reader: FieldReader, spec: RoundSpec) -> None:
    """Refuse a round whose smallest survey, at its minimum participation, holds fewer peers than the minimum set."""
    peers, minimum = spec.participation.min_participation, spec.participation.min_anonymity_set
    learning, median_rounds = spec.learning, spec.schedule.median_rounds
    smallest = smallest_anonymity_set(peers, learning.k_p, learning.pool_per_mille, median_rounds)
    if smallest >= minimum:
        return
    pool = comparison_pool_size(learning.pool_per_mille, peers, median_rounds)
    # Name the partitions that fall short: the pool's (its peers over the sub-rounds) or the data partitions.
    where = (
        f"a comparison-pool partition ({pool} pool peers over {median_rounds} sub-rounds)"
        if pool and max(1, pool // median_rounds) == smallest
        else f"a data partition ({peers - pool} peers over k_p = {learning.k_p})"
    )
    reader.fail_at(
        "participation.min_anonymity_set",
        f"at min_participation = {peers} the smallest survey holds {smallest} peer(s), {where}, fewer than "
        f"min_anonymity_set = {minimum}: raise min_participation, lower k_p or the sub-rounds, or state a smaller minimum",
    )


def release_plan(spec: RoundSpec, seed: bytes) -> ReleasePlan:
    """How a round divides ``eps_total`` (:meth:`protocol.ReleasePlan.build`): with a comparison pool, one
    comparison at the full ε_T for a pool peer and ``k_h`` reports at ``ε_T / k_h`` for a data peer;
    without one, ``median_share`` of ε_T for every peer's median answer."""
    features, learning, privacy = spec.task.features, spec.learning, spec.privacy
    pooled = bool(learning.comparison_pool) and bool(features.numeric_names)
    return ReleasePlan.build(
        kind=learning.plan, features=features.names, numeric_features=features.numeric_names, k_p=learning.k_p,
        k_h=learning.k_h, k_s=learning.k_s, epsilon_total=privacy.eps_total, seed=seed, oracle=privacy.oracle,
        median_peers=MedianPeers.RESERVED if pooled else MedianPeers.ALL, median_share=privacy.median_share,
        median_steps=max(spec.schedule.median_rounds, 1),
        **({"comparison_pool": learning.comparison_pool} if pooled else {}),
    )


def _check_buildable(reader: FieldReader, spec: RoundSpec) -> None:
    """Build what the round will build from these values, so a failure shows now and names its field.

    The release plan (``round new``) and each data survey's frequency oracle
    (the aggregator and the peers, at the partition sizes ``"auto"`` chooses
    among) are made as they will be then.
    """
    oracle = spec.privacy.oracle
    try:
        release = release_plan(spec, bytes(32))
    except (PlanError, ValueError) as exc:
        reader.fail_at("privacy", f"no release plan for these values: {exc}")
    domains = {spec.task.features.domain_size(subset) for subsets in release.subsets for subset in subsets}
    for m in sorted(domains):
        for n in (1, 1000):
            try:
                make_oracle(oracle, release.release_epsilon, m, n=n)
            except (ValueError, ZeroDivisionError, OverflowError) as exc:
                reader.fail_at("privacy.oracle", f"{oracle!r} cannot encode {m} values at epsilon {release.release_epsilon:g}: {exc}")
