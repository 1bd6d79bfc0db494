"""The tables of a round spec (``round.toml``), one typed record each.

Each table of the TOML is one frozen dataclass whose fields are named as the
table's keys, and whose :meth:`read` checks every key of its own table with
:class:`protocol.FieldReader` (so each refusal names its field, e.g.
``schedule.median_send``) and refuses keys it does not know. Checks that
span tables (a delivery window against the path length, the median search
against the partitions, the anonymity set against the participation) live
in ``aggregator._spec``, which builds the :class:`RoundSpec` from these by
keyword.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from anonml.crypto import DEFAULT_MAX_HOPS, DEFAULT_PACKET_SIZE, SphinxGeometry
from anonml.mechanisms import ORACLE_NAMES
from anonml.protocol import (
    DEFAULT_COMPARISON_POOL,
    DEFAULT_MIN_ANONYMITY_SET,
    DEFAULT_VOTE,
    EPSILON_TOTAL_RANGE,
    MAX_MEDIAN_STEPS,
    MAX_QUANTILES,
    MAX_ROSTER,
    MAX_ROWS_PER_PEER,
    MAX_REGULARIZATION_RULE,
    MAX_SGD_LEARNING_RATE,
    PLAN_KINDS,
    SGD_LOSSES,
    REGISTRATION_POLICIES,
    TASK_KINDS,
    VOTES,
    FeatureSpec,
    FeatureSpecError,
    FieldReader,
    Learner,
    PlanKind,
    QueryError,
    RegistrationPolicy,
    RelayEntry,
    RoundPurpose,
    SgdLoss,
    StatisticQuery,
    TaskKind,
    check_queries,
    queried_features,
    read_sink_workers,
    uses_label,
)

PLANNER = "auto"
"""``[learning] plan = "auto"``: the planner chooses the plan, its partitions,
the cut points and the combiner by simulation, and the round uses its choice."""

class ShortfallAction(StrEnum):
    """What a round whose survey got fewer than ``min_reports_per_survey`` reports does (``[participation] on_shortfall``)."""

    DEGRADED = "degraded"  # it still learns and publishes, and says which surveys fell short
    FAIL = "fail"  # it fails when that phase closes: no model

MAX_SPEC_BYTES = 1 << 20
"""A round spec is a few kilobytes; more is refused before the TOML parser sees it."""

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


@dataclass(frozen=True)
class TaskTable:
    """``[task]``: what the round computes, the features and the label, and the cut points of the numeric features."""

    features: FeatureSpec
    """The task, however the table gives it: ``builtin``, ``spec_file``, or ``features`` and ``label`` written out."""
    quantiles: int | None
    """Cut points per numeric feature, if the table sets them (already applied to ``features``)."""
    kind: TaskKind = TaskKind.ENSEMBLE
    """What the round computes from the reports (``kind``; the partition ensemble when left out)."""
    queries: tuple[StatisticQuery, ...] = ()
    """A statistics task's queries (``queries``; empty: the default set). ``features`` then holds only
    the features they read, so a peer releases nothing else."""
    rows_per_peer: int = 0
    """A model-averaging task's minimum rows per data peer (``rows_per_peer``, at least the learner's
    ``MIN_ROWS_PER_PEER``, which is also its default); 0 for every other kind, which may not set it."""
    learning_rate: float | None = None
    """An SGD task's γ0 (``learning_rate``, signed in the manifest); None: the learner's default. No other kind may set it."""
    loss: SgdLoss | None = None
    """An SGD task's loss (``loss``, signed in the manifest; logistic unless set); None for every other kind."""
    regularization_rule: float | None = None
    """A model-averaging task's λ rule (``regularization_rule``: λ = rule / (rows_per_peer ε_T), signed; default
    ``learning.ROUND_REGULARIZATION_RULE``); None for every other kind, which may not set it."""
    categorical_weight: float | None = None
    """A model-averaging task's categorical-column weight (``categorical_weight`` in (0, 1], signed; default
    ``learning.ROUND_CATEGORICAL_WEIGHT``); None for every other kind, which may not set it."""

    @property
    def labelled(self) -> bool:
        """Whether the data reports carry the label (``RoundManifest.labelled_reports``, as the manifest will say)."""
        return not self.queries or uses_label(self.queries)

    @classmethod
    def read(cls, table: FieldReader, base_dir: Path | None) -> TaskTable:
        kind = TaskKind(table.choice("kind", TASK_KINDS)) if table.optional("kind") else TaskKind.ENSEMBLE
        if table.optional("builtin"):
            table.choice("builtin", ("adult",))
            from anonml.learning import adult_spec

            features = adult_spec()
        elif table.optional("spec_file"):
            features = _read_feature_spec_file(table, table.text("spec_file", max_len=4096), base_dir)
        else:
            raw = {"features": table.items("features", max_items=256), "label": table.obj("label")}
            try:
                features = FeatureSpec.from_dict(raw)
            except FeatureSpecError as exc:
                table.fail("features", str(exc))
        quantiles = table.integer("quantiles", 1, MAX_QUANTILES) if table.optional("quantiles") else None
        queries = _read_queries(table, kind, features) if table.optional("queries") else ()
        rows_per_peer = 0
        if kind == TaskKind.MODEL_AVERAGING:
            from anonml.learning import MIN_ROWS_PER_PEER

            rows_per_peer = table.integer("rows_per_peer", MIN_ROWS_PER_PEER, MAX_ROWS_PER_PEER) if table.optional("rows_per_peer") else MIN_ROWS_PER_PEER
        for key, owner in (("learning_rate", TaskKind.SGD), ("loss", TaskKind.SGD),
                           ("regularization_rule", TaskKind.MODEL_AVERAGING), ("categorical_weight", TaskKind.MODEL_AVERAGING)):
            if kind != owner and table.optional(key):
                table.fail(key, f"only a {str(owner)!r} task sets {key}; this is a {str(kind)!r} task")
        learning_rate, loss = None, None
        if kind == TaskKind.SGD:
            learning_rate = _positive(table, "learning_rate", MAX_SGD_LEARNING_RATE) if table.optional("learning_rate") else None
            loss = SgdLoss(table.choice("loss", SGD_LOSSES)) if table.optional("loss") else SgdLoss.LOGISTIC
        rule, weight = None, None
        if kind == TaskKind.MODEL_AVERAGING:
            from anonml.learning import ROUND_CATEGORICAL_WEIGHT, ROUND_REGULARIZATION_RULE

            rule = _positive(table, "regularization_rule", MAX_REGULARIZATION_RULE) if table.optional("regularization_rule") else ROUND_REGULARIZATION_RULE
            weight = _positive(table, "categorical_weight", 1.0) if table.optional("categorical_weight") else ROUND_CATEGORICAL_WEIGHT
        table.done()
        if queries:
            read = queried_features(queries, features.names)
            features = FeatureSpec(tuple(f for f in features.features if f.name in read), features.label)
        return cls(features=features if quantiles is None else features.with_quantiles(quantiles), quantiles=quantiles, kind=kind,
                   queries=queries, rows_per_peer=rows_per_peer, learning_rate=learning_rate, loss=loss,
                   regularization_rule=rule, categorical_weight=weight)


