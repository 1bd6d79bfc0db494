"""Making a round from a spec and opening it again: keys, seed, signed manifest, database."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from anonml.aggregator._engines import PostgresLocation, redact
from anonml.aggregator._round import Clock, RoundSecrets, RoundState
from anonml.aggregator._spec import RoundSpec, release_plan
from anonml.aggregator._home import AggregatorHome
from anonml.aggregator._store import RoundStore
from anonml.base.errors import ConfigError
from anonml.crypto import IssuerSecretKey, SphinxGeometry, node_id_of, public_key_of
from anonml.mechanisms import total_epsilon
from anonml.protocol import (
    AggregatorHop,
    FeatureSpec,
    PhaseTimes,
    RoundManifest,
    RoundSchedule,
    SignedManifest,
    TaskKind,
    seed_commitment,
    worst_case_releases,
)


def _phase(t_s: int, send: int, delivery: int, check: int, second_send: int, second_delivery: int) -> PhaseTimes:
    """One phase from its durations: send, deliver, check the log, then the second chance (DESIGN.md §3.6-7)."""
    t_c = t_s + send + delivery
    t_2 = t_c + check
    return PhaseTimes(t_s, send, t_c, t_2, second_send, t_2 + second_send + second_delivery)


def build_schedule(spec: RoundSpec, start: int) -> RoundSchedule:
    """Absolute times from the spec's durations; ``publish_gap`` seconds before each phase that needs published results."""
    durations = spec.schedule
    t_register_end = start + durations.register
    t_issue_end = t_register_end + durations.issue
    t = t_issue_end
    median = []
    for index in range(durations.median_rounds):
        # Sub-round 0's thresholds are public from the start; later ones need the gap.
        t += durations.publish_gap if index else 0
        phase = _phase(t, durations.median_send, durations.median_delivery, durations.check, durations.median_second_send,
                       durations.median_second_delivery)
        median.append(phase)
        t = phase.t_r
    t += durations.publish_gap if median else 0
    data = _phase(t, durations.data_send, durations.data_delivery, durations.check, durations.data_second_send,
                  durations.data_second_delivery)
    return RoundSchedule(t_register_end, t_issue_end, tuple(median), data)


def worst_case_epsilon(
    spec: FeatureSpec, k_h: int, k_s: int, eps_median: float, eps_data: float, median_rounds: int, comparison_pool: bool
) -> float:
    """ε_T to promise in the manifest: the record-level sum of :func:`protocol.worst_case_releases`.

    Peers check the same releases against their ledger before consenting, so
    the promise and the consent follow one rule.
    """
    medians, subsets = worst_case_releases(
        spec, k_h=k_h, k_s=k_s, eps_median=eps_median, eps_data=eps_data, median_rounds=median_rounds,
        comparison_pool=comparison_pool,
    )
    return float(total_epsilon(medians, subsets))


CREATED_AT = "created_at"
"""The round store's meta key holding the Unix time ``round new`` made the round."""


def round_created(store: RoundStore) -> int:
    """When ``round new`` made the round in ``store`` (0 for a round made before this was recorded)."""
    created = store.get_meta(CREATED_AT)
    return int(created) if created is not None else 0


