"""Partition grinding: the aggregator registers Sybils with nonces of its choosing (issue 24; DESIGN.md §3 step 3).

Until it signs the roster head the aggregator knows its seed and every
honest entry; each Sybil nonce gives another roster root, so another
assignment. :func:`grind_sybils` tries nonces until the partition seed it
can compute puts only Sybils beside a target (anonymity set 1 for the
target's reports). Under protocol v1 (``H(seed ‖ root)``, a round listing no
relay mirror) that seed is the real one; once the relays' beacon values
enter the seed, revealed only after the head is signed, the aggregator's
choice no longer predicts anything. :class:`GrindPartitions` runs the attack
inside a simulated round and records what came of it in the real plan.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

import trio
from nacl.signing import SigningKey

from anonml.aggregator import Registration
from anonml.protocol import FeatureSpec, PartitionPlan, RegisterRequest, RosterEntry, RoundManifest, roster_root
from anonml.simulate._adversary import Adversary, RoundContext


@dataclass(frozen=True)
class GrindResult:
    """The Sybil entries chosen, how many Sybils the grinder's own computation put beside the target, tries spent."""

    entries: tuple[RosterEntry, ...]
    beside: int
    tries: int


def sybils_beside(plan: PartitionPlan, target: bytes, sybils: frozenset[bytes]) -> tuple[int, int]:
    """``(Sybils in the target's partition, other members of it)`` under ``plan``."""
    partition = plan.partition_of[target]
    mates = [key for key, p in plan.partition_of.items() if p == partition and key != target]
    return sum(1 for key in mates if key in sybils), len(mates)


def grind_sybils(manifest: RoundManifest, spec: FeatureSpec, seed: bytes, honest: Sequence[RosterEntry],
                 sybils: Sequence[SigningKey], target: bytes, tries: int, rng: random.Random) -> GrindResult:
    """Draw nonces for every Sybil up to ``tries`` times and keep the draw that, under the partition seed the
    aggregator can compute before signing (``H(seed ‖ root)``), puts the most Sybils beside ``target``;
    stops as soon as every other member of the target's partition is a Sybil."""
    sybil_keys = frozenset(bytes(key.verify_key) for key in sybils)
    best = GrindResult((), -1, 0)
    for attempt in range(1, tries + 1):
        chosen = tuple(RegisterRequest.create(key, manifest.round_id, nonce=rng.randbytes(32)).entry for key in sybils)
        ordered = sorted((*honest, *chosen), key=lambda entry: entry.identity_key)
        plan = PartitionPlan.derive(manifest, spec, [entry.identity_key for entry in ordered], seed, roster_root(ordered))
        beside, mates = sybils_beside(plan, target, sybil_keys)
        if beside > best.beside:
            best = GrindResult(chosen, beside, attempt)
        if beside == mates:
            break
    return best


class GrindPartitions(Adversary):
    """An aggregator that, a second before registration closes, stores ``sybils`` ground Sybil registrations.

    ``aimed`` is how many Sybils its own computation put beside ``target_key`` (after ``tried`` draws);
    ``achieved`` and ``mates`` are what the round's real plan did, once derived.
    """

    name = "grind-partitions"

    def __init__(self, target_key: bytes, sybils: int = 4, tries: int = 5000, seed: int = 0) -> None:
        super().__init__()
        self.target_key = target_key
        self.sybils = [SigningKey(hashlib.sha256(f"{seed}:sybil:{i}".encode()).digest()) for i in range(sybils)]
        self.tries = tries
        self.rng = random.Random(seed)
        self.aimed: int | None = None
        self.tried: int | None = None
        self.achieved: int | None = None
        self.mates: int | None = None

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        context.nursery.start_soon(self._grind, context)

    async def _grind(self, context: RoundContext) -> None:
        state = context.state
        await trio.sleep(max(0.0, state.manifest.schedule.t_register_end - 1 - context.clock()))
        result = grind_sybils(state.manifest, state.spec, state.secrets.seed, state.store.roster_entries(), self.sybils,
                              self.target_key, self.tries, self.rng)
        now = int(context.clock())
        state.store.register_many([Registration(entry, None, f"sybil-{i}", now) for i, entry in enumerate(result.entries)],
                                  **state.registration_rules())
        self.aimed, self.tried = result.beside, result.tries
        while state.plan is None and state.outcome() is None:
            await trio.sleep(1.0)
        if state.plan is not None:
            self.achieved, self.mates = sybils_beside(state.plan, self.target_key,
                                                      frozenset(bytes(key.verify_key) for key in self.sybils))
