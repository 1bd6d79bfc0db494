"""The in-memory network (transport/_memory.py) under trio's MockClock: the real link server and client,
the real HTTP server (gate, pacer, hypercorn) reached by httpx, refusals, the adversary's hook, and the
roles' clients threaded through it."""

from __future__ import annotations

from collections import Counter
from functools import partial
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest
import trio
import trio.testing
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from anonml.peer import AggregatorClient, AggregatorError, mirror_clients, open_transport
from anonml.relay import DirectoryError, PinnedAggregator, fetch_manifest, serve_mirror
from anonml.transport import (
    AckStatus,
    Dial,
    HttpLimits,
    LinkClient,
    LinkError,
    LinkErrorReason,
    LinkIdentity,
    LinkSessionStats,
    TCP_NETWORK,
    MemoryNetwork,
    MemoryStream,
    connection_pair,
    listening_address,
    peer_address,
    serve_http,
    serve_link,
    serve_streams,
)

SIZE = 64
GEOMETRY = bytes(range(32))
SERVER = LinkIdentity(bytes(range(1, 33)))
NEIGHBOUR = LinkIdentity(bytes(range(2, 34)))
RELAY_IP, NEIGHBOUR_IP, PEER_IP, OTHER_PEER_IP = "10.1.0.1", "10.1.0.2", "10.2.0.7", "10.2.0.8"
Address = tuple[str, int]


def frame(index: int) -> bytes:
    return bytes([1]) + index.to_bytes(4, "big") + bytes(SIZE - 5)


async def test_a_link_hello_and_batch_are_acknowledged_between_two_nodes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    received: list[bytes] = []
    sessions: list[tuple[str, LinkSessionStats]] = []

    async def on_packets(frames: list[bytes]) -> Sequence[AckStatus]:
        received.extend(frames)
        return [AckStatus.ACCEPTED] * len(frames)

    async def handler(stream: trio.abc.Stream) -> None:
        stats = LinkSessionStats()
        sessions.append((peer_address(stream), stats))
        async with stream:
            await serve_link(stream, on_packets, packet_size=SIZE, geometry_hash=GEOMETRY, stats=stats,
                             identity=SERVER, admit=lambda node_id: node_id == NEIGHBOUR.node_id)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_streams, network, handler, RELAY_IP, 0)
        host, port = listening_address(listeners)
        client = LinkClient(host, port, packet_size=SIZE, geometry_hash=GEOMETRY, identity=NEIGHBOUR,
                            expect_node_id=SERVER.node_id, network=network.node(NEIGHBOUR_IP))
        started = trio.current_time()
        first = await client.send_batch([frame(i) for i in range(5)], give_up_at=started + 10)
        second = await client.send_batch([frame(5)], give_up_at=started + 10)
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert first == [AckStatus.ACCEPTED] * 5 and second == [AckStatus.ACCEPTED]
    assert received == [frame(i) for i in range(6)]
    assert client.connects == 1 and client.failures == 0
    # The server saw the neighbour's own address and its authenticated node id.
    assert [(source, stats.peer) for source, stats in sessions] == [(NEIGHBOUR_IP, NEIGHBOUR.node_id)]
    assert host == RELAY_IP and port >= 49152
    assert trio.current_time() == started  # nothing waited: no timeout fired on the way


def hello_app(seen: list[tuple[float, str, str]]) -> Starlette:
    async def hello(request: Request) -> Response:
        client = request.client
        assert client is not None
        body = (await request.body()).decode()
        seen.append((trio.current_time(), client.host, body))
        return PlainTextResponse(f"{request.method} from {client.host}: {body}")

    return Starlette(routes=[Route("/", hello, methods=["GET", "POST"])])


IN_PROCESS = pytest.mark.parametrize("in_process", [False, True], ids=["over-http11", "in-process"])


