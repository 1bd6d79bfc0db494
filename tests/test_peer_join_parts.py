"""Pieces of the peer's round that need no aggregator: the packet transport
(real TCP against the protocol's own link server), path choice, resend
windows and the worst-case budget."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import trio

from anonml.peer._join import choose_path, peer_generator
from anonml.peer._transport import open_transport
from anonml.transport._link import AckStatus, serve_link
from anonml.protocol._manifest import RelayEntry

PACKET = 64
GEOMETRY = b"\x07" * 32


async def test_the_transport_batches_packets_and_returns_each_ack() -> None:
    batches: list[int] = []

    async def on_packets(frames: list[bytes]) -> list[AckStatus]:
        batches.append(len(frames))
        return [AckStatus.ACCEPTED if f[0] == 1 else AckStatus.REJECTED for f in frames]

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            await serve_link(stream, on_packets, packet_size=PACKET, geometry_hash=GEOMETRY)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        results: list[AckStatus | None] = []
        async with open_transport(packet_size=PACKET, geometry_hash=GEOMETRY) as transport:

            async def send(first: int) -> None:
                packet = bytes([first]) + bytes(PACKET - 1)
                results.append(await transport.send("127.0.0.1", port, packet, give_up_at=trio.current_time() + 10))

            async with trio.open_nursery() as senders:
                for i in range(50):
                    senders.start_soon(send, 1 if i % 5 else 2)
        nursery.cancel_scope.cancel()
    assert results.count(AckStatus.ACCEPTED) == 40
    assert results.count(AckStatus.REJECTED) == 10
    assert sum(batches) == 50
    assert len(batches) < 50  # packets queued behind a send in flight went in one batch


async def test_an_unreachable_relay_gives_no_ack_by_the_deadline() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        async with open_transport(packet_size=PACKET, geometry_hash=GEOMETRY) as transport:
            status = await transport.send("127.0.0.1", port, bytes(PACKET), give_up_at=trio.current_time() + 0.5)
    assert status is None


def relay(i: int) -> RelayEntry:
    return RelayEntry(bytes([i]) * 16, "127.0.0.1", 1000 + i, bytes([i]) * 32, 0)


def test_paths_are_distinct_relays_and_avoid_failed_ones_when_possible() -> None:
    relays = [relay(i) for i in range(5)]
    rng = np.random.default_rng(1)
    seen_first = set()
    for _ in range(200):
        path = choose_path(relays, 3, rng)
        assert len({r.node_id for r in path}) == 3
        seen_first.add(path[0].node_id)
    assert len(seen_first) == 5  # independently chosen: every relay leads some path
    avoid = {relays[0].node_id, relays[1].node_id}
    for _ in range(100):
        path = choose_path(relays, 3, rng, avoid)
        assert not {r.node_id for r in path} & avoid
    # not enough fresh relays: the path is still full length, fresh ones included
    path = choose_path(relays, 3, rng, {r.node_id for r in relays[:4]})
    assert len(path) == 3 and relays[4] in path


def test_the_peer_generator_is_chacha20_keyed_from_the_os() -> None:
    from randomgen import ChaCha

    first, second = peer_generator(), peer_generator()
    assert isinstance(first.bit_generator, ChaCha)
    assert first.bit_generator.state["state"]["rounds"] == 20
    # fresh 256-bit keys: two peers never share a stream
    assert first.integers(0, 2**62, 4).tolist() != second.integers(0, 2**62, 4).tolist()
    # a key given for a test reproduces its stream
    assert peer_generator(7).uniform(0, 1, 3).tolist() == peer_generator(7).uniform(0, 1, 3).tolist()


def test_every_message_ends_acknowledged_unconfirmed_or_missing_with_its_reason() -> None:
    from anonml.peer._join import LogView, _Outgoing, message_outcome
    from anonml.protocol import PhaseTimes, SealedReport, SurveyId

    survey = SurveyId.data(bytes(32), 0, 0)
    phase = PhaseTimes(100, 10, 130, 134, 10, 164)

    def out(receipt: bytes, left: bool) -> _Outgoing:
        return _Outgoing(survey, SealedReport(survey, b"", receipt), phase, left=left)

    final = LogView({}, {}, {survey: frozenset({b"counted"})}, {survey: (b"counted",)}, compared=True)
    assert message_outcome(out(b"counted", left=True), final) == "acknowledged"
    # No first relay took it in either chance: it never left this machine.
    assert message_outcome(out(b"lost", left=False), final) == "never-sent"
    # A first relay took it (first send or resend) and the final log still lacks it.
    assert message_outcome(out(b"lost", left=True), final) == "no-receipt-after-second-chance"
    # No final log to read: neither counted nor missing.
    assert message_outcome(out(b"counted", left=True), None) == "unconfirmed"


def test_the_peer_answers_only_thresholds_asking_once_about_each_numeric_feature() -> None:
    from anonml.peer._join import JoinRefused, check_thresholds
    from anonml.protocol import FeatureSpec, MedianThresholds, SurveyId

    spec = FeatureSpec.from_dict({
        "features": [
            {"name": "colour", "type": "categorical", "categories": ["red", "blue"]},
            {"name": "age", "type": "numeric", "low": 0, "high": 100},
            {"name": "size", "type": "numeric", "low": 0, "high": 10},
        ],
        "label": {"name": "y", "positive": ["1"], "negative": ["0"]},
    })
    def asking(*features: str, cut_points: int = 1) -> MedianThresholds:
        return MedianThresholds(0, features, tuple((1.0,) * cut_points for _ in features))

    check_thresholds(asking("age", "size"), spec)
    # What the consent text promised is one bit per numeric feature; anything
    # else (a repeat, a categorical feature, an omission) is refused.
    for features in [("age", "age", "size"), ("age", "size", "colour"), ("age",), ("size", "age")]:
        with pytest.raises(JoinRefused) as refused:
            check_thresholds(asking(*features), spec)
        assert refused.value.reason == "bad-thresholds"
    # One threshold per cut point of the spec, no more and no fewer.
    with pytest.raises(JoinRefused) as refused:
        check_thresholds(asking("age", "size", cut_points=3), spec)
    assert refused.value.reason == "bad-thresholds"
    check_thresholds(asking("age", "size", cut_points=3), spec.with_quantiles(3))
    with pytest.raises(JoinRefused):
        check_thresholds(asking("age", "size", cut_points=2), spec.with_quantiles(3))


def test_the_consent_shows_clipped_values_and_unknown_labels_as_such() -> None:
    """Issue 29: `age = 500.0` was shown although the round bins it as 90, and an income of "maybe" as "your label is 0"."""
    from anonml.peer._disclosure import _label_words, _value_words
    from anonml.protocol import FeatureSpec

    spec = FeatureSpec.from_dict({
        "features": [{"name": "age", "type": "numeric", "low": 17, "high": 90},
                     {"name": "colour", "type": "categorical", "categories": ["red", "blue"]}],
        "label": {"name": "income", "positive": [">50K"]},
    })
    assert _value_words(spec, "age", 500.0).startswith("500.0 (clipped to 90")
    assert _value_words(spec, "age", 3.0).startswith("3.0 (clipped to 17")
    assert _value_words(spec, "age", 40.0) == "40.0" and _value_words(spec, "colour", "red") == "'red'"
    unknown = _label_words(spec, 0, "maybe")
    assert "'maybe' is unknown" in unknown and "your label is 0" not in unknown
    assert _label_words(spec, 1, ">50K") == "your label is 1 ('>50K')"


def test_every_peer_event_prints_in_words() -> None:
    """Issue 29: `manifest-unmirrored`, `log-unverified` and `equivocation` were printed as raw tokens."""
    from anonml.peer import EVENT_WORDS, PeerEvent

    assert set(EVENT_WORDS) == set(PeerEvent)
    for event, words in EVENT_WORDS.items():
        assert len(words.split()) >= 5 and ("-" not in event.value or event.value not in words), (event, words)


def test_joining_a_round_that_has_ended_is_refused_with_a_clear_line() -> None:
    import click
    import pytest

    from anonml.peer._cli import _refuse_ended_round

    _refuse_ended_round("r", ends=1_000, now=999.0)
    with pytest.raises(click.ClickException) as refused:
        _refuse_ended_round("r", ends=1_000, now=1_000.0)
    assert "ended at" in refused.value.message and "nothing can be sent" in refused.value.message


def test_every_refusal_a_peer_raises_is_a_named_reason() -> None:
    """The reasons the demo counts are one vocabulary: every `JoinRefused(...)` in the peer names a RefusalReason."""
    import ast
    from pathlib import Path

    import anonml.peer
    from anonml.peer import RefusalReason

    folder = Path(anonml.peer.__file__).parent
    raised = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("JoinRefused", "BeaconRefused") and node.args:
                first = node.args[0]
                if ast.unparse(first) == "refused.reason":  # a BeaconRefused passed on: its own raise is checked
                    continue
                raised.add(first.value if isinstance(first, ast.Constant) else ast.unparse(first).rsplit(".", 1)[-1].lower().replace("_", "-"))
    assert raised and raised <= {str(reason) for reason in RefusalReason}, raised - {str(r) for r in RefusalReason}


def test_a_choice_names_its_options_by_value_not_by_enum_repr() -> None:
    """Issue 29: `name must be one of (<OracleName.GRR: 'grr'>, ...)`."""
    import pytest

    from anonml.mechanisms import make_oracle

    with pytest.raises(ValueError) as refused:
        make_oracle("nope", 4, 1.0)
    assert "one of grr, sue, pq" in str(refused.value) and "<" not in str(refused.value)
