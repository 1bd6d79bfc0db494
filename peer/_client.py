"""The peer's HTTP client for the aggregator's API (``protocol._api``).

One :class:`AggregatorClient` wraps one ``httpx.AsyncClient`` (a connection
pool), so a process running many peers reuses a few connections instead of
opening one per request. Every response body is parsed by the protocol's
strict, size-bounded parsers.

Only what can succeed later is retried (with capped, jittered backoff, and
reported to ``on_retry`` so a person sees it): 5xx, 429, timeouts, and a
connection that fails after the aggregator has answered once (it is
restarting). Inside :func:`answer_by` a request also stops retrying at the
caller's deadline, and each attempt may take only a share of the time left
(:func:`attempt_timeout`): a connection that swallows a request and never
answers (a black hole) costs that share, not the client's whole timeout, so
a peer retries on a fresh connection while its window is still open. What cannot is refused at once with the fix in the message: a
URL that is not ``http(s)://HOST:PORT``, a host name that does not resolve,
and nothing listening at the first contact (unless ``wait_for_service``:
the demo starts its peers before the aggregator serves).
"""

from __future__ import annotations

import contextvars
import math
import random
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import httpx
import trio

from anonml.base.errors import InputError, TransportError
from anonml.base.memo import PureCache
from anonml.protocol import (
    CLOCK_HEADER,
    MAX_RESPONSE_BYTES,
    PATH_CREDENTIAL,
    PATH_HEADS,
    PATH_MANIFEST,
    PATH_MEDIAN,
    PATH_MEDIANS,
    PATH_RECEIPTS,
    PATH_REGISTER,
    PATH_ROSTER,
    PATH_ROSTER_HEAD,
    PATH_STATUS,
    BeaconStatement,
    Check,
    CredentialRequest,
    CredentialResponse,
    ErrorResponse,
    HeadsResponse,
    InvalidApiMessage,
    InvalidDocument,
    ReceiptSegment,
    RegisterRequest,
    RegisterResponse,
    RosterResponse,
    RoundStatus,
    SignedDocument,
    SignedManifest,
    SurveyKind,
    mirror_path,
)
from anonml.transport import TCP_NETWORK, Network, tls_context

T = TypeVar("T")

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# The first retry's jitter bound (doubled per retry up to 2 s). What is retried is mostly a service
# a second or so from ready (503 for credentials until the partitions follow the relays' beacon
# reveals): starting at 50 ms took seven requests per peer to wait out one second.
_FIRST_BACKOFF = 0.25
RETRY_GAP_CAP = 2.0
"""The longest a peer's client waits between two attempts of a request, or two polls for a document."""
# Inside answer_by, an attempt takes at most this share of the time left before the deadline (so a black-holed
# attempt leaves room for two more), but never less than _MIN_ATTEMPT_SECONDS (a loaded aggregator answers slowly).
_ATTEMPT_SHARE = 1 / 3
_MIN_ATTEMPT_SECONDS = 1.0

# The manifest is a peer's first request of a round, made before it knows the round's schedule, so no deadline
# bounds its attempts: one that a connection swallows would wait the client's whole timeout (60 s), past a
# small round's registration (bench faults, 60 peers: a peer worker's first request black-holed, and all its
# 30 peers found registration closed). It is a small signed document the aggregator serves from memory.
_MANIFEST_ATTEMPT_SECONDS = 5.0
# A receipt-log segment and a mirror's copy of the heads are needed by the final check, whose deadline lies
# minutes after the round (peer._session's settle time): a third of that let one swallowed attempt wait the
# client's whole 60 s, and every peer of the partition in that process waited on it (bench faults with ingest
# workers on PostgreSQL, lossy links: in 2 of 3 runs some partitions' peers of one worker, each partition's
# together, were still at their final check 30 s after the round). Both are served from memory; a large
# round's partition segment is a few hundred kilobytes.
_LOG_ATTEMPT_SECONDS = 15.0

_answer_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("answer_deadline", default=None)


@contextmanager
def answer_by(deadline: float) -> Iterator[None]:
    """Requests made inside (by any :class:`AggregatorClient`, in this task and the tasks it starts) are needed by
    ``deadline`` (trio time): they stop retrying then, and each attempt gets :func:`attempt_timeout`. Nested, the
    earlier deadline holds."""
    outer = _answer_deadline.get()
    token = _answer_deadline.set(deadline if outer is None else min(outer, deadline))
    try:
        yield
    finally:
        _answer_deadline.reset(token)