def _positive(table: FieldReader, key: str, highest: float) -> float:
    """A number of the task in (0, ``highest``]."""
    value = table.number(key, 0.0, highest)
    if value <= 0:
        table.fail(key, f"must be positive, got {value!r}")
    return value


def _read_queries(table: FieldReader, kind: TaskKind, features: FeatureSpec) -> tuple[StatisticQuery, ...]:
    """``task.queries``: e.g. ``["count:label", "histogram:age", "mean:hours", "quantile:age:0.5"]`` (:mod:`protocol._queries`)."""
    if kind != TaskKind.STATISTICS:
        table.fail("queries", f'queries are asked of a statistics task: set kind = "{TaskKind.STATISTICS}" (got {str(kind)!r})')
    try:
        return check_queries(table.raw("queries"), features)
    except QueryError as exc:
        table.fail("queries", str(exc))


@dataclass(frozen=True)
class LearningTable:
    """``[learning]``: the plan and the ensemble (with ``plan = "auto"``, placeholders until the planner chooses)."""

    k_p: int
    k_h: int
    k_s: int
    plan: str
    learner: str
    vote: str
    comparison_pool: float
    """The share of peers reserved for the median search (0: every peer answers it), in steps of 0.001."""
    expected_peers: int | None
    """Peers the planner plans for (``plan = "auto"`` only; None: ``min_participation``)."""

    @classmethod
    def read(cls, table: FieldReader, *, numeric: bool) -> LearningTable:
        """``numeric``: whether the task has a numeric feature (a comparison pool answers its median search)."""
        plan = table.choice("plan", (*PLAN_KINDS, PLANNER))
        learner = table.choice("learner", tuple(Learner))
        if plan == PLANNER:
            for chosen in ("k_p", "k_h", "k_s", "vote", "comparison_pool"):
                if table.optional(chosen):
                    table.fail(chosen, f'the planner chooses it when plan = "{PLANNER}": leave it out')
            expected_peers = table.integer("expected_peers", 1, MAX_ROSTER) if table.optional("expected_peers") else None
            table.done()
            # Placeholders until the planner has chosen (aggregator._spec, once the budget and participation are read).
            return cls(k_p=1, k_h=1, k_s=1, plan=plan, learner=learner, vote=DEFAULT_VOTE, comparison_pool=0.0,
                       expected_peers=expected_peers)
        if table.optional("expected_peers"):
            table.fail("expected_peers", f'only the planner uses it: set plan = "{PLANNER}", or leave it out')
        # The "one" plan's default, as in the experiments: every peer makes exactly one release at the full ε_T.
        comparison_pool = DEFAULT_COMPARISON_POOL if plan == PlanKind.ONE and numeric else 0.0
        if table.optional("comparison_pool"):
            # Whole per mille: the manifest states it as an integer; 0 is no pool.
            comparison_pool = round(table.number("comparison_pool", 0.0, 0.999) * 1000) / 1000
        values = cls(
            k_p=table.integer("k_p", 1, 4096), k_h=table.integer("k_h", 1, 64), k_s=table.integer("k_s", 1, 16), plan=plan,
            learner=learner, vote=table.choice("vote", VOTES) if table.optional("vote") else DEFAULT_VOTE,
            comparison_pool=comparison_pool, expected_peers=None,
        )
        table.done()
        return values

    @property
    def pool_per_mille(self) -> int:
        """``comparison_pool`` as the manifest states it (``RoundManifest.comparison_pool``)."""
        return round(self.comparison_pool * 1000)


