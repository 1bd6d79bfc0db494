"""The peer against the real aggregator service on loopback (HTTP over real
sockets): registration, roster and seed check, partition agreement, blind
credential issuance, and the refusal of a manifest that changed under it."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from nacl.signing import SigningKey

from anonml.aggregator._round import RoundState
from anonml.aggregator._service import AggregatorConfig, serve_aggregator
from anonml.aggregator._setup import create_round
from anonml.aggregator._spec import RoundSpec, parse_round_spec
from anonml.aggregator._home import AggregatorHome
from anonml.crypto import generate_keypair
from anonml.peer import PeerLedger, PeerRound, planned_releases
from anonml.peer._client import AggregatorClient, AggregatorError
from anonml.peer._features import RoundPipeline
from anonml.peer._framework import Dataset, Event
from anonml.peer._identity import PeerIdentity
from anonml.peer._join import JoinRefused, Peer, RoundSession, check_manifest_unchanged
from anonml.peer._store import PeerStore
from anonml.peer._transport import open_transport
from anonml.protocol import SurveyId, derive_subsets
from anonml.protocol._features import FeatureSpec
from anonml.testing import SettableClock
from round_support import two_feature_spec

T0 = 1_800_000_000


def spec_document(register_seconds: int = 100) -> dict[str, Any]:
    # Each relay lists its beacon key, as `relay info` prints it: a test that gives one a mirror needs it listed.
    relays = [
        {"node_id": (bytes([i + 1]) * 16).hex(), "host": "127.0.0.1", "port": 9000 + i, "public_key": generate_keypair()[1].hex(), "key_epoch": 1,
         "beacon_key": bytes(SigningKey.generate().verify_key).hex()}
        for i in range(3)
    ]
    return two_feature_spec(
        name="peer-test", eps_total=2.0, min_participation=2,
        schedule={"register": register_seconds, "issue": 100, "median_rounds": 2, "median_send": 10, "median_delivery": 20, "data_send": 50, "data_delivery": 60},
        network={"relays": relays, "http_port": 8080, "sink_port": 8081},
    )


def make_round(home: AggregatorHome, now: int, register_seconds: int = 100) -> RoundState:
    state, _ = create_round(home, parse_round_spec(spec_document(register_seconds)), now=now)
    return state


@pytest.fixture
def home(tmp_path: Path) -> AggregatorHome:
    home = AggregatorHome(tmp_path / "agg")
    home.initialise(bytes(range(32)), generate_keypair()[0])
    return home


@pytest.fixture
async def served(home: AggregatorHome, nursery: trio.Nursery) -> AsyncIterator[tuple[RoundState, str, SettableClock]]:
    """A round served on loopback whose clock stands still until the test moves it.

    HTTP runs over real sockets, so trio's MockClock cannot drive it; the
    round and the peers read a :class:`SettableClock` instead, and no window
    can close before the test has done what it needs inside it, however long
    a loaded machine takes to start a CLI or answer a request.
    """
    yield await serve_at_rest(home, nursery, parse_round_spec(spec_document(register_seconds=3)))
    nursery.cancel_scope.cancel()


async def serve_at_rest(home: AggregatorHome, nursery: trio.Nursery, spec: RoundSpec) -> tuple[RoundState, str, SettableClock]:
    """The round of ``spec`` served on loopback, its clock standing at ``T0`` until the caller moves it."""
    clock = SettableClock(float(T0))
    state, _ = create_round(home, spec, now=T0)
    state.clock = clock
    addresses = await nursery.start(serve_aggregator, AggregatorConfig(state))
    return state, addresses.http_url, clock


async def serve_round(home: AggregatorHome, nursery: trio.Nursery, register_seconds: int) -> tuple[RoundState, str]:
    state = make_round(home, int(time.time()), register_seconds=register_seconds)
    addresses = await nursery.start(serve_aggregator, AggregatorConfig(state))
    return state, addresses.http_url


@pytest.fixture
async def announced(home: AggregatorHome, nursery: trio.Nursery) -> AsyncIterator[tuple[RoundState, str]]:
    """A round served on loopback whose registration stays open for the whole test (CLI processes start slowly under load)."""
    yield await serve_round(home, nursery, register_seconds=600)
    nursery.cancel_scope.cancel()


def vector_for(pipeline: RoundPipeline, age: float, colour: str, label: str) -> Any:
    return pipeline.vector_of(Dataset((Event({"age": age, "colour": colour, "y": label}, None, 2),)))


@asynccontextmanager
async def registered_peers(url: str, clock: SettableClock, store: PeerStore, count: int = 5) -> AsyncIterator[list[PeerRound]]:
    """``count`` peers of the round served at ``url``, each registered, sharing one session whose transport stays
    open while the caller uses them."""
    client = AggregatorClient(url, retry_for=5)
    try:
        signed = await client.manifest()
        pipeline = RoundPipeline.for_spec(FeatureSpec.from_dict(dict(signed.manifest.features)))
        async with open_transport(packet_size=2048, geometry_hash=bytes(32)) as transport:
            session = RoundSession(client, transport, now=clock)
            runs = [
                PeerRound(Peer(PeerIdentity.generate(), store, vector_for(pipeline, 30.0 + i, "red", "1"), np.random.default_rng(i)), session, signed, pipeline, lambda _: None)
                for i in range(count)
            ]
            for run in runs:
                await run.register()
            yield runs
    finally:
        await client.aclose()


async def test_peers_register_agree_on_partitions_and_get_credentials_blindly(served: Any, tmp_path: Path) -> None:
    state, url, clock = served
    store = PeerStore(tmp_path / "peers.sqlite", durable=False)
    async with registered_peers(url, clock, store) as runs:
        assert state.store.counts()["registered"] == 5
        # Registration closes only now; partition() waits for the seed to be revealed.
        clock.now = state.manifest.schedule.t_register_end
        for run in runs:
            partition, size, subsets = await run.partition()
            assert state.assignment()[run.key] == partition
            assert size in (2, 3)
            assert len(subsets) == 1 and len(subsets[0]) == 1
            run.credential = await run.obtain_credential(partition)
            assert run.credential.partition == partition
            registration = store.registration(run.key, run.round_id)
            assert registration is not None and registration.credential == run.credential.to_bytes()
    assert state.store.counts()["credentials"] == 5


async def test_a_peer_in_a_partition_below_the_manifests_minimum_anonymity_set_refuses_before_its_credential(
    home: AggregatorHome, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Issue 24: the manifest signs a minimum anonymity set; a peer whose partition (derived from the
    seed and roster) is smaller refuses with reason "anonymity-set" before it asks for a credential.
    ``round new`` refuses such a spec, so the round is made as an aggregator that skips the check would."""
    spec = parse_round_spec(spec_document(register_seconds=3))
    spec = replace(spec, participation=replace(spec.participation, min_anonymity_set=3))
    state, url, clock = await serve_at_rest(home, nursery, spec)
    store = PeerStore(tmp_path / "peers.sqlite", durable=False)
    outcomes: dict[int, str] = {}
    async with registered_peers(url, clock, store) as runs:
        assert runs[0].manifest.min_anonymity_set == 3
        clock.now = state.manifest.schedule.t_register_end
        for run in runs:  # 5 peers in k_p = 2 partitions: one of 3 peers, one of 2
            try:
                partition, _, _ = await run.partition()
            except JoinRefused as refused:
                size = state.partition_sizes()[state.assignment()[run.key]]
                assert refused.reason == "anonymity-set" and size == 2
                assert f"has {size} peer(s), fewer than the manifest's minimum anonymity set of 3" in str(refused)
                outcomes[size] = outcomes.get(size, "") + "r"
                continue
            await run.obtain_credential(partition)
            outcomes[3] = outcomes.get(3, "") + "c"
    assert outcomes == {2: "rr", 3: "ccc"}
    assert state.store.counts()["credentials"] == 3  # the refusing peers asked for nothing
    nursery.cancel_scope.cancel()