def attempt_timeout(left: float, timeout: float) -> float:
    """Seconds one attempt may take when its answer is needed ``left`` seconds from now: a third of that, at
    least _MIN_ATTEMPT_SECONDS, at most the client's ``timeout``."""
    return min(timeout, max(_MIN_ATTEMPT_SECONDS, left * _ATTEMPT_SHARE))


class AggregatorError(TransportError):
    """Raised by :class:`AggregatorClient` when the aggregator refuses a request
    (a 4xx other than 404-for-not-yet, with its ``error`` reason), answers
    with a body that does not parse, or stays unreachable past the deadline.

    ``status`` is the HTTP status (0 when no response came).
    """

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"aggregator answered {status}: {reason}" if status else f"aggregator unreachable: {reason}")


class BadAggregatorUrl(InputError):
    """Raised by :class:`AggregatorClient` for a URL that cannot name an aggregator (no ``http://``, no host)."""


def check_aggregator_url(text: str) -> httpx.URL:
    """``text`` as an aggregator base URL (``http://HOST:PORT``), or BadAggregatorUrl naming the fix."""
    example = "e.g. --aggregator http://127.0.0.1:8080"
    try:
        url = httpx.URL(text.strip())
    except httpx.InvalidURL as exc:
        raise BadAggregatorUrl(f"{text!r} is not a URL ({exc}); {example}") from None
    if url.scheme not in ("http", "https"):
        raise BadAggregatorUrl(f"{text!r} does not start with http:// or https://; {example}")
    if not url.host:
        raise BadAggregatorUrl(f"{text!r} names no host; {example}")
    return url


