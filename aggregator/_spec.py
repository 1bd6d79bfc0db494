"""The round spec (``round.toml``): its format, an example, and its validation.

:func:`parse_round_spec` turns a parsed TOML document into a :class:`RoundSpec`
or raises :class:`RoundSpecError` naming the offending field
(``learning.k_p``) and what it accepts; ``anonml aggregator round new``
prints the example. Validation is complete: every name is checked against
the registry the round will use it with (oracles, plans, learners), and the
release plan, the frequency oracles and the packet geometry are built once
from the spec, so a spec ``round new`` accepts cannot fail later in
``aggregator run`` or at the peers.
"""

from __future__ import annotations

import datetime
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anonml.crypto import DEFAULT_MAX_HOPS, DEFAULT_PACKET_SIZE, SphinxGeometry
from anonml.mechanisms import ORACLE_NAMES, make_oracle
from anonml.protocol import (
    DEFAULT_COMPARISON_POOL,
    DEFAULT_VOTE,
    EPSILON_TOTAL_RANGE,
    PLAN_KINDS,
    MAX_QUANTILES,
    MAX_ROSTER,
    REGISTRATION_POLICIES,
    FeatureSpec,
    FeatureSpecError,
    MedianPeers,
    PlanError,
    PlanKind,
    RegistrationPolicy,
    RelayEntry,
    ReleasePlan,
    RoundPurpose,
    VOTES,
    derive_subsets,
)
from anonml.protocol import FieldReader, InvalidDocument

if TYPE_CHECKING:
    from anonml.learning import PlanChoice

LEARNERS = ("logreg", "tree")
"""The partition ensemble's base learners (``learning.PartitionEnsemble(base=...)``)."""

PLANNER = "auto"
"""``[learning] plan = "auto"``: the planner chooses the plan, its partitions,
the cut points and the combiner by simulation, and the round uses its choice."""

RoundPlanner = Callable[["FeatureSpec", int, float, int, float, str], "PlanChoice"]
"""``(spec, peers, eps_total, median_rounds, median_share, oracle)`` to the plan a round runs; raises PlanError when none fits."""


def plan_by_simulation(
    spec: FeatureSpec, peers: int, eps_total: float, median_rounds: int, median_share: float, oracle: str
) -> PlanChoice:
    """:func:`learning.choose_round_plan` with its defaults (two simulations per
    candidate, seed 0: the same spec always gets the same plan)."""
    from anonml.learning import choose_round_plan

    return choose_round_plan(spec, peers, eps_total, median_rounds=median_rounds, median_share=median_share, oracle=oracle)


SHORTFALL_OUTCOMES = ("degraded", "fail")
"""What a round whose survey got fewer than ``min_reports_per_survey`` reports does (``[participation] on_shortfall``)."""


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
    """A validated ``round.toml``; durations are seconds from the round's start.

    ``start`` is the Unix time registration opens, if the spec fixes it
    (``[schedule] start``); otherwise the round starts when ``round new`` runs
    (or at its ``--start``).
    """

    name: str
    spec: FeatureSpec
    k_p: int
    k_h: int
    k_s: int
    plan: str
    learner: str
    vote: str
    eps_total: float
    oracle: str
    median_share: float
    register_seconds: int
    issue_seconds: int
    median_rounds: int
    median_send: int
    median_delivery: int
    data_send: int
    data_delivery: int
    check_seconds: int
    median_second_send: int
    median_second_delivery: int
    data_second_send: int
    data_second_delivery: int
    publish_gap: int
    relays: tuple[RelayEntry, ...]
    path_length: int
    packet_size: int
    max_hops: int
    http_host: str
    http_port: int
    sink_host: str
    sink_port: int
    min_participation: int
    registration: RegistrationPolicy
    purpose: RoundPurpose
    max_roster: int
    max_per_client: int
    invitations: int
    allow_list: tuple[bytes, ...]
    min_reports_per_survey: int
    on_shortfall: str
    start: int | None = None
    planned: PlanChoice | None = None
    """The planner's choice, with its simulated AUC, when the spec says ``plan = "auto"``."""
    comparison_pool: float = 0.0
    """The share of peers reserved for the median search (0: every peer answers it), in steps of 0.001."""