@pytest.mark.parametrize("k_h", [1, 2])
def test_the_promised_epsilon_is_what_a_peer_consents_to_and_bounds_what_it_spends(home: AggregatorHome, tmp_path: Path, k_h: int) -> None:
    document = spec_document()
    document["learning"]["k_h"] = k_h
    state, _ = create_round(home, parse_round_spec(document), now=T0)
    manifest = state.manifest
    spec = FeatureSpec.from_dict(dict(manifest.features))
    store = PeerStore(tmp_path / "peers.sqlite", durable=False)
    # Before partitions are known: the peer's ledger total of the worst case is the promise.
    medians, subsets = planned_releases(manifest, spec)
    consenting = PeerLedger(store, PeerIdentity.generate().public_key, state.round_id, manifest.eps_total)
    assert consenting.total_after(medians=medians, subsets=subsets) == manifest.eps_total
    assert manifest.eps_total == pytest.approx(document["privacy"]["eps_total"])
    consenting.check(medians=medians, subsets=subsets)
    # Once the seed is known: what a peer of each partition really spends fits the promise.
    dealt = derive_subsets(state.secrets.seed, spec.names, manifest.plan, manifest.k_p, manifest.k_h, manifest.k_s)
    for partition, partition_subsets in enumerate(dealt):
        ledger = PeerLedger(store, PeerIdentity.generate().public_key, state.round_id, manifest.eps_total)
        if manifest.median_rounds:
            ledger.spend_median(manifest.median_survey(partition), spec.numeric_names, manifest.eps_median)
        for index, subset in enumerate(partition_subsets):
            ledger.spend_labelled(SurveyId.data(state.round_id, partition, index), subset, manifest.eps_data)
        assert ledger.spent() <= manifest.eps_total


