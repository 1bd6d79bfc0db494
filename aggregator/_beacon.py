"""The aggregator's side of the relays' commit–reveal (DESIGN.md §3 step 3; ``protocol._beacon``).

While registration is open the aggregator asks every relay mirror the
manifest lists for its beacon commitment (a statement the relay signed with
the beacon key the manifest lists for it; any other is refused and counted)
and stores each one (the store's
``meta``, so a restarted aggregator signs the same roster head). The head
it signs at ``t_register_end`` carries them in manifest order. Then it asks
the mirrors for their reveals, stores each value that opens its commitment,
and derives the partitions once every committed relay has revealed; until
then a credential request waits (``aggregator._service.CREDENTIAL_HOLD_SECONDS``)
and is then answered 503 (the peer's client retries it).

A relay that never reveals leaves the round without partitions: it fails
at ``t_issue_end`` with that relay named (DESIGN accepts this: a relay can
abort a round, never bias one).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import httpx
import trio

from anonml.protocol import (
    MAX_RESPONSE_BYTES,
    BeaconCommitment,
    BeaconStatement,
    InvalidDocument,
    RelayEntry,
    mirror_path,
)
from anonml.base.threads import run_blocking
from anonml.transport import TCP_NETWORK, Network, tls_context

if TYPE_CHECKING:
    from anonml.aggregator._round import RoundState
    from anonml.aggregator._store import RoundStore

log = logging.getLogger("anonml.aggregator")

# One key per relay, written once (``RoundStore.put_meta_once``): a stalled driver beside its successor can store
# a relay's value only if none is stored, and never overwrites another relay's (a read-modify-write of one shared
# key could). Values are the hex of the bytes, as the round store's version 8 held them in one JSON object.
_COMMITMENT_PREFIX = "beacon/commitment/"
_REVEAL_PREFIX = "beacon/reveal/"
POLL_SECONDS = 1.0
"""Between rounds of asking the mirrors for commitments while registration is open (nobody waits on them)."""
REVEAL_POLL_SECONDS = 0.2
"""Between rounds of asking for the reveals once the head is signed: credentials wait on them. A relay's mirror
fetches the head at ``t_register_end`` and then every ``relay._mirror.DUE_POLL_SECONDS`` (0.2 s) until it holds
it, and reveals at once; polled once a second, the reveals lay unread for most of that second (issue 26)."""
_TIMEOUT_SECONDS = 5.0


def _stored(store: RoundStore, prefix: str) -> dict[bytes, bytes]:
    return {bytes.fromhex(key[len(prefix):]): bytes.fromhex(value.decode("ascii"))
            for key, value in store.meta_under(prefix).items()}


def _store_once(store: RoundStore, prefix: str, node_id: bytes, value: bytes) -> bytes:
    return bytes.fromhex(store.put_meta_once(prefix + node_id.hex(), value.hex().encode("ascii")).decode("ascii"))


def stored_commitments(store: RoundStore, relays: tuple[RelayEntry, ...]) -> tuple[BeaconCommitment, ...]:
    """The commitments collected so far, in the manifest's relay order (the order the head lists them in)."""
    commitments = _stored(store, _COMMITMENT_PREFIX)
    return tuple(BeaconCommitment(relay.node_id, commitments[relay.node_id]) for relay in relays if relay.node_id in commitments)


def store_commitment(store: RoundStore, node_id: bytes, commitment: bytes) -> None:
    """Keep a relay's commitment (its first: a later one for the same relay is ignored) before the head is signed."""
    _store_once(store, _COMMITMENT_PREFIX, node_id, commitment)


def stored_reveals(store: RoundStore) -> dict[bytes, bytes]:
    """Node id → revealed value, each checked against its commitment before it was stored."""
    return _stored(store, _REVEAL_PREFIX)


