"""Colluding relay mirrors that lie about their clock to one peer, to make it stop (``clock-off``).

Before its credential a peer compares its clock with the clocks the relay
mirrors state on every answer (``protocol.CLOCK_HEADER``) and stops when more
than half of the mirrors put it over ``MAX_CLOCK_ERROR`` off on one side
(``peer._session.check_clock``). A minority of colluding mirrors must not be
able to force that stop: each mirror must count once, however often it is
asked. A mirror that answers 404 ("not mirrored yet") is asked again while the
peer polls for a quorum of mirrors holding the manifest, so a peer that
counted every answer would let a mirror that keeps answering 404 vote as
often as the peer polls.

:class:`LyingMirrorClocks` plays that: the colluding relays' mirrors (a
minority: by default the last ``(relays - 1) // 2`` of the manifest) answer
every request of a target with 404 and a clock ``lie`` seconds ahead of true
time. It times this with a fault it did not cause: the route between the
target and one honest mirror is down for ``outage`` seconds after
registration ends (a restart, a flapping link), so the target keeps polling
while the other honest mirrors have answered. A mirror it cannot reach
states no clock. Every other request, and every other peer's, reaches the
real mirrors.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import h11
import trio

from anonml.protocol import CLOCK_HEADER, MAX_REQUEST_BYTES
from anonml.simulate._adversary import Adversary, Clock, RoundContext
from anonml.transport import Dial, connection_pair

NOT_HELD = b'{"error":"not mirrored (yet)"}'


class LyingMirrorClocks(Adversary):
    """A minority of relay mirrors answer the targets 404 with a false clock while one honest mirror is out of reach.

    ``relays``: the colluding relays' indices (None: the last ``(relays - 1) // 2``); ``lie``: seconds their
    stated clock runs ahead of true time (the target looks that far behind); ``outage``: seconds after
    registration ends that the first honest mirror refuses the targets' connections.
    """

    name = "lying-mirror-clocks"

    def __init__(self, targets: Sequence[str] = (), relays: Sequence[int] | None = None, *,
                 lie: float = 100.0, outage: float = 10.0) -> None:
        super().__init__(targets)
        if lie <= 0 or outage < 0:
            raise ValueError(f"lie must be positive and outage at least 0; got lie={lie!r}, outage={outage!r}")
        self.relays = None if relays is None else tuple(relays)
        self.lie = lie
        self.outage = outage
        self.refused = 0
        """The targets' connections the honest mirror out of reach refused."""
        self.lies = 0
        """Answers the colluding mirrors gave the targets."""

    def describe(self) -> str:
        relays = "the last (relays - 1) // 2 relays" if self.relays is None else f"relays {list(self.relays)}"
        return (f"{self.name} ({relays} answer 404, clock {self.lie:.0f} s ahead; "
                f"one honest mirror {self.outage:.0f} s out of reach)")

    def attach(self, context: RoundContext) -> None:
        super().attach(context)
        mirrors = [urlsplit(relay.mirror_url) for relay in context.manifest.relays if relay.mirror_url is not None]
        count = len(mirrors)
        colluding = {i % count for i in self.relays} if self.relays is not None else set(range(count - (count - 1) // 2, count))
        honest = [(m.hostname, m.port) for i, m in enumerate(mirrors) if i not in colluding]
        addresses = {(m.hostname, m.port) for i, m in enumerate(mirrors) if i in colluding}
        back_at = context.manifest.schedule.t_register_end + self.outage
        previous = context.network.on_connect

        async def lie_to_targets(dial: Dial) -> None:
            if previous is not None:
                await previous(dial)
            if dial.source[0] not in self.targets:
                return
            if honest and dial.destination == honest[0] and context.clock() < back_at:
                self.refused += 1
                raise ConnectionRefusedError(f"{dial.destination[0]} is out of reach")
            if dial.destination not in addresses:
                return
            # The colluding operator reads the request first: the manifest it answers itself, anything else
            # goes on to its relay's mirror as sent.
            outer, inner = connection_pair(dial.source, dial.destination)
            ours, dial.server = dial.server, inner
            context.nursery.start_soon(self._serve, ours, outer, context.clock)

        context.network.on_connect = lie_to_targets

    async def _serve(self, stream: trio.abc.Stream, relay: trio.abc.Stream, clock: Clock) -> None:
        """Read one HTTP/1.1 request; answer a manifest request 404 stating a clock ``lie`` seconds ahead,
        pass any other to the relay's mirror and its answer back."""
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
        sent = bytearray()
        try:
            async with stream, relay:
                while not isinstance(event := connection.next_event(), h11.Request):
                    if event is not h11.NEED_DATA:
                        return
                    sent += (data := await stream.receive_some(MAX_REQUEST_BYTES))
                    connection.receive_data(bytes(data))
                if not event.target.decode().endswith("/manifest"):
                    await relay.send_all(bytes(sent))  # a mirror request is a GET: its whole request is read
                    await _pass_answer(relay, stream, event)
                    return
                headers = [("content-type", "application/json"), ("content-length", str(len(NOT_HELD))),
                           (CLOCK_HEADER, f"{clock() + self.lie:.3f}"), ("connection", "close")]
                for part in (h11.Response(status_code=404, headers=headers), h11.Data(data=NOT_HELD), h11.EndOfMessage()):
                    await stream.send_all(connection.send(part) or b"")
                self.lies += 1
        except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the target gave up on the request



async def _pass_answer(relay: trio.abc.Stream, stream: trio.abc.Stream, request: h11.Request) -> None:
    """Pass the relay's answer to ``request`` back as it comes, until it ends (the relay keeps the connection)."""
    answer = h11.Connection(h11.CLIENT)
    answer.send(h11.Request(method=request.method, target=request.target, headers=request.headers))
    answer.send(h11.EndOfMessage())
    while True:
        event = answer.next_event()
        if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return
        if event is h11.NEED_DATA:
            data = bytes(await relay.receive_some())
            answer.receive_data(data)
            await stream.send_all(data)
