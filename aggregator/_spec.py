"""The round spec (``round.toml``): its format, an example, and its validation.

:func:`parse_round_spec` turns a parsed TOML document into a :class:`RoundSpec`
or raises :class:`RoundSpecError` naming the offending field
(``learning.k_p``); ``anonml aggregator round new`` prints the example.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anonml.crypto import DEFAULT_MAX_HOPS, DEFAULT_PACKET_SIZE
from anonml.protocol import (
    FeatureSpec,
    FeatureSpecError,
    PlanError,
    RelayEntry,
    derive_subsets,
)
from anonml.protocol._canonical import FieldReader, InvalidDocument


class RoundSpecError(InvalidDocument):
    """Raised by :func:`parse_round_spec` for a malformed round spec; ``field`` names the bad field."""


@dataclass(frozen=True)
class RoundSpec:
    """A validated ``round.toml``; times are seconds relative to the round's creation."""

    name: str
    spec: FeatureSpec
    k_p: int
    k_h: int
    k_s: int
    plan: str
    learner: str
    eps_total: float
    oracle: str
    median_share: float
    register_seconds: int
    issue_seconds: int
    median_rounds: int
    median_send: int
    median_delivery: int
    data_send: int
    data_delivery: int
    publish_gap: int
    relays: tuple[RelayEntry, ...]
    path_length: int
    packet_size: int
    max_hops: int
    http_host: str
    http_port: int
    sink_host: str
    sink_port: int
    min_participation: int
    registration: str
    invitations: int
    allow_list: tuple[bytes, ...]


ROUND_SPEC_EXAMPLE = """\
name = "adult-income"

[task]                      # builtin = "adult", or features + label as protocol.FeatureSpec.to_dict()
builtin = "adult"

[learning]
k_p = 8                     # partitions
k_h = 2                     # subsets per partition ("one" plan: 1)
k_s = 2                     # features per subset
plan = "split"              # or "one"
learner = "logreg"          # or "tree"

[privacy]
eps_total = 4.0             # promised to each peer (thesis eq. 7.4), median answers included
oracle = "auto"             # or a mechanisms.ORACLE_NAMES entry
median_share = 0.5          # optional: share of eps_total for the median search

[schedule]                  # seconds; the round starts when `round new` runs
register = 120
issue = 60
median_rounds = 4           # sub-round i queries partition i (needs <= k_p; 0 without numeric features)
median_send = 10            # each sub-round: send window (delta) ...
median_delivery = 20        # ... then delivery window (needs >= path_length + 1)
data_send = 60
data_delivery = 60
publish_gap = 2             # optional: seconds between publishing results and the next send window

[network]
path_length = 3             # relays per path
packet_size = 2048          # optional; relays must use the same geometry (their defaults match)
max_hops = 5                # optional: Sphinx routing slots, >= path_length + 1
http_host = "127.0.0.1"
http_port = 8080
sink_host = "127.0.0.1"     # where last relays deliver (the aggregator is the last Sphinx hop)
sink_port = 8081
relays = [                  # `anonml relay info` gives each entry
  { node_id = "<hex>", host = "127.0.0.1", port = 9001, public_key = "<hex>", key_epoch = 1 },
]

[participation]
min_participation = 100
registration = "open"       # or "allow-list" (allow_list = ["<hex identity key>", ...]) or "invitation" (invitations = N)
"""


