"""Issue 13 against a relay's mirror: it is public HTTP in the relay's own process, so clients
that trickle a request (or pile up) must be capped and cut off, not hold file descriptors the
relay's link needs. Real sockets on loopback."""

from __future__ import annotations

from collections import Counter

import httpx
import trio

from anonml.demo import free_port
from anonml.transport import HttpLimits
from anonml.relay import serve_mirror


async def test_trickling_clients_are_capped_per_source_and_cut_off_while_others_are_served(
    nursery: trio.Nursery,
) -> None:
    counts: Counter[str] = Counter()
    limits = HttpLimits(max_connections=16, max_connections_per_source=4, read_timeout=1.0)
    port = free_port()
    url = await nursery.start(lambda task_status: serve_mirror(("127.0.0.1", port), (), limits=limits, counts=counts,
                                                               task_status=task_status))
    closed_by_server: list[bool] = []

    async def trickle() -> None:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port, local_address="127.0.0.3")
        except OSError:
            closed_by_server.append(True)
            return
        await stream.send_all(b"GET /v1/mirror/")
        with trio.move_on_after(8):
            try:
                while True:
                    await stream.send_all(b"a")
                    with trio.move_on_after(0.3):
                        if not await stream.receive_some(4096):
                            closed_by_server.append(True)
                            return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                closed_by_server.append(True)
                return
        closed_by_server.append(False)
        await stream.aclose()

    async with trio.open_nursery() as clients:
        for _ in range(12):  # the source's share is 4: each newcomer takes the slot of its own idlest one
            clients.start_soon(trickle)
        await trio.sleep(0.3)
        # Another client is served meanwhile.
        async with httpx.AsyncClient(base_url=url, timeout=3) as client:
            assert (await client.get("/v1/mirror/00/manifest")).status_code == 404
    assert counts["refused/per-source"] + counts["refused/evicted-idle"] >= 12 - 4
    # ... and those let in are cut off by the read deadline, not held for as long as they trickle.
    assert closed_by_server == [True] * 12


async def test_a_mirror_on_ipv6_reports_a_url_that_reaches_it(nursery: trio.Nursery) -> None:
    """transport.serve_http wrote ``http://::1:PORT``, which no HTTP client can use; an IPv6 host is bracketed."""
    url = await nursery.start(lambda task_status: serve_mirror(("::1", 0), (), task_status=task_status))
    assert url.startswith("http://[::1]:")
    async with httpx.AsyncClient(base_url=url, timeout=3) as client:
        assert (await client.get("/v1/mirror/00/manifest")).status_code == 404
