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

from anonml.aggregator._spec_example import ROUND_SPEC_EXAMPLE
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
from anonml.crypto import SphinxGeometry
from anonml.mechanisms import OracleName, make_oracle
from anonml.protocol import (
    FeatureSpec,
    FieldReader,
    InvalidDocument,
    MedianPeers,
    PlanError,
    PlanKind,
    ReleasePlan,
    TaskKind,
    comparison_pool_size,
    derive_subsets,
    hop_slice,
    report_capacity,
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
    # A model's rows are encoded from the features' public bounds: no median search, so no median phase.
    numeric = bool(task.features.numeric_names) and task.kind != TaskKind.MODEL_AVERAGING
    learning = LearningTable.read(reader.child("learning"), numeric=numeric)
    if learning.plan == PLANNER and task.quantiles is not None:
        reader.fail_at("task.quantiles", f'the planner chooses the cut points when learning.plan = "{PLANNER}": leave it out')
    privacy = PrivacyTable.read(reader.child("privacy"), pooled=bool(learning.comparison_pool))
    if task.kind == TaskKind.STATISTICS:
        _check_statistics(reader, learning, privacy)
    # An SGD round's median sub-rounds are its gradient steps, numeric features or not.
    schedule = ScheduleTable.read(reader.child("schedule"), numeric=numeric or task.kind == TaskKind.SGD)
    if task.kind == TaskKind.SGD:
        _check_sgd(reader, learning, schedule)
    network = NetworkTable.read(reader.child("network"), base_dir)
    for key, delivery in schedule.deliveries().items():
        if hop_slice(delivery, network.path_length) < 1:
            reader.fail_at(f"schedule.{key}", f"{delivery} s cannot hold the first hop's guard, {network.path_length} relay "
                           f"windows and the slack slice (needs {network.path_length + 2})")
    participation = ParticipationTable.read(reader.child("participation"))
    if task.kind == TaskKind.MODEL_AVERAGING:
        _check_model_averaging(reader, task, learning, network)
    reader.done()
    spec = RoundSpec(
        name=name, task=task, learning=learning, privacy=privacy, schedule=schedule, network=network,
        participation=participation,
    )
    if learning.plan == PLANNER:
        spec = _planned(reader, spec, planner)
    _check_round(reader, spec)
    return spec


STATISTICS_ORACLES = (OracleName.OUE, OracleName.SUE, OracleName.PQ)
"""The oracles a statistics task may use: unary encodings, which perturb every cell independently, so the
error of a sum of cells (a feature's bin over both labels, a count, a CDF) is the sum of the cells' errors."""


def _check_statistics(reader: FieldReader, learning: LearningTable, privacy: PrivacyTable) -> None:
    """A statistics task: each data peer makes ONE release, of one feature (and the label), at the whole ε_T."""
    if learning.plan != PlanKind.ONE or learning.k_s != 1:
        reader.fail_at("learning", f'a statistics task releases one feature per peer: set plan = "one" and k_s = 1 '
                                   f"(got plan = {learning.plan!r}, k_s = {learning.k_s})")
    if privacy.oracle not in STATISTICS_ORACLES:
        reader.fail_at("privacy.oracle", f"a statistics task needs a unary encoding ({', '.join(STATISTICS_ORACLES)}), "
                                         f"whose cells are perturbed independently; got {privacy.oracle!r}")


def _check_sgd(reader: FieldReader, learning: LearningTable, schedule: ScheduleTable) -> None:
    """An SGD task: the median sub-rounds are the gradient steps, each taken by the partitions that answer it,
    so every partition must answer one (no comparison pool) and every step needs a partition."""
    if learning.comparison_pool:
        reader.fail_at("learning.comparison_pool", "an SGD task deals every partition one gradient step: set it to 0")
    if learning.k_p < schedule.median_rounds:
        reader.fail_at("learning.k_p", f"an SGD task needs a partition for each of its {schedule.median_rounds} steps "
                                       f"(schedule.median_rounds), got k_p = {learning.k_p}")


def _check_model_averaging(reader: FieldReader, task: TaskTable, learning: LearningTable, network: NetworkTable) -> None:
    """A model-averaging task: each data survey is one fixed block of the model's coordinates, so the round has
    one survey per block (``plan = "split"``, ``k_s = 1``, ``k_h`` = the blocks the packet's payload needs)."""
    from anonml.learning import RoundModel

    capacity = report_capacity(SphinxGeometry.create(max_hops=network.max_hops, packet_size=network.packet_size).message_size)
    blocks = RoundModel.of(task.features, 1.0, task.rows_per_peer, capacity).blocks
    if learning.plan != PlanKind.SPLIT or learning.k_s != 1 or learning.k_h != blocks.blocks:
        reader.fail_at("learning", f"a model-averaging task sends its {blocks.dimension} coordinates in {blocks.blocks} block(s) of at most "
                                   f"{blocks.per_block} ({capacity} report bytes a packet): set plan = \"split\", k_s = 1 and "
                                   f"k_h = {blocks.blocks} (got plan = {learning.plan!r}, k_s = {learning.k_s}, k_h = {learning.k_h})")
    if blocks.blocks > len(task.features.names):
        reader.fail_at("network.packet_size", f"{blocks.blocks} blocks need as many features to deal as subsets, the task has "
                                              f"{len(task.features.names)}: use larger packets")


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
    searched = () if spec.task.kind == TaskKind.MODEL_AVERAGING else features.numeric_names  # no median search
    return ReleasePlan.build(
        kind=learning.plan, features=features.names, numeric_features=searched, k_p=learning.k_p,
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
    domains = {spec.task.features.domain_size(subset, labelled=spec.task.labelled) for subsets in release.subsets for subset in subsets}
    for m in sorted(domains):
        for n in (1, 1000):
            try:
                make_oracle(oracle, release.release_epsilon, m, n=n)
            except (ValueError, ZeroDivisionError, OverflowError) as exc:
                reader.fail_at("privacy.oracle", f"{oracle!r} cannot encode {m} values at epsilon {release.release_epsilon:g}: {exc}")
