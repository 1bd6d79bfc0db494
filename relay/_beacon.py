"""The relay's share of every mirrored round's partition seed (DESIGN.md §3 step 3; ``protocol._beacon``).

For each round its mirror holds, the relay draws a fresh 32-byte value
``r`` and writes it to its data directory, fsynced, before it serves
anything about it: a restarted relay serves the same commitment, never a
second one (two commitments would let whoever saw both pick). It serves
the commitment at once, and reveals ``r`` only when all of these hold:

* its mirror holds the round's signed roster head (the first one it saw; a
  different one is kept beside it as a conflict, the proof of equivocation);
* its clock has reached ``t_register_end`` (no registration can follow);
* that head lists this relay's commitment unchanged.

Until then every round's current reason for withholding is counted once
when it changes (``withheld/<reason>``) and logged, so an operator sees why.

Every statement it serves is signed with its beacon key, an Ed25519 key
derived from its identity key (:func:`beacon_signing_key`) whose public half
its descriptor publishes (``beacon_key``) for the manifest to list.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
from nacl.signing import SigningKey

from anonml.base.storage import make_private_dir, read_secret_file, write_secret_file
from anonml.protocol import (
    BEACON_BYTES,
    BeaconCommitment,
    BeaconStatement,
    InvalidDocument,
    RosterHead,
    SignedDocument,
    SignedManifest,
    beacon_commitment,
)
from anonml.relay._keys import load_identity_key
from anonml.relay._metrics import log_event

logger = logging.getLogger("anonml.relay")

BEACON_DIR = "beacon"
"""Under the relay's data directory: one file per mirrored round, named by aggregator identity and round id."""
_BEACON_KEY_DOMAIN = b"anonml/relay-beacon-key/v1"


def beacon_signing_key(identity_private: bytes) -> SigningKey:
    """The relay's beacon key: Ed25519, derived from its X25519 identity key (one secret to keep, the same
    key after a restart), under a domain of its own so it signs nothing but beacon statements."""
    return SigningKey(hashlib.sha256(_BEACON_KEY_DOMAIN + identity_private).digest())


class RelayBeacon:
    """One relay's beacon values, one per ``(aggregator identity, round)``, durable in ``data_dir``.

    ``draw`` gives a fresh value (the CSPRNG; a seeded generator in the
    simulator); ``now`` is the relay's wall clock (UTC seconds); ``signing_key``
    signs every statement (:func:`beacon_signing_key`).
    """

    def __init__(self, data_dir: Path, node_id: bytes, signing_key: SigningKey, *, now: Callable[[], float],
                 draw: Callable[[], bytes]) -> None:
        self.directory = data_dir / BEACON_DIR
        self.node_id = node_id
        self.signing_key = signing_key
        self.now = now
        self.draw = draw
        self.counts: Counter[str] = Counter()
        self._values: dict[tuple[bytes, bytes], bytes] = {}
        self._revealed: set[tuple[bytes, bytes]] = set()
        self._withheld: dict[tuple[bytes, bytes], str] = {}

    def value(self, identity: bytes, round_id: bytes) -> bytes:
        """This relay's value for the round: the stored one, or a fresh one stored durably first."""
        key = (identity, round_id)
        if key not in self._values:
            path = self.directory / f"{identity.hex()}-{round_id.hex()}"
            stored = read_secret_file(path, what="beacon value", max_bytes=BEACON_BYTES) if path.exists() else b""
            if len(stored) != BEACON_BYTES:
                # Missing, or torn by a crash between create and fsync: nothing was served from it (a value is
                # served only after write_secret_file returned), so a fresh value replaces it.
                stored = self.draw()
                make_private_dir(self.directory)
                path.unlink(missing_ok=True)
                write_secret_file(path, stored)
                _sync_directory(self.directory)
            self._values[key] = stored
        return self._values[key]

    def update(self, identity: bytes, signed: SignedManifest | None, roster_head: SignedDocument | None) -> None:
        """After each mirror refresh: hold a value for the mirrored round and decide whether to reveal it."""
        if signed is None:
            return
        key = (identity, signed.round_id)
        commitment = beacon_commitment(signed.round_id, self.value(identity, signed.round_id))
        if key in self._revealed:
            return
        reason = self._withhold_reason(signed, roster_head, commitment)
        if reason is None:
            self._revealed.add(key)
            self.counts["revealed"] += 1
            log_event(logger, logging.INFO, "beacon-revealed", round_id=signed.round_id.hex()[:16])
        elif self._withheld.get(key) != reason:
            self._withheld[key] = reason
            self.counts[f"withheld/{reason}"] += 1
            log_event(logger, logging.INFO, "beacon-withheld", round_id=signed.round_id.hex()[:16], reason=reason)

    def _withhold_reason(self, signed: SignedManifest, roster_head: SignedDocument | None, commitment: bytes) -> str | None:
        if roster_head is None:
            return "no-roster-head"
        if self.now() < signed.manifest.schedule.t_register_end:
            return "registration-open"
        try:
            head = RosterHead.from_document(roster_head)
        except InvalidDocument:
            return "bad-roster-head"
        if BeaconCommitment(self.node_id, commitment) in head.beacon:
            return None
        if any(entry.node_id == self.node_id for entry in head.beacon):
            return "commitment-changed"
        return "commitment-missing"

    def statement(self, identity: bytes, signed: SignedManifest | None) -> BeaconStatement | None:
        """What ``GET /v1/mirror/{identity}/beacon`` serves: None until the round's value is stored."""
        if signed is None or (identity, signed.round_id) not in self._values:
            return None
        key = (identity, signed.round_id)
        value = self._values[key]
        statement = BeaconStatement(self.node_id, signed.round_id, beacon_commitment(signed.round_id, value),
                                    value if key in self._revealed else None)
        return statement.sign(self.signing_key)


def relay_beacon(data_dir: Path, node_id: bytes, now: Callable[[], float], rng: np.random.Generator | None) -> RelayBeacon:
    """The relay's beacon: values from the CSPRNG, or from a generator spawned off ``rng`` (the simulator's
    seeded one, so one seed gives one trace), which leaves ``rng``'s own draws (release times) as they were;
    statements signed with the key derived from the relay's identity in ``data_dir``."""
    key = beacon_signing_key(load_identity_key(data_dir))
    if rng is None:
        return RelayBeacon(data_dir, node_id, key, now=now, draw=lambda: os.urandom(BEACON_BYTES))
    generator = rng.spawn(1)[0]
    return RelayBeacon(data_dir, node_id, key, now=now, draw=lambda: generator.bytes(BEACON_BYTES))


def _sync_directory(path: Path) -> None:
    """fsync a directory, so the file just created in it survives a crash as well as its contents."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
