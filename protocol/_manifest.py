"""The round manifest: the one signed document every role of a round agrees on.

DESIGN.md §4. The manifest fixes the task, the learning and privacy
parameters, the schedule, the relay directory, the packet geometry, the token
public key and the partition-seed commitment. Its canonical encoding (JSON,
sorted keys, no whitespace, bytes as lowercase hex, integers only except the
epsilons, which are canonical decimal strings) is hashed with SHA-256 into the
``round_id`` that names the round everywhere — it is ``SurveyId.round_id``, so
a token made for one manifest can never verify under another.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from anonml.crypto import NodeAddress, PathHop, ReleaseWindow, SphinxGeometry, build_packet
from anonml.protocol._api import MAX_ROSTER, format_host_port
from anonml.protocol._canonical import FieldReader, InvalidDocument, canonical_json, format_epsilon, parse_json_object
from anonml.protocol._queries import QueryError, StatisticQuery, check_queries, queried_features, uses_label
from anonml.protocol._vocabulary import SGD_LOSSES, TASK_KINDS, Combiner, SgdLoss, TaskKind
from anonml.protocol._signed import ed25519_holds
from anonml.protocol._schedule import Attempt, RoundSchedule, acceptance_window, hop_windows
from anonml.protocol._survey import ROUND_ID_BYTES, SurveyId

if TYPE_CHECKING:
    from nacl.signing import SigningKey


PROTOCOL_VERSION = 1
MAX_MANIFEST_BYTES = 512 * 1024
MAX_RELAYS = 256
SEED_BYTES = 32
PLANS = ("split", "one")
VOTES = tuple(str(vote) for vote in Combiner)
DEFAULT_VOTE = str(Combiner.WEIGHTED)  # eq. 6.2, the thesis's vote


class RegistrationPolicy(enum.StrEnum):
    """Who may register (DESIGN.md §3 step 2)."""

    OPEN = "open"
    """Anyone: Sybils cost nothing, so only a demo or test round may use it."""
    ALLOW_LIST = "allow-list"
    INVITATION = "invitation"


class RoundPurpose(enum.StrEnum):
    """What a round is for; ``open`` registration is refused outside demos and tests."""

    PRODUCTION = "production"
    DEMO = "demo"
    TEST = "test"


REGISTRATION_POLICIES = tuple(policy.value for policy in RegistrationPolicy)

_MANIFEST_DOMAIN = b"anonml/manifest/v1"
_SEED_DOMAIN = b"anonml/seed/v1"
_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9 ._\-]*"
_HOST_PATTERN = r"[A-Za-z0-9.:\-\[\]]+"
_URL_PATTERN = r"https?://[A-Za-z0-9.:\-\[\]]+(/[A-Za-z0-9._\-/]*)?"
_MAX_PORT = 65535


def comparison_pool_size(per_mille: int, peers: int, median_rounds: int) -> int:
    """How many of ``peers`` form a comparison pool of ``per_mille``: its share, halves rounded up,
    and at least one peer per median sub-round while there are peers (0 without a pool)."""
    if not per_mille:
        return 0
    share = (per_mille * peers + 500) // 1000
    return min(peers, max(share, median_rounds))


DEFAULT_MIN_ANONYMITY_SET = 5
"""The minimum anonymity set a round spec states when it leaves ``min_anonymity_set`` out.

