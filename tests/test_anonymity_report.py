"""The round's anonymity report (issue 12, DESIGN.md §11): the aggregator's timing guess from its full view,
scored against a known truth, far above chance on a leaky schedule and at chance on the uniform one.

Tolerances are binomial: a guess at chance p over N messages has standard
error sqrt(p (1 - p) / N); Spearman's rho of independent samples has 1/sqrt(n - 1).
Every check allows 3 standard errors (a false failure about 1 time in 370 per
check, and the seeds are fixed, so a run is reproducible).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import numpy as np
import pytest
import trio
from nacl.signing import SigningKey

from anonml.aggregator import LINKS_JSON, FullView, RequestLog, linking_report
from anonml.aggregator._service import AggregatorConfig, serve_aggregator
from anonml.aggregator._store import VerifiedPacket
from anonml.protocol import PATH_REGISTER, RegisterRequest, SurveyId, receipt_digest
from anonml.aggregator import rank_link, score_links, timing_figures
from test_anonymity_protocol import make_round

N = 2_000
ROUND = bytes(32)


def test_timing_figures_link_a_fifo_network_and_not_an_independent_one() -> None:
    rng = np.random.default_rng(1)
    send = rng.uniform(0, 30, N)
    # Leaky: every packet delayed by about the same time (a FIFO relay), so arrival order is send order.
    leaky = timing_figures(send, send + 40 + rng.uniform(0, 0.01, N), np.random.default_rng(2))
    assert leaky["spearman_rho"] > 0.99
    assert leaky["exact_link_accuracy"] > 0.5 and leaky["half_link_accuracy"] > 0.99
    # Uniform: each packet released at a uniform time of the delivery window, independent of its send time.
    uniform = timing_figures(send, rng.uniform(30, 70, N), np.random.default_rng(3))
    assert abs(uniform["spearman_rho"]) < 3 * uniform["rho_standard_error"]
    assert uniform["rho_standard_error"] == 1 / math.sqrt(N - 1)
    chance = uniform["exact_link_chance"]
    assert chance == pytest.approx(1 / N)
    assert uniform["exact_link_accuracy"] <= chance + 3 * math.sqrt(chance * (1 - chance) / N)
    assert abs(uniform["half_link_accuracy"] - 0.5) < 3 * uniform["half_link_standard_error"]


def test_rank_link_breaks_ties_at_random_not_by_input_order() -> None:
    # Everyone requested at the same scheduled second and everything arrived in the same second:
    # input order (here the truth) must not leak into the guess.
    keys = list(range(N))
    guesses = rank_link(dict.fromkeys(keys, 100.0), [200.0] * N, np.random.default_rng(4))
    score = score_links(guesses, keys, [N] * N)
    assert score.accuracy <= score.chance + 3 * score.standard_error


def _view(leaky: bool, seed: int, partitions: int = 2, per_partition: int = 500) -> tuple[RequestLog, list[tuple[SurveyId, bytes, float]], dict[bytes, int], dict[bytes, bytes]]:
    """A round's full view: each peer's signed request at a time of its own, and one arrival per peer.

    Leaky: a peer's packet arrives a fixed delay after its last request (a
    peer that asks for something just before it sends, through a FIFO
    network). Uniform: the arrival is independent of the peer's requests.
    Returns the log, the arrivals, identity -> partition, and receipt -> true sender.
    """
    rng = np.random.default_rng(seed)
    log, arrivals, partition_of, truth = RequestLog(), [], {}, {}
    for index in range(partitions * per_partition):
        identity = index.to_bytes(32, "big")
        partition = index % partitions
        partition_of[identity] = partition
        requested = float(rng.uniform(0, 100))
        log.record(requested - 50, "10.0.0.1")  # a shared address (a NAT): attributed to nobody
        log.record(requested, f"10.1.{index // 256}.{index % 256}", identity)
        receipt = receipt_digest(identity)
        truth[receipt] = identity
        arrived = requested + 150 + float(rng.uniform(0, 0.5)) if leaky else float(rng.uniform(150, 250))
        arrivals.append((SurveyId.data(ROUND, partition, 0), receipt, arrived))
    return log, arrivals, partition_of, truth


def _score(leaky: bool, seed: int, tmp_path: Path) -> tuple[float, float, float, dict[str, object]]:
    log, arrivals, partition_of, truth = _view(leaky, seed)
    report = linking_report(FullView(arrivals, partition_of, lambda survey: 120.0, log, ROUND), tmp_path)
    links = json.loads((tmp_path / LINKS_JSON).read_text())
    score = score_links([bytes.fromhex(link["guess"]) for link in links], [truth[bytes.fromhex(link["receipt"])] for link in links],
                        [link["candidates"] for link in links])
    return score.accuracy, score.chance, score.standard_error, report


def test_the_aggregators_guess_links_a_leaky_schedule_far_above_chance(tmp_path: Path) -> None:
    accuracy, chance, error, report = _score(True, 5, tmp_path)
    assert chance == pytest.approx(1 / 500) and report["chance"] == pytest.approx(chance) and report["anonymity_set_min"] == 500
    assert report["messages"] == 1000 and report["requests_attributed"] == 1000  # the NAT's requests name nobody
    assert accuracy > 0.3 > chance + 10 * error  # 150 times chance


def test_the_aggregators_guess_is_at_chance_when_arrivals_are_independent(tmp_path: Path) -> None:
    accuracy, chance, error, _ = _score(False, 6, tmp_path)
    assert abs(accuracy - chance) <= 3 * error


def test_an_address_only_one_identity_used_names_that_identity() -> None:
    log = RequestLog()
    alice, bob = b"a" * 32, b"b" * 32
    log.record(10.0, "192.0.2.1", alice)
    log.record(20.0, "192.0.2.1")  # alice's address, unsigned request: still alice
    log.record(15.0, "192.0.2.9", bob)
    log.record(16.0, "192.0.2.9", alice)
    log.record(30.0, "192.0.2.9")  # two identities behind it: nobody
    last, attributed = log.last_seen(25.0)
    assert last == {alice: 20.0, bob: 15.0} and attributed == 4


async def test_the_served_api_logs_every_request_and_names_signed_ones(tmp_path: Path, nursery: trio.Nursery) -> None:
    state, clock = make_round(tmp_path, registration="open", purpose="test", max_per_client=100)
    addresses = await nursery.start(serve_aggregator, AggregatorConfig(state))
    key = SigningKey(b"\x07" * 32)
    async with httpx.AsyncClient(base_url=addresses.http_url) as client:
        assert (await client.get("/v1/manifest")).status_code == 200
        response = await client.post(PATH_REGISTER, content=RegisterRequest.create(key, state.round_id).to_json())
        assert response.status_code == 200, response.text
        refused = await client.post(PATH_REGISTER, content=b"{}")
        assert refused.status_code == 400
    named = [r for r in state.requests.requests if r.identity is not None]
    assert [r.identity for r in named] == [bytes(key.verify_key)]  # the refused request names nobody
    assert len(state.requests.requests) == 4 and {r.address for r in state.requests.requests} == {"127.0.0.1"}
    nursery.cancel_scope.cancel()


def test_accepted_packets_keep_their_arrival_to_the_sub_second(tmp_path: Path) -> None:
    state, _ = make_round(tmp_path)
    survey = SurveyId.data(state.round_id, 0, 0)
    packets = [VerifiedPacket(survey, bytes([i]) * 32, bytes(32), b"\x00", receipt_digest(bytes([i])), 1000.25 + i) for i in range(3)]
    state.store.store_batch(packets, [], 1002)
    assert [(s, a) for s, _, a in state.store.arrivals()] == [(survey, 1000.25), (survey, 1001.25), (survey, 1002.25)]


def test_the_demo_scores_the_aggregators_guesses_against_who_sent_what(tmp_path: Path) -> None:
    from anonml.demo._progress import Progress
    from anonml.demo._summary import anonymity_figures

    rng = np.random.default_rng(7)
    n = 400
    send = rng.uniform(0, 30, n)
    # Worker summaries carry (identity, receipt, send time); the aggregator guessed every sender right
    # for the first 100 messages and always "peer 0" for the rest, with arrivals in send order.
    progress = Progress(summaries={0: {"sent": [[f"{i:064x}", f"{i:064x}", float(send[i])] for i in range(n)]}})
    links = [{"survey": "00", "receipt": f"{i:064x}", "arrived": float(send[i]) + 40, "guess": f"{i if i < 100 else 0:064x}",
              "candidates": n} for i in range(n)]
    (tmp_path / LINKS_JSON).write_text(json.dumps(links))
    figures = anonymity_figures(progress, tmp_path / LINKS_JSON)
    assert figures["senders_known"] == n
    assert figures["aggregator_guess"]["correct"] == 100 and figures["aggregator_guess"]["chance"] == pytest.approx(1 / n)
    assert figures["spearman_rho"] == pytest.approx(1.0)
    # Two surveys in two phases, arrivals independent of sends inside each: the correlation is measured
    # within surveys, not between phases (pooled times would give rho near 1 from the phases alone).
    later = rng.uniform(100, 130, n)
    for i, link in enumerate(links):
        link["survey"] = "01" if i % 2 else "00"
        link["arrived"] = float(rng.uniform(40, 70) if i % 2 == 0 else rng.uniform(140, 170))
    progress.summaries[0]["sent"] = [[f"{i:064x}", f"{i:064x}", float(send[i] if i % 2 == 0 else later[i])] for i in range(n)]
    (tmp_path / LINKS_JSON).write_text(json.dumps(links))
    phased = anonymity_figures(progress, tmp_path / LINKS_JSON)
    assert abs(phased["spearman_rho"]) < 3 * phased["rho_standard_error"]
    assert anonymity_figures(progress, tmp_path / "missing.json") == {"unavailable": "missing.json was not written (the round did not learn)"}
