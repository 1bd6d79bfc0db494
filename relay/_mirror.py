"""The relay's read-only mirror of the aggregator's signed documents (DESIGN.md §5).

A peer must compare what the aggregator showed it with what everyone else
was shown before it decides anything (register, resend or cover), or an
aggregator could show one peer a document of its own: a manifest with a
unique issuer key, a roster of Sybils, or a receipt log without that peer's
receipt, whose resend would then name it (issue 12, attacks 1 and 3). Each
relay therefore mirrors, for every aggregator it pins, the latest signed
manifest, the signed roster head, every sub-round's signed thresholds, the
signed medians, and every signed receipt-log head:

* it fetches them on a fixed schedule (``refresh_seconds``) from the
  aggregator's public API, exactly as any peer would;
* it keeps a document only if the *pinned* identity key signed it (the key
  the relay's operator configured, never the one a manifest names);
* it keeps the first head it saw for each ``(survey, check)`` and checks each
  final head against the first with the RFC 9162 §2.1.4 consistency proof;
  a second, different signed document for the same slot is kept beside the
  first as a conflict (served, so anyone can see the proof);
* it serves them read-only: ``GET /v1/mirror/{identity}/manifest``,
  ``/roster/head``, ``/median/{i}``, ``/medians`` and ``/heads`` (the same
  bodies as the aggregator's ``/v1/manifest``, ``/v1/roster/head``,
  ``/v1/median/{i}``, ``/v1/medians`` and ``/v1/heads``), and
  ``/v1/mirror/{identity}/conflicts``;
* with a :class:`relay._beacon.RelayBeacon`, it commits to a fresh value for
  each round it mirrors and reveals it once the signed roster head carries
  the commitment (``GET /v1/mirror/{identity}/beacon``, DESIGN.md §3 step 3).

Thresholds and medians never change once signed, so each is fetched until
the mirror holds it, then no more: a peer that was shown another copy holds
two signed documents for one slot. Nothing is asked before the manifest's
schedule says it can exist (the roster head at the end of registration,
sub-round ``i``'s thresholds when sub-round ``i - 1`` ends, the medians when
the last sub-round ends), and an answer whose bytes equal the last one
already checked is not parsed or verified again: a refresh of an unchanged
aggregator costs its requests only. Refreshes follow the schedule: one at each
scheduled publication (the end of registration, each check), then every
``DUE_POLL_SECONDS`` until the document is here, so peers waiting on the
mirrors get it within a fraction of a second instead of a whole period.
"""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from anonml.protocol import (
    CLOCK_HEADER,
    MAX_RESPONSE_BYTES,
    PATH_HEADS,
    PATH_MANIFEST,
    PATH_MEDIAN,
    PATH_MEDIANS,
    PATH_MIRROR,
    PATH_ROSTER_HEAD,
    Check,
    DocumentKind,
    HeadsResponse,
    InvalidDocument,
    SignedDocument,
    SignedManifest,
    SurveyId,
    TaskKind,
    TreeHead,
    canonical_json,
)
from anonml.transport import TCP_NETWORK, HttpLimits, Network, serve_http_on, tls_context
from anonml.relay._beacon import RelayBeacon
from anonml.relay._config import PinnedAggregator
from anonml.relay._metrics import log_event

logger = logging.getLogger("anonml.relay")

MIRROR_LIMITS = HttpLimits(max_connections=128, max_connections_per_source=16)
"""Well below the relay's link capacity: every peer polls the mirror a few times per round."""
DUE_POLL_SECONDS = 0.2
"""Between refreshes while a scheduled document is missing: peers wait on the mirrors for it."""
DUE_SECONDS = 5.0
"""How long after its scheduled time a missing document is polled for at that pace (then at the usual one)."""
IN_ROUND_REFRESH_SECONDS = 5.0
"""Between refreshes from registration's close to the round's last scheduled publication, when nothing the
aggregator publishes is off the schedule (each scheduled document is fetched at its time and polled for):
at the usual pace (1 s) these refreshes were 28% of a simulated round's CPU, for nothing."""

