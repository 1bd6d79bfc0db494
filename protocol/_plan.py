"""Release plans: which peers form which partition, which feature subsets
each partition releases, and with what privacy budget.

Everything is derived deterministically from a public seed (DESIGN.md §3
step 3): peers are ordered by ``SHA-256(seed ‖ peer_key)`` and dealt
round-robin into ``k_p`` partitions (sizes equal ±1); feature subsets come
from feature orders hashed the same way. Anyone holding the roster and the
revealed seed recomputes the same plan, so the aggregator cannot pick
partitions.

Privacy is record-level (DESIGN.md §8): a peer's ε is the SUM of the ε of
every release it makes, each comparison bit of the quantile search and each
subset report. A plan divides the promised ``ε_T`` so that the costliest
peer's sum is exactly ``ε_T``.

Two kinds (DESIGN.md §9):

* ``"split"`` — the thesis's plan (§6.1): each partition is asked for ``k_h``
  disjoint subsets of ``k_s`` features; every peer sends all ``k_h``.
* ``"one"`` — each partition releases exactly one subset (``k_h = 1``) and
  the ``k_p`` subsets are dealt so that every feature is covered as evenly
  as possible.

Who answers the quantile search (thesis Algorithm 1, §7.2.1, generalised to
several cut points) is ``median_peers``:

* ``"reserved"`` — a pool of ``comparison_pool`` of the peers (the first in
  the seeded order) answers it and sends nothing else; every other peer sends
  its subsets. With ``kind="one"`` every peer makes exactly ONE release at
  the full ``ε_T`` (one comparison or one subset report): the default.
* ``"all"`` — the thesis's choice: every peer answers once for every numeric
  feature, so ``ε_T = n_numeric·ε_e + k_h·ε_h``.
* ``"disjoint"`` — peers answer only for the numeric features their
  partition does not release.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from anonml.base.display import one_of
from anonml.base.errors import InputError
from anonml.protocol._features import MAX_FEATURES, FeatureSpec
from anonml.protocol._vocabulary import DEFAULT_COMPARISON_POOL, DEFAULT_MEDIAN_STEPS, MAX_MEDIAN_STEPS, MAX_PARTITIONS, MEDIAN_PEERS, PLAN_KINDS, MedianPeers

SEED_BYTES = 32

IntArray = npt.NDArray[np.int64]


class PlanError(InputError):
    """Raised when plan parameters cannot be satisfied (e.g. more subset slots
    than features) or a serialised plan is malformed; names the field."""


def _hash_order(seed: bytes, tag: bytes, keys: Sequence[bytes]) -> list[int]:
    """Indices of ``keys`` sorted by SHA-256(seed ‖ tag ‖ key); ties (equal
    keys) broken by position so the order is total."""
    digests = [hashlib.sha256(seed + tag + key).digest() for key in keys]
    return sorted(range(len(keys)), key=lambda i: (digests[i], i))


def row_keys(n: int) -> list[bytes]:
    """Peer keys for in-process simulation: row id ``i`` as 8 big-endian bytes."""
    return [i.to_bytes(8, "big") for i in range(n)]


@dataclass(frozen=True)
class Assignment:
    """Where each peer sits: ``rank[i]`` is peer ``i``'s position in the
    seeded order and ``partition[i]`` its data partition, dealt round-robin
    (``COMPARISON_POOL`` for a peer of a reserved comparison pool)."""

    rank: IntArray
    partition: IntArray

    COMPARISON_POOL = -1

    def members(self, partition: int) -> IntArray:
        return np.flatnonzero(self.partition == partition)


def assign_partitions(seed: bytes, keys: Sequence[bytes], k_p: int, *, pool: int = 0) -> Assignment:
    """Order peers by SHA-256(seed ‖ key); the first ``pool`` form the
    comparison pool and the rest are dealt into ``k_p`` partitions."""
    _check_int("k_p", k_p, 1, MAX_PARTITIONS)
    _check_int("pool", pool, 0, len(keys))
    order = _hash_order(seed, b"anonml/partition/v1", keys)
    rank = np.empty(len(keys), dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(len(keys), dtype=np.int64)
    partition = np.where(rank < pool, Assignment.COMPARISON_POOL, (rank - pool) % k_p)
    return Assignment(rank=rank, partition=partition)


def _check_int(field: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PlanError(f"{field}: expected an integer in [{low}, {high}], got {value!r}")
    return value


def _check_epsilon(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PlanError(f"{field}: expected a finite non-negative number, got {value!r}")
    return float(value)


def _feature_order(seed: bytes, features: Sequence[str], round_: int) -> list[str]:
    keys = [name.encode() for name in features]
    tag = b"anonml/subsets/v1/" + round_.to_bytes(4, "big")
    return [features[i] for i in _hash_order(seed, tag, keys)]


def derive_subsets(seed: bytes, features: Sequence[str], kind: str, k_p: int, k_h: int, k_s: int) -> tuple[tuple[tuple[str, ...], ...], ...]:
    """Feature subsets per partition, from the seed.

    ``"split"``: partition ``p`` takes a fresh seeded order of the features and
    cuts its first ``k_h·k_s`` into ``k_h`` disjoint subsets. ``"one"``: the
    ``k_p`` subsets are cut from a stream of successive seeded orders, so
    every feature appears ``⌊k_p·k_s/k_f⌋`` or one more times.
    """
    names = list(features)
    k_f = len(names)
    if kind not in PLAN_KINDS:
        raise PlanError(f"kind: expected one of {one_of(PLAN_KINDS)}, got {kind!r}")
    if len(set(names)) != k_f or not 1 <= k_f <= MAX_FEATURES:
        raise PlanError(f"features: expected 1 to {MAX_FEATURES} distinct names, got {names!r}")
    _check_int("k_p", k_p, 1, MAX_PARTITIONS)
    _check_int("k_s", k_s, 1, k_f)
    if kind == "split":
        _check_int("k_h", k_h, 1, k_f)
        if k_h * k_s > k_f:
            raise PlanError(f"k_h: {k_h} disjoint subsets of {k_s} features need {k_h * k_s} features, only {k_f} exist")
        out = []
        for p in range(k_p):
            order = _feature_order(seed, names, p)
            out.append(tuple(tuple(order[j * k_s:(j + 1) * k_s]) for j in range(k_h)))
        return tuple(out)
    if k_h != 1:
        raise PlanError(f"k_h: the 'one' plan sends one subset per peer, so k_h must be 1, got {k_h!r}")
    if k_p * k_s < k_f:
        raise PlanError(f"k_p: {k_p} partitions of one {k_s}-feature subset cannot cover {k_f} features")
    stream: list[str] = []
    round_ = 0
    subsets: list[tuple[tuple[str, ...], ...]] = []
    while len(subsets) < k_p:
        subset: list[str] = []
        while len(subset) < k_s:
            # Refill with the next seeded order; take the first feature not
            # already in this subset (only possible at an order boundary).
            if all(name in subset for name in stream):
                stream.extend(_feature_order(seed, names, round_))
                round_ += 1
            pick = next(i for i, name in enumerate(stream) if name not in subset)
            subset.append(stream.pop(pick))
        subsets.append((tuple(subset),))
    return tuple(subsets)


PeerReleases = tuple[dict[str, float], list[tuple[tuple[str, ...], float]]]
"""What one peer releases, in the form ``mechanisms.total_epsilon`` takes: ``(medians, subsets)``."""


class PeerRole(StrEnum):
    """The kinds of peer a round makes; which one a peer is follows from the seed (its partition)."""

    PEER = "peer"
    """Without a comparison pool: the partition's median answer (if any) and its subset reports."""
    COMPARISON_POOL = "comparison-pool"
    """A peer of a reserved comparison pool: one comparison bit, nothing else."""
    DATA = "data"
    """A data peer of a round with a comparison pool: its subset reports, no comparison."""