@dataclass(frozen=True)
class PrivacyTable:
    """``[privacy]``: the budget promised to each peer and how it is spent."""

    eps_total: float
    oracle: str
    median_share: float
    """Share of ``eps_total`` for the median search when every peer answers it (no comparison pool)."""

    @classmethod
    def read(cls, table: FieldReader, *, pooled: bool) -> PrivacyTable:
        """``pooled``: whether a comparison pool answers the median search (then at the full ``eps_total``)."""
        eps_total = table.number("eps_total", *EPSILON_TOTAL_RANGE)
        oracle = table.choice("oracle", ORACLE_NAMES)
        median_share = table.number("median_share", 0.01, 0.99) if table.optional("median_share") else 0.5
        if pooled and table.optional("median_share"):
            table.fail("median_share", "a comparison pool answers the median search at the full eps_total: leave it out, "
                       "or set learning.comparison_pool = 0 for every peer to answer it")
        table.done()
        return cls(eps_total=eps_total, oracle=oracle, median_share=median_share)


@dataclass(frozen=True)
class ScheduleTable:
    """``[schedule]``: durations in seconds from the round's start (``aggregator.build_schedule`` lays them out)."""

    start: int | None
    """The Unix time registration opens, if the spec fixes it; otherwise when ``round new`` runs (or its ``--start``)."""
    register: int
    issue: int
    median_rounds: int
    median_send: int
    median_delivery: int
    data_send: int
    data_delivery: int
    check: int
    """After each delivery window, seconds to publish and compare receipt-log heads."""
    median_second_send: int
    median_second_delivery: int
    data_second_send: int
    data_second_delivery: int
    publish_gap: int
    """Seconds between publishing results (thresholds, medians) and the next send window."""

    @classmethod
    def read(cls, table: FieldReader, *, numeric: bool) -> ScheduleTable:
        """``numeric``: whether the task has a numeric feature (then it needs median sub-rounds, else it has none)."""
        start = _start_time(table.raw("start"), table.name("start"), table) if table.optional("start") else None

        def seconds(key: str, low: int, default: int | None = None) -> int:
            if table.optional(key):
                return table.integer(key, low, 10**7)
            return DEFAULT_SCHEDULE[key] if default is None else default

        median_rounds = table.integer("median_rounds", 0, MAX_MEDIAN_STEPS) if numeric else 0
        if not numeric:
            table.optional("median_rounds")
        elif median_rounds == 0:
            table.fail("median_rounds", "numeric features need at least one median sub-round")
        median_send, median_delivery = seconds("median_send", 1), seconds("median_delivery", 2)
        data_send, data_delivery = seconds("data_send", 1), seconds("data_delivery", 2)
        values = cls(
            start=start, register=seconds("register", 1), issue=seconds("issue", 1), median_rounds=median_rounds,
            median_send=median_send, median_delivery=median_delivery, data_send=data_send, data_delivery=data_delivery,
            check=seconds("check", 1, 4),
            # Each phase's second chance defaults to its first windows' lengths.
            median_second_send=seconds("median_second_send", 1, median_send),
            median_second_delivery=seconds("median_second_delivery", 2, median_delivery),
            data_second_send=seconds("data_second_send", 1, data_send),
            data_second_delivery=seconds("data_second_delivery", 2, data_delivery),
            # Thresholds of sub-round i (and the final medians) are published when the
            # previous delivery window closes; the gap lets every peer fetch them
            # before its send window opens.
            publish_gap=table.integer("publish_gap", 0, 10**6) if table.optional("publish_gap") else 2,
        )
        table.done()
        return values

    def deliveries(self) -> dict[str, int]:
        """Every delivery window by its key: each must hold the relays' windows of a path."""
        return {key: getattr(self, key) for key in ("median_delivery", "data_delivery", "median_second_delivery", "data_second_delivery")}