class BeaconCollector:
    """Collects the listed mirrors' commitments, then their reveals, over ``network``; what it refuses is counted
    in ``state.beacon_refused`` (the status shows it)."""

    def __init__(self, state: RoundState, network: Network = TCP_NETWORK) -> None:
        self.state = state
        self.network = network
        self.mirrors = tuple(relay for relay in state.manifest.relays if relay.mirror_url is not None)

    async def _statement(self, client: httpx.AsyncClient, relay: RelayEntry) -> BeaconStatement | None:
        """The relay's statement for this round, or None (unreachable, not yet, or not about this relay and round)."""
        assert relay.mirror_url is not None
        url = relay.mirror_url + mirror_path(self.state.manifest.identity_key, "beacon")
        try:
            response = await client.get(url)
            if response.status_code != 200 or len(response.content) > MAX_RESPONSE_BYTES:
                return None
            statement = BeaconStatement.from_json(response.content)
        except (httpx.HTTPError, OSError):
            return None
        except InvalidDocument:
            self.state.beacon_refused["malformed"] += 1
            return None
        if statement.node_id != relay.node_id or statement.round_id != self.state.round_id:
            self.state.beacon_refused["another-relay-or-round"] += 1
            return None
        if not statement.signed_by(relay.mirror_beacon_key):
            # Not the relay's word: whoever answered at its mirror's address cannot commit or reveal in its name.
            self.state.beacon_refused["unsigned"] += 1
            return None
        return statement

    async def collect_commitments(self) -> None:
        """Until registration closes, ask each listed mirror that has not committed yet; store each first commitment."""
        schedule = self.state.manifest.schedule
        async with self.network.http_client(timeout=httpx.Timeout(_TIMEOUT_SECONDS), verify=tls_context()) as client:
            while True:
                # The store's reads and writes off the event loop, which serves the API meanwhile.
                committed = await run_blocking(_stored, self.state.store, _COMMITMENT_PREFIX)
                for relay in self.mirrors:
                    if relay.node_id in committed:
                        continue
                    statement = await self._statement(client, relay)
                    # A commitment that comes after registration closed is not in the head: never store it.
                    if statement is not None and self.state.now() < schedule.t_register_end:
                        await run_blocking(store_commitment, self.state.store, relay.node_id, statement.commitment)
                committed = await run_blocking(_stored, self.state.store, _COMMITMENT_PREFIX)
                if len(committed) == len(self.mirrors) or self.state.now() >= schedule.t_register_end:
                    return
                await trio.sleep(POLL_SECONDS)

    async def collect_reveals(self, commitments: tuple[BeaconCommitment, ...]) -> tuple[bytes, ...] | None:
        """Each committed relay's value in the head's order, stored as it comes; None if one is missing at ``t_issue_end``."""
        until = self.state.manifest.schedule.t_issue_end
        revealed = await run_blocking(stored_reveals, self.state.store)
        async with self.network.http_client(timeout=httpx.Timeout(_TIMEOUT_SECONDS), verify=tls_context()) as client:
            while True:
                for entry in commitments:
                    if entry.node_id in revealed:
                        continue
                    relay = next(r for r in self.mirrors if r.node_id == entry.node_id)
                    statement = await self._statement(client, relay)
                    if statement is None or statement.reveal is None:
                        continue
                    if statement.commitment != entry.commitment or not statement.opened():
                        self.state.beacon_refused["reveal-mismatch"] += 1
                        continue
                    revealed[entry.node_id] = await run_blocking(_store_once, self.state.store, _REVEAL_PREFIX, entry.node_id,
                                                                 statement.reveal)
                if all(entry.node_id in revealed for entry in commitments):
                    return tuple(revealed[entry.node_id] for entry in commitments)
                if self.state.now() >= until:
                    missing = [entry.node_id.hex()[:16] for entry in commitments if entry.node_id not in revealed]
                    log.warning("round %s: relays %s did not reveal their beacon values by t_issue_end",
                                self.state.round_id.hex()[:12], ", ".join(missing))
                    return None
                await trio.sleep(REVEAL_POLL_SECONDS)