@dataclass
class MirroredAggregator:
    """What the mirror holds for one pinned aggregator's current round."""

    pinned: PinnedAggregator
    manifest: SignedManifest | None = None
    roster_head: SignedDocument | None = None
    published: dict[str, SignedDocument] = field(default_factory=dict)
    """Signed thresholds (``median/{i}``) and medians (``medians``), by the path they are served under."""
    heads: dict[tuple[SurveyId, Check], SignedDocument] = field(default_factory=dict)
    sizes: dict[tuple[SurveyId, Check], TreeHead] = field(default_factory=dict)
    proofs: dict[SurveyId, tuple[bytes, ...]] = field(default_factory=dict)
    conflicts: list[tuple[bytes, bytes]] = field(default_factory=list)
    """Pairs of different signed documents for one slot: proofs of equivocation."""
    checked: dict[str, bytes] = field(default_factory=dict)
    """The last body fetched from each aggregator path and fully checked: the same bytes again hold nothing new."""
    bodies: dict[str, bytes | None] = field(default_factory=dict)
    """What each mirror path serves, encoded once after each change (every peer asks for each document)."""

    def reset(self, manifest: SignedManifest) -> None:
        """A new round: its documents replace the previous round's."""
        self.manifest, self.roster_head = manifest, None
        self.heads, self.sizes, self.proofs, self.published, self.checked = {}, {}, {}, {}, {}
        self.bodies.clear()

    def body(self, slot: str) -> bytes | None:
        """The body served at mirror path ``slot`` (``manifest``, ``roster/head``, ``heads``, ``median/{i}``,
        ``medians``), None while not held."""
        if slot not in self.bodies:
            self.bodies[slot] = self._encode(slot)
        return self.bodies[slot]

    def _encode(self, slot: str) -> bytes | None:
        if self.manifest is None:
            return None
        if slot == "manifest":
            return self.manifest.to_json()
        if slot == "heads":
            return self.heads_json()
        document = self.roster_head if slot == "roster/head" else self.published.get(slot)
        return None if document is None else document.to_json()

    def keep_published(self, slot: str, document: SignedDocument) -> None:
        """Signed thresholds (``median/{i}``) or medians (``medians``), checked by the caller."""
        self.published[slot] = document
        self.bodies.pop(slot, None)

    def keep_roster_head(self, document: SignedDocument) -> None:
        if self.roster_head is None:
            self.roster_head = document
            self.bodies.pop("roster/head", None)
        elif not self.roster_head.same_as(document):
            self._conflict(self.roster_head.to_json(), document.to_json())

    def wanted(self, now: float) -> dict[str, tuple[str, DocumentKind]]:
        """The thresholds and medians not held yet whose time has come: mirror path -> (the aggregator's
        path, the document's kind). Sub-round ``i``'s thresholds are published when sub-round ``i - 1``
        ends (sub-round 0's from the start), the medians when the last one ends."""
        assert self.manifest is not None
        median = self.manifest.manifest.schedule.median
        # An SGD round publishes the model of each step where the thresholds would be, and no medians.
        sgd = self.manifest.manifest.task_kind == TaskKind.SGD
        kind = DocumentKind.SGD_MODEL if sgd else DocumentKind.THRESHOLDS
        slots = {f"median/{i}": (PATH_MEDIAN.format(i=i), kind)
                 for i in range(len(median)) if i == 0 or median[i - 1].t_r <= now}
        if median and median[-1].t_r <= now and not sgd:
            slots["medians"] = (PATH_MEDIANS, DocumentKind.MEDIANS)
        return {slot: wanted for slot, wanted in slots.items() if slot not in self.published}

    def due(self, now: float) -> bool:
        """Whether a document the schedule says is published by ``now`` is missing here, its time at most
        :data:`DUE_SECONDS` ago: the roster head after registration, thresholds and medians (:meth:`wanted`),
        a phase's heads after each of its checks."""
        if self.manifest is None:
            return False
        schedule = self.manifest.manifest.schedule

        def recent(at: int) -> bool:
            return at <= now < at + DUE_SECONDS

        if recent(schedule.t_register_end) and self.roster_head is None:
            return True
        if any(recent(phase.t_r) for phase in schedule.median) and self.wanted(now):
            return True
        held = set()
        for survey, check in self.heads:
            with suppress(InvalidDocument):  # a signed head for a survey the schedule lacks is no phase's
                held.add((schedule.phase_of(survey), check))
        return any(recent(phase.check_time(check)) and (phase, check) not in held for phase in schedule.phases for check in Check)

    def next_refresh(self, now: float, refresh_seconds: float) -> float:
        """Seconds until the next refresh: :data:`DUE_POLL_SECONDS` while a document is :meth:`due`, else
        ``refresh_seconds`` (:data:`IN_ROUND_REFRESH_SECONDS` from registration's close to the round's last
        scheduled publication) or until the next scheduled publication if that comes sooner.

        The usual pace holds while registration is open (the relay's beacon commitment waits on the
        manifest) and once the round is over (the next round's manifest can come at any time)."""
        if self.due(now):
            return DUE_POLL_SECONDS
        if self.manifest is None:
            return refresh_seconds
        schedule = self.manifest.manifest.schedule
        times = [schedule.t_register_end, *(phase.check_time(check) for phase in schedule.phases for check in Check)]
        upcoming = [at - now for at in times if at > now]
        in_round = schedule.t_register_end <= now and bool(upcoming)
        return min([IN_ROUND_REFRESH_SECONDS if in_round else refresh_seconds, *upcoming])

    def keep_heads(self, response: HeadsResponse) -> None:
        """Merge verified heads: the first per slot stays; a different one is a conflict."""
        assert self.manifest is not None
        verified = response.verify(self.pinned.identity, self.manifest.round_id)
        by_slot = {
            (head.survey, head.check): document
            for document in response.heads
            for head in (TreeHead.from_document(document),)
        }
        for slot, document in by_slot.items():
            kept = self.heads.get(slot)
            if kept is None:
                self.heads[slot], self.sizes[slot] = document, verified[slot]
            elif not kept.same_as(document):
                self._conflict(kept.to_json(), document.to_json())
        self.proofs.update({survey: proof for survey, proof in response.proofs.items() if (survey, Check.FINAL) in self.heads})
        self.bodies.pop("heads", None)

    def _conflict(self, first: bytes, second: bytes) -> None:
        if (first, second) not in self.conflicts:
            self.conflicts.append((first, second))
            log_event(logger, logging.WARNING, "equivocation", aggregator=self.pinned.url, conflicts=len(self.conflicts))

    def heads_json(self) -> bytes:
        return HeadsResponse(tuple(self.heads.values()), dict(self.proofs)).to_json()