# Windows of a real round, in seconds, when its spec leaves them out. Peers
# are people's machines that join over minutes, not processes started
# together, and every window must hold a relay or aggregator restart (a
# process start, its store reopened, the peers' retries) with room to spare;
# relay windows of minutes also mix more packets (DESIGN.md §7). The demo
# plans seconds instead, from costs it measures (anonml.demo._schedule).
DEFAULT_SCHEDULE = {
    "register": 30 * 60,
    "issue": 15 * 60,
    "median_send": 5 * 60,
    "median_delivery": 10 * 60,
    "data_send": 15 * 60,
    "data_delivery": 30 * 60,
}

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
median_rounds = 4           # partition p answers in sub-round p % median_rounds (needs <= k_p; 0 without numeric
                            # features); with a comparison pool, pool partition k_p + s answers sub-round s
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
""".replace("{ORACLES}", ", ".join(name for name in ORACLE_NAMES if name != "auto"))


def _start_time(value: object, field: str, reader: FieldReader) -> int:
    """``[schedule] start``: a TOML date-time (local time without an offset) or Unix seconds."""
    if isinstance(value, datetime.datetime):
        # A TOML local date-time has no offset: it means this machine's local time.
        moment = value if value.tzinfo is not None else value.astimezone()
        return int(moment.timestamp())
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**40:
        return value
    reader.fail_at(field, f"expected a date-time such as 2026-12-01T09:00:00+01:00 (or Unix seconds), got {value!r}")


def _read_feature_spec_file(reader: FieldReader, value: str, base_dir: Path | None) -> FeatureSpec:
    """``[task] spec_file``: the feature-spec TOML ``anonml experiment csv --spec`` reads, relative to the round spec."""
    path = Path(value) if base_dir is None else base_dir / value
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
        if len(data) > MAX_SPEC_BYTES:
            reader.fail("spec_file", f"{str(path)!r} is larger than {MAX_SPEC_BYTES} bytes")
        return FeatureSpec.from_toml(data.decode("utf-8"))
    except FileNotFoundError:
        reader.fail("spec_file", f"no file {str(path)!r}")
    except (OSError, UnicodeDecodeError) as exc:
        reader.fail("spec_file", f"cannot read {str(path)!r} as UTF-8 text ({exc})")
    except FeatureSpecError as exc:
        reader.fail("spec_file", f"{str(path)!r}: {exc}")


def _read_relay_file(reader: FieldReader, value: str, field: str, base_dir: Path | None) -> dict[str, Any]:
    """The descriptor ``anonml relay info --json`` wrote to ``value``, checked for a current key."""
    path = Path(value) if base_dir is None else base_dir / value
    try:
        descriptor = json.loads(path.read_text())
    except FileNotFoundError:
        reader.fail_at(field, f"no file {str(path)!r}: write it with `anonml relay info --data-dir RELAY_DIR --json > {value}`")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reader.fail_at(field, f"{str(path)!r} is not the JSON `anonml relay info --json` writes ({exc})")
    if not isinstance(descriptor, dict):
        reader.fail_at(field, f"{str(path)!r} is not the JSON `anonml relay info --json` writes")
    if descriptor.get("public_key") is None:
        reader.fail_at(field, f"{str(path)!r} has no key for the current epoch: start `anonml relay run` once, then run `anonml relay info --json` again")
    return descriptor


def _check_relay_geometry(reader: FieldReader, field: str, descriptor: dict[str, Any], geometry: SphinxGeometry) -> None:
    """A relay whose descriptor names another packet geometry would drop every packet of the round."""
    theirs = descriptor.get("geometry") or {}
    if (theirs.get("max_hops"), theirs.get("packet_size")) != (geometry.max_hops, geometry.packet_size):
        reader.fail_at(
            field,
            f"the relay accepts {theirs.get('max_hops')} hops of {theirs.get('packet_size')} bytes, the round uses "
            f"{geometry.max_hops} of {geometry.packet_size}: set network.max_hops and network.packet_size to match",
        )


MAX_SPEC_BYTES = 1 << 20
"""A round spec is a few kilobytes; more is refused before the TOML parser sees it."""


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
    task = reader.child("task")
    if task.optional("builtin"):
        builtin = task.choice("builtin", ("adult",))
        from anonml.learning import adult_spec

        spec = adult_spec() if builtin == "adult" else None
        assert spec is not None
    elif task.optional("spec_file"):
        spec = _read_feature_spec_file(task, task.text("spec_file", max_len=4096), base_dir)
    else:
        raw = {"features": task.items("features", max_items=256), "label": task.obj("label")}
        try:
            spec = FeatureSpec.from_dict(raw)
        except FeatureSpecError as exc:
            task.fail("features", str(exc))
    quantiles = task.integer("quantiles", 1, MAX_QUANTILES) if task.optional("quantiles") else None
    if quantiles is not None:
        spec = spec.with_quantiles(quantiles)
    task.done()
    learning = reader.child("learning")
    plan = learning.choice("plan", (*PLAN_KINDS, PLANNER))
    learner = learning.choice("learner", LEARNERS)
    expected_peers: int | None = None
    if plan == PLANNER:
        # Placeholders until the planner has chosen (below, once the budget and participation are read).
        k_p = k_h = k_s = 1
        vote = DEFAULT_VOTE
        for chosen in ("k_p", "k_h", "k_s", "vote"):
            if learning.optional(chosen):
                learning.fail(chosen, f'the planner chooses it when plan = "{PLANNER}": leave it out')
        if quantiles is not None:
            reader.fail_at("task.quantiles", f'the planner chooses the cut points when learning.plan = "{PLANNER}": leave it out')
        expected_peers = learning.integer("expected_peers", 1, MAX_ROSTER) if learning.optional("expected_peers") else None
    else:
        k_p = learning.integer("k_p", 1, 4096)
        k_h = learning.integer("k_h", 1, 64)
        k_s = learning.integer("k_s", 1, 16)
        vote = learning.choice("vote", VOTES) if learning.optional("vote") else DEFAULT_VOTE
        if learning.optional("expected_peers"):
            learning.fail("expected_peers", f'only the planner uses it: set plan = "{PLANNER}", or leave it out')
    # The "one" plan's default, as in the experiments: every peer makes exactly one release at the full ε_T.
    comparison_pool = DEFAULT_COMPARISON_POOL if plan == PlanKind.ONE and spec.numeric_names else 0.0
    if learning.optional("comparison_pool"):
        if plan == PLANNER:
            learning.fail("comparison_pool", f'the planner chooses it when plan = "{PLANNER}": leave it out')
        # Whole per mille: the manifest states it as an integer; 0 is no pool.
        comparison_pool = round(learning.number("comparison_pool", 0.0, 0.999) * 1000) / 1000
    learning.done()
    privacy = reader.child("privacy")
    eps_total = privacy.number("eps_total", *EPSILON_TOTAL_RANGE)
    oracle = privacy.choice("oracle", ORACLE_NAMES)
    median_share = privacy.number("median_share", 0.01, 0.99) if privacy.optional("median_share") else 0.5
    if comparison_pool and privacy.optional("median_share"):
        privacy.fail("median_share", "a comparison pool answers the median search at the full eps_total: leave it out, "
                     "or set learning.comparison_pool = 0 for every peer to answer it")
    privacy.done()
    schedule = reader.child("schedule")
    start = _start_time(schedule.raw("start"), "schedule.start", schedule) if schedule.optional("start") else None

    def seconds(name: str, low: int) -> int:
        return schedule.integer(name, low, 10**7) if schedule.optional(name) else DEFAULT_SCHEDULE[name]

    register_seconds = seconds("register", 1)
    issue_seconds = seconds("issue", 1)
    # With a fixed plan a sub-round needs a partition of its own; the planner only considers plans where it has one.
    median_rounds = schedule.integer("median_rounds", 0, 64 if plan == PLANNER or comparison_pool else min(k_p, 64)) if spec.numeric_names else 0
    if not spec.numeric_names:
        schedule.optional("median_rounds")
    elif median_rounds == 0:
        schedule.fail("median_rounds", "numeric features need at least one median sub-round")
    median_send = seconds("median_send", 1)
    median_delivery = seconds("median_delivery", 2)
    data_send = seconds("data_send", 1)
    data_delivery = seconds("data_delivery", 2)

    def optional(key: str, low: int, default: int) -> int:
        return seconds(key, low) if schedule.optional(key) else default

    check_seconds = optional("check", 1, 4)
    median_second_send = optional("median_second_send", 1, median_send)
    median_second_delivery = optional("median_second_delivery", 2, median_delivery)
    data_second_send = optional("data_second_send", 1, data_send)
    data_second_delivery = optional("data_second_delivery", 2, data_delivery)
    # Thresholds of sub-round i (and the final medians) are published when the
    # previous delivery window closes; the gap lets every peer fetch them
    # before its send window opens.
    publish_gap = schedule.integer("publish_gap", 0, 10**6) if schedule.optional("publish_gap") else 2
    schedule.done()
    network = reader.child("network")
    # Each entry: a relay file's name (`relay info --json` output) or the five fields written out.
    descriptors = {
        i: _read_relay_file(network, item, f"network.relays[{i}]", base_dir)
        for i, item in enumerate(network.items("relays", max_items=256))
        if isinstance(item, str)
    }
    relays = tuple(
        RelayEntry.read(network.nested(
            {key: descriptors[i].get(key) for key in ("node_id", "host", "port", "public_key", "key_epoch")}
            if i in descriptors else item,
            f"network.relays[{i}]",
        ))
        for i, item in enumerate(network.items("relays", max_items=256))
    )
    path_length = network.integer("path_length", 1, 16)
    if path_length > len(relays):
        network.fail("path_length", f"{path_length} relays per path but {len(relays)} relays listed")
    for phase_name, delivery in (
        ("median_delivery", median_delivery), ("data_delivery", data_delivery),
        ("median_second_delivery", median_second_delivery), ("data_second_delivery", data_second_delivery),
    ):
        if delivery < path_length + 1:
            reader.fail_at(f"schedule.{phase_name}", f"{delivery} s cannot hold {path_length} relay windows and the slack slice")
    packet_size = (
        network.integer("packet_size", 512, 65536) if network.optional("packet_size") else DEFAULT_PACKET_SIZE
    )
    max_hops = network.integer("max_hops", 2, 32) if network.optional("max_hops") else DEFAULT_MAX_HOPS
    if path_length + 1 > max_hops:
        network.fail("max_hops", f"{max_hops} routing slots cannot hold {path_length} relays and the aggregator")
    try:
        geometry = SphinxGeometry.create(max_hops=max_hops, packet_size=packet_size)
    except ValueError as exc:
        network.fail("packet_size", f"{packet_size} bytes with {max_hops} hops is not a usable packet geometry ({exc})")
    for i, descriptor in descriptors.items():
        _check_relay_geometry(network, f"network.relays[{i}]", descriptor, geometry)
    http_host = network.text("http_host", max_len=255)
    http_port = network.integer("http_port", 1, 65535)
    sink_host = network.text("sink_host", max_len=255)
    sink_port = network.integer("sink_port", 1, 65535)
    network.done()
    participation = reader.child("participation")
    min_participation = participation.integer("min_participation", 1, 2**31)
    registration = RegistrationPolicy(participation.choice("registration", REGISTRATION_POLICIES))
    purpose = RoundPurpose(participation.choice("purpose", tuple(p.value for p in RoundPurpose))) if participation.optional("purpose") else RoundPurpose.PRODUCTION
    max_roster = participation.integer("max_roster", 1, MAX_ROSTER) if participation.optional("max_roster") else MAX_ROSTER
    max_per_client = participation.integer("max_per_client", 1, MAX_ROSTER) if participation.optional("max_per_client") else 1
    invitations = participation.integer("invitations", 0, MAX_ROSTER) if participation.optional("invitations") else 0
    allow_list = tuple(
        participation.decode_hex(item, f"participation.allow_list[{i}]", size=32)
        for i, item in enumerate(participation.items("allow_list", max_items=10**6) if participation.optional("allow_list") else [])
    )
    min_reports = participation.integer("min_reports_per_survey", 0, 2**31) if participation.optional("min_reports_per_survey") else None
    on_shortfall = participation.choice("on_shortfall", SHORTFALL_OUTCOMES) if participation.optional("on_shortfall") else "degraded"
    participation.done()
    reader.done()
    if registration is RegistrationPolicy.INVITATION and invitations == 0:
        reader.fail_at("participation.invitations", "the invitation policy needs invitations > 0")
    if registration is RegistrationPolicy.ALLOW_LIST and not allow_list:
        reader.fail_at("participation.allow_list", "the allow-list policy needs a non-empty allow_list")
    if registration is RegistrationPolicy.OPEN and purpose is RoundPurpose.PRODUCTION:
        reader.fail_at(
            "participation.registration",
            "open registration admits Sybils for free: set purpose = \"demo\" or \"test\", or use \"invitation\" or \"allow-list\"",
        )
    if min_participation > max_roster:
        reader.fail_at("participation.min_participation", f"{min_participation} exceeds max_roster = {max_roster}")
    choice: PlanChoice | None = None
    if plan == PLANNER:
        try:
            choice = planner(spec, expected_peers or min_participation, eps_total, median_rounds, median_share, oracle)
        except PlanError as exc:
            reader.fail_at(
                "learning.plan",
                f"the planner found no plan for {expected_peers or min_participation} peers with {median_rounds} median "
                f"sub-rounds ({exc}): raise learning.expected_peers or lower schedule.median_rounds",
            )
        spec = choice.spec_for(spec)
        k_p, k_h, k_s, plan, vote = choice.k_p, choice.k_h, choice.k_s, choice.kind, choice.combiner
        comparison_pool = choice.comparison_pool if choice.median_peers == MedianPeers.RESERVED else 0.0
    if comparison_pool and not spec.numeric_names:
        reader.fail_at("learning.comparison_pool", "a comparison pool answers the median search: the task has no numeric feature")
    if min_reports is None:
        min_reports = default_min_reports(min_participation, k_p)
    try:
        derive_subsets(bytes(32), spec.names, plan, k_p, k_h, k_s)
    except PlanError as exc:
        reader.fail_at("learning", str(exc))
    _check_buildable(reader, spec, plan, k_p, k_h, k_s, eps_total, oracle, median_share, median_rounds, comparison_pool)
    return RoundSpec(
        name, spec, k_p, k_h, k_s, plan, learner, vote, eps_total, oracle, median_share, register_seconds, issue_seconds,
        median_rounds, median_send, median_delivery, data_send, data_delivery, check_seconds, median_second_send,
        median_second_delivery, data_second_send, data_second_delivery, publish_gap, relays, path_length,
        packet_size, max_hops, http_host, http_port, sink_host, sink_port, min_participation, registration, purpose,
        max_roster, max_per_client, invitations, allow_list, min_reports, on_shortfall, start, choice,
        comparison_pool=comparison_pool,
    )


def release_plan(
    spec: FeatureSpec, plan: str, k_p: int, k_h: int, k_s: int, eps_total: float, seed: bytes, oracle: str,
    median_share: float, median_rounds: int, comparison_pool: float,
) -> ReleasePlan:
    """How a round divides ``eps_total`` (:meth:`protocol.ReleasePlan.build`): with a comparison pool, one
    comparison at the full ε_T for a pool peer and ``k_h`` reports at ``ε_T / k_h`` for a data peer;
    without one, ``median_share`` of ε_T for every peer's median answer."""
    pooled = bool(comparison_pool) and bool(spec.numeric_names)
    return ReleasePlan.build(
        kind=plan, features=spec.names, numeric_features=spec.numeric_names, k_p=k_p, k_h=k_h, k_s=k_s,
        epsilon_total=eps_total, seed=seed, oracle=oracle, median_peers=MedianPeers.RESERVED if pooled else MedianPeers.ALL,
        median_share=median_share, median_steps=max(median_rounds, 1),
        **({"comparison_pool": comparison_pool} if pooled else {}),
    )


def _check_buildable(
    reader: FieldReader, spec: FeatureSpec, plan: str, k_p: int, k_h: int, k_s: int, eps_total: float, oracle: str,
    median_share: float, median_rounds: int, comparison_pool: float,
) -> None:
    """Build what the round will build from these values, so a failure shows now and names its field.

    The release plan (``round new``) and each data survey's frequency oracle
    (the aggregator and the peers, at the partition sizes ``"auto"`` chooses
    among) are made as they will be then.
    """
    try:
        release = release_plan(spec, plan, k_p, k_h, k_s, eps_total, bytes(32), oracle, median_share, median_rounds, comparison_pool)
    except (PlanError, ValueError) as exc:
        reader.fail_at("privacy", f"no release plan for these values: {exc}")
    domains = {spec.domain_size(subset) for subsets in release.subsets for subset in subsets}
    for m in sorted(domains):
        for n in (1, 1000):
            try:
                make_oracle(oracle, release.release_epsilon, m, n=n)
            except (ValueError, ZeroDivisionError, OverflowError) as exc:
                reader.fail_at("privacy.oracle", f"{oracle!r} cannot encode {m} values at epsilon {release.release_epsilon:g}: {exc}")