@IN_PROCESS
async def test_http_requests_reach_the_real_server_from_each_clients_own_address(
    autojump_clock: trio.testing.MockClock, in_process: bool,
) -> None:
    network = MemoryNetwork(in_process_http=in_process)
    seen: list[tuple[float, str, str]] = []
    counts: Counter[str] = Counter()
    # One request a second once a source's burst of one is spent: the pacer holds the rest on trio's clock.
    limits = HttpLimits(request_rate=1.0, request_burst=1.0, request_floor=1.0)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve_http(hello_app(seen), "10.0.0.1", 8080, limits, counts, network=network,
                                           task_status=task_status)
        )
        assert url == "http://10.0.0.1:8080"
        async with network.http_client(base_url=url, local_address=PEER_IP) as client:
            got = await client.get("/")
            posted = await client.post("/", content=b"report")
        async with network.node(OTHER_PEER_IP).http_client(base_url=url) as other:
            other_got = await other.get("/")
        nursery.cancel_scope.cancel()
    assert (got.status_code, got.text) == (200, f"GET from {PEER_IP}: ")
    assert (posted.status_code, posted.text) == (200, f"POST from {PEER_IP}: report")
    assert other_got.text == f"GET from {OTHER_PEER_IP}: "
    # The second request of PEER_IP waited its second; the other source had its own bucket.
    assert [(round(at, 6), host) for at, host, _ in seen] == [(0.0, PEER_IP), (1.0, PEER_IP), (1.0, OTHER_PEER_IP)]
    assert counts["paced"] == 1


async def test_an_idle_connection_closed_by_the_server_is_replaced_and_a_silent_server_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dials: list[tuple[float, Dial]] = []

    async def record(dial: Dial) -> None:
        dials.append((trio.current_time(), dial))

    network = MemoryNetwork(on_connect=record)
    seen: list[tuple[float, str, str]] = []

    async def silent(request: Request) -> Response:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    app = hello_app(seen)
    app.router.routes.append(Route("/silent", silent))
    limits = HttpLimits(keep_alive_timeout=5.0)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve_http(app, "10.0.0.1", 0, limits, Counter(), network=network,
                                           task_status=task_status)
        )
        async with network.http_client(base_url=url, local_address=PEER_IP, timeout=3.0) as client:
            assert (await client.get("/")).status_code == 200
            assert (await client.get("/")).status_code == 200  # kept alive: the same connection
            await trio.sleep(6.0)  # past hypercorn's keep-alive: it closes the idle connection
            assert (await client.get("/")).status_code == 200
            before = trio.current_time()
            with pytest.raises(httpx.ReadTimeout):
                await client.get("/silent")
            assert trio.current_time() - before == pytest.approx(3.0)
        nursery.cancel_scope.cancel()
    # One connection for the first two, a new one after the server closed it (reused for /silent).
    assert [(at, dial.source[0]) for at, dial in dials] == [(0.0, PEER_IP), (6.0, PEER_IP)]


