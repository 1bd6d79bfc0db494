"""The round's rules every role must compute identically, written once (issue 10).

:class:`PartitionPlan` is what follows from a manifest and its final roster:
the partition seed ``H(seed ‖ roster root ‖ r_1 ‖ … ‖ r_m)`` (DESIGN.md §3 step 3), each
peer's partition, the partition sizes, the feature subsets per partition and
the frequency oracle of each data survey. The peer and the aggregator both
build it; if they disagreed, every report would be rejected as malformed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from anonml.mechanisms import FrequencyOracle, make_oracle
from anonml.protocol._api import partition_seed
from anonml.protocol._features import FeatureSpec
from anonml.protocol._manifest import RoundManifest
from anonml.protocol._plan import Assignment, assign_partitions, derive_subsets


@lru_cache(maxsize=1024)
def survey_oracle(name: str, epsilon: float, m: int, n: int) -> FrequencyOracle:
    """The frequency oracle of a data survey over a domain of ``m`` values in a partition of ``n`` peers.

    ``"auto"`` chooses by ``n`` (DESIGN.md §8). Built once per process: a
    round has at most ``k_p · k_h`` of them and thousands of peers ask.
    """
    return make_oracle(name, epsilon, m, n=max(n, 1))


@dataclass(frozen=True)
class PartitionPlan:
    """Partitions, subsets and oracles of one round, derived from public values only."""

    manifest: RoundManifest
    spec: FeatureSpec
    seed: bytes
    """The partition seed, ``H(revealed seed ‖ roster root ‖ relays' beacon values)`` (``protocol.partition_seed``)."""
    keys: tuple[bytes, ...]
    partition_of: dict[bytes, int] = field(repr=False)
    sizes: tuple[int, ...]
    """Peers per partition, the pool's after the ``k_p`` data partitions'."""
    subsets: tuple[tuple[tuple[str, ...], ...], ...]

    @classmethod
    def derive(cls, manifest: RoundManifest, spec: FeatureSpec, keys: Sequence[bytes], revealed_seed: bytes, root: bytes,
               reveals: Sequence[bytes] = ()) -> PartitionPlan:
        """Order ``keys`` (the roster) by ``H(partition seed ‖ key)``, deal them into partitions, cut the subsets.

        ``reveals`` are the relays' beacon values in the signed head's order
        (none for a round whose manifest lists no mirror).

        With a comparison pool the first ``comparison_pool_size`` peers of the
        order are dealt round-robin into the pool partitions ``k_p …`` (one per
        median sub-round) and the rest into the ``k_p`` data partitions.
        """
        seed = partition_seed(revealed_seed, root, reveals)
        ordered = tuple(keys)
        assignment = assign_partitions(seed, list(ordered), manifest.k_p, pool=manifest.comparison_pool_size(len(ordered)))
        partitions = np.where(
            assignment.partition == Assignment.COMPARISON_POOL,
            manifest.k_p + assignment.rank % max(manifest.median_rounds, 1),
            assignment.partition,
        )
        sizes = np.bincount(partitions, minlength=manifest.partitions)
        subsets = derive_subsets(seed, spec.names, manifest.plan, manifest.k_p, manifest.k_h, manifest.k_s)
        return cls(
            manifest, spec, seed, ordered,
            {key: int(p) for key, p in zip(ordered, partitions, strict=True)},
            tuple(int(size) for size in sizes), subsets,
        )

    def subsets_of(self, partition: int) -> tuple[tuple[str, ...], ...]:
        """The feature subsets the peers of ``partition`` send (none for a comparison-pool partition)."""
        return () if self.manifest.is_pool_partition(partition) else self.subsets[partition]

    def oracle(self, partition: int, subset: int) -> FrequencyOracle:
        """The frequency oracle of data survey ``(partition, subset)``."""
        domain = self.spec.domain_size(self.subsets[partition][subset], labelled=self.manifest.labelled_reports)
        return survey_oracle(self.manifest.oracle, self.manifest.eps_data, domain, self.sizes[partition])