def parse_round_spec(document: dict[str, Any]) -> RoundSpec:
    """Validate a parsed round.toml (see ROUND_SPEC_EXAMPLE); every error names its field (``learning.k_p``)."""
    reader = FieldReader(document, "", RoundSpecError)
    name = reader.text("name", max_len=128, pattern=r"[A-Za-z0-9][A-Za-z0-9 ._\-]*")
    task = reader.child("task")
    if task.optional("builtin"):
        builtin = task.choice("builtin", ("adult",))
        from anonml.learning._adult import adult_spec

        spec = adult_spec() if builtin == "adult" else None
        assert spec is not None
    else:
        raw = {"features": task.items("features", max_items=256), "label": task.obj("label")}
        try:
            spec = FeatureSpec.from_dict(raw)
        except FeatureSpecError as exc:
            task.fail("features", str(exc))
    task.done()
    if any(getattr(spec.feature(n), "quantiles", 1) != 1 for n in spec.numeric_names):
        reader.fail_at("task.features", "the network round supports median binning only (quantiles = 1)")
    learning = reader.child("learning")
    k_p = learning.integer("k_p", 1, 4096)
    k_h = learning.integer("k_h", 1, 64)
    k_s = learning.integer("k_s", 1, 16)
    plan = learning.choice("plan", ("split", "one"))
    learner = learning.choice("learner", ("logreg", "tree"))
    learning.done()
    privacy = reader.child("privacy")
    eps_total = privacy.number("eps_total", 1e-6, 100.0)
    oracle = privacy.text("oracle", max_len=32, pattern=r"[a-z0-9_\-]+")
    median_share = privacy.number("median_share", 0.01, 0.99) if privacy.optional("median_share") else 0.5
    privacy.done()
    schedule = reader.child("schedule")
    register_seconds = schedule.integer("register", 1, 10**7)
    issue_seconds = schedule.integer("issue", 1, 10**7)
    median_rounds = schedule.integer("median_rounds", 0, min(k_p, 64)) if spec.numeric_names else 0
    if not spec.numeric_names:
        schedule.optional("median_rounds")
    elif median_rounds == 0:
        schedule.fail("median_rounds", "numeric features need at least one median sub-round")
    median_send = schedule.integer("median_send", 1, 10**7)
    median_delivery = schedule.integer("median_delivery", 2, 10**7)
    data_send = schedule.integer("data_send", 1, 10**7)
    data_delivery = schedule.integer("data_delivery", 2, 10**7)
    # Thresholds of sub-round i (and the final medians) are published when the
    # previous delivery window closes; the gap lets every peer fetch them
    # before its send window opens.
    publish_gap = schedule.integer("publish_gap", 0, 10**6) if schedule.optional("publish_gap") else 2
    schedule.done()
    network = reader.child("network")
    relays = tuple(
        RelayEntry.read(network.nested(item, f"network.relays[{i}]"))
        for i, item in enumerate(network.items("relays", max_items=256))
    )
    path_length = network.integer("path_length", 1, 16)
    if path_length > len(relays):
        network.fail("path_length", f"{path_length} relays per path but {len(relays)} relays listed")
    for phase_name, delivery in (("median_delivery", median_delivery), ("data_delivery", data_delivery)):
        if delivery < path_length + 1:
            reader.fail_at(f"schedule.{phase_name}", f"{delivery} s cannot hold {path_length} relay windows and the slack slice")
    packet_size = (
        network.integer("packet_size", 512, 65536) if network.optional("packet_size") else DEFAULT_PACKET_SIZE
    )
    max_hops = network.integer("max_hops", 2, 32) if network.optional("max_hops") else DEFAULT_MAX_HOPS
    if path_length + 1 > max_hops:
        network.fail("max_hops", f"{max_hops} routing slots cannot hold {path_length} relays and the aggregator")
    http_host = network.text("http_host", max_len=255)
    http_port = network.integer("http_port", 1, 65535)
    sink_host = network.text("sink_host", max_len=255)
    sink_port = network.integer("sink_port", 1, 65535)
    network.done()
    participation = reader.child("participation")
    min_participation = participation.integer("min_participation", 1, 2**31)
    registration = participation.choice("registration", ("open", "allow-list", "invitation"))
    invitations = participation.integer("invitations", 0, 10**6) if participation.optional("invitations") else 0
    allow_list = tuple(
        participation.decode_hex(item, f"participation.allow_list[{i}]", size=32)
        for i, item in enumerate(participation.items("allow_list", max_items=10**6) if participation.optional("allow_list") else [])
    )
    participation.done()
    reader.done()
    if registration == "invitation" and invitations == 0:
        reader.fail_at("participation.invitations", "the invitation policy needs invitations > 0")
    if registration == "allow-list" and not allow_list:
        reader.fail_at("participation.allow_list", "the allow-list policy needs a non-empty allow_list")
    try:
        derive_subsets(bytes(32), spec.names, plan, k_p, k_h, k_s)
    except PlanError as exc:
        reader.fail_at("learning", str(exc))
    return RoundSpec(
        name, spec, k_p, k_h, k_s, plan, learner, eps_total, oracle, median_share, register_seconds, issue_seconds,
        median_rounds, median_send, median_delivery, data_send, data_delivery, publish_gap, relays, path_length,
        packet_size, max_hops,
        http_host, http_port, sink_host, sink_port, min_participation, registration, invitations, allow_list,
    )
