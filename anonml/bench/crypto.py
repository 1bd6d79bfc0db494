"""``anonml bench crypto``: packet and token costs beside same-run baselines.

Absolute times drift on shared machines, so every time is also printed as a
ratio to one X25519 and one P-256 scalar multiplication measured in the same
run (DESIGN.md §11). Token targets (DESIGN.md §6): token ≤ 300 bytes,
verification ≤ 0.6 ms on one core; issue 26: verification in a batch of 256
at most 4 P-256 multiplications per token. A token alone costs five point
decompressions, two constant-time multiplications (the keyed MAC check) and
one public multi-scalar multiplication; in a batch the proofs share one
multi-scalar multiplication and the key's multiplications are made once per
partition (crypto/_token.py). ``H(ctx)`` is cached per survey, as it is at
the aggregator.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from petlib.ec import EcGroup

from anonml.crypto import (
    BATCH_POINTS_PER_TOKEN,
    CredentialSecret,
    IssuerSecretKey,
    NodeAddress,
    PathHop,
    ReleaseWindow,
    SphinxGeometry,
    Token,
    TokenJob,
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
    verify_tokens,
)

# The primitives' own benchmarks time the group and X25519 operations below the
# package's face on purpose (tests/test_package.py names this the one exception).
from anonml.crypto._group import G, POINT_BYTES, SCALAR_BYTES, decode_point, public_lincomb, random_scalar, secret_mul, system_rng
from anonml.crypto._primitives import x25519

# DESIGN.md §5 and §6 targets, checked and printed beside the figures.
TARGETS: dict[str, tuple[str, float]] = {
    "sphinx_process_hop_us": ("<=", 250.0),
    "sphinx_build_3hop_us": ("<=", 1000.0),
    "token_verify_us": ("<=", 600.0),
    "token_bytes": ("<=", 300.0),
}
# Targets on the ratio to one P-256 multiplication (issue 26), checked against ``x_p256``.
RATIO_TARGETS: dict[str, tuple[str, float]] = {
    "token_verify_batch256_us": ("<=", 4.0),
}
VERIFY_BATCH = 256
_P256_CURVE = 415  # NID of NIST P-256 in OpenSSL (petlib's EcGroup id), DESIGN.md §6


def time_us(operation: Callable[[], object], repeat: int) -> float:
    """Microseconds per call of ``operation``: the fastest of ``repeat`` calls."""
    return time_us_interleaved({"operation": operation}, repeat)["operation"]


def time_us_interleaved(operations: Mapping[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Microseconds per call of each operation: the fastest of ``repeat`` calls.

    Each call is timed on its own and the minimum kept (timeit's rule: the
    minimum is the cost with the least interference from other processes; on
    a machine shared by several busy processes a batch of a millisecond-long
    operation is almost never undisturbed, a single call often is). The
    operations take turns call by call, so load hits all of them alike and
    the ratios between them stay meaningful.
    """
    best = dict.fromkeys(operations, float("inf"))
    clock = time.perf_counter
    for _ in range(repeat):
        for name, operation in operations.items():
            started = clock()
            operation()
            best[name] = min(best[name], clock() - started)
    return {name: seconds * 1e6 for name, seconds in best.items()}