def release_roles(
    spec: FeatureSpec, *, k_h: int, k_s: int, eps_median: float, eps_data: float, median_rounds: int,
    comparison_pool: bool = False,
) -> dict[PeerRole, PeerReleases]:
    """What each kind of peer of a round can at worst be asked for, before partitions are known.

    Without a pool there is one kind: every numeric feature answered at
    ``eps_median`` (if the round has a median phase, ``median_rounds > 0``)
    and ``k_h`` subset releases of ``k_s`` features at ``eps_data``. With a
    pool there are two: a pool peer's one comparison at ``eps_median`` (about
    a feature it draws at random; the first numeric feature stands for it, as
    every one costs the same) and a data peer's ``k_h`` subset releases.

    Why this is the worst case: the subsets a peer sends come from the seed
    (DESIGN.md §3 step 3), which stays secret until registration closes, so
    neither the promise nor the consent can depend on them. The record-level
    sum does not depend on the deal at all (every subset report costs
    ``eps_data``); the features are ordered so that the secondary eq. 7.4
    figure (``ε_f^i = ε_h + ε_e^i``, ``ε_l = Σ_j ε_h^j``, the max) is also the
    worst deal's: subsets holding the numeric features that also paid for the
    median search.

    A manifest asking for more subset slots than there are features
    (``k_h·k_s > k_f``) cannot be dealt at all: :func:`derive_subsets` refuses
    it once the seed is known. Rather than fail before that, each empty slot
    counts the first feature again (eq. 7.4 sums a feature released twice),
    so every slot still costs the label its ``eps_data``.
    """
    pooled = comparison_pool and bool(median_rounds) and bool(spec.numeric_names)
    medians = {name: eps_median for name in spec.numeric_names} if median_rounds and not pooled else {}
    names = spec.names
    worst_first = sorted(names, key=lambda name: -medians.get(name, 0.0))
    subsets = [
        (tuple(worst_first[j * k_s:(j + 1) * k_s]) or (names[0],), eps_data) for j in range(k_h)
    ]
    if not pooled:
        return {PeerRole.PEER: (medians, subsets)}
    return {PeerRole.COMPARISON_POOL: ({spec.numeric_names[0]: eps_median}, []), PeerRole.DATA: ({}, subsets)}