async def test_nothing_listening_is_a_refused_connection_for_every_client(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    with pytest.raises(ConnectionRefusedError):
        await network.connect("10.0.0.1", 9000)
    listeners = await network.listen("10.0.0.1", 9000)
    with pytest.raises(OSError):
        await network.listen("10.0.0.1", 9000)  # in use
    stream = await network.connect("10.0.0.1", 9000)
    await stream.aclose()
    await listeners[0].aclose()
    with pytest.raises(ConnectionRefusedError):
        await network.connect("10.0.0.1", 9000)  # closed again
    link = LinkClient("10.0.0.1", 9000, packet_size=SIZE, geometry_hash=GEOMETRY, network=network)
    with pytest.raises(LinkError) as refused:
        await link._connect()
    assert refused.value.reason is LinkErrorReason.CONNECT_FAILED
    async with network.http_client() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("http://10.0.0.1:9000/")


async def test_the_gate_caps_connections_per_source_over_the_memory_network(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    counts: Counter[str] = Counter()
    # The per-source cap binds from the first connection (transport/_admission.py): a source's third
    # connection takes the slot of its own connection idle longest, never another source's.
    limits = HttpLimits(max_connections=4, max_connections_per_source=2)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve_http(hello_app([]), "10.0.0.1", 8080, limits, counts, network=network,
                                           task_status=task_status)
        )
        held = [await network.connect("10.0.0.1", 8080, local_address=PEER_IP) for _ in range(2)]
        await trio.sleep(0.1)
        third = await network.connect("10.0.0.1", 8080, local_address=PEER_IP)
        assert await held[0].receive_some() == b""  # the oldest silent one is closed for it
        assert trio.current_time() == 0.1  # by the gate, not by hypercorn's keep-alive timeout
        async with network.http_client(base_url=url, local_address=OTHER_PEER_IP) as other:
            assert (await other.get("/")).status_code == 200  # another source still gets in
        async with network.http_client(base_url=url, local_address=PEER_IP) as again:
            assert (await again.get("/")).status_code == 200  # and so does the first, in turn
        assert await held[1].receive_some() == b""
        await third.aclose()
        nursery.cancel_scope.cancel()
    assert counts["refused/evicted-idle"] == 2 and counts["refused/per-source"] == 0, counts


async def test_http_churn_from_sixteen_networks_leaves_fresh_connections_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Issue 25: 544 silent connections from 16 addresses, reopened when closed, took every slot, and
    6.9% of GETs on new connections were answered. Scaled: 16 addresses (each in a /24 of its own)
    hold every one of 32 slots and reopen at once; each honest GET opens a fresh connection."""
    network = MemoryNetwork()
    counts: Counter[str] = Counter()
    limits = HttpLimits(max_connections=32, max_connections_per_source=2)
    opened = 0

    async def churn(source: str) -> None:
        nonlocal opened
        while True:
            stream = await network.connect("10.0.0.1", 8080, local_address=source)
            opened += 1
            while await stream.receive_some():  # silent until the server closes it
                pass
            await trio.sleep(0.01)  # then at once again

    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve_http(hello_app([]), "10.0.0.1", 8080, limits, counts, network=network,
                                           task_status=task_status)
        )
        for index in range(16):
            for _ in range(2):
                nursery.start_soon(churn, f"10.3.{index}.1")
        await trio.sleep(1.0)
        answered = 0
        for _ in range(20):
            async with network.http_client(base_url=url, local_address=PEER_IP) as fresh:
                try:
                    answered += (await fresh.get("/")).status_code == 200
                except httpx.HTTPError:
                    pass
            await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    assert answered == 20, counts
    assert counts["refused/evicted-idle"] >= 20 and opened > 32


@IN_PROCESS
async def test_the_connect_hook_can_refuse_and_interpose(autojump_clock: trio.testing.MockClock, in_process: bool) -> None:
    """A hook refuses one source and counts the bytes of the others by sitting between the two ends
    (in process too: a request whose dial a hook stands in front of goes over it as HTTP/1.1)."""
    relayed: Counter[str] = Counter()

    async def pump(source: trio.abc.Stream, sink: trio.abc.Stream, label: str) -> None:
        async with source, sink:
            while chunk := await source.receive_some():
                relayed[label] += len(chunk)
                await sink.send_all(chunk)

    async with trio.open_nursery() as nursery:

        async def adversary(dial: Dial) -> None:
            if dial.source[0] == OTHER_PEER_IP:
                raise ConnectionRefusedError("dropped by the adversary")
            outer, inner = connection_pair(dial.source, dial.destination)
            nursery.start_soon(pump, dial.server, outer, "to-server")
            nursery.start_soon(pump, outer, dial.server, "to-client")
            dial.server = inner

        network = MemoryNetwork(on_connect=adversary, in_process_http=in_process)
        url = await nursery.start(
            lambda task_status: serve_http(hello_app([]), "10.0.0.1", 8080, HttpLimits(), Counter(), network=network,
                                           task_status=task_status)
        )
        async with network.http_client(base_url=url, local_address=PEER_IP) as client:
            got = await client.get("/")
        async with network.http_client(base_url=url, local_address=OTHER_PEER_IP) as refused:
            with pytest.raises(httpx.ConnectError):
                await refused.get("/")
        nursery.cancel_scope.cancel()
    assert got.text == f"GET from {PEER_IP}: "  # the interposed server end keeps the client's address
    assert relayed["to-server"] > 0 and relayed["to-client"] >= len(got.content)


async def test_the_roles_clients_dial_through_the_network_they_are_given(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The peer's aggregator, mirror and packet clients and the relay's manifest fetch, each from its node's IP."""
    dials: set[tuple[str, Address]] = set()

    async def refuse(dial: Dial) -> None:
        dials.add((dial.source[0], dial.destination))
        raise ConnectionRefusedError("nobody home")

    network = MemoryNetwork(on_connect=refuse)
    peer = network.node(PEER_IP)
    clients = (AggregatorClient("http://10.0.0.1:8080", network=peer), mirror_clients(peer)("http://10.1.0.1:8081"))
    for client in clients:
        with pytest.raises(AggregatorError):
            await client.manifest()
        await client.aclose()
    async with open_transport(packet_size=SIZE, geometry_hash=GEOMETRY, network=network,
                              local_address=OTHER_PEER_IP) as packets:
        assert await packets.send("10.1.0.1", 7000, frame(0), give_up_at=trio.current_time() + 1.0) is None
    with pytest.raises(DirectoryError):
        await fetch_manifest("http://10.0.0.1:8080", identity=bytes(32), timeout=1.0,
                             network=network.node(RELAY_IP))
    assert dials == {
        (PEER_IP, ("10.0.0.1", 8080)), (PEER_IP, ("10.1.0.1", 8081)),
        (OTHER_PEER_IP, ("10.1.0.1", 7000)), (RELAY_IP, ("10.0.0.1", 8080)),
    }


async def test_a_relay_mirror_serves_and_refreshes_over_the_network(autojump_clock: trio.testing.MockClock) -> None:
    dials: list[tuple[str, Address]] = []

    async def record(dial: Dial) -> None:
        dials.append((dial.source[0], dial.destination))

    network = MemoryNetwork(on_connect=record)
    pinned = PinnedAggregator("http://10.0.0.1:8080", bytes(range(32)))  # nobody serves it: refreshes fail
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve_mirror, (RELAY_IP, 8081), [pinned], network=network.node(RELAY_IP),
                                          now=lambda: 1_800_000_000.25))
        client = AggregatorClient(url, network=network.node(PEER_IP))
        assert await client.mirrored_manifest(pinned.identity) is None  # 404: not mirrored (yet)
        # Every answer, a 404 too, tells the relay's clock: the peer checks its own against it.
        assert client.server_clock is not None and client.server_clock[0] == 1_800_000_000.25
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert url == f"http://{RELAY_IP}:8081"
    assert set(dials) == {(RELAY_IP, ("10.0.0.1", 8080)), (PEER_IP, (RELAY_IP, 8081))}