Five: a report whose survey holds at least five reports is, by elimination
alone, linked to its sender at most one time in five (the timing estimate
of ``aggregator._anonymity`` is tested to stay at that chance), and the
README's round of 100 peers in 8 partitions (12 each) meets it with room,
while the 16-peer round with a 10% pool of issue 24 (one peer per pool
partition) is refused. A round that wants a stronger promise states more.
"""


def smallest_anonymity_set(peers: int, k_p: int, pool_per_mille: int, median_rounds: int) -> int:
    """The fewest peers in any partition that has one, when ``peers`` are dealt as
    :class:`PartitionPlan` deals them (0 for no peers).

    Every survey is answered by the peers of one partition (a data survey by
    its data partition, a median survey by its pool partition or, without a
    pool, by its data partition), so this is the smallest set a report can
    hide in while every peer answers. Both deals are round-robin, so the
    sizes differ by at most one, and the figure never shrinks as ``peers``
    grows: a round that meets a minimum at ``min_participation`` meets it
    at every larger roster.
    """
    pool = comparison_pool_size(pool_per_mille, peers, median_rounds)
    groups = [(peers - pool, k_p), (pool, median_rounds)]
    return min((max(1, dealt // parts) for dealt, parts in groups if dealt > 0), default=0)


class InvalidManifest(InvalidDocument):
    """Raised when a manifest (or a signed manifest) is malformed, inconsistent, or its signature fails.

    ``field`` names the offending field, e.g. ``"schedule.data.t_r"`` or ``"signature"``.
    """


def seed_commitment(seed: bytes) -> bytes:
    """``H(seed)``, published in the manifest before registration (DESIGN.md §3, commit-reveal)."""
    return hashlib.sha256(_SEED_DOMAIN + seed).digest()


def check_seed(seed: bytes, commitment: bytes) -> bool:
    """Whether a revealed ``seed`` opens ``commitment``; peers refuse the round otherwise."""
    return len(seed) == SEED_BYTES and hmac.compare_digest(seed_commitment(seed), commitment)


def _read_hop_address(reader: FieldReader) -> tuple[bytes, str, int, bytes]:
    """(node id, host, port, X25519 public key): how every Sphinx hop of the
    manifest, relay or aggregator, is named and reached, with the same bounds."""
    return (
        reader.hex("node_id", max_size=64),
        reader.text("host", max_len=255, pattern=_HOST_PATTERN),
        reader.integer("port", 1, _MAX_PORT),
        reader.hex("public_key", size=32),
    )


@dataclass(frozen=True)
class RelayEntry:
    """One mix node of the relay directory."""

    FIELDS: ClassVar[tuple[str, ...]] = ("node_id", "host", "port", "public_key", "key_epoch", "mirror_port", "beacon_key")
    """Every field a relay's entry may have: what a spec's relay row takes from a relay descriptor (`relay info --json`)."""

    node_id: bytes
    host: str
    port: int
    public_key: bytes
    key_epoch: int
    mirror_port: int | None = None
    """Where the relay serves its read-only mirror of the aggregator's signed documents (``relay._mirror``), if it does."""
    beacon_key: bytes | None = None
    """The Ed25519 key that verifies the relay's signed beacon statements (``protocol._beacon``), from its descriptor;
    :meth:`read` requires it of a relay listed with a mirror (only those take part in the beacon)."""

    def to_dict(self) -> dict[str, Any]:
        entry = {
            "node_id": self.node_id.hex(),
            "host": self.host,
            "port": self.port,
            "public_key": self.public_key.hex(),
            "key_epoch": self.key_epoch,
            "mirror_port": self.mirror_port,
        }
        # Written only when present: a manifest without beacon keys keeps the canonical bytes (and round id) it had.
        return entry if self.beacon_key is None else {**entry, "beacon_key": self.beacon_key.hex()}

    @property
    def mirror_url(self) -> str | None:
        if self.mirror_port is None:
            return None
        return f"http://{format_host_port(self.host, self.mirror_port)}"

    @property
    def mirror_beacon_key(self) -> bytes:
        """The key this mirrored relay's beacon statements must verify under: every manifest lists one for each
        relay it lists with a mirror (:meth:`read`, which every ``RoundManifest`` passes through, refuses it otherwise)."""
        assert self.beacon_key is not None, "a relay listed with a mirror lists its beacon key"
        return self.beacon_key

    @classmethod
    def read(cls, reader: FieldReader) -> RelayEntry:
        entry = cls(
            *_read_hop_address(reader),
            key_epoch=reader.integer("key_epoch", 0, 2**32),
            mirror_port=reader.integer("mirror_port", 1, _MAX_PORT) if reader.raw("mirror_port", optional=True) is not None else None,
            beacon_key=reader.hex("beacon_key", size=32) if reader.raw("beacon_key", optional=True) is not None else None,
        )
        reader.done()
        if entry.mirror_port is not None and entry.beacon_key is None:
            # Its beacon statements are checked against this key: without it, whoever answers at the mirror's
            # address could commit and reveal in the relay's name, and so choose the partitions.
            reader.fail("beacon_key", "a relay listed with a mirror must list its beacon key (`anonml relay info` prints it)")
        return entry


MAX_SINK_WORKERS = 16
"""The most further packet-sink addresses (ingest workers) a manifest may list for its final hop."""