async def test_a_peer_refuses_a_manifest_whose_hash_differs_from_the_one_it_registered_under(home: AggregatorHome, tmp_path: Path) -> None:
    first, second = make_round(home, T0), make_round(home, T0 + 7)
    assert first.signed.manifest.name == second.signed.manifest.name
    assert first.round_id != second.round_id
    peer = Peer(PeerIdentity.generate(), PeerStore(tmp_path / "peer.sqlite"), None, np.random.default_rng(0))  # type: ignore[arg-type]
    check_manifest_unchanged(peer, first.signed, "http://127.0.0.1:8080")
    check_manifest_unchanged(peer, first.signed, "http://127.0.0.1:8080")
    with pytest.raises(JoinRefused) as refused:
        check_manifest_unchanged(peer, second.signed, "http://127.0.0.1:8080")
    assert refused.value.reason == "manifest-changed"


def peer_cli(*args: str) -> list[str]:
    from anonml.base.process import anonml_command

    return anonml_command("peer", *args)


async def test_peer_cli_dry_run_shows_what_leaves_and_sends_nothing(announced: Any, tmp_path: Path) -> None:
    state, url = announced
    data_dir = tmp_path / "me"
    init = await trio.run_process(peer_cli("init", "--data-dir", str(data_dir)), capture_stdout=True, capture_stderr=True)
    assert b"created" in init.stdout
    again = await trio.run_process(peer_cli("init", "--data-dir", str(data_dir)), capture_stdout=True, capture_stderr=True, check=False)
    assert again.returncode != 0 and b"refusing to overwrite" in again.stderr
    good = tmp_path / "me.csv"
    good.write_text("age,colour,y\n41,green,1\n")
    shown = await trio.run_process(
        peer_cli("join", "--data-dir", str(data_dir), "--aggregator", url, "--data", str(good), "--dry-run"),
        capture_stdout=True, capture_stderr=True,
    )
    text = shown.stdout.decode()
    assert "age = 41.0, shared only as above or below the group's privately estimated median" in text
    assert "colour = 'green', shared only as which of 3 categories" in text
    assert "1 data packet(s)" in text and "'grr' frequency oracle" in text
    assert "at most epsilon 2 of the 2 this round promises" in text
    assert "nothing was sent" in text
    assert state.store.counts()["registered"] == 0


async def dry_run_join(url: str, tmp_path: Path, csv_text: str) -> Any:
    """A new peer's `peer join --dry-run` at ``url`` with a file holding ``csv_text``: the finished process."""
    data_dir = tmp_path / "me"
    await trio.run_process(peer_cli("init", "--data-dir", str(data_dir)), capture_stdout=True)
    data = tmp_path / "me.csv"
    data.write_text(csv_text)
    return await trio.run_process(peer_cli("join", "--data-dir", str(data_dir), "--aggregator", url, "--data", str(data), "--dry-run"),
                                  capture_stdout=True, capture_stderr=True, check=False)


def label_free_statistics_document() -> dict[str, Any]:
    """The test round as a statistics task whose queries read ``colour`` and never the label."""
    document = spec_document(register_seconds=600)
    document["task"].update(kind="statistics", queries=["histogram:colour"])
    document["learning"] = {"k_p": 2, "k_h": 1, "k_s": 1, "plan": "one", "learner": "logreg"}
    document["privacy"]["oracle"] = "oue"
    for key in ("median_rounds", "median_send", "median_delivery"):  # no numeric feature is read: no median search
        document["schedule"].pop(key)
    return document