def slow_app(done: list[tuple[float, str]]) -> Starlette:
    """``/stream``: two chunks 3 s apart; ``/late``: answers after 100 s (and records that it did)."""

    async def stream(request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first;"
            await trio.sleep(3.0)
            yield b"second"

        return StreamingResponse(chunks())

    async def late(request: Request) -> Response:
        await trio.sleep(100.0)
        done.append((trio.current_time(), "late"))
        return PlainTextResponse("too late")

    return Starlette(routes=[Route("/stream", stream), Route("/late", late)])


@IN_PROCESS
async def test_bodies_stream_and_timeouts_hold_on_trios_clock_and_a_server_outlives_its_client(
    autojump_clock: trio.testing.MockClock, in_process: bool,
) -> None:
    """The in-process path keeps what the wire path does: a body streams (each chunk within the read
    timeout), a slow answer is a ReadTimeout at the client's deadline, and the server still finishes the
    request its client gave up on (a withheld request still lands, late, as over TCP)."""
    network = MemoryNetwork(in_process_http=in_process)
    done: list[tuple[float, str]] = []
    counts: Counter[str] = Counter()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve_http(slow_app(done), "10.0.0.1", 8080, HttpLimits(read_timeout=1_000.0), counts,
                                           network=network, task_status=task_status)
        )
        async with network.http_client(base_url=url, local_address=PEER_IP, timeout=5.0) as client:
            streamed = await client.get("/stream")
            started = trio.current_time()
            with pytest.raises(httpx.ReadTimeout):
                await client.get("/late")
            gave_up = trio.current_time() - started
        async with network.http_client(base_url=url, local_address=PEER_IP, timeout=2.0) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await impatient.get("/stream")  # the first chunk comes at once, the second 3 s later
        await trio.sleep(200.0)
        nursery.cancel_scope.cancel()
    assert (streamed.status_code, streamed.content) == (200, b"first;second")
    assert gave_up == pytest.approx(5.0)
    assert [round(at, 6) for at, _ in done] == [103.0]


