"""``anonml bench aggregator``: the packet sink's cost per packet, beside same-run baselines.

Simulated peers (real identities, blind credentials, tokens and Sphinx
packets, no network) fill one round; the bench then times the aggregator's
verification path (:func:`aggregator.process_batch`) — final Sphinx layer,
message parsing, token verification, report check, durable store — in
link-sized batches, with verification in the batch's thread and in a process
pool. Not timed: the sink's link reads and its inbox (the commit that makes
a frame durable before it is acknowledged, and reading it back). Baselines measured
in the same run: one X25519 scalar multiplication and one token verification
alone (DESIGN.md §11: ratios, because absolute times drift on shared machines).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from anonml.aggregator import AggregatorHome, IssuerWorkers, create_round, parse_round_spec, process_batch
from anonml.crypto import (
    generate_keypair,
    make_token,
    public_key_of,
    verify_token,
)
from anonml.protocol import SurveyId
from anonml.testing import SettableClock, enrol


def bench_spec(relays: list[dict[str, Any]] | None = None, schedule: dict[str, int] | None = None, sink_port: int = 8081) -> dict[str, Any]:
    """A test-purpose round of two categorical features (no median phase), open registration, k_p = 2.

    ``relays`` default to three made-up entries (this bench sends straight to
    the sink); ``anonml bench anonymity`` passes its real relays, its windows
    and its sink's port.
    """
    relays = relays or [
        {"node_id": f"{i + 1:02x}" * 16, "host": "127.0.0.1", "port": 9000 + i, "public_key": generate_keypair()[1].hex(), "key_epoch": 1}
        for i in range(3)
    ]
    return {
        "name": "bench",
        "task": {
            "features": [
                {"name": "a", "type": "categorical", "categories": ["x", "y", "z"]},
                {"name": "b", "type": "categorical", "categories": ["u", "v"]},
            ],
            "label": {"name": "y", "positive": ["1"], "negative": ["0"]},
        },
        "learning": {"k_p": 2, "k_h": 1, "k_s": 2, "plan": "split", "learner": "logreg"},
        "privacy": {"eps_total": 2.0, "oracle": "auto"},
        "schedule": schedule or {"register": 100, "issue": 100, "median_send": 10, "median_delivery": 20, "data_send": 50, "data_delivery": 60},
        "network": {"relays": relays, "path_length": 3, "http_host": "127.0.0.1", "http_port": 8080, "sink_host": "127.0.0.1", "sink_port": sink_port},
        "participation": {"min_participation": 1, "registration": "open", "purpose": "test", "max_per_client": 100_000,
                          "min_anonymity_set": 1},
    }


def run_bench(n_packets: int, batch: int, processes: int, seed: int) -> dict[str, Any]:
    """Per-packet sink cost over ``n_packets`` fresh packets; returns the figures."""
    rng = np.random.default_rng(seed)
    start = 1_800_000_000
    with tempfile.TemporaryDirectory() as tmp:
        home = AggregatorHome(Path(tmp) / "agg")
        home.initialise(os.urandom(32), generate_keypair()[0])
        clock = SettableClock(start + 1)
        state, _ = create_round(home, parse_round_spec(bench_spec()), now=start)
        state.clock = clock
        peers = enrol(state, clock, [rng.bytes(32) for _ in range(n_packets)])
        data = state.manifest.schedule.data
        clock.now = data.t_s + data.delta + 1
        frames = []
        for peer in peers:
            oracle = state.data_oracle(peer.partition, 0)
            report = oracle.encode_report(oracle.privatize(np.array([int(rng.integers(0, 12))]), rng)[0])
            frames.append(peer.packet(SurveyId.data(state.round_id, peer.partition, 0), report))

        private = os.urandom(32)
        began = time.perf_counter()
        for _ in range(200):
            public_key_of(private)
        x25519 = (time.perf_counter() - began) / 200
        survey = SurveyId.data(state.round_id, peers[0].partition, 0)
        credential = peers[0].credential
        assert credential is not None
        token = make_token(peers[0].public, credential, survey.to_bytes(), b"m")
        issuer_key = state.secrets.issuer_key
        assert issuer_key is not None  # the round is open
        began = time.perf_counter()
        for _ in range(20):
            verify_token(issuer_key, survey.to_bytes(), b"m", token, expected_partition=survey.partition)
        token_alone = (time.perf_counter() - began) / 20

        figures: dict[str, Any] = {"packets": n_packets, "batch": batch, "x25519_seconds": x25519, "verify_token_seconds": token_alone}
        modes = [0] + ([processes] if processes > 0 else [])
        half = n_packets // len(modes)
        for index, procs in enumerate(modes):
            verifier = IssuerWorkers(state.secrets.issuer_key, procs)
            try:
                part = frames[index * half : (index + 1) * half]
                verifier.warm()
                began = time.perf_counter()
                outcomes: list[str] = []
                for offset in range(0, len(part), batch):
                    outcomes += process_batch(state, part[offset : offset + batch], state.now(), verifier)
                seconds = (time.perf_counter() - began) / max(len(part), 1)
            finally:
                verifier.close()
            figures[f"processes={procs}"] = {
                "seconds_per_packet": seconds,
                "packets_per_second": 1 / seconds if seconds else 0.0,
                "x_x25519": seconds / x25519,
                "x_verify_token": seconds / token_alone,
                "accepted": outcomes.count("accepted"),
            }
        state.store.close()
    return figures