def worst_case_releases(
    spec: FeatureSpec, *, k_h: int, k_s: int, eps_median: float, eps_data: float, median_rounds: int,
    comparison_pool: bool = False,
) -> PeerReleases:
    """The releases of the costliest kind of peer (:func:`release_roles`), by record-level sum.

    The aggregator promises the record-level sum of exactly this as the
    manifest's ε_T, and each peer checks the same sum against its ledger
    before consenting, so both sides must use this one rule.
    """
    return costliest(release_roles(
        spec, k_h=k_h, k_s=k_s, eps_median=eps_median, eps_data=eps_data, median_rounds=median_rounds,
        comparison_pool=comparison_pool,
    ))


def costliest(roles: Mapping[PeerRole, PeerReleases]) -> PeerReleases:
    """The releases of the kind of peer whose record-level sum is largest (the first on a tie)."""
    from anonml.mechanisms import total_epsilon

    return max(roles.values(), key=lambda releases: total_epsilon(*releases))


@dataclass(frozen=True)
class ReleasePlan:
    """A complete release plan; build one with :meth:`build`.

    ``release_epsilon`` (ε_h) is the budget of one subset report,
    ``median_epsilon`` (ε_e) that of one comparison answer (one bit) of the
    quantile search; ``comparison_pool`` the share of peers in a reserved
    comparison pool (0 unless ``median_peers == "reserved"``).
    """

    kind: str
    k_p: int
    k_h: int
    k_s: int
    seed: bytes
    features: tuple[str, ...]
    numeric_features: tuple[str, ...]
    subsets: tuple[tuple[tuple[str, ...], ...], ...]
    release_epsilon: float
    median_epsilon: float
    median_peers: str
    median_steps: int
    oracle: str
    comparison_pool: float = 0.0

    @classmethod
    def build(
        cls,
        *,
        kind: str,
        features: Sequence[str],
        numeric_features: Sequence[str],
        k_p: int,
        k_h: int,
        k_s: int,
        epsilon_total: float,
        seed: bytes,
        oracle: str = "auto",
        median_peers: str = MedianPeers.RESERVED,
        median_share: float = 0.5,
        median_steps: int = DEFAULT_MEDIAN_STEPS,
        comparison_pool: float = DEFAULT_COMPARISON_POOL,
    ) -> ReleasePlan:
        """Derive subsets from ``seed`` and divide the record-level
        ``epsilon_total`` (ε_T) between comparison answers and subset reports
        so that the costliest peer's sum is ε_T.

        ``"reserved"``: a pool peer answers one comparison at ``ε_e = ε_T``;
        every other peer sends ``k_h`` reports at ``ε_h = ε_T/k_h``
        (``comparison_pool`` is the pool's share of the peers). ``"all"`` and
        ``"disjoint"``: ``median_share`` of ε_T goes to the comparisons, split
        evenly over the most any peer answers (every numeric feature for
        "all"), the rest to the ``k_h`` reports.
        """
        eps_t = _check_epsilon("epsilon_total", epsilon_total)
        if eps_t <= 0:
            raise PlanError(f"epsilon_total: must be positive, got {epsilon_total!r}")
        if median_peers not in MEDIAN_PEERS:
            raise PlanError(f"median_peers: expected one of {one_of(MEDIAN_PEERS)}, got {median_peers!r}")
        share = _check_epsilon("median_share", median_share)
        pool = _check_epsilon("comparison_pool", comparison_pool) if numeric_features and median_peers == MedianPeers.RESERVED else 0.0
        if numeric_features and median_peers != MedianPeers.RESERVED and not 0 < share < 1:
            raise PlanError(f"median_share: expected a number in (0, 1), got {median_share!r}")
        if numeric_features and median_peers == MedianPeers.RESERVED and not 0 < pool < 1:
            raise PlanError(f"comparison_pool: expected a number in (0, 1), got {comparison_pool!r}")
        _check_int("k_h", k_h, 1, MAX_FEATURES)
        subsets = derive_subsets(seed, features, kind, k_p, k_h, k_s)
        if not numeric_features:
            eps_e, eps_h = 0.0, eps_t / k_h
        elif median_peers == MedianPeers.RESERVED:
            eps_e, eps_h = eps_t, eps_t / k_h
        else:
            released = [{n for s in part for n in s} for part in subsets]
            most = max(
                len(numeric_features) if median_peers == MedianPeers.ALL else sum(1 for f in numeric_features if f not in r)
                for r in released
            )
            eps_e = share * eps_t / max(most, 1)
            eps_h = (1 - share) * eps_t / k_h if most else eps_t / k_h
        plan = cls(
            kind=kind, k_p=k_p, k_h=k_h, k_s=k_s, seed=seed, features=tuple(features),
            numeric_features=tuple(numeric_features), subsets=subsets, release_epsilon=eps_h,
            median_epsilon=eps_e, median_peers=str(median_peers), median_steps=median_steps, oracle=str(oracle),
            comparison_pool=pool,
        )
        plan.validate()
        return plan

    def validate(self) -> None:
        if self.kind not in PLAN_KINDS:
            raise PlanError(f"kind: expected one of {one_of(PLAN_KINDS)}, got {self.kind!r}")
        if not isinstance(self.seed, bytes) or not 1 <= len(self.seed) <= 64:
            raise PlanError(f"seed: expected 1 to 64 bytes, got {self.seed!r}")
        if self.subsets != derive_subsets(self.seed, self.features, self.kind, self.k_p, self.k_h, self.k_s):
            raise PlanError("subsets: do not match the subsets derived from the seed")
        unknown = [f for f in self.numeric_features if f not in self.features]
        if unknown:
            raise PlanError(f"numeric_features: unknown features {unknown!r}")
        _check_epsilon("release_epsilon", self.release_epsilon)
        _check_epsilon("median_epsilon", self.median_epsilon)
        if self.median_peers not in MEDIAN_PEERS:
            raise PlanError(f"median_peers: expected one of {one_of(MEDIAN_PEERS)}, got {self.median_peers!r}")
        _check_int("median_steps", self.median_steps, 1, MAX_MEDIAN_STEPS)
        pool = _check_epsilon("comparison_pool", self.comparison_pool)
        if pool >= 1 or (pool > 0) != (self.median_peers == MedianPeers.RESERVED and bool(self.numeric_features)):
            raise PlanError(f"comparison_pool: expected a share in (0, 1) exactly for a reserved pool, got {self.comparison_pool!r}")
        if not isinstance(self.oracle, str) or not self.oracle:
            raise PlanError(f"oracle: expected a mechanism name, got {self.oracle!r}")
        for name in self.numeric_features:
            if self.median_peers != MedianPeers.RESERVED and not self.median_partitions(name):
                raise PlanError(f"median_peers: every partition releases {name!r}, so no peer can answer its median search without paying twice; use median_peers='all'")

    def released_features(self, partition: int) -> set[str]:
        return {name for subset in self.subsets[partition] for name in subset}

    def median_partitions(self, feature: str) -> tuple[int, ...]:
        """The data partitions whose peers answer the quantile search of
        ``feature`` (none with a reserved pool)."""
        if self.median_peers == MedianPeers.RESERVED:
            return ()
        if self.median_peers == MedianPeers.ALL:
            return tuple(range(self.k_p))
        return tuple(p for p in range(self.k_p) if feature not in self.released_features(p))

    def median_epsilon_by_feature(self, partition: int) -> dict[str, float]:
        """ε_e^i for a peer of ``partition``, for the features it is asked about."""
        return {f: self.median_epsilon for f in self.numeric_features if partition in self.median_partitions(f)}

    def releases_of_partition(self, partition: int) -> tuple[dict[str, float], list[tuple[tuple[str, ...], float]]]:
        """What one peer of ``partition`` releases, as ``(medians, subsets)``
        (``Assignment.COMPARISON_POOL``: one comparison, named by the first
        numeric feature; every pool peer answers about one feature)."""
        if partition == Assignment.COMPARISON_POOL:
            return {self.numeric_features[0]: self.median_epsilon}, []
        return self.median_epsilon_by_feature(partition), [(subset, self.release_epsilon) for subset in self.subsets[partition]]

    def epsilon_of_partition(self, partition: int) -> float:
        """The record-level ε of one peer of ``partition`` (the sum of its releases)."""
        from anonml.mechanisms import total_epsilon

        return float(total_epsilon(*self.releases_of_partition(partition)))

    def peer_groups(self) -> list[int]:
        """Every kind of peer: the data partitions and, with a reserved pool, ``COMPARISON_POOL``."""
        return [*range(self.k_p), *([Assignment.COMPARISON_POOL] if self.comparison_pool > 0 else [])]

    @property
    def epsilon_total(self) -> float:
        """The record-level ε_T, comparison cost included: the costliest peer's sum."""
        return max(self.epsilon_of_partition(p) for p in self.peer_groups())

    def pool_size(self, n: int) -> int:
        """Peers in the comparison pool out of ``n`` (0 without one)."""
        return int(round(self.comparison_pool * n)) if self.comparison_pool > 0 else 0

    def assign(self, keys: Sequence[bytes]) -> Assignment:
        """Where every peer sits under this plan (:func:`assign_partitions` with the pool)."""
        return assign_partitions(self.seed, keys, self.k_p, pool=self.pool_size(len(keys)))

    def median_groups(self, feature: str, assignment: Assignment) -> list[IntArray]:
        """Peers (row indices) answering each step of Algorithm 1 for
        ``feature``, each answering once: the eligible peers in seeded order
        dealt round-robin into ``median_steps`` groups.

        With a reserved pool the pool is dealt over the steps the same way
        (a round's pool partition ``k_p + s`` answers sub-round ``s``), and
        each pool peer answers about ONE numeric feature that it draws
        uniformly at random, as a round's pool peer does: the draw comes from
        the plan's seed, so every feature's groups agree on who drew it."""
        if self.median_peers == MedianPeers.RESERVED:
            pool = assignment.members(Assignment.COMPARISON_POOL)
            pool = pool[np.argsort(assignment.rank[pool], kind="stable")]
            steps = [pool[step::self.median_steps] for step in range(self.median_steps)]
            draw = np.random.default_rng(list(hashlib.sha256(self.seed + b"anonml/pool-features/v1").digest()))
            drawn = draw.integers(0, len(self.numeric_features), size=pool.size)
            features = [drawn[step::self.median_steps] for step in range(self.median_steps)]
            index = self.numeric_features.index(feature)
            return [members[chosen == index] for members, chosen in zip(steps, features, strict=True)]
        peers = np.flatnonzero(np.isin(assignment.partition, self.median_partitions(feature)))
        peers = peers[np.argsort(assignment.rank[peers], kind="stable")]
        return [peers[step::self.median_steps] for step in range(self.median_steps)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "k_p": self.k_p, "k_h": self.k_h, "k_s": self.k_s, "seed": self.seed.hex(),
            "features": list(self.features), "numeric_features": list(self.numeric_features),
            "subsets": [[list(s) for s in part] for part in self.subsets],
            "release_epsilon": self.release_epsilon, "median_epsilon": self.median_epsilon,
            "median_peers": self.median_peers, "median_steps": self.median_steps, "oracle": self.oracle,
            "comparison_pool": self.comparison_pool,
        }

    @classmethod
    def from_dict(cls, data: object) -> ReleasePlan:
        """Parse and validate (the subsets must be the ones the seed derives)."""
        fields = {"kind", "k_p", "k_h", "k_s", "seed", "features", "numeric_features", "subsets", "release_epsilon", "median_epsilon", "median_peers", "median_steps", "oracle", "comparison_pool"}
        if not isinstance(data, Mapping):
            raise PlanError(f"plan: expected a mapping, got {data!r}")
        if set(data) != fields:
            raise PlanError(f"plan: missing {sorted(fields - set(data))!r}, unknown {sorted(map(str, set(data) - fields))!r}")
        try:
            seed = bytes.fromhex(data["seed"])
        except (TypeError, ValueError):
            raise PlanError(f"seed: expected hex, got {data['seed']!r}") from None
        for key in ("features", "numeric_features"):
            if not isinstance(data[key], list) or not all(isinstance(v, str) for v in data[key]) or len(data[key]) > MAX_FEATURES:
                raise PlanError(f"{key}: expected a list of feature names, got {data[key]!r}")
        subsets_raw = data["subsets"]
        if not isinstance(subsets_raw, list) or len(subsets_raw) > MAX_PARTITIONS or not all(
            isinstance(part, list) and len(part) <= MAX_FEATURES and all(isinstance(s, list) and len(s) <= MAX_FEATURES and all(isinstance(n, str) for n in s) for s in part)
            for part in subsets_raw
        ):
            raise PlanError(f"subsets: expected a list of lists of feature-name lists, got {subsets_raw!r}")
        for key in ("k_p", "k_h", "k_s"):
            _check_int(key, data[key], 1, MAX_PARTITIONS)
        plan = cls(
            kind=data["kind"], k_p=data["k_p"], k_h=data["k_h"], k_s=data["k_s"], seed=seed,
            features=tuple(data["features"]), numeric_features=tuple(data["numeric_features"]),
            subsets=tuple(tuple(tuple(s) for s in part) for part in subsets_raw),
            release_epsilon=_check_epsilon("release_epsilon", data["release_epsilon"]),
            median_epsilon=_check_epsilon("median_epsilon", data["median_epsilon"]),
            median_peers=data["median_peers"], median_steps=data["median_steps"], oracle=data["oracle"],
            comparison_pool=_check_epsilon("comparison_pool", data["comparison_pool"]),
        )
        plan.validate()
        return plan
