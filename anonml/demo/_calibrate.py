"""What each phase of a round costs per peer on this machine, measured now.

The demo sizes its round's windows from these figures (:mod:`._schedule`)
instead of from constants measured once on another day: the same round needs
twice the time on a machine whose cores are shared with four busy processes.
Every figure is the *mean* wall time of real calls (the code paths a round
runs, not models of them), taken under whatever load the machine has now, so
contention is in the figure; the minimum would hide it.

The cores of one machine are not equally fast, so every figure is measured
on each core in turn and the slowest core's is kept (:func:`measure_costs`).
Measured here (2 virtual cores): one credential issuance took 0.83-0.93 ms
pinned to core 0 and 0.99-1.09 ms pinned to core 1, and an unpinned
measurement landed on either, 0.81 or 1.16 ms a minute apart. The round runs
on every core, so a plan from the fast core's figures held its work only at
the fast core's speed: the Adult demo planned 562-571 s or 751-795 s on the
same code, and a fast plan missed its issuance window (issue 26).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import trio
from nacl.signing import SigningKey

from anonml.crypto import (
    Credential,
    CredentialSecret,
    IssuerSecretKey,
    NodeAddress,
    PathHop,
    ReleaseWindow,
    SphinxGeometry,
    begin_issuance,
    build_packet,
    finish_issuance,
    generate_keypair,
    issue_credential,
    make_token,
    never_replayed,
    node_id_of,
    process_packet,
    verify_token,
)
from anonml.peer import PeerIdentity, PeerStore
from anonml.protocol import (
    CredentialRequest,
    CredentialResponse,
    RegisterRequest,
    RosterResponse,
    SurveyId,
    bound_bytes,
    seal_report,
)

# Samples per figure: enough for a stable mean of millisecond calls, a
# fraction of a second in all.
SAMPLES = 24
# The demo measures once its own processes (peer workers, relays, the
# aggregator's identity) use under a tenth of a core together, their start-up
# over; it waits at most QUIET_TIMEOUT seconds (a child that keeps working is
# load the round will also see).
QUIET_SHARE = 0.1
QUIET_TIMEOUT = 20.0
# At most this many cores are measured, spread over the allowed ones: each costs about half a second.
MAX_MEASURED_CORES = 8


@dataclass(frozen=True)
class PhaseCosts:
    """Seconds of wall time per unit of work, measured on this machine now.

    ``register``: one peer's registration (its identity, the signed request,
    its encoding, the aggregator's signature check). ``issue``: one blind
    credential exchange but its transport (:func:`_credential_exchange`: the signed request, issuance with
    proof, the peer's check, the peer's store). ``token``:
    one message made at the peer (token and Sphinx packet). ``verify``: one
    message checked (every relay's hop, the final hop, the token).
    ``roster_entry``: one entry of the final roster as each peer process reads it
    (parsed, hashed into the root, its signature checked) before any of its
    peers asks for a credential. ``http``: one loopback request and response
    through the aggregator's HTTP stack. ``process_start``: one ``anonml`` child process run to completion.
    ``serving_start``: a fresh interpreter importing what ``anonml aggregator
    run`` imports before it answers (:func:`serving_start_seconds`).
    """

    register: float
    issue: float
    roster_entry: float
    token: float
    relay_hop: float
    verify: float
    http: float
    process_start: float
    serving_start: float

    def to_dict(self) -> dict[str, float]:
        return {name: round(value, 6) for name, value in asdict(self).items()}


def mean_seconds(operation: Callable[[], object], samples: int = SAMPLES) -> float:
    """Mean wall seconds per call of ``operation`` (one warm-up call first)."""
    operation()
    started = time.perf_counter()
    for _ in range(samples):
        operation()
    return (time.perf_counter() - started) / samples


def _register() -> None:
    identity = PeerIdentity.generate()
    request = RegisterRequest.create(identity.signing_key, b"\x01" * 32)
    RegisterRequest.from_json(request.to_json()).verify()


ROSTER_SAMPLE = 256


def _roster_entry_seconds(entries: int = ROSTER_SAMPLE) -> float:
    """Seconds per entry of reading a signed roster of fresh ``entries`` once (``peer.RoundSession.roster``).

    Once, and no warm-up: a signature that verified is remembered (``protocol.ed25519_holds``), so a
    second reading of the same roster would time the cache."""
    round_id, aggregator = b"\x01" * 32, SigningKey.generate()
    signed = [RegisterRequest.create(PeerIdentity.generate().signing_key, round_id).entry for _ in range(entries)]
    document = RosterResponse.create(aggregator, round_id, signed, b"\x02" * 32).to_json()
    key = bytes(aggregator.verify_key)
    started = time.perf_counter()
    RosterResponse.from_json(document).verify(key, round_id)
    return (time.perf_counter() - started) / entries


def _credential_exchange(issuer: IssuerSecretKey, secret: CredentialSecret, identity: SigningKey, store: PeerStore) -> Credential:
    """One credential as the round makes it, but for the transport (timed apart, ``http``): the peer's blinded
    request stored and signed (``peer.PeerRound.obtain_credential``), the aggregator's check of it and its blind
    answer, then the peer's check of the answer and its stored credential. Not timed: the aggregator's record
    of it, committed with a batch of others (``aggregator.CredentialBatcher``)."""
    round_id, peer = b"\x01" * 32, bytes(identity.verify_key)
    public = issuer.public_key()
    store.remember_manifest(peer, "http://calibration", "calibration", round_id)
    store.set_partition(peer, round_id, 0)
    request, state = begin_issuance(public, secret, 0)
    store.set_issuance(peer, round_id, request.to_bytes())
    body = CredentialRequest.create(identity, round_id, request.to_bytes()).to_json()
    received = CredentialRequest.from_json(body)
    received.verify()
    answer = CredentialResponse(issue_credential(issuer, received.request, 0).to_bytes(), 0).to_json()
    credential = finish_issuance(state, CredentialResponse.from_json(answer).response)
    store.set_credential(peer, round_id, credential.to_bytes())
    return credential


def _crypto_costs(path_length: int, samples: int) -> dict[str, float]:
    issuer = IssuerSecretKey.generate()
    public = issuer.public_key()
    with tempfile.TemporaryDirectory(prefix="anonml-calibration-") as scratch:
        # The demo's peer workers keep their stores with durable=False (anonml.demo._swarm).
        store = PeerStore(Path(scratch) / "peer.sqlite", durable=False)
        identity, secret = SigningKey.generate(), CredentialSecret.generate()
        credential = _credential_exchange(issuer, secret, identity, store)
        issue = mean_seconds(partial(_credential_exchange, issuer, secret, identity, store), samples)
        store.close()
    geometry = SphinxGeometry.create()
    keys = [generate_keypair() for _ in range(path_length + 1)]
    hops = [
        PathHop(node_id_of(public_key), NodeAddress("127.0.0.1", 9000 + i), public_key, ReleaseWindow(0, 60))
        for i, (_, public_key) in enumerate(keys)
    ]
    survey = SurveyId.data(b"\x01" * 32, 0, 0)
    report = b"\x00" * 8

    def token() -> bytes:
        # What a peer runs per message (peer._join.prepare): the sealed report, then its packet.
        return build_packet(geometry, hops, seal_report(public, credential, survey, report, geometry.message_size).message)

    packet = token()
    made = make_token(public, credential, survey.to_bytes(), bound_bytes(survey, report))
    hop = mean_seconds(lambda: process_packet(geometry, keys[0][0], packet, is_replay=never_replayed), samples)
    check = mean_seconds(
        lambda: verify_token(issuer, survey.to_bytes(), bound_bytes(survey, report), made, expected_partition=0), samples
    )
    return {
        "register": mean_seconds(_register, samples),
        "issue": issue,
        "roster_entry": _roster_entry_seconds(),
        "token": mean_seconds(token, samples),
        "relay_hop": hop,
        # Every relay's hop and the final hop (the same Sphinx step), then the token check.
        "verify": hop * (path_length + 1) + check,
    }


async def _http_round_trip(samples: int, concurrency: int = 1) -> float:
    """Mean seconds per POST and its JSON answer through hypercorn, starlette and httpx on loopback, with
    ``concurrency`` of them in flight at once, as the round's workers keep theirs: each costs more then
    (measured here: 1.1-1.2 ms one at a time, 1.4 ms at 8 and 2.0-2.2 ms at 32 in flight)."""
    import httpx
    from hypercorn.config import Config
    from hypercorn.trio import serve
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")

    app = Starlette(routes=[Route("/", echo, methods=["POST"])])
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    body = os.urandom(300).hex().encode()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, config, mode="asgi"))  # type: ignore[arg-type]
        async with httpx.AsyncClient(base_url=binds[0], limits=httpx.Limits(max_connections=concurrency)) as client:

            async def post(times: int) -> None:
                for _ in range(times):
                    (await client.post("/", content=body)).raise_for_status()

            await post(1)
            each = max(1, -(-samples // concurrency))
            started = time.perf_counter()
            async with trio.open_nursery() as posting:
                for _ in range(concurrency):
                    posting.start_soon(post, each)
            seconds = (time.perf_counter() - started) / (each * concurrency)
        nursery.cancel_scope.cancel()
    return seconds


# What `anonml aggregator run` imports before it serves (aggregator/_cli.py imports them in the command).
_SERVING_MODULES = ("anonml.aggregator._report", "anonml.aggregator._round", "anonml.aggregator._service",
                    "anonml.aggregator._setup", "anonml.aggregator._progress")


async def serving_start_seconds() -> float:
    """Wall seconds a fresh interpreter takes to import the aggregator's serving stack: most of the time between
    ``aggregator run`` starting and its first answer. ``aggregator init`` (``process_start``) imports a fraction
    of it: 0.6-0.7 s against 3.8-10.2 s here at load 15 (issue 27)."""
    started = time.perf_counter()
    await trio.run_process([sys.executable, "-c", "import " + ", ".join(_SERVING_MODULES)])
    return time.perf_counter() - started


def allowed_cpus() -> list[int | None]:
    """The cores this process may run on, by number ([None] where the platform does not say)."""
    if not hasattr(os, "sched_getaffinity"):
        return [None]
    return [*sorted(os.sched_getaffinity(0))]


def measured_cpus(allowed: Sequence[int | None], most: int = MAX_MEASURED_CORES) -> list[int | None]:
    """The cores to measure: every allowed one, or ``most`` of them evenly spread."""
    if len(allowed) <= most:
        return list(allowed)
    return [allowed[i * len(allowed) // most] for i in range(most)]


@contextmanager
def pinned_to(cpu: int | None) -> Iterator[None]:
    """Run the calling thread on core ``cpu`` alone until the block ends (None: wherever it may run)."""
    if cpu is None:
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def slowest(figures: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per figure, the largest of the cores' measurements."""
    return {name: max(measured[name] for measured in figures) for name in figures[0]}


async def _costs_on(cpu: int | None, path_length: int, samples: int, concurrency: int = 1) -> dict[str, float]:
    """The per-unit figures measured with the measuring thread on core ``cpu`` (HTTP with ``concurrency``
    requests in flight)."""

    def crypto() -> dict[str, float]:
        with pinned_to(cpu):
            return _crypto_costs(path_length, samples)

    figures = await trio.to_thread.run_sync(crypto)
    # The server and client of the round trip both run on this (trio's) thread.
    with pinned_to(cpu):
        figures["http"] = await _http_round_trip(samples, concurrency)
    return figures


async def measure_costs(path_length: int, process_start: float, samples: int = SAMPLES, *, requests_in_flight: int = 1) -> PhaseCosts:
    """Time every phase's per-unit work now, on each core in turn, and keep the slowest core's figures;
    ``process_start`` is a child process run the caller timed; ``requests_in_flight``: the HTTP requests
    the round's peers keep in flight at once (``_schedule.requests_in_flight``)."""
    per_core = [await _costs_on(cpu, path_length, samples, requests_in_flight) for cpu in measured_cpus(allowed_cpus())]
    return PhaseCosts(process_start=process_start, serving_start=await serving_start_seconds(), **slowest(per_core))