@dataclass(frozen=True)
class NetworkTable:
    """``[network]``: the relays, the packet geometry, and where the aggregator serves and receives."""

    relays: tuple[RelayEntry, ...]
    path_length: int
    packet_size: int
    max_hops: int
    http_host: str
    http_port: int
    sink_host: str
    sink_port: int
    sink_workers: tuple[tuple[str, int], ...] = ()
    """Further addresses of the packet sink, each an ``aggregator worker`` (the manifest's ``aggregator.workers``)."""

    @classmethod
    def read(cls, table: FieldReader, base_dir: Path | None) -> NetworkTable:
        items = table.items("relays", max_items=256)
        # Each entry: a relay file's name (`relay info --json` output) or the five fields written out (and its
        # mirror_port, if any). A file's mirror is kept: without it peers could confirm neither the manifest nor
        # the receipt logs with anyone (issue 29's README walk found it dropped).
        descriptors = {
            i: _read_relay_file(table, item, f"{table.name('relays')}[{i}]", base_dir)
            for i, item in enumerate(items) if isinstance(item, str)
        }
        relays = tuple(
            RelayEntry.read(table.nested(
                {key: descriptors[i].get(key) for key in RelayEntry.FIELDS}
                if i in descriptors else item,
                f"{table.name('relays')}[{i}]",
            ))
            for i, item in enumerate(items)
        )
        path_length = table.integer("path_length", 1, 16)
        if path_length > len(relays):
            table.fail("path_length", f"{path_length} relays per path but {len(relays)} relays listed")
        packet_size = table.integer("packet_size", 512, 65536) if table.optional("packet_size") else DEFAULT_PACKET_SIZE
        max_hops = table.integer("max_hops", 2, 32) if table.optional("max_hops") else DEFAULT_MAX_HOPS
        if path_length + 1 > max_hops:
            table.fail("max_hops", f"{max_hops} routing slots cannot hold {path_length} relays and the aggregator")
        try:
            geometry = SphinxGeometry.create(max_hops=max_hops, packet_size=packet_size)
        except ValueError as exc:
            table.fail("packet_size", f"{packet_size} bytes with {max_hops} hops is not a usable packet geometry ({exc})")
        for i, descriptor in descriptors.items():
            _check_relay_geometry(table, f"{table.name('relays')}[{i}]", descriptor, geometry)
        values = cls(
            relays=relays, path_length=path_length, packet_size=packet_size, max_hops=max_hops,
            http_host=table.text("http_host", max_len=255), http_port=table.integer("http_port", 1, 65535),
            sink_host=table.text("sink_host", max_len=255), sink_port=table.integer("sink_port", 1, 65535),
            sink_workers=read_sink_workers(table, "sink_workers") if table.optional("sink_workers") else (),
        )
        table.done()
        if values.http_port == values.sink_port:
            # `aggregator run` binds both on one machine: the second bind would fail there, at the round's start.
            table.fail("sink_port", f"{values.sink_port} is also http_port: the HTTP API and the packet sink need two ports")
        if (values.sink_host, values.sink_port) in values.sink_workers:
            table.fail("sink_workers", f"{values.sink_host}:{values.sink_port} is the sink's own address (sink_host, sink_port)")
        if (values.http_host, values.http_port) in values.sink_workers:
            table.fail("sink_workers", f"{values.http_host}:{values.http_port} is the HTTP API's address")
        return values


