"""The peer's check of the relays' commit–reveal before it derives its partition (DESIGN.md §3 step 3).

The signed roster head must carry a commitment from every relay mirror the
manifest lists (else ``beacon-incomplete``: a head without an honest
relay's commitment is one the aggregator may have ground). Each relay's
reveal, fetched from that relay's own mirror, must open its commitment
(else ``beacon-mismatch``), must be signed with the beacon key the manifest
lists for the relay (a statement that is not is ignored: it is not the
relay's word), and must come by ``until`` (else
``beacon-unrevealed``: the round cannot have unbiased partitions, so the
peer stops before its credential, the first thing that ties it to them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio

from anonml.base.errors import AnonMLError
from anonml.peer._client import AggregatorClient, AggregatorError, retry_delay
from anonml.peer._events import RefusalReason
from anonml.protocol import BeaconCommitment, InvalidDocument, RelayEntry, RosterHead, RoundManifest


class BeaconRefused(AnonMLError):
    """The peer refuses the round's partitions; ``reason`` is ``beacon-incomplete``, ``-mismatch`` or ``-unrevealed``."""

    def __init__(self, reason: RefusalReason, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def check_commitments(manifest: RoundManifest, head: RosterHead) -> None:
    """Raise BeaconRefused unless ``head`` lists exactly the manifest's mirrors, each once, in manifest order."""
    listed = [relay.node_id for relay in manifest.relays if relay.mirror_url is not None]
    carried = [entry.node_id for entry in head.beacon]
    if carried != listed:
        missing = sum(1 for node_id in listed if node_id not in carried)
        raise BeaconRefused(RefusalReason.BEACON_INCOMPLETE, f"the signed roster head lacks the beacon commitments of {missing} of the "
                                                 f"{len(listed)} listed relay mirrors (or lists others); refusing the round")


async def collect_reveals(manifest: RoundManifest, head: RosterHead, mirrors: Sequence[tuple[RelayEntry, AggregatorClient]],
                          now: Callable[[], float], until: float) -> tuple[bytes, ...]:
    """Every relay's value in the head's order, each from its own mirror, polled until ``until``; raises BeaconRefused."""
    by_node = {relay.node_id: mirror for relay, mirror in mirrors}
    keys = {relay.node_id: relay.mirror_beacon_key for relay, _ in mirrors}
    revealed: dict[bytes, bytes] = {}
    pending: list[BeaconCommitment] = list(head.beacon)
    attempt = 0
    while pending:
        for entry in list(pending):
            try:
                statement = await by_node[entry.node_id].mirrored_beacon(manifest.identity_key)
            except (AggregatorError, InvalidDocument):
                continue
            if statement is None or statement.reveal is None:
                continue
            if statement.node_id != entry.node_id or statement.round_id != manifest.round_id:
                continue  # not this relay's statement for this round: it proves nothing either way
            if not statement.signed_by(keys[entry.node_id]):
                continue  # not signed by the relay: whoever answered at its mirror cannot reveal in its name
            if statement.commitment != entry.commitment or not statement.opened():
                raise BeaconRefused(RefusalReason.BEACON_MISMATCH, f"relay {entry.node_id.hex()[:16]} revealed a value that does not open "
                                                       "its commitment in the signed roster head; refusing the round")
            revealed[entry.node_id] = statement.reveal
            pending.remove(entry)
        if not pending:
            break
        if now() > until:
            raise BeaconRefused(RefusalReason.BEACON_UNREVEALED, f"{len(pending)} of {len(head.beacon)} relays did not reveal their beacon "
                                                     "values in time; the partitions cannot be derived, refusing the round")
        await trio.sleep(retry_delay(attempt))
        attempt += 1
    return tuple(revealed[entry.node_id] for entry in head.beacon)