async def _get(client: httpx.AsyncClient, url: str) -> bytes | None:
    """The body of ``GET url``, None for 404; raises httpx.HTTPError otherwise."""
    response = await client.get(url)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    if len(response.content) > MAX_RESPONSE_BYTES:
        raise httpx.HTTPError(f"response of {len(response.content)} bytes from {url}")
    return response.content


async def refresh_one(client: httpx.AsyncClient, mirrored: MirroredAggregator, now: float) -> None:
    """Fetch and verify the aggregator's manifest, roster head and heads once at wall time ``now`` (errors
    are logged, not raised); a body equal to the last one checked from its path is not checked again."""
    base = mirrored.pinned.url.rstrip("/")

    async def changed(path: str) -> bytes | None:
        body = await _get(client, base + path)
        return None if body is None or body == mirrored.checked.get(path) else body

    try:
        body = await changed(PATH_MANIFEST)
        if body is not None:
            signed = SignedManifest.from_json(body, expected_identity=mirrored.pinned.identity)
            if mirrored.manifest is None or mirrored.manifest.round_id != signed.round_id:
                mirrored.reset(signed)
            mirrored.checked[PATH_MANIFEST] = body
        if mirrored.manifest is None:
            return
        manifest = mirrored.manifest.manifest
        round_id = mirrored.manifest.round_id
        # The roster is signed when registration closes; asking before only gets 404s.
        head = await changed(PATH_ROSTER_HEAD) if manifest.schedule.t_register_end <= now else None
        if head is not None:
            document = SignedDocument.from_json(head, max_bytes=MAX_RESPONSE_BYTES)
            document.verify(mirrored.pinned.identity, kind=DocumentKind.ROSTER_HEAD, round_id=round_id)
            mirrored.keep_roster_head(document)
            mirrored.checked[PATH_ROSTER_HEAD] = head
        for slot, (path, kind) in mirrored.wanted(now).items():
            body = await _get(client, base + path)
            if body is not None:
                document = SignedDocument.from_json(body, max_bytes=MAX_RESPONSE_BYTES)
                document.verify(mirrored.pinned.identity, kind=kind, round_id=round_id)
                mirrored.keep_published(slot, document)
        heads = await changed(PATH_HEADS)
        if heads is not None:
            mirrored.keep_heads(HeadsResponse.from_json(heads))
            mirrored.checked[PATH_HEADS] = heads
    except (httpx.HTTPError, InvalidDocument) as exc:
        log_event(logger, logging.DEBUG, "mirror-fetch-failed", aggregator=mirrored.pinned.url, error=str(exc)[:200])