async def test_a_request_to_an_app_in_process_is_dialled_but_never_reaches_the_listener(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """In process, the hook still sees one dial per request, from the requester's address, and the app
    answers it; hypercorn (behind the listener) never accepts a connection for it."""
    dials: list[Dial] = []

    async def record(dial: Dial) -> None:
        dials.append(dial)

    network = MemoryNetwork(on_connect=record, in_process_http=True)
    seen: list[tuple[float, str, str]] = []
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve_http(hello_app(seen), "10.0.0.1", 8080, HttpLimits(), Counter(), network=network,
                                           task_status=task_status)
        )
        async with network.http_client(base_url=url, local_address=PEER_IP) as client:
            answers = [(await client.post("/", content=str(i).encode())).text for i in range(3)]
        nursery.cancel_scope.cancel()
    assert answers == [f"POST from {PEER_IP}: {i}" for i in range(3)]
    assert [(dial.source[0], dial.destination) for dial in dials] == [(PEER_IP, ("10.0.0.1", 8080))] * 3
    # Every dialled pair stayed unused: not one byte of HTTP/1.1 was written to a server end.
    assert not any(dial.server.is_readable() for dial in dials if isinstance(dial.server, MemoryStream))


def cookie_setter(cookies_sent: list[str | None]) -> Starlette:
    async def tracked(request: Request) -> Response:
        cookies_sent.append(request.headers.get("cookie"))
        return PlainTextResponse("", headers={"set-cookie": "tracker=peer-7; Path=/"})

    return Starlette(routes=[Route("/", tracked)])


@IN_PROCESS
async def test_memory_clients_keep_no_cookies(autojump_clock: trio.testing.MockClock, in_process: bool) -> None:
    """A server that sets a cookie never gets it back: it cannot tie a client's requests together that way."""
    network = MemoryNetwork(in_process_http=in_process)
    cookies_sent: list[str | None] = []
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve_http(cookie_setter(cookies_sent), "10.0.0.1", 8080, HttpLimits(), Counter(),
                                           network=network, task_status=task_status)
        )
        async with network.http_client(base_url=url, local_address=PEER_IP) as client:
            await client.get("/")
            await client.get("/")
            assert not client.cookies
        nursery.cancel_scope.cancel()
    assert cookies_sent == [None, None]


async def test_tcp_clients_keep_no_cookies() -> None:
    """The real network's clients too (httpx's own transport, with a handler in place of the server)."""
    cookies_sent: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        cookies_sent.append(request.headers.get("cookie"))
        return httpx.Response(200, headers={"set-cookie": "tracker=peer-7; Path=/"})

    async with TCP_NETWORK.http_client(transport=httpx.MockTransport(handler)) as client:
        await client.get("http://10.0.0.1/")
        await client.get("http://10.0.0.1/")
        assert not client.cookies
    assert cookies_sent == [None, None]


@IN_PROCESS
async def test_a_server_that_stops_mid_request_leaves_its_client_without_an_answer(
    autojump_clock: trio.testing.MockClock, in_process: bool,
) -> None:
    """A server cancelled while it handles a request closes the connection: its client gets a transport error,
    never an answer the server did not give (a 500 would read as the server refusing)."""
    network = MemoryNetwork(in_process_http=in_process)
    failures: list[BaseException] = []
    async with trio.open_nursery() as outer:
        server = trio.CancelScope()

        async def serve(task_status: trio.TaskStatus[str]) -> None:
            with server:
                await serve_http(slow_app([]), "10.0.0.1", 8080, HttpLimits(read_timeout=1_000.0), Counter(),
                                 network=network, task_status=task_status)

        url = await outer.start(serve)

        async def ask() -> None:
            async with network.http_client(base_url=url, local_address=PEER_IP, timeout=50.0) as client:
                try:
                    await client.get("/late")
                except httpx.TransportError as exc:
                    failures.append(exc)

        outer.start_soon(ask)
        await trio.sleep(10.0)
        server.cancel()
    assert len(failures) == 1 and not isinstance(failures[0], httpx.TimeoutException)