def _unresolvable(exc: BaseException) -> bool:
    """Whether ``exc`` (from httpx) comes from a host name that does not resolve."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return True
        seen = seen.__cause__ or seen.__context__
    return "Name or service not known" in str(exc) or "nodename nor servname" in str(exc)


RetryListener = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class AggregatorClient:
    """Typed calls to one aggregator. ``retry_for`` bounds how long transient
    failures are retried (seconds of trio time); ``on_retry`` hears each
    failure that is being retried. With ``wait_for_service`` a refused
    connection is retried even before the aggregator has first answered.
    ``network`` makes its HTTP client (the round simulator's in-memory one, seen from the peer's IP)."""

    def __init__(
        self, base_url: str, *, max_connections: int = 32, timeout: float = 60.0, retry_for: float = 120.0,
        wait_for_service: bool = False, on_retry: RetryListener = _quiet, network: Network = TCP_NETWORK,
        jitter: random.Random | None = None,
    ) -> None:
        self.base_url = str(check_aggregator_url(base_url)).rstrip("/")
        self._timeout = timeout
        self._http = network.http_client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            verify=tls_context(),
        )
        # Thousands of peers of one process queue here, not inside httpx's
        # pool, whose acquisition timeout would fail requests that merely wait.
        self._limiter = trio.CapacityLimiter(max_connections)
        self._retry_for = retry_for
        self._wait_for_service = wait_for_service
        self._reached = False
        self.on_retry = on_retry
        # Draws the retry delays; seeded in the simulator, so one seed gives one trace.
        self._jitter = jitter if jitter is not None else random.Random()
        self.requests = 0
        self.server_clock: tuple[float, float] | None = None
        """The last answer's ``protocol.CLOCK_HEADER`` (a relay mirror's clock) and the trio time it arrived."""
        self.retries = 0

    def _permanent(self, exc: httpx.HTTPError) -> AggregatorError | None:
        """The error to raise at once for a failure that no retry can cure, else None."""
        if _unresolvable(exc):
            host = httpx.URL(self.base_url).host
            return AggregatorError(0, f"the host {host!r} of {self.base_url} does not resolve: check the --aggregator URL")
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)) and not (self._reached or self._wait_for_service):
            return AggregatorError(
                0, f"nothing answers at {self.base_url} ({exc or type(exc).__name__}): check the URL, and that the "
                "aggregator is serving its round (`anonml aggregator run`)",
            )
        if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
            return AggregatorError(0, f"{self.base_url}: {exc}")
        return None

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: bytes | None = None, *,
                    attempt_cap: float | None = None) -> httpx.Response | None:
        """The response, or None for 404 (a document not published yet). ``attempt_cap``: the longest one attempt
        may take, where no deadline (:func:`answer_by`) gives a shorter one."""
        deadline = trio.current_time() + self._retry_for
        needed_by = _answer_deadline.get()
        if needed_by is not None:
            deadline = min(deadline, needed_by)
        backoff = _FIRST_BACKOFF
        while True:
            self.requests += 1
            try:
                async with self._limiter:
                    # Measured once the limiter lets it go: waiting for a turn is not the connection's fault.
                    timeout = self._timeout if attempt_cap is None else min(self._timeout, attempt_cap)
                    if needed_by is not None:
                        timeout = attempt_timeout(needed_by - trio.current_time(), timeout)
                    response = await self._http.request(
                        method, path, content=body, headers={"content-type": "application/json"} if body else None,
                        timeout=httpx.Timeout(timeout),
                    )
            except httpx.HTTPError as exc:
                permanent = self._permanent(exc)
                if permanent is not None:
                    raise permanent from None
                failure: AggregatorError = AggregatorError(0, f"{type(exc).__name__}: {exc}")
            else:
                self._reached = True
                told = _clock_header(response)
                if told is not None:
                    self.server_clock = (told, trio.current_time())
                if len(response.content) > MAX_RESPONSE_BYTES:
                    raise AggregatorError(response.status_code, f"response of {len(response.content)} bytes is too large")
                if response.status_code == 404:
                    return None
                if response.status_code < 400:
                    return response
                failure = AggregatorError(response.status_code, _error_reason(response))
                if response.status_code not in _RETRY_STATUSES:
                    raise failure
            if trio.current_time() + backoff > deadline:
                raise failure
            if backoff == _FIRST_BACKOFF or backoff >= RETRY_GAP_CAP and self.retries % 5 == 0:
                left = deadline - trio.current_time()
                self.on_retry(f"{method} {path}: {failure}; retrying for up to {left:.0f} s")
            self.retries += 1
            # Full jitter: thousands of peers retrying together must not come back in step.
            await trio.sleep(self._jitter.uniform(0, backoff))
            backoff = min(backoff * 2, RETRY_GAP_CAP)

    async def _get(self, path: str, parse: Callable[[bytes], T], *, attempt_cap: float | None = None) -> T | None:
        """The document at ``path`` as ``parse`` reads it (a pure function of the body's bytes), or None for 404."""
        response = await self._call("GET", path, attempt_cap=attempt_cap)
        if response is None:
            return None
        key = (parse, response.content)
        kept = _PARSED.get(key)
        if kept is None:
            kept = _parsed(response, parse)
            _PARSED.put(key, kept, len(response.content))
        return kept  # type: ignore[return-value]  # kept under (parse, body): parse's own result

    async def _post(self, path: str, body: bytes, parse: Callable[[bytes], T]) -> T:
        response = await self._call("POST", path, body)
        if response is None:
            raise AggregatorError(404, f"{path} is not served")
        return _parsed(response, parse)

    async def manifest(self) -> SignedManifest:
        """The signed manifest, signature checked (``SignedManifest.from_json``)."""
        signed = await self._get(PATH_MANIFEST, SignedManifest.from_json, attempt_cap=_MANIFEST_ATTEMPT_SECONDS)
        if signed is None:
            raise AggregatorError(404, "no round is being served")
        return signed

    async def register(self, request: RegisterRequest) -> RegisterResponse:
        return await self._post(PATH_REGISTER, request.to_json(), RegisterResponse.from_json)

    async def roster(self) -> RosterResponse | None:
        return await self._get(PATH_ROSTER, RosterResponse.from_json)

    async def credential(self, request: CredentialRequest) -> CredentialResponse:
        return await self._post(PATH_CREDENTIAL, request.to_json(), CredentialResponse.from_json)

    async def median(self, sub_round: int) -> SignedDocument | None:
        """The signed thresholds of median sub-round ``sub_round`` (the caller verifies them)."""
        return await self._get(PATH_MEDIAN.format(i=sub_round), _document)

    async def medians(self) -> SignedDocument | None:
        return await self._get(PATH_MEDIANS, _document)

    async def segment(self, kind: SurveyKind, partition: int, check: Check) -> ReceiptSegment | None:
        """One partition's receipt-log segment of a phase at a check (the caller verifies it)."""
        path = PATH_RECEIPTS.format(kind=kind.name.lower(), partition=partition, check=int(check))
        return await self._get(path, ReceiptSegment.from_json, attempt_cap=_LOG_ATTEMPT_SECONDS)

    async def status(self) -> RoundStatus | None:
        """The round's status as signed by the aggregator (parsed; not checked against an identity)."""
        document = await self._get(PATH_STATUS, _document)
        return None if document is None else _parsed_document(document, RoundStatus.from_document)

    # -- a relay's mirror of the aggregator's documents (this client's base URL is the relay's mirror) ----

    async def mirrored_manifest(self, identity: bytes) -> SignedManifest | None:
        return await self._get(mirror_path(identity, "manifest"), SignedManifest.from_json)

    async def mirrored_roster_head(self, identity: bytes) -> SignedDocument | None:
        return await self._get(mirror_path(identity, "roster/head"), _document)

    async def mirrored_document(self, identity: bytes, slot: str) -> SignedDocument | None:
        """A relay mirror's copy of a signed thresholds (``median/{i}``) or medians (``medians``) document."""
        return await self._get(mirror_path(identity, slot), _document)

    async def mirrored_beacon(self, identity: bytes) -> BeaconStatement | None:
        """A relay's beacon commitment for the round it mirrors and, once revealed, its value (``protocol._beacon``)."""
        return await self._get(mirror_path(identity, "beacon"), BeaconStatement.from_json)

    async def mirrored_heads(self, identity: bytes) -> HeadsResponse | None:
        return await self._get(mirror_path(identity, "heads"), HeadsResponse.from_json, attempt_cap=_LOG_ATTEMPT_SECONDS)

    async def roster_head(self) -> SignedDocument | None:
        return await self._get(PATH_ROSTER_HEAD, _document)

    async def heads(self) -> HeadsResponse | None:
        return await self._get(PATH_HEADS, HeadsResponse.from_json)


# Documents as parsed (signatures checked where the parser checks them), by parser and exact body: every
# peer of a process reads the same manifest, roster, heads and segments from the aggregator and each mirror,
# and in the round simulator each peer has its own client. A parser is a pure function of the body's bytes,
# so a repeat answers from here; a body that fails to parse is parsed (and refused) every time, and the
# parsed documents are frozen. Bounded by the bodies' bytes.
_PARSED: PureCache[tuple[Callable[[bytes], object], bytes], object] = PureCache(max_entries=256, max_weight=32 << 20)


def _document(body: bytes) -> SignedDocument:
    return SignedDocument.from_json(body, max_bytes=MAX_RESPONSE_BYTES)


def _parsed_document(document: SignedDocument, parse: Callable[[SignedDocument], T]) -> T:
    try:
        return parse(document)
    except InvalidDocument as exc:
        raise AggregatorError(200, f"malformed {document.kind.value} document: {exc}") from None


def _parsed(response: httpx.Response, parse: Callable[[bytes], T]) -> T:
    try:
        return parse(response.content)
    except InvalidDocument as exc:
        raise AggregatorError(response.status_code, f"malformed {response.request.url.path} response: {exc}") from None


def _error_reason(response: httpx.Response) -> str:
    try:
        return ErrorResponse.from_json(response.content).error
    except InvalidApiMessage:
        return response.text[:200] or response.reason_phrase


def retry_delay(attempt: int) -> float:
    """Seconds between polls for a document not published yet (capped exponential)."""
    return min(0.25 * math.pow(1.5, attempt), RETRY_GAP_CAP)


def _clock_header(response: httpx.Response) -> float | None:
    """A relay mirror's clock from its answer (``protocol.CLOCK_HEADER``), if it gives a plausible one."""
    value = response.headers.get(CLOCK_HEADER)
    try:
        told = float(value) if value is not None and len(value) <= 32 else None
    except ValueError:
        return None
    return told if told is not None and 0 < told < 1e11 else None


def mirror_clients(network: Network = TCP_NETWORK) -> Callable[[str], AggregatorClient]:
    """How a round session opens its client to one relay mirror, over ``network``: few connections and short
    retries (a mirror only corroborates what the aggregator serves)."""

    def open_mirror(url: str) -> AggregatorClient:
        return AggregatorClient(url, max_connections=4, retry_for=2.0, network=network)

    return open_mirror
