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
from anonml.protocol import (
    PATH_REGISTER,
    FeatureSpec,
    InvalidDocument,
    PartitionPlan,
    RegisterRequest,
    RosterEntry,
    RoundManifest,
    roster_root,
)
from anonml.simulate._adversary import Adversary, HttpAction, HttpRecord, RoundContext


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
    """Draw Sybil nonces up to ``tries`` times and keep the draw that, under the partition seed the
    aggregator can compute before signing (``H(seed ‖ root)``), puts the most Sybils beside ``target``;
    stops as soon as every other member of the target's partition is a Sybil.

    Each try draws a fresh nonce for one Sybil in turn (one signature a try): any entry that changes
    changes the roster root, so every try is a fresh assignment."""
    sybil_keys = frozenset(bytes(key.verify_key) for key in sybils)
    chosen = [RegisterRequest.create(key, manifest.round_id, nonce=rng.randbytes(32)).entry for key in sybils]
    best = GrindResult((), -1, 0)
    for attempt in range(1, tries + 1):
        turn = attempt % len(sybils)
        chosen[turn] = RegisterRequest.create(sybils[turn], manifest.round_id, nonce=rng.randbytes(32)).entry
        ordered = sorted((*honest, *chosen), key=lambda entry: entry.identity_key)
        plan = PartitionPlan.derive(manifest, spec, [entry.identity_key for entry in ordered], seed, roster_root(ordered))
        beside, mates = sybils_beside(plan, target, sybil_keys)
        if beside > best.beside:
            best = GrindResult(tuple(chosen), beside, attempt)
        if beside == mates:
            break
    return best


def sybils_to_isolate(honest: int, partitions: int) -> int:
    """How many Sybils fill the rest of a target's partition when ``honest`` peers and they are dealt evenly:
    ``k`` with ``(honest + k) / partitions − 1 = k``."""
    return max(1, -(-(honest - partitions) // max(1, partitions - 1)))


class GrindPartitions(Adversary):
    """An aggregator that, a second before registration closes, stores ground Sybil registrations.

    Its target is the identity that registered from a target address (the
    aggregator reads every registration it is sent), or ``target_key``.
    ``sybils`` is how many it registers (None: as many as would fill the
    target's partition, :func:`sybils_to_isolate`). ``aimed`` is how many
    Sybils its own computation put beside the target (after ``tried``
    draws); ``achieved`` and ``mates`` are what the round's real plan did,
    once derived.
    """

    name = "grind-partitions"

    def __init__(self, targets: Sequence[str] = (), *, target_key: bytes | None = None, sybils: int | None = None,
                 tries: int = 5000, seed: int = 0) -> None:
        super().__init__(targets)
        self.target_key = target_key
        self.sybil_count = sybils
        self.seed = seed
        self.sybils: list[SigningKey] = []
        self.tries = tries
        self.rng = random.Random(seed)
        self.aimed: int | None = None
        self.tried: int | None = None
        self.achieved: int | None = None
        self.mates: int | None = None

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        context.nursery.start_soon(self._grind, context)

    def on_request(self, record: HttpRecord) -> HttpAction:
        if record.path == PATH_REGISTER and record.address in self.targets and self.target_key is None:
            return HttpAction(inspect=self._read_registration)
        return HttpAction()

    def _read_registration(self, body: bytes) -> None:
        try:
            self.target_key = RegisterRequest.from_json(body).identity_key
        except InvalidDocument:
            pass  # not a registration it can read: nothing to aim at

    async def _grind(self, context: RoundContext) -> None:
        state = context.state
        await trio.sleep(max(0.0, state.manifest.schedule.t_register_end - 1 - context.clock()))
        honest = state.store.roster_entries()
        if self.target_key is None or self.target_key not in {entry.identity_key for entry in honest}:
            return  # its target never registered: nobody to isolate
        count = self.sybil_count if self.sybil_count is not None else sybils_to_isolate(len(honest), state.manifest.partitions)
        self.sybils = [SigningKey(hashlib.sha256(f"{self.seed}:sybil:{i}".encode()).digest()) for i in range(count)]
        result = grind_sybils(state.manifest, state.spec, state.secrets.seed, honest, self.sybils, self.target_key,
                              self.tries, self.rng)
        now = int(context.clock())
        state.store.register_many([Registration(entry, None, f"sybil-{i}", now) for i, entry in enumerate(result.entries)],
                                  **state.registration_rules())
        self.aimed, self.tried = result.beside, result.tries
        while state.plan is None and state.outcome() is None:
            await trio.sleep(1.0)
        if state.plan is not None:
            self.achieved, self.mates = sybils_beside(state.plan, self.target_key,
                                                      frozenset(bytes(key.verify_key) for key in self.sybils))

    def describe(self) -> str:
        return f"{self.name} ({len(self.sybils)} Sybils, {self.aimed} aimed beside the target, {self.achieved} achieved)"