def build_mirror_app(mirrored: Sequence[MirroredAggregator], beacon: RelayBeacon | None = None,
                     now: Callable[[], float] = time.time) -> Starlette:
    """The read-only HTTP face of the mirror (and of the relay's beacon, if it has one); every answer carries
    the relay's clock ``now`` (``protocol.CLOCK_HEADER``), which peers check theirs against."""
    by_identity = {m.pinned.identity.hex(): m for m in mirrored}

    def found(body: bytes | None) -> Response:
        clock = {CLOCK_HEADER: f"{now():.3f}"}
        if body is None:
            return Response(canonical_json({"error": "not mirrored (yet)"}), status_code=404, media_type="application/json",
                            headers=clock)
        return Response(body, media_type="application/json", headers=clock)

    def lookup(request: Request) -> MirroredAggregator | None:
        return by_identity.get(str(request.path_params["identity"]))

    async def document(request: Request) -> Response:
        """Any held document, by its path below ``/v1/mirror/{identity}/``."""
        m = lookup(request)
        return found(None if m is None else m.body(request.url.path.split("/", 4)[4]))

    async def conflicts(request: Request) -> Response:
        m = lookup(request)
        if m is None:
            return found(None)
        pairs = [[first.decode(), second.decode()] for first, second in m.conflicts]
        return found(canonical_json({"conflicts": pairs}))

    async def beacon_statement(request: Request) -> Response:
        m = lookup(request)
        statement = None if m is None or beacon is None else beacon.statement(m.pinned.identity, m.manifest)
        return found(None if statement is None else statement.to_json())

    prefix = PATH_MIRROR
    return Starlette(
        routes=[
            Route(prefix + "/beacon", beacon_statement, methods=["GET"]),
            Route(prefix + "/manifest", document, methods=["GET"]),
            Route(prefix + "/roster/head", document, methods=["GET"]),
            Route(prefix + "/median/{i:int}", document, methods=["GET"]),
            Route(prefix + "/medians", document, methods=["GET"]),
            Route(prefix + "/heads", document, methods=["GET"]),
            Route(prefix + "/conflicts", conflicts, methods=["GET"]),
        ]
    )


async def serve_mirror(
    listen: tuple[str, int],
    aggregators: Sequence[PinnedAggregator],
    *,
    refresh_seconds: float = 1.0,
    timeout: float = 10.0,
    limits: HttpLimits = MIRROR_LIMITS,
    counts: Counter[str] | None = None,
    network: Network = TCP_NETWORK,
    now: Callable[[], float] = time.time,
    beacon: RelayBeacon | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Mirror every pinned aggregator, refreshing every ``refresh_seconds``; report the mirror's base URL.
    It listens and fetches over ``network``; ``now`` is the wall clock the manifest's schedule is read against.

    Served behind ``transport.serve_http``'s connection caps and deadlines
    (issue 13): the mirror is public and shares the relay's process, so slow
    or piled-up clients must not take the file descriptors its link needs.
    ``counts`` gets the HTTP server's refusals and departed clients. An
    address that cannot be bound raises a plain ``OSError`` (the listener is
    opened before any task starts), which ``serve_relay`` turns into a
    one-line config error. ``beacon`` (if any) is updated after each refresh.
    """
    mirrored = [MirroredAggregator(pinned) for pinned in aggregators]
    counts = counts if counts is not None else Counter()
    listeners = await network.listen(listen[0], listen[1])
    # The client outlives the nursery's tasks (they use it until cancelled).
    async with (
        network.http_client(timeout=httpx.Timeout(timeout), verify=tls_context()) as client,
        trio.open_nursery() as nursery,
    ):
        url = await nursery.start(serve_http_on, build_mirror_app(mirrored, beacon, now), listeners, limits, counts)

        async def refresh_forever(m: MirroredAggregator) -> None:
            while True:
                await refresh_one(client, m, now())
                if beacon is not None:
                    beacon.update(m.pinned.identity, m.manifest, m.roster_head)
                await trio.sleep(m.next_refresh(now(), refresh_seconds))

        for m in mirrored:
            nursery.start_soon(refresh_forever, m)
        task_status.started(url)