@dataclass(frozen=True)
class AggregatorHop:
    """The aggregator as the last Sphinx hop: its X25519 key and packet-sink address.

    ``workers`` are further addresses of the same hop (``aggregator worker``
    processes holding its key, sharing its store): a last relay may deliver
    a packet to any of :attr:`endpoints`, whichever the packet names.
    """

    node_id: bytes
    host: str
    port: int
    public_key: bytes
    workers: tuple[tuple[str, int], ...] = ()

    @property
    def endpoints(self) -> tuple[tuple[str, int], ...]:
        """Every address the final hop takes packets at: its own first (the one packets name), then its workers'."""
        return ((self.host, self.port), *self.workers)

    def to_dict(self) -> dict[str, Any]:
        hop = {"node_id": self.node_id.hex(), "host": self.host, "port": self.port, "public_key": self.public_key.hex()}
        # Written only when there are some: a manifest without workers keeps the canonical bytes (and round id) it had.
        return hop if not self.workers else {**hop, "workers": [{"host": h, "port": p} for h, p in self.workers]}

    @classmethod
    def read(cls, reader: FieldReader) -> AggregatorHop:
        address = _read_hop_address(reader)
        listed = reader.optional("workers")
        workers = read_sink_workers(reader, "workers") if listed else ()
        if listed and not workers:
            reader.fail("workers", "an empty list: leave it out")
        hop = cls(*address, workers=workers)
        reader.done()
        if hop.endpoints[0] in workers:
            reader.fail("workers", "the hop's own address is listed")
        return hop


def read_sink_workers(reader: FieldReader, key: str) -> tuple[tuple[str, int], ...]:
    """``key = [{ host, port }, ...]``: where the sink's ingest workers take packets (at most
    :data:`MAX_SINK_WORKERS`, none listed twice); a spec's ``sink_workers`` and a manifest's ``workers``."""
    workers: list[tuple[str, int]] = []
    for index, item in enumerate(reader.items(key, max_items=MAX_SINK_WORKERS)):
        worker = reader.nested(item, f"{reader.name(key)}[{index}]")
        address = (worker.text("host", max_len=255, pattern=_HOST_PATTERN), worker.integer("port", 1, _MAX_PORT))
        worker.done()
        if address in workers:
            worker.fail("port", f"{address[0]}:{address[1]} is listed twice")
        workers.append(address)
    return tuple(workers)


MAX_ROWS_PER_PEER = 10_000_000
"""The most rows a model-averaging round may ask each peer for (``task.rows_per_peer``)."""


MAX_SGD_LEARNING_RATE = 100.0
"""The largest γ0 an SGD round may sign (``[task] learning_rate``)."""


MAX_REGULARIZATION_RULE = 100.0
"""The largest λ rule a model-averaging round may sign (``[task] regularization_rule``: λ = rule / (rows_per_peer ε_T))."""


def _read_task_number(task: FieldReader, key: str, kind: TaskKind, owner: TaskKind, highest: float) -> float:
    """A number only ``owner`` rounds sign in ``[task]``: a canonical decimal string in (0, ``highest``]."""
    if kind != owner:
        task.fail(key, f"only a {str(owner)!r} task sets {key}; this is a {str(kind)!r} task")
    value = task.epsilon(key)
    if not 0 < value <= highest:
        task.fail(key, f"expected a number in (0, {highest:g}], got {value!r}")
    return value


def _read_loss(task: FieldReader, kind: TaskKind) -> SgdLoss:
    """An SGD round's signed loss (:class:`SgdLoss`)."""
    if kind != TaskKind.SGD:
        task.fail("loss", f"only an SGD task takes a loss's gradient; this is a {str(kind)!r} task")
    return SgdLoss(task.choice("loss", SGD_LOSSES))