@dataclass(frozen=True)
class ParticipationTable:
    """``[participation]``: who may register, how many must, and what a short survey does."""

    min_participation: int
    registration: RegistrationPolicy
    purpose: RoundPurpose
    max_roster: int
    max_per_client: int
    """Identities one client address may register (open registration only)."""
    invitations: int
    allow_list: tuple[bytes, ...]
    min_reports_per_survey: int | None
    """A survey with fewer accepted reports is short (None: ``aggregator._spec.default_min_reports``)."""
    on_shortfall: ShortfallAction
    min_anonymity_set: int
    """The fewest peers any survey may hide a report among, signed in the manifest
    (``RoundManifest.min_anonymity_set``; default :data:`protocol.DEFAULT_MIN_ANONYMITY_SET`)."""

    @classmethod
    def read(cls, table: FieldReader) -> ParticipationTable:
        def optional(key: str, low: int, high: int, default: int) -> int:
            return table.integer(key, low, high) if table.optional(key) else default

        allow_list = tuple(
            table.decode_hex(item, f"{table.name('allow_list')}[{i}]", size=32)
            for i, item in enumerate(table.items("allow_list", max_items=10**6) if table.optional("allow_list") else [])
        )
        values = cls(
            min_participation=table.integer("min_participation", 1, 2**31),
            registration=RegistrationPolicy(table.choice("registration", REGISTRATION_POLICIES)),
            purpose=RoundPurpose(table.choice("purpose", tuple(p.value for p in RoundPurpose)))
            if table.optional("purpose") else RoundPurpose.PRODUCTION,
            max_roster=optional("max_roster", 1, MAX_ROSTER, MAX_ROSTER),
            max_per_client=optional("max_per_client", 1, MAX_ROSTER, 1),
            invitations=optional("invitations", 0, MAX_ROSTER, 0),
            allow_list=allow_list,
            min_reports_per_survey=table.integer("min_reports_per_survey", 0, 2**31) if table.optional("min_reports_per_survey") else None,
            on_shortfall=ShortfallAction(table.choice("on_shortfall", tuple(ShortfallAction))) if table.optional("on_shortfall") else ShortfallAction.DEGRADED,
            min_anonymity_set=optional("min_anonymity_set", 1, MAX_ROSTER, DEFAULT_MIN_ANONYMITY_SET),
        )
        table.done()
        values.check(table)
        return values

    def check(self, table: FieldReader) -> None:
        """The policy's own needs, and a minimum the roster can reach."""
        if self.registration is RegistrationPolicy.INVITATION and self.invitations == 0:
            table.fail("invitations", "the invitation policy needs invitations > 0")
        if self.registration is RegistrationPolicy.ALLOW_LIST and not self.allow_list:
            table.fail("allow_list", "the allow-list policy needs a non-empty allow_list")
        if self.registration is RegistrationPolicy.OPEN and self.purpose is RoundPurpose.PRODUCTION:
            table.fail(
                "registration",
                "open registration admits Sybils for free: set purpose = \"demo\" or \"test\", or use \"invitation\" or \"allow-list\"",
            )
        if self.min_participation > self.max_roster:
            table.fail("min_participation", f"{self.min_participation} exceeds max_roster = {self.max_roster}")


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