async def test_peer_cli_joins_a_label_free_round_with_a_file_that_has_no_label_column(
    home: AggregatorHome, nursery: trio.Nursery, tmp_path: Path,
) -> None:
    state, _ = create_round(home, parse_round_spec(label_free_statistics_document()), now=int(time.time()))
    url = (await nursery.start(serve_aggregator, AggregatorConfig(state))).http_url
    shown = await dry_run_join(url, tmp_path, "age,colour\n41,green\n")
    text = shown.stdout.decode()
    assert shown.returncode == 0, shown.stderr.decode()
    assert "queries histogram:colour" in text and "your label is never sent" in text, text
    assert "colour = 'green'" in text and "age = " not in text and "nothing was sent" in text, text
    nursery.cancel_scope.cancel()


async def test_peer_cli_reports_a_malformed_csv_row_with_its_line_number(announced: Any, tmp_path: Path) -> None:
    _, url = announced
    result = await dry_run_join(url, tmp_path, "age,colour,y\n\n41,green\n")
    assert result.returncode == 1
    assert b"line 3: expected 3 fields" in result.stderr


async def _answer_losing_proxy(upstream_port: int, lost: list[int], task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A loopback proxy that passes every request on to the aggregator and every answer back, except that it
    resets the connection instead of passing on the answer to a credential request (it counts those in ``lost``):
    the aggregator issued and stored the credential, the peer never hears it."""

    async def handle(client: trio.SocketStream) -> None:
        answer_lost = False
        async with client, await trio.open_tcp_stream("127.0.0.1", upstream_port) as server:

            async def requests() -> None:
                nonlocal answer_lost
                async for chunk in client:  # the peer's requests, passed on as they come
                    answer_lost = answer_lost or chunk.startswith(b"POST /v1/credential")
                    await server.send_all(chunk)

            async def answers() -> None:
                async for chunk in server:
                    if answer_lost:
                        lost.append(1)
                        # Closed with an RST on leaving ``async with client``: the peer's read fails.
                        client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        nursery.cancel_scope.cancel()
                        return
                    await client.send_all(chunk)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(requests)
                nursery.start_soon(answers)

    await trio.serve_tcp(handle, 0, host="127.0.0.1", task_status=task_status)


async def test_a_peer_whose_credential_answers_were_lost_gets_the_stored_answer_for_its_stored_request(
    served: Any, tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Issue 27: the answer to a credential request lost on a reset connection. The client retries the same
    request, and a peer run again (after a crash, or after the client gave up) sends the request it stored
    before the first send: the aggregator answers it with the stored credential. Before, every retry was
    refused 409 (already issued) and a run again re-blinded, refused too: the peer sent nothing all round."""
    state, url, clock = served
    store = PeerStore(tmp_path / "peers.sqlite", durable=False)
    lost: list[int] = []
    [listener] = await nursery.start(_answer_losing_proxy, int(url.rsplit(":", 1)[1].strip("/")), lost)
    proxy_url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
    async with registered_peers(url, clock, store, count=2) as runs:
        clock.now = state.manifest.schedule.t_register_end
        run = runs[0]
        partition, _, _ = await run.partition()
        # Every answer lost: the client retries the identical request until it gives up.
        lossy = AggregatorClient(proxy_url, retry_for=1.5)
        try:
            cut_off = PeerRound(run.peer, RoundSession(lossy, run.session.transport, now=clock), run.signed, run.pipeline, lambda _: None)
            with pytest.raises(AggregatorError):
                await cut_off.obtain_credential(partition)
        finally:
            await lossy.aclose()
        assert len(lost) >= 2 and state.store.counts()["credentials"] == 1
        assert (registration := store.registration(run.key, run.round_id)) is not None and registration.credential is None
        # Run again (a new PeerRound on the same store): the stored request, answered from the aggregator's store.
        again = PeerRound(run.peer, run.session, run.signed, run.pipeline, lambda _: None)
        credential = await again.obtain_credential(partition)
        assert credential.partition == partition
        assert state.store.counts()["credentials"] == 1
        registration = store.registration(run.key, run.round_id)
        assert registration is not None and registration.credential == credential.to_bytes() and registration.issuance is None