def cpu_us(operation: Callable[[], object], repeat: int) -> float:
    """Microseconds of this process's CPU per call of ``operation``: the least of ``repeat`` calls.

    For operations of tens of milliseconds (a batch of 256 tokens): on a
    machine shared by busy processes such a call is almost never left
    undisturbed, and wall time then counts the other processes' turns; the
    process's own CPU time does not (the relay benchmark measures its intake
    the same way)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        operation()
        best = min(best, time.process_time() - started)
    return best * 1e6


_CTX = b"anonml/bench/survey-context"
_MESSAGE = bytes(range(256)) * 8  # a 2 KiB payload, hashed once into the proof
_PARTITION = 3


def measure_tokens(repeat: int) -> dict[str, float]:
    """Microseconds for each step of issuance and of a token, its size, and
    the cost of one P-256 multiplication measured in the same run."""
    secret_key = IssuerSecretKey.generate()
    public_key = secret_key.public_key()
    secret = CredentialSecret.generate()
    request, state = begin_issuance(public_key, secret, _PARTITION)
    request_bytes = request.to_bytes()
    response_bytes = issue_credential(secret_key, request_bytes, _PARTITION).to_bytes()
    credential = finish_issuance(state, response_bytes)
    token = make_token(public_key, credential, _CTX, _MESSAGE)
    verify_token(secret_key, _CTX, _MESSAGE, token, expected_partition=_PARTITION)  # warm the H(ctx) cache
    # A batch as the aggregator's verifier gets one: distinct messages, one survey.
    messages = [_MESSAGE + index.to_bytes(2, "big") for index in range(VERIFY_BATCH)]
    batch = [TokenJob(_CTX, m, make_token(public_key, credential, _CTX, m), _PARTITION) for m in messages]
    # A batch takes ~VERIFY_BATCH times longer than one token: fewer repeats keep the run short.
    batch_us = cpu_us(lambda: verify_tokens(secret_key, batch), max(3, repeat // 50))

    scalar, point = random_scalar(system_rng), secret_mul(random_scalar(system_rng), G)
    floor = measure_verify_floor(batch, repeat)
    return {
        **floor,
        "p256_mul_us": time_us(lambda: secret_mul(scalar, point), repeat),
        "token_create_us": time_us(lambda: make_token(public_key, credential, _CTX, _MESSAGE), repeat),
        "token_verify_us": time_us(
            lambda: verify_token(secret_key, _CTX, _MESSAGE, token, expected_partition=_PARTITION), repeat
        ),
        "token_verify_batch256_us": batch_us / VERIFY_BATCH,
        "token_bytes": float(len(token)),
        "issue_request_us": time_us(lambda: begin_issuance(public_key, secret, _PARTITION), repeat),
        "issue_us": time_us(lambda: issue_credential(secret_key, request_bytes, _PARTITION), repeat),
        "issue_finish_us": time_us(lambda: finish_issuance(state, response_bytes), repeat),
    }


def measure_verify_floor(batch: list[TokenJob], repeat: int) -> dict[str, float]:
    """The group work alone of verifying ``batch`` (crypto/_token.py,
    ``BATCH_POINTS_PER_TOKEN``): one point decompression and one point of a
    multi-scalar multiplication the batch's size, and per token their sum,
    the least ``token_verify_batch256_us`` can cost with this token format
    before any hashing or Python work."""
    decoded, summed = BATCH_POINTS_PER_TOKEN
    tokens = [Token.from_bytes(job.token) for job in batch]
    # The batch's own points, U and Cs twice as the verifier sums them (distinct points, as in a real batch).
    points = [p for t in tokens for p in (t.u, t.cs, t.cu_prime, t.tag, t.commitment, t.u, t.cs)]
    if len(points) != summed * len(batch):
        raise AssertionError(f"the floor sums {len(points)} points, the verifier {summed * len(batch)}")
    scalars = [random_scalar(system_rng) for _ in points]
    encoding = tokens[0].to_bytes()[-(3 * SCALAR_BYTES + POINT_BYTES) : -3 * SCALAR_BYTES]  # the commitment A
    decode_us = time_us(lambda: decode_point(encoding), repeat)
    sum_point_us = cpu_us(lambda: public_lincomb(scalars, points), max(3, repeat // 50)) / len(points)
    return {
        "p256_decode_us": decode_us,
        "p256_sum_point_us": sum_point_us,
        "token_verify_floor_batch256_us": decoded * decode_us + summed * sum_point_us,
    }


def _baseline_operations() -> dict[str, Callable[[], object]]:
    """One X25519 and one P-256 variable-base scalar multiplication."""
    scalar, point = os.urandom(32), generate_keypair()[1]
    group = EcGroup(_P256_CURVE)
    order = group.order()
    p256_point = order.random() * group.generator()
    p256_scalar = order.random()
    return {
        "x25519_mult_us": lambda: x25519(scalar, point),
        "p256_mult_us": lambda: p256_scalar * p256_point,
    }


def _sphinx_operations(geometry: SphinxGeometry) -> dict[str, Callable[[], object]]:
    """Build a 4-hop (3 relays + aggregator) and a 3-hop packet; process one
    relay hop and one final hop."""
    keys = [generate_keypair() for _ in range(4)]
    path = [
        PathHop(node_id_of(public), NodeAddress("127.0.0.1", 9000 + index), public, ReleaseWindow(0, 60))
        for index, (_, public) in enumerate(keys)
    ]
    message = os.urandom(geometry.message_size)
    four_hop = build_packet(geometry, path, message)
    one_hop = build_packet(geometry, path[-1:], message)
    return {
        "sphinx_build_4hop_us": lambda: build_packet(geometry, path, message),
        "sphinx_build_3hop_us": lambda: build_packet(geometry, path[:3], message),
        "sphinx_process_hop_us": lambda: process_packet(geometry, keys[0][0], four_hop, is_replay=never_replayed),
        "sphinx_process_final_us": lambda: process_packet(geometry, keys[-1][0], one_hop, is_replay=never_replayed),
    }


def measure_sphinx(repeat: int, geometry: SphinxGeometry | None = None) -> dict[str, float]:
    """Sphinx costs (µs) and sizes (bytes), with both baselines timed in turn with them."""
    geometry = geometry or SphinxGeometry.create()
    figures = time_us_interleaved({**_baseline_operations(), **_sphinx_operations(geometry)}, repeat)
    figures["sphinx_packet_bytes"] = float(geometry.packet_size)
    figures["sphinx_message_bytes"] = float(geometry.message_size)
    return figures


def run_benchmark(repeat: int) -> dict[str, Any]:
    """All figures, each time with its ratio to both baselines, and target checks."""
    measured = measure_sphinx(repeat)
    baselines = {name: measured.pop(name) for name in ("x25519_mult_us", "p256_mult_us")}
    measured.update(measure_tokens(repeat))
    # The token figures were timed apart from the baselines: time the
    # baselines again and keep the least disturbed measurement of each.
    again = time_us_interleaved(_baseline_operations(), repeat)
    baselines = {name: min(value, again[name]) for name, value in baselines.items()}
    figures: dict[str, dict[str, Any]] = {}
    for name, value in measured.items():
        entry: dict[str, Any] = {"value": round(value, 2)}
        if name.endswith("_us"):
            entry["x_x25519"] = round(value / baselines["x25519_mult_us"], 2)
            entry["x_p256"] = round(value / baselines["p256_mult_us"], 2)
        if name in TARGETS:
            relation, bound = TARGETS[name]
            entry["target"] = f"{relation} {bound:g}"
            entry["meets_target"] = value <= bound
        if name in RATIO_TARGETS:
            relation, bound = RATIO_TARGETS[name]
            entry["target"] = f"{relation} {bound:g} × P-256"
            entry["meets_target"] = entry["x_p256"] <= bound
        figures[name] = entry
    return {
        "repeat": repeat,
        "baselines_us": {name: round(value, 2) for name, value in baselines.items()},
        "figures": figures,
    }