@dataclass(frozen=True)
class RoundManifest:
    """DESIGN.md §4, field by field.

    ``features`` is the feature-spec dict of ``protocol._features`` (kept as
    plain JSON here so the manifest hash depends only on its canonical form).
    ``eps_median`` is the budget of one comparison bit of a median answer
    (one bit per numeric feature), ``eps_data`` the budget of one data subset,
    ``eps_total`` the record-level total promised to each peer: the sum over
    every release it can be asked for (DESIGN.md §8, issue 11). ``oracle`` is a frequency-oracle
    name or ``"auto"`` (the policy of DESIGN.md §8).

    ``comparison_pool`` (per mille, 0 for none) reserves that share of the
    peers for the median search: they form ``median_rounds`` pool partitions,
    numbered ``k_p …``, one per sub-round, and each answers ONE comparison bit
    at ``eps_median`` and sends no data; the peers of the ``k_p`` data
    partitions send their subsets and answer no comparison. Without a pool
    every data partition answers in one sub-round (``median_sub_round``).
    """

    name: str
    label: str
    features: Mapping[str, Any]
    k_p: int
    k_h: int
    k_s: int
    plan: str
    learner: str
    eps_median: float
    eps_data: float
    eps_total: float
    oracle: str
    schedule: RoundSchedule
    relays: tuple[RelayEntry, ...]
    aggregator_hop: AggregatorHop
    aggregator_url: str
    path_length: int
    geometry: Mapping[str, Any]
    token_public_key: bytes
    token_kid: bytes
    seed_commitment: bytes
    min_participation: int
    registration: RegistrationPolicy
    identity_key: bytes
    purpose: RoundPurpose = RoundPurpose.PRODUCTION
    max_roster: int = MAX_ROSTER
    """The most registrations the round admits (at most the protocol's :data:`MAX_ROSTER`)."""
    vote: str = DEFAULT_VOTE
    """How the ensemble combines its partitions' histograms (:class:`Combiner`); post-processing only."""
    comparison_pool: int = 0
    """Per mille of the peers reserved for the median search (0: every partition answers it)."""
    min_anonymity_set: int = 0
    """The fewest peers any survey may hide a report among (``participation.min_anonymity_set``): a round
    spec states it (default :data:`DEFAULT_MIN_ANONYMITY_SET`), ``round new`` refuses a spec whose
    smallest partition at ``min_participation`` falls below it, and a peer whose own partition is smaller
    refuses to send. 0: none stated (manifests made before the field existed)."""
    task_kind: str = TaskKind.ENSEMBLE
    """What the round computes from its reports (``[task] kind``, :class:`TaskKind`); the ensemble by default."""
    statistic_queries: tuple[str, ...] = ()
    """A statistics round's queries in their canonical spelling (``[task] queries``, :mod:`protocol._queries`);
    empty: the default set. With queries, ``features`` are exactly the ones they read."""
    rows_per_peer: int = 0
    """A model-averaging round's public minimum of rows per data peer (``[task] rows_per_peer``): its
    noise is calibrated to it, and a peer holding fewer refuses to release. 0 for every other kind."""
    sgd_learning_rate: float | None = None
    """An SGD round's γ0 (``[task] learning_rate``: step k moves by γ0/√k), signed so everyone can replay the
    published models; None: the learner's default (``learning.SGD_LEARNING_RATE``), and no field is written, so a
    manifest made before the field encodes (and hashes) as it did. Only an SGD round may set it."""
    sgd_loss: str | None = None
    """An SGD round's loss (``[task] loss``, :class:`SgdLoss`), whose clipped gradient each peer releases; None:
    logistic, and no field is written (manifests made before the field). Only an SGD round may set it."""
    regularization_rule: float | None = None
    """A model-averaging round's λ rule (``[task] regularization_rule``: λ = rule / (rows_per_peer ε_T)); None: the
    rule rounds used before the field (``learning.AVERAGING_RULE``), and no field is written."""
    categorical_weight: float | None = None
    """A model-averaging round's public weight of the categorical columns (``[task] categorical_weight`` in (0, 1]:
    each peer multiplies them by it before dividing its rows by the weights' norm, into the unit ball); None: the
    weight rounds used before the field (``learning.AVERAGING_CATEGORICAL_WEIGHT``), and no field is written."""
    version: int = PROTOCOL_VERSION
    _canonical: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "registration", RegistrationPolicy(self.registration))
        object.__setattr__(self, "purpose", RoundPurpose(self.purpose))
        # One validation path: the constructor's output must parse strictly.
        try:
            encoded = canonical_json(self._to_dict())
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidManifest("$", f"cannot encode the manifest: {exc}") from None
        RoundManifest._read(FieldReader(parse_json_object(encoded, max_bytes=MAX_MANIFEST_BYTES, error=InvalidManifest), "", InvalidManifest))
        object.__setattr__(self, "task_kind", TaskKind(self.task_kind))  # a known kind: _read refused any other
        object.__setattr__(self, "_canonical", encoded)

    @cached_property
    def round_id(self) -> bytes:
        """SHA-256 of the canonical encoding: the round's name (``SurveyId.round_id``).

        Computed once: a peer reads it a dozen times on its way to registering, and a demo worker runs
        thousands of peers (issue 26: their start-up held back the Adult demo's registrations)."""
        return hashlib.sha256(self._canonical).digest()

    @cached_property
    def labelled_reports(self) -> bool:
        """Whether a data report carries the label: always, but in a statistics round whose queries never count it."""
        return not self.statistic_queries or uses_label([StatisticQuery.parse(text) for text in self.statistic_queries])

    @property
    def median_rounds(self) -> int:
        return len(self.schedule.median)

    @property
    def partitions(self) -> int:
        """Every partition a credential can name: the ``k_p`` data partitions, then the pool's."""
        return self.k_p + (self.median_rounds if self.comparison_pool else 0)

    def is_pool_partition(self, partition: int) -> bool:
        """Whether ``partition`` is one of the comparison pool's (its peers send no data)."""
        return self.k_p <= partition < self.partitions

    def comparison_pool_size(self, peers: int) -> int:
        """How many of ``peers`` (the final roster) form the comparison pool: its share, rounded,
        and at least one peer per sub-round while the roster has them (0 without a pool)."""
        return comparison_pool_size(self.comparison_pool, peers, self.median_rounds)

    def answers_median(self, partition: int) -> bool:
        """Whether the peers of ``partition`` answer the median search (with a pool, only the pool's)."""
        if not self.median_rounds or not 0 <= partition < self.partitions:
            return False
        return self.is_pool_partition(partition) or not self.comparison_pool

    def median_sub_round(self, partition: int) -> int:
        """The one median sub-round in which the peers of ``partition`` answer.

        Pool partition ``k_p + s`` answers sub-round ``s``; without a pool,
        data partition ``p`` answers sub-round ``p % median_rounds``. Either
        way a step of the quantile search hears from about ``1 / median_rounds``
        of the peers that answer (the experiments' deal), not from one partition.
        """
        if not self.answers_median(partition):
            raise ValueError(f"the peers of partition {partition!r} answer no median sub-round")
        return partition - self.k_p if self.comparison_pool else partition % self.median_rounds

    def median_partitions(self, sub_round: int) -> range:
        """The partitions whose peers answer in median sub-round ``sub_round``."""
        if not 0 <= sub_round < self.median_rounds:
            raise ValueError(f"sub_round must be in [0, {self.median_rounds}), got {sub_round!r}")
        if self.comparison_pool:
            return range(self.k_p + sub_round, self.k_p + sub_round + 1)
        return range(sub_round, self.k_p, self.median_rounds)

    def median_survey(self, partition: int) -> SurveyId:
        """The median survey the peers of ``partition`` answer."""
        return SurveyId.median(self.round_id, partition, self.median_sub_round(partition))

    def canonical_bytes(self) -> bytes:
        return self._canonical

    def sphinx_geometry(self) -> SphinxGeometry:
        """The packet geometry of this round (every packet has the same size, DESIGN.md §5)."""
        return self._geometry

    @cached_property
    def _geometry(self) -> SphinxGeometry:
        return SphinxGeometry.from_dict(dict(self.geometry))

    def hop_windows(self, survey: SurveyId, attempt: Attempt = Attempt.FIRST) -> list[ReleaseWindow]:
        """Each hop's release window for a packet of ``survey`` sent in ``attempt`` (``protocol.hop_windows``)."""
        return hop_windows(self.schedule, survey, self.path_length, attempt)

    def path_hops(self, relays: Sequence[RelayEntry], windows: Sequence[ReleaseWindow]) -> list[PathHop]:
        """The Sphinx path through ``relays`` and on to the aggregator, each hop told its window."""
        if len(windows) != len(relays) + 1:
            raise InvalidManifest("path_length", f"{len(windows)} windows for {len(relays)} relays and the aggregator")
        hops = [PathHop(r.node_id, NodeAddress(r.host, r.port), r.public_key, w) for r, w in zip(relays, windows, strict=False)]
        last = self.aggregator_hop
        hops.append(PathHop(last.node_id, NodeAddress(last.host, last.port), last.public_key, windows[-1]))
        return hops

    def packet(self, relays: Sequence[RelayEntry], survey: SurveyId, message: bytes, attempt: Attempt = Attempt.FIRST) -> bytes:
        """A Sphinx packet carrying ``message`` (an encoded end-to-end message) through ``relays`` to the aggregator."""
        if relays:
            windows = hop_windows(self.schedule, survey, len(relays), attempt)
        else:  # straight to the aggregator (tests and benchmarks)
            windows = [ReleaseWindow(*acceptance_window(self.schedule, survey))]
        return build_packet(self._geometry, self.path_hops(relays, windows), message)

    def to_dict(self) -> dict[str, Any]:
        return self._to_dict()

    def _to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "name": self.name,
            # The kind is written only when it is not the ensemble, so a manifest made before
            # task kinds existed encodes (and hashes) as it did.
            "task": {"label": self.label, "features": dict(self.features),
                     **({"kind": str(self.task_kind)} if self.task_kind != TaskKind.ENSEMBLE else {}),
                     **({"queries": list(self.statistic_queries)} if self.statistic_queries else {}),
                     **({"rows_per_peer": self.rows_per_peer} if self.task_kind == TaskKind.MODEL_AVERAGING else {}),
                     **({"learning_rate": format_epsilon(self.sgd_learning_rate)} if self.sgd_learning_rate is not None else {}),
                     **({"loss": str(self.sgd_loss)} if self.sgd_loss is not None else {}),
                     **({"regularization_rule": format_epsilon(self.regularization_rule)} if self.regularization_rule is not None else {}),
                     **({"categorical_weight": format_epsilon(self.categorical_weight)} if self.categorical_weight is not None else {})},
            "learning": self._learning_dict(),
            "privacy": {
                "eps_median": format_epsilon(self.eps_median),
                "eps_data": format_epsilon(self.eps_data),
                "eps_total": format_epsilon(self.eps_total),
                "oracle": self.oracle,
            },
            "schedule": self.schedule.to_dict(),
            "network": {
                "relays": [relay.to_dict() for relay in self.relays],
                "aggregator": self.aggregator_hop.to_dict(),
                "path_length": self.path_length,
                "geometry": dict(self.geometry),
            },
            "aggregator_url": self.aggregator_url,
            "identity_key": self.identity_key.hex(),
            "token": {"public_key": self.token_public_key.hex(), "kid": self.token_kid.hex()},
            "seed_commitment": self.seed_commitment.hex(),
            "participation": {
                "min_participation": self.min_participation,
                "registration": str(self.registration),
                "purpose": str(self.purpose),
                "max_roster": self.max_roster,
                # Written only when stated, so that a manifest made before the
                # field existed encodes (and hashes) as it did.
                **({"min_anonymity_set": self.min_anonymity_set} if self.min_anonymity_set else {}),
            },
        }

    def _learning_dict(self) -> dict[str, Any]:
        learning: dict[str, Any] = {"k_p": self.k_p, "k_h": self.k_h, "k_s": self.k_s, "plan": self.plan, "learner": self.learner}
        # Written only when it is not the default, so that a manifest which
        # does not choose a vote encodes (and hashes) as before the field existed.
        if self.vote != DEFAULT_VOTE:
            learning["vote"] = self.vote
        if self.comparison_pool:
            learning["comparison_pool"] = self.comparison_pool
        return learning

    @classmethod
    def from_dict(cls, value: object) -> RoundManifest:
        """Strictly parse a manifest dict; raise InvalidManifest naming the bad field."""
        return cls._parse(value, "")

    @classmethod
    def _parse(cls, value: object, path: str) -> RoundManifest:
        reader = FieldReader(value, path, InvalidManifest)
        try:
            encoded = canonical_json(value)
        except (TypeError, ValueError) as exc:
            raise InvalidManifest("$", f"not canonically encodable: {exc}") from None
        if len(encoded) > MAX_MANIFEST_BYTES:
            raise InvalidManifest("$", f"manifest of {len(encoded)} bytes exceeds {MAX_MANIFEST_BYTES}")
        return cls._read(reader)

    @classmethod
    def from_json(cls, data: bytes | str) -> RoundManifest:
        return cls.from_dict(parse_json_object(data, max_bytes=MAX_MANIFEST_BYTES, error=InvalidManifest))

    @classmethod
    def _read(cls, reader: FieldReader) -> RoundManifest:
        version = reader.integer("version", PROTOCOL_VERSION, PROTOCOL_VERSION)
        name = reader.text("name", max_len=128, pattern=_NAME_PATTERN)
        task = reader.child("task")
        label = task.text("label", max_len=128)
        features = task.obj("features")
        task_kind = task.choice("kind", TASK_KINDS) if task.optional("kind") else TaskKind.ENSEMBLE
        if task.optional("kind") and task_kind == TaskKind.ENSEMBLE:
            # One encoding per manifest: the default is written by leaving the field out.
            task.fail("kind", f"{str(TaskKind.ENSEMBLE)!r} is the default: leave the field out")
        queries = _read_queries(task, TaskKind(task_kind), features) if task.optional("queries") else ()
        # A model's noise is calibrated to its peers' row count: signed with the kind, and only with it.
        rows_per_peer = task.integer("rows_per_peer", 1, MAX_ROWS_PER_PEER) if task_kind == TaskKind.MODEL_AVERAGING else 0
        kind = TaskKind(task_kind)
        learning_rate = _read_task_number(task, "learning_rate", kind, TaskKind.SGD, MAX_SGD_LEARNING_RATE) if task.optional("learning_rate") else None
        loss = _read_loss(task, kind) if task.optional("loss") else None
        rule = (_read_task_number(task, "regularization_rule", kind, TaskKind.MODEL_AVERAGING, MAX_REGULARIZATION_RULE)
                if task.optional("regularization_rule") else None)
        weight = _read_task_number(task, "categorical_weight", kind, TaskKind.MODEL_AVERAGING, 1.0) if task.optional("categorical_weight") else None
        task.done()
        learning = reader.child("learning")
        k_p = learning.integer("k_p", 1, 4096)
        k_h = learning.integer("k_h", 1, 64)
        k_s = learning.integer("k_s", 1, 16)
        plan = learning.choice("plan", PLANS)
        learner = learning.text("learner", max_len=64, pattern=_NAME_PATTERN)
        vote = learning.choice("vote", VOTES) if learning.optional("vote") else DEFAULT_VOTE
        if learning.optional("vote") and vote == DEFAULT_VOTE:
            # One encoding per manifest: the default is written by leaving the field out.
            learning.fail("vote", f"{DEFAULT_VOTE!r} is the default: leave the field out")
        # Per mille, so the canonical form stays integers; 0 is written by leaving the field out.
        comparison_pool = learning.integer("comparison_pool", 1, 999) if learning.optional("comparison_pool") else 0
        learning.done()
        privacy = reader.child("privacy")
        eps_median = privacy.epsilon("eps_median")
        eps_data = privacy.epsilon("eps_data")
        eps_total = privacy.epsilon("eps_total")
        oracle = privacy.text("oracle", max_len=32, pattern=r"[a-z0-9_\-]+")
        privacy.done()
        if eps_data <= 0:
            privacy.fail("eps_data", f"must be positive, got {eps_data!r}")
        schedule = RoundSchedule.read(reader.child("schedule"))
        network = reader.child("network")
        relays = tuple(
            RelayEntry.read(network.nested(item, f"{network.name('relays')}[{index}]"))
            for index, item in enumerate(network.items("relays", max_items=MAX_RELAYS))
        )
        aggregator_hop = AggregatorHop.read(network.child("aggregator"))
        path_length = network.integer("path_length", 1, 16)
        geometry = network.obj("geometry")
        network.done()
        if len(relays) < path_length:
            network.fail("path_length", f"{path_length!r} relays per path but only {len(relays)} in the directory")
        if len({relay.node_id for relay in relays}) != len(relays):
            network.fail("relays", "duplicate node_id")
        aggregator_url = reader.text("aggregator_url", max_len=512, pattern=_URL_PATTERN)
        identity_key = reader.hex("identity_key", size=32)
        token = reader.child("token")
        token_public_key = token.hex("public_key", max_size=1024)
        token_kid = token.hex("kid", max_size=64)
        token.done()
        commitment = reader.hex("seed_commitment", size=32)
        participation = reader.child("participation")
        min_participation = participation.integer("min_participation", 1, 2**31)
        registration = RegistrationPolicy(participation.choice("registration", REGISTRATION_POLICIES))
        purpose = RoundPurpose(participation.choice("purpose", tuple(p.value for p in RoundPurpose)))
        max_roster = participation.integer("max_roster", 1, MAX_ROSTER)
        # 0 is written by leaving the field out: one encoding per manifest.
        min_anonymity_set = participation.integer("min_anonymity_set", 1, MAX_ROSTER) if participation.optional("min_anonymity_set") else 0
        participation.done()
        reader.done()
        if registration is RegistrationPolicy.OPEN and purpose is RoundPurpose.PRODUCTION:
            participation.fail("registration", "open registration admits Sybils for free: only a demo or test round may use it")
        if min_participation > max_roster:
            participation.fail("min_participation", f"{min_participation!r} exceeds max_roster={max_roster!r}")
        if comparison_pool and not schedule.median:
            learning.fail("comparison_pool", "a comparison pool answers the median search: the schedule has no median sub-round")
        if not comparison_pool and len(schedule.median) > k_p:
            reader.fail_at(reader.name("schedule.median"), f"{len(schedule.median)} median sub-rounds but only k_p={k_p!r} partitions")
        manifest = object.__new__(cls)
        values: dict[str, Any] = dict(
            name=name, label=label, features=features, k_p=k_p, k_h=k_h, k_s=k_s, plan=plan, learner=learner,
            eps_median=eps_median, eps_data=eps_data, eps_total=eps_total, oracle=oracle, schedule=schedule,
            relays=relays, aggregator_hop=aggregator_hop, aggregator_url=aggregator_url, path_length=path_length,
            geometry=geometry, token_public_key=token_public_key, token_kid=token_kid, seed_commitment=commitment,
            min_participation=min_participation, registration=registration, identity_key=identity_key,
            purpose=purpose, max_roster=max_roster, vote=vote, comparison_pool=comparison_pool,
            min_anonymity_set=min_anonymity_set, task_kind=TaskKind(task_kind), statistic_queries=queries,
            rows_per_peer=rows_per_peer, sgd_learning_rate=learning_rate, sgd_loss=loss, regularization_rule=rule,
            categorical_weight=weight, version=version,
        )
        for key, item in values.items():
            object.__setattr__(manifest, key, item)
        object.__setattr__(manifest, "_canonical", canonical_json(manifest._to_dict()))
        return manifest


