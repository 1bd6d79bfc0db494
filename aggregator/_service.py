"""The aggregator service: HTTP/JSON API, packet sink, and the round's phase driver.

One ``serve_aggregator(config, *, task_status)`` (STYLE.md 1) opens the HTTP
API (starlette on hypercorn's HTTP/1.1 protocol, behind connection caps and
deadlines: :mod:`aggregator._http`) and the packet sink, reports their bound
addresses, then drives the round through its phases by the schedule
(DESIGN.md §3) and returns the round's outcome. A failing store never stops
it (:mod:`aggregator._health`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Generic, TypeVar

import tenacity
import trio
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.middleware import Middleware
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from anonml.aggregator._beacon import BeaconCollector, stored_reveals
from anonml.aggregator._dashboard import RelayWatch, dashboard_routes
from anonml.aggregator._round import (
    ApiRefused,
    Clock,
    RoundState,
    credential_answer,
    issuance_refused,
    registration_outcome,
    request_digest,
)
from anonml.aggregator._health import Health, Part, render_metrics
from anonml.aggregator._report import warm_learning
from anonml.aggregator._sink import InboxLimits, PacketSink, SinkLimits
from anonml.aggregator._store import ROSTER_FINAL, IssuedAnswer, IssuedCredential, Refusal, Registered, Registration
from anonml.aggregator._workers import IssuerWorkers
from anonml.crypto import IssueJob, JobRefused
from anonml.base.errors import StorageError
from anonml.base.threads import run_blocking
from anonml.protocol import (
    MAX_REQUEST_BYTES,
    PATH_CREDENTIAL,
    PATH_HEADS,
    PATH_MANIFEST,
    PATH_MEDIAN,
    PATH_MEDIANS,
    PATH_RECEIPTS,
    PATH_REGISTER,
    PATH_REPORT,
    PATH_ROSTER,
    PATH_ROSTER_HEAD,
    PATH_STATUS,
    Check,
    CredentialRequest,
    CredentialResponse,
    DocumentKind,
    ErrorResponse,
    InvalidApiMessage,
    RegisterRequest,
    RegisterResponse,
    RosterHead,
    RoundPhase,
    SignedDocument,
    SurveyKind,
)
from anonml.transport import (
    TCP_NETWORK,
    HttpLimits,
    Network,
    fit_connection_caps,
    listening_address,
    raise_descriptor_limit,
    serve_http,
    serve_streams,
)

log = logging.getLogger(__name__)

@dataclass
class AggregatorConfig:
    """How to serve one round. ``clock`` gives UTC seconds (injectable for tests)."""

    state: RoundState
    http_host: str = "127.0.0.1"
    http_port: int = 0
    sink_host: str = "127.0.0.1"
    sink_port: int = 0
    worker_processes: int = 0
    """Processes for blind issuance and token verification (0: in a thread of the service)."""
    linger: float = 0.0
    on_learn: Callable[[RoundState], dict[str, Any]] | None = None
    # Called with the outcome when the round ends, before the linger: `aggregator run` prints its summary here.
    on_end: Callable[[RoundPhase], None] | None = None
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    sink_limits: SinkLimits = field(default_factory=SinkLimits)
    inbox_limits: InboxLimits = field(default_factory=InboxLimits)
    """Undecided messages the sink keeps in all and per delivering relay before it answers BUSY."""
    commit_retry_seconds: float = 20.0
    """How long a registration or credential commit is retried on a failing store before its requests get 503."""
    network: Network = TCP_NETWORK
    """Where the API and the sink listen and the relay probes connect (the round simulator's in-memory network)."""
    app_middleware: Callable[[ASGIApp], ASGIApp] | None = None
    """What stands in front of the API (the round simulator's adversary, which sees and may delay every request)."""


@dataclass(frozen=True)
class BoundAddresses:
    http_url: str
    sink: tuple[str, int]


def _json(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def _is_decimal(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also accepts '²', which ``int`` refuses (a GET of
    /v1/median/%C2%B2 answered 500), and '١', which ``int`` reads as 1."""
    return text.isascii() and text.isdigit()


def _error(status: int, reason: str) -> Response:
    return _json(ErrorResponse(reason).to_json(), status)


async def _read_body(request: Request, timeout: float) -> bytes:
    """The request body, refusing more than MAX_REQUEST_BYTES (413) without reading it all, or
    one that takes longer than ``timeout`` seconds in all (408: issue 13's byte-every-5-s clients)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not _is_decimal(declared) or int(declared) > MAX_REQUEST_BYTES):
        raise ApiRefused(413, f"request body exceeds {MAX_REQUEST_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(timeout):
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_REQUEST_BYTES:
                raise ApiRefused(413, f"request body exceeds {MAX_REQUEST_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    raise ApiRefused(408, f"request body not received within {timeout} s")


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    """No handler crashes the service or answers 500 for what a client sent (STYLE.md 2);
    a client that hangs up mid-request goes to the app's handler, which counts it."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiRefused as exc:
            return _error(exc.status, exc.reason)
        except InvalidApiMessage as exc:
            return _error(400, str(exc))
        except ClientDisconnect:
            raise
        except Exception:
            log.exception("handler %s failed", request.url.path)
            return _error(500, "internal error")

    return guarded


Item = TypeVar("Item")
Outcome = TypeVar("Outcome")


class GroupCommit(Generic[Item, Outcome]):
    """Commits waiting items together: one SQLite transaction (one fsync) for all of them.

    Each request is answered only after its item is durable; committing each
    on its own costs an fsync per request (measured ~4 ms under load, capping
    registration at ~100-250 per second for the whole round). A commit that
    fails with StorageError (a full disk) is retried with backoff for up to
    ``give_up_after`` seconds while ``part`` is marked unhealthy; then its
    requests are answered 503 (nothing was stored) and the batcher goes on.
    """

    def __init__(self, commit_many: Callable[[list[Item]], list[Outcome]], health: Health, part: Part,
                 *, give_up_after: float = 20.0,
                 wait: tenacity.wait.wait_base = tenacity.wait_exponential(multiplier=0.05, max=2.0)) -> None:
        self._commit_many = commit_many
        self._health = health
        self._part = part
        self._give_up_after = give_up_after
        self._wait = wait
        self._pending: list[tuple[Item, list[Outcome], trio.Event]] = []
        self._wakeup = trio.Event()
        self._busy = False

    async def submit(self, item: Item) -> Outcome:
        """Wait until ``item`` is committed; its outcome. Raises ApiRefused(503) if the commit failed."""
        result: list[Outcome] = []
        done = trio.Event()
        self._pending.append((item, result, done))
        self._wakeup.set()
        await done.wait()
        if not result:
            raise ApiRefused(503, "could not be stored; retry")
        return result[0]

    async def _commit(self, items: list[Item]) -> list[Outcome]:
        give_up_at = trio.current_time() + self._give_up_after

        def failed(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            self._health.fail(self._part, error if error is not None else StorageError("commit failed"))

        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(StorageError), wait=self._wait, sleep=trio.sleep, reraise=True,
            stop=lambda state: trio.current_time() + (state.upcoming_sleep or 0.0) >= give_up_at,
            before_sleep=failed,
        )
        async for attempt in retrying:
            with attempt:
                outcomes = await run_blocking(self._commit_many, items)
        self._health.recover(self._part)
        return outcomes

    async def run(self) -> None:
        """Commit waiting items in batches until cancelled."""
        while True:
            self._wakeup = trio.Event()
            if not self._pending:
                await self._wakeup.wait()
                continue
            batch, self._pending = self._pending, []
            self._busy = True
            try:
                outcomes = await self._commit([item for item, _, _ in batch])
                for (_, result, _), outcome in zip(batch, outcomes):
                    result.append(outcome)
            except StorageError as exc:
                self._health.fail(self._part, exc)
            except Exception:
                log.exception("committing %d items failed", len(batch))
            finally:
                self._busy = False
                for _, _, done in batch:
                    done.set()

    async def drain(self) -> None:
        """Wait until every submitted item is committed."""
        while self._pending or self._busy:
            await trio.sleep(0.01)


class RegistrationBatcher(GroupCommit[Registration, Registered | Refusal]):
    """Registrations, group-committed; the roster waits for :meth:`drain` (DESIGN.md §3 step 2-3)."""

    def __init__(self, state: RoundState, health: Health, *, give_up_after: float = 20.0) -> None:
        super().__init__(lambda items: state.store.register_many(items, **state.registration_rules()), health,
                         Part.REGISTRATIONS, give_up_after=give_up_after)
        self.state = state

    async def register(self, request: RegisterRequest, client: str) -> bool:
        """Admit, wait for the commit; True if newly registered. Raises ApiRefused.

        ``client`` is the address the request came from: the open policy's
        Sybil cap counts identities per client.
        """
        now = self.state.admit_registration(request)
        if now is None:
            return False
        return registration_outcome(await self.submit(Registration(request.entry, request.invitation, client, now)))


CREDENTIAL_HOLD_SECONDS = 1.0
"""How long a credential request waits for the partitions before it is answered 503. They follow the relays'
reveals a fraction of a second after registration closes (``aggregator._beacon.REVEAL_POLL_SECONDS``); a peer
answered 503 comes back after its client's retry gap, up to 2 s (``peer._client``), so every peer that asked at
``t_register_end`` got its credential a second or two after the partitions were there (issue 26). A peer's attempt
at the start of issuance may take a third of the window (``peer._client.attempt_timeout``), seconds; one that
times out all the same gets the stored answer at its retry."""


class CredentialBatcher(GroupCommit[tuple[CredentialRequest, int, int], "IssuedAnswer | JobRefused"]):
    """Blind issuance and its record, a batch at a time; one credential per peer per round (the first commit wins).

    A batch's P-256 proofs run together (in the worker processes when there
    are any, DESIGN.md §6) and its credentials are stored in one commit: one
    thread hop and one fsync per batch instead of per request. An answer is
    sent only after it is stored, so a retry of the same request finds it.
    """

    def __init__(self, state: RoundState, workers: IssuerWorkers, health: Health, *, give_up_after: float = 20.0) -> None:
        super().__init__(self._issue_and_record, health, Part.CREDENTIALS, give_up_after=give_up_after)
        self.state = state
        self.workers = workers
        self._partitions_derived = trio.Event()

    def partitions_derived(self) -> None:
        """Answer the requests held for the partitions (:func:`drive_round` calls it once it has derived them)."""
        self._partitions_derived.set()

    def _issue_and_record(self, items: list[tuple[CredentialRequest, int, int]]) -> list[IssuedAnswer | JobRefused]:
        responses = self.workers.issue([IssueJob(request.request, partition) for request, partition, _ in items])
        issued = [
            IssuedCredential(request.identity_key, partition, response, now, request_digest(request))
            for (request, partition, now), response in zip(items, responses) if isinstance(response, bytes)
        ]
        recorded = iter(self.state.store.record_credentials(issued))
        # Per request: the answer stored for its peer (its own, or the first one's), or the refusal.
        return [next(recorded) if isinstance(response, bytes) else response for response in responses]

    async def issue(self, request: CredentialRequest) -> CredentialResponse:
        """Admit, wait for the batch's issuance and commit (or replay the stored answer); raises ApiRefused.

        A request that comes after registration closed but before the partitions follow the relays' reveals
        waits for them up to :data:`CREDENTIAL_HOLD_SECONDS`, then is admitted or refused as it stands then.
        Only a signed request from the roster waits: anybody else is refused first.
        """
        self.state.authenticate_credential(request)
        if self.state.plan is None and self.state.seed_revealed(self.state.now()):
            with trio.move_on_after(CREDENTIAL_HOLD_SECONDS):
                await self._partitions_derived.wait()
        partition, now = self.state.place_credential(request)
        earlier = self.state.earlier_answer(request)
        if earlier is not None:
            return earlier
        outcome = await self.submit((request, partition, now))
        if isinstance(outcome, JobRefused):
            raise issuance_refused(outcome.reason)
        return credential_answer(outcome)


def _address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


class _RecordRequests:
    """Logs every request's address and time (the aggregator's full view; ``aggregator._anonymity``).

    Signed requests are logged again by their handlers, with the identity that signed them.
    """

    def __init__(self, app: ASGIApp, state: RoundState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            client = scope.get("client")
            self.state.requests.record(self.state.clock(), str(client[0]) if client else "unknown")
        await self.app(scope, receive, send)


def build_app(
    state: RoundState, registrations: RegistrationBatcher, credentials: CredentialBatcher, sink: PacketSink,
    limits: HttpLimits = HttpLimits(), relays: RelayWatch | None = None,
) -> Starlette:
    """The HTTP API of protocol/_api.py over one round, and its read-only dashboard (``/dashboard``).

    Writes go through the group-committing batchers.
    """
    health = sink.health

    async def read_body(request: Request) -> bytes:
        try:
            return await _read_body(request, limits.body_timeout)
        except ApiRefused as exc:
            health.http[f"body-refused/{exc.status}"] += 1
            raise

    snapshots = state.snapshots

    def snapshot(body: bytes | None, missing: str) -> Response:
        if body is None:
            raise ApiRefused(404, missing)
        return _json(body)

    async def manifest(request: Request) -> Response:
        return _json(state.manifest_json())

    async def register(request: Request) -> Response:
        client = _address(request)
        at, registration = state.clock(), RegisterRequest.from_json(await read_body(request))
        await registrations.register(registration, client)
        # Logged once the signature is known good: an identity names only the requests it signed.
        state.requests.record(at, client, registration.identity_key)
        return _json(RegisterResponse(True).to_json())

    async def roster(request: Request) -> Response:
        return snapshot(snapshots.roster, "the roster is published when registration closes")

    async def roster_head(request: Request) -> Response:
        return snapshot(snapshots.roster_head, "the roster is published when registration closes")

    async def credential(request: Request) -> Response:
        at, credential_request = state.clock(), CredentialRequest.from_json(await read_body(request))
        response = await credentials.issue(credential_request)
        state.requests.record(at, _address(request), credential_request.identity_key)
        return _json(response.to_json())

    async def median(request: Request) -> Response:
        raw = request.path_params["i"]
        if not _is_decimal(raw) or len(raw) > 5:
            raise ApiRefused(404, f"no median sub-round {raw[:16]!r}")
        return snapshot(state.thresholds_json(int(raw)), f"thresholds of median sub-round {int(raw)} are not published")

    async def medians(request: Request) -> Response:
        return snapshot(state.medians_json(), "medians are published after the median phase")

    async def receipts(request: Request) -> Response:
        kind, partition, check = (request.path_params[k] for k in ("kind", "partition", "check"))
        if kind not in ("median", "data") or not _is_decimal(partition) or len(partition) > 5 or check not in ("0", "1"):
            raise ApiRefused(404, f"no receipt segment {request.url.path[:80]!r}")
        key = (SurveyKind.MEDIAN if kind == "median" else SurveyKind.DATA, int(partition), Check(int(check)))
        return snapshot(snapshots.segments.get(key), "that receipt-log check is not published (yet)")

    async def heads(request: Request) -> Response:
        return snapshot(snapshots.heads, "no tree head is published yet")

    async def status(request: Request) -> Response:
        return snapshot(snapshots.status, "the status is not ready yet")

    async def metrics(request: Request) -> Response:
        body = render_metrics(health, state.link_errors, state.store.inbox_size())
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def report(request: Request) -> Response:
        if snapshots.report is None:
            body = await run_blocking(state.store.get_result, "report")
            if body is None:
                raise ApiRefused(404, "the report is published after the round")
            document = SignedDocument.create(state.secrets.signing_key, DocumentKind.REPORT, state.round_id, json.loads(body))
            snapshots.report = document.to_json()
        return _json(snapshots.report)

    routes = [
        Route(PATH_MANIFEST, _guarded(manifest), methods=["GET"]),
        Route(PATH_REGISTER, _guarded(register), methods=["POST"]),
        Route(PATH_ROSTER, _guarded(roster), methods=["GET"]),
        Route(PATH_ROSTER_HEAD, _guarded(roster_head), methods=["GET"]),
        Route(PATH_CREDENTIAL, _guarded(credential), methods=["POST"]),
        Route(PATH_MEDIAN, _guarded(median), methods=["GET"]),
        Route(PATH_MEDIANS, _guarded(medians), methods=["GET"]),
        Route(PATH_RECEIPTS, _guarded(receipts), methods=["GET"]),
        Route(PATH_HEADS, _guarded(heads), methods=["GET"]),
        Route(PATH_STATUS, _guarded(status), methods=["GET"]),
        Route(PATH_REPORT, _guarded(report), methods=["GET"]),
        *dashboard_routes(state, relays if relays is not None else RelayWatch(state)),
        Route("/metrics", _guarded(metrics), methods=["GET"]),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(_RecordRequests, state=state)])
    _answer_errors(app, health)
    return app


def _answer_errors(app: Starlette, health: Health) -> None:
    """Unknown paths and methods answered as the API's own errors; a client gone mid-request counted, not logged."""

    async def http_error(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 404)
        return _error(int(code), f"{getattr(exc, 'detail', 'not found')}: {request.method} {request.url.path[:64]}")

    async def disconnected(request: Request, exc: Exception) -> Response:
        # Issue 13: each disconnect used to log a full traceback as an internal error.
        health.http["client-disconnected"] += 1
        return _error(400, "client disconnected")

    app.add_exception_handler(404, http_error)
    app.add_exception_handler(405, http_error)
    app.add_exception_handler(ClientDisconnect, disconnected)


async def wait_until(clock: Clock, when: float) -> None:
    """Sleep until ``clock() >= when`` (works with wall time and trio's MockClock)."""
    while True:
        remaining = when - clock()
        if remaining <= 0:
            return
        await trio.sleep(remaining)


async def _warm_learning(state: RoundState) -> None:
    """Import the learning stack once issuance has closed, its blind issuance done: from then until the data
    phase's last delivery slice the aggregator verifies only the median sub-rounds' few packets."""
    await wait_until(state.clock, state.manifest.schedule.t_issue_end)
    await run_blocking(warm_learning)


async def _settle(state: RoundState, when: int) -> None:
    """Wait until ``when`` and until every frame that arrived before it has been verified.

    Frames wait in the inbox until the verifier gets to them; results
    computed for a phase ending at ``when`` must include every one of them.
    """
    await wait_until(state.clock, when)
    while await run_blocking(state.store.inbox_pending_before, when):
        await trio.sleep(0.05)


async def _beacon_plan(state: RoundState, beacon: BeaconCollector | None) -> bool:
    """Wait for the reveals of every relay the signed head lists and derive the partitions; False (the round
    failed) if one did not reveal by ``t_issue_end``: the partitions cannot be derived without it."""
    assert state.final_roster is not None
    commitments = RosterHead.from_document(state.final_roster.head).beacon
    reveals = None if beacon is None else await beacon.collect_reveals(commitments)
    if reveals is None:
        missing = len(commitments) - len(await run_blocking(stored_reveals, state.store))
        reason = f"{missing} of the {len(commitments)} relays listed in the roster head did not reveal their beacon values"
        await _fail(state, {"reason": reason})
        return False
    await run_blocking(state.derive_plan, reveals)
    return True


async def drive_round(
    state: RoundState,
    on_learn: Callable[[RoundState], dict[str, Any]] | None = None,
    registrations: RegistrationBatcher | None = None,
    credentials: CredentialBatcher | None = None,
    beacon: BeaconCollector | None = None,
) -> RoundPhase:
    """Take the round through its phases by the schedule; return ``DONE``, ``DEGRADED`` or ``FAILED``.

    Minimum participation is checked when registration and issuance close; a
    round that misses it ends at once with a clear status (DESIGN.md §3).
    After each phase, a survey with fewer accepted reports than the spec's
    ``min_reports_per_survey`` fails the round then (``on_shortfall =
    "fail"``) or makes it end ``DEGRADED`` after learning (the default).
    At each phase's two checks (``t_c`` and ``t_r``) the receipt-log heads
    are signed once every frame that arrived before is stored (DESIGN.md §5).
    When the signed roster head carries relays' beacon commitments the
    partitions wait for ``beacon``'s reveals (``aggregator._beacon``).
    ``on_learn(state)`` runs in a worker thread after the data phase.
    """
    # Every read and write of the store runs off the event loop, which serves the sink and the API meanwhile
    # (on PostgreSQL each is a round trip to the server, and some read a whole survey's reports).
    outcome = await run_blocking(state.outcome)
    if outcome is not None:
        return outcome
    schedule = state.manifest.schedule
    # Sub-round 0 asks about the middle of each feature's public bounds: nothing to wait for.
    await run_blocking(state.publish_thresholds, 0)
    for checkpoint in (schedule.t_register_end, schedule.t_issue_end):
        await wait_until(state.clock, checkpoint)
        # Requests admitted before a deadline count: wait until they are stored.
        for batcher in (registrations, credentials):
            if batcher is not None:
                await batcher.drain()
        failure = await run_blocking(state.participation_failure, state.now())
        if failure is not None:
            await _fail(state, {"reason": failure})
            return RoundPhase.FAILED
        if state.now() >= schedule.t_register_end:
            state.close_registration()
            # Signing, hashing and encoding every entry: off the event loop.
            await run_blocking(state.freeze_roster)
            if state.plan is None and not await _beacon_plan(state, beacon):
                return RoundPhase.FAILED
            if credentials is not None:
                credentials.partitions_derived()
            # Ingest workers verify from here on (every registration is stored: the batcher drained).
            await run_blocking(state.store.put_meta, ROSTER_FINAL, b"1")
            await run_blocking(state.rebuild_log_snapshots)
    minimum, on_shortfall = await run_blocking(state.shortfall_rule)
    for index, phase in enumerate(schedule.phases):
        if phase is schedule.data and state.sgd is None:
            await run_blocking(state.publish_medians)
        for check in Check:
            await _settle(state, phase.check_time(check))
            await run_blocking(state.publish_heads, phase, check)
        short = await run_blocking(state.shortfall, [phase])
        if short and on_shortfall == "fail":
            # The spec says a short survey ends the round: now, before peers spend budget on later phases.
            await _fail(state, {"reason": f"too few reports: {_shortfall_words(short, minimum)}", "shortfall": short})
            return RoundPhase.FAILED
        # Publish the next sub-round's thresholds now (thesis Algorithm 1's next step), or an SGD round's next model.
        await run_blocking(state.publish_thresholds, index + 1)
    # Decided before learning, which writes it into the report (state.ending()).
    ending = await run_blocking(state.ending)
    # Learning takes seconds on a large round: off the event loop, so the API keeps answering.
    state.learning_started_at = state.now()
    detail = await run_blocking(on_learn, state) if on_learn is not None else {}
    if ending is RoundPhase.DEGRADED:
        short = await run_blocking(state.shortfall, schedule.phases)
        detail = {**detail, "reason": f"too few reports: {_shortfall_words(short, minimum)}", "shortfall": short}
        log.warning("round %s degraded: %s", state.round_id.hex()[:12], detail["reason"])
    await run_blocking(state.finish, ending, detail)
    return ending


async def _fail(state: RoundState, detail: dict[str, Any]) -> None:
    """End the round ``FAILED`` for ``detail["reason"]``, with the store's counts beside it."""
    log.warning("round %s failed: %s", state.round_id.hex()[:12], detail["reason"])
    counts = await run_blocking(state.store.counts)
    await run_blocking(state.finish, RoundPhase.FAILED, {**detail, "counts": counts})


def _shortfall_words(short: dict[str, int], minimum: int) -> str:
    """``"data 3/1 accepted 2, median 0 accepted 0 (each needs at least 6)"``."""
    return ", ".join(f"{survey} accepted {count}" for survey, count in short.items()) + f" (each needs at least {minimum})"


async def keep_status(state: RoundState, sink: PacketSink, every: float = 1.0) -> None:
    """Rebuild the signed status snapshot every ``every`` seconds, in a thread (issue 13: never per request),
    with the service's health and the sink's refusals not yet committed."""
    while True:
        now = state.now()  # on the loop: trio's MockClock is only readable here
        await run_blocking(state.refresh_status, now, sink.health.status_counts(), sink.pending_refusals())
        await trio.sleep(every)


# Descriptors the service uses besides its listeners' connections: the round's store (SQLite and
# its journal), the listeners, logs, the relay probes; and each worker process's pipes.
_OWN_DESCRIPTORS = 48
_DESCRIPTORS_PER_WORKER = 6
_MIN_HTTP_CONNECTIONS = 32


def fit_to_descriptors(config: AggregatorConfig) -> AggregatorConfig:
    """``config`` with the API's and the sink's connection caps inside the open-file limit (raised to
    the hard limit first; issue 25: the API admitted 512 connections under a limit of 256);
    :class:`transport.DescriptorLimitError` when even their minimums do not fit."""
    http, sink = config.http_limits, config.sink_limits
    relays = len(config.state.manifest.relays)
    wanted = {"HTTP": http.max_connections, "sink": sink.max_connections}
    # Every relay of the round may deliver at once, and strangers need a few public slots beside them.
    minimum = {"HTTP": min(http.max_connections, _MIN_HTTP_CONNECTIONS),
               "sink": min(sink.max_connections, relays + sink.max_per_source)}
    reserve = _OWN_DESCRIPTORS + relays + _DESCRIPTORS_PER_WORKER * config.worker_processes
    caps = fit_connection_caps(wanted, minimum, reserve=reserve, limit=raise_descriptor_limit(), server="aggregator")
    if caps == wanted:
        return config
    log.warning("connection caps lowered to fit the open-file limit: HTTP %d, sink %d", caps["HTTP"], caps["sink"])
    fitted_http = replace(http, max_connections=caps["HTTP"],
                          max_connections_per_source=min(http.max_connections_per_source, caps["HTTP"]))
    fitted_sink = replace(sink, max_connections=caps["sink"], max_per_source=min(sink.max_per_source, caps["sink"]),
                          reserved=min(sink.reserved, max(relays, caps["sink"] - sink.max_per_source)))
    return replace(config, http_limits=fitted_http, sink_limits=fitted_sink)


async def serve_aggregator(
    config: AggregatorConfig, *, task_status: trio.TaskStatus[BoundAddresses] = trio.TASK_STATUS_IGNORED
) -> RoundPhase:
    """Serve one round until it ends (plus ``config.linger`` seconds); return its outcome (``DONE``, ``DEGRADED`` or ``FAILED``)."""
    config = fit_to_descriptors(config)
    state = config.state
    health = Health()
    workers = IssuerWorkers(state.secrets.issuer_key, config.worker_processes)
    try:
        sink = PacketSink(state, workers, inbox=config.inbox_limits, connections=config.sink_limits, health=health)
        registrations = RegistrationBatcher(state, health, give_up_after=config.commit_retry_seconds)
        credentials = CredentialBatcher(state, workers, health, give_up_after=config.commit_retry_seconds)
        relays = RelayWatch(state, config.network)
        api = build_app(state, registrations, credentials, sink, config.http_limits, relays)
        app: ASGIApp = api if config.app_middleware is None else config.app_middleware(api)
        await sink.admit_legacy_frames()
        async with trio.open_nursery() as nursery:
            # What answers the API's requests and collects the relays' beacon commitments runs before the API
            # serves: registration is open from the first request the API answers (issue 27: started after
            # the worker pool's warm-up, 4.5 s at load 12, a round's registrations went unanswered and its
            # commitments uncollected until registration had closed).
            nursery.start_soon(registrations.run)
            nursery.start_soon(credentials.run)
            beacon = BeaconCollector(state, config.network)
            nursery.start_soon(beacon.collect_commitments)
            # Sub-round 0's thresholds are public from the API's first answer (a relay's mirror asks for them in
            # its first refresh); drive_round publishes them too, a no-op then, for a round driven unserved.
            await run_blocking(state.publish_thresholds, 0)
            http_url = await nursery.start(partial(serve_http, app, config.http_host, config.http_port,
                                                   config.http_limits, health.http, network=config.network))
            listeners = await nursery.start(serve_streams, config.network, sink.handle, config.sink_host,
                                            config.sink_port)
            sink_port = listening_address(listeners)[1]
            nursery.start_soon(sink.verify_forever)
            nursery.start_soon(relays.probe_forever)
            # Spawning the worker processes only speeds up issuance and verification (the pool would spawn
            # them at its first batch anyway): never something the round waits for.
            nursery.start_soon(run_blocking, workers.warm)
            if config.on_learn is not None:
                nursery.start_soon(_warm_learning, state)
            await run_blocking(state.refresh_status, state.now())
            nursery.start_soon(keep_status, state, sink)
            task_status.started(BoundAddresses(http_url, (config.sink_host, sink_port)))
            outcome = await drive_round(state, config.on_learn, registrations, credentials, beacon)
            if config.on_end is not None:
                config.on_end(outcome)
            await trio.sleep(config.linger)
            nursery.cancel_scope.cancel()
    finally:
        workers.close()
    return outcome