def echo_app(seen: list[dict[str, object]]) -> Starlette:
    """Answers with what it was asked (method, path, query, headers, body); a redirect for /moved."""

    async def echo(request: Request) -> Response:
        body = await request.body()
        seen.append({"method": request.method, "path": request.url.path, "query": request.url.query,
                     "headers": sorted(request.headers.items()), "body": body})
        if request.url.path.endswith("/moved"):
            return Response(status_code=307, headers={"location": "/elsewhere"})
        return PlainTextResponse(f"{request.method} {request.url.path} {body.decode()}", headers={"x-echo": "1"})

    return Starlette(routes=[Route("/{path:path}", echo, methods=["GET", "POST"])])


async def test_the_in_process_clients_short_request_is_the_request_httpx_sends(autojump_clock: trio.testing.MockClock) -> None:
    """What the app sees and what the role gets back are the same whether httpx's own ``send`` runs
    (a keyword beyond URL, body and headers sends the request that way) or the short path does."""
    network = MemoryNetwork(in_process_http=True)
    seen: list[dict[str, object]] = []
    answers: dict[str, list[tuple[int, list[tuple[str, str]], bytes, str]]] = {"short": [], "httpx": []}
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve_http(echo_app(seen), "10.0.0.1", 8080, HttpLimits(), Counter(), network=network,
                                           task_status=task_status)
        )
        async with network.http_client(base_url=url + "/v1", local_address=PEER_IP, headers={"x-role": "peer"}) as client:
            for way, extra in (("short", {}), ("httpx", {"params": {}})):
                for method, path, body, headers in (("GET", "/manifest", None, None), ("POST", "/credential", b"{}", {"content-type": "application/json"}),
                                                    ("GET", "/moved", None, None), ("GET", "/manifest", None, None)):
                    response = await client.request(method, path, content=body, headers=headers, **extra)
                    answers[way].append((response.status_code, sorted(response.headers.items()), response.content,
                                         str(response.request.url)))
        nursery.cancel_scope.cancel()
    assert answers["short"] == answers["httpx"]
    assert [a[0] for a in answers["short"]] == [200, 200, 307, 200]  # the redirect is not followed, as httpx's default
    assert answers["short"][1][2] == b"POST /v1/credential {}"
    assert answers["short"][0][3] == "http://10.0.0.1:8080/v1/manifest"
    assert seen[:4] == seen[4:]
    assert ("x-role", "peer") in seen[0]["headers"]  # type: ignore[operator]


async def test_peers_parse_a_document_they_all_get_once_and_a_malformed_one_every_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two peers' clients reading the same bytes share one parse (a pure function of them); a body the
    parser refuses is refused to each asker."""
    network = MemoryNetwork(in_process_http=True)
    bodies = {"/good": b'{"n":1}', "/bad": b'{"n":"x"}'}

    async def serve(request: Request) -> Response:
        return Response(bodies[request.url.path], media_type="application/json")

    parsed: list[bytes] = []

    def parse(body: bytes) -> dict[str, int]:
        parsed.append(body)
        if body == bodies["/bad"]:
            raise AggregatorError(200, "malformed")
        return {"n": 1}

    app = Starlette(routes=[Route("/good", serve), Route("/bad", serve)])
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve_http(app, "10.0.0.1", 8080, HttpLimits(), Counter(), network=network, task_status=task_status)
        )
        peers = [AggregatorClient(url, network=network.node(ip)) for ip in (PEER_IP, OTHER_PEER_IP)]
        firsts = [await peer._get("/good", parse) for peer in peers]
        for peer in peers:
            with pytest.raises(AggregatorError, match="malformed"):
                await peer._get("/bad", parse)
            await peer.aclose()
        nursery.cancel_scope.cancel()
    assert firsts == [{"n": 1}, {"n": 1}] and firsts[0] is firsts[1]
    assert parsed == [bodies["/good"], bodies["/bad"], bodies["/bad"]]