def _read_queries(task: FieldReader, kind: TaskKind, features: Mapping[str, Any]) -> tuple[str, ...]:
    """``task.queries``: a statistics round's queries, canonically spelt, over exactly the features they read."""
    from anonml.protocol._features import FeatureSpec, FeatureSpecError

    if kind != TaskKind.STATISTICS:
        task.fail("queries", f"only a {str(TaskKind.STATISTICS)!r} task takes queries, this one is {str(kind)!r}")
    try:
        spec = FeatureSpec.from_dict(dict(features))
        queries = check_queries(task.raw("queries"), spec)
    except FeatureSpecError as exc:
        task.fail("features", str(exc))
    except QueryError as exc:
        task.fail("queries", str(exc))
    texts = tuple(query.text for query in queries)
    if list(texts) != task.raw("queries"):
        # One encoding per manifest: the spec parser writes each query in its canonical spelling.
        task.fail("queries", f"not in canonical spelling: expected {list(texts)!r}")
    unread = [name for name in spec.names if name not in queried_features(queries, spec.names)]
    if unread:
        task.fail("features", f"{', '.join(map(repr, unread))} read by no query: a peer releases only what the queries need")
    return texts


def _signed_bytes(round_id: bytes) -> bytes:
    return _MANIFEST_DOMAIN + round_id