def create_round(
    home: AggregatorHome, spec: RoundSpec, *, now: int, rng_bytes: Callable[[int], bytes] = os.urandom
) -> tuple[RoundState, list[str]]:
    """Make a round: issuer key, seed and commitment, signed manifest, database. Returns it and its invitation codes."""
    signing_key = home.signing_key()
    final_private = home.read_key(home.final_hop_path)
    final_public = public_key_of(final_private)
    seed = rng_bytes(32)
    issuer_key = IssuerSecretKey.generate(rng_bytes)
    issuer_public = issuer_key.public_key()
    plan = release_plan(spec, seed)
    features, learning, network, participation = spec.task.features, spec.learning, spec.network, spec.participation
    geometry = SphinxGeometry.create(max_hops=network.max_hops, packet_size=network.packet_size)
    eps_median, eps_data = plan.median_epsilon, plan.release_epsilon
    eps_total = worst_case_epsilon(features, learning.k_h, learning.k_s, eps_median, eps_data, spec.schedule.median_rounds,
                                   plan.comparison_pool > 0)
    if spec.task.kind == TaskKind.SGD:
        # One release per peer, its gradient, at the whole budget (learning.SgdRule reads eps_total).
        eps_median = eps_data = eps_total = spec.privacy.eps_total
    manifest = RoundManifest(
        name=spec.name, label=features.label.name, features=features.to_dict(), k_p=learning.k_p, k_h=learning.k_h,
        k_s=learning.k_s, plan=learning.plan, learner=learning.learner, vote=learning.vote, eps_median=eps_median,
        eps_data=eps_data, oracle=spec.privacy.oracle, eps_total=eps_total,
        schedule=build_schedule(spec, now), relays=network.relays,
        aggregator_hop=AggregatorHop(node_id_of(final_public), network.sink_host, network.sink_port, final_public,
                                     workers=network.sink_workers),
        aggregator_url=f"http://{network.http_host}:{network.http_port}", path_length=network.path_length,
        geometry=geometry.to_dict(), token_public_key=issuer_public.to_bytes(), token_kid=issuer_public.kid,
        seed_commitment=seed_commitment(seed), min_participation=participation.min_participation,
        registration=participation.registration, identity_key=bytes(signing_key.verify_key), purpose=participation.purpose,
        max_roster=participation.max_roster, comparison_pool=round(plan.comparison_pool * 1000),
        min_anonymity_set=participation.min_anonymity_set, task_kind=spec.task.kind, rows_per_peer=spec.task.rows_per_peer,
        statistic_queries=tuple(query.text for query in spec.task.queries), sgd_learning_rate=spec.task.learning_rate,
        sgd_loss=spec.task.loss, regularization_rule=spec.task.regularization_rule, categorical_weight=spec.task.categorical_weight,
    )
    signed = SignedManifest.sign(manifest, signing_key)
    directory = home.round_dir(signed.round_id)
    directory.mkdir(mode=0o700, parents=True, exist_ok=False)
    store = RoundStore(directory / "round.sqlite")
    store.put_meta("manifest", signed.to_json())
    # When the round was made: `aggregator rounds` sorts by it and `run`/`report` default to the newest
    # (the directory's own time changes whenever the database is opened).
    store.put_meta(CREATED_AT, str(now).encode())
    store.put_meta("issuer_key", issuer_key.to_bytes())
    store.put_meta("seed", seed)
    codes = [rng_bytes(12).hex() for _ in range(participation.invitations)]
    store.add_invitations(codes)
    store.add_allowed(participation.allow_list)
    store.put_meta("max_per_client", str(participation.max_per_client).encode())
    # The aggregator's own rule for a short survey (RoundState.shortfall): not
    # in the manifest, since peers act the same whatever it says.
    store.put_meta("min_reports_per_survey", str(spec.min_reports_per_survey).encode())
    store.put_meta("on_shortfall", participation.on_shortfall.encode())
    if spec.planned is not None:
        # What the planner chose for `plan = "auto"` and what it expected (the report states it).
        store.put_meta("planned", json.dumps(spec.planned.to_dict(), sort_keys=True).encode())
    secrets = RoundSecrets(signing_key, issuer_key, seed, final_private)
    return RoundState(store, signed, secrets), codes


def postgres_location(url: str, round_id_hex: str) -> PostgresLocation:
    """Where a round lives on the PostgreSQL server ``url``: its own schema, named by its id."""
    return PostgresLocation(url, f"round_{round_id_hex[:32]}")


def open_round(home: AggregatorHome, round_id_hex: str, *, clock: Clock = time.time, store_url: str | None = None) -> RoundState:
    """Load a round created by :func:`create_round` (raises FileNotFoundError for an unknown round).

    ``store_url``: a ``postgresql://`` URL to run the round on that server (in its
    own schema). The first time, the round's SQLite store is copied there in
    one transaction and marked moved: from then on the round is opened only
    with that URL, so its two copies never both take packets.
    """
    directory = home.root / "rounds" / round_id_hex
    if not (directory / "round.sqlite").is_file():
        raise FileNotFoundError(f"no round {round_id_hex!r} in {str(home.root)!r}")
    store = _open_store(directory / "round.sqlite", round_id_hex, store_url)
    signing_key = home.signing_key()
    manifest_json, issuer, seed = (store.get_meta(k) for k in ("manifest", "issuer_key", "seed"))
    # The issuer key is erased when the round ends (RoundState.finish); before that it must be there.
    if manifest_json is None or seed is None or (issuer is None and store.get_result("outcome") is None):
        raise FileNotFoundError(f"round {round_id_hex!r} is incomplete")
    signed = SignedManifest.from_json(manifest_json, expected_identity=bytes(signing_key.verify_key))
    issuer_key = IssuerSecretKey.from_bytes(issuer) if issuer is not None else None
    secrets = RoundSecrets(signing_key, issuer_key, seed, home.read_key(home.final_hop_path))
    return RoundState(store, signed, secrets, clock=clock)


MOVED = "moved_to"
"""The meta key of a SQLite store whose round moved to PostgreSQL: the server (without password) and schema."""


def _open_store(path: Path, round_id_hex: str, url: str | None) -> RoundStore:
    """The round's store: its SQLite file, or its schema on PostgreSQL (moved there the first time)."""
    local = RoundStore(path)
    moved = local.get_meta(MOVED)
    if url is None:
        if moved is not None:
            local.close()
            raise ConfigError(f"round {round_id_hex[:16]} runs on PostgreSQL ({moved.decode()}): pass its --store URL")
        return local
    location = postgres_location(url, round_id_hex)
    remote = RoundStore(location)
    try:
        if remote.get_meta("manifest") is None:
            if moved is not None:
                raise ConfigError(f"round {round_id_hex[:16]} moved to {moved.decode()}, and {redact(url)} does not hold it")
            remote.copy_from(local)
            local.put_meta(MOVED, f"{redact(url)} schema {location.schema}".encode())
    except BaseException:
        remote.close()
        raise
    finally:
        local.close()
    return remote