@dataclass(frozen=True)
class SignedManifest:
    """A manifest with the aggregator's Ed25519 signature over its ``round_id``."""

    manifest: RoundManifest
    signature: bytes

    @property
    def round_id(self) -> bytes:
        return self.manifest.round_id

    @classmethod
    def sign(cls, manifest: RoundManifest, signing_key: SigningKey) -> SignedManifest:
        if bytes(signing_key.verify_key) != manifest.identity_key:
            raise InvalidManifest("identity_key", "the signing key does not match the manifest's identity_key")
        return cls(manifest, signing_key.sign(_signed_bytes(manifest.round_id)).signature)

    def verify(self, expected_identity: bytes | None = None) -> None:
        """Check the signature; with ``expected_identity`` also that the signer is that key.

        Raises InvalidManifest (field ``"signature"`` or ``"identity_key"``).
        """
        if expected_identity is not None and not hmac.compare_digest(expected_identity, self.manifest.identity_key):
            raise InvalidManifest("identity_key", f"signed by {self.manifest.identity_key.hex()!r}, expected {expected_identity.hex()!r}")
        if not ed25519_holds(self.manifest.identity_key, _signed_bytes(self.round_id), self.signature):
            raise InvalidManifest("signature", "the manifest signature does not verify") from None

    def to_dict(self) -> dict[str, Any]:
        return {"manifest": self.manifest.to_dict(), "signature": self.signature.hex(), "round_id": self.round_id.hex()}

    def to_json(self) -> bytes:
        return self._json

    @cached_property
    def _json(self) -> bytes:
        # Encoded once: every peer records the manifest it registers under (peer._join.check_manifest_unchanged).
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, value: object, *, expected_identity: bytes | None = None) -> SignedManifest:
        """Strictly parse and verify; raises InvalidManifest naming the bad field."""
        reader = FieldReader(value, "", InvalidManifest)
        manifest = RoundManifest._parse(reader.raw("manifest"), "manifest")
        signature = reader.hex("signature", size=64)
        round_id = reader.hex("round_id", size=ROUND_ID_BYTES)
        reader.done()
        if not hmac.compare_digest(round_id, manifest.round_id):
            raise InvalidManifest("round_id", f"{round_id.hex()!r} is not the hash of the manifest ({manifest.round_id.hex()!r})")
        signed = cls(manifest, signature)
        signed.verify(expected_identity)
        return signed

    @classmethod
    def from_json(cls, data: bytes | str, *, expected_identity: bytes | None = None) -> SignedManifest:
        return cls.from_dict(
            parse_json_object(data, max_bytes=MAX_MANIFEST_BYTES + 1024, error=InvalidManifest),
            expected_identity=expected_identity,
        )
