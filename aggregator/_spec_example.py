"""The example ``round.toml`` that ``anonml aggregator round new --help`` prints.

A module of its own, importing only the oracles' names, so that printing the
help does not load the spec's validation (numpy, the protocol, the learner).
"""

from __future__ import annotations

from anonml.mechanisms import OracleName

ROUND_SPEC_EXAMPLE = """\
name = "adult-income"

[task]                      # builtin = "adult"; or spec_file = "people.toml", the feature spec `anonml experiment
builtin = "adult"           # csv --spec` reads (relative to this spec); or features + label written out here
# kind = "statistics"       # optional: what the round computes, "ensemble" (default: the partition ensemble) or
                            # "statistics" (histograms, the positive count, means and medians, each with its error
                            # formula; needs plan = "one", k_s = 1 and a unary-encoding oracle: oue, sue or pq)
# queries = ["count:label", "histogram:education-num", "mean:age", "quantile:age:0.9"]
                            # optional, statistics only: what to answer instead of the default set; count:label,
                            # histogram:F, mean:F (numeric), quantile:F:Q (numeric, 0 < Q < 1, on the cut points'
                            # grid). Peers release only the features the queries read, and no label unless
                            # count:label is asked
# learning_rate = 3         # optional, kind = "sgd" only: γ0 of the gradient steps (step k moves by γ0/√k;
                            # default 1), signed in the manifest
# loss = "hinge"            # optional, kind = "sgd" only: "logistic" (default), "hinge" (linear SVM) or
                            # "squared" (linear regression): whose gradient each peer releases; signed
# regularization_rule = 1.5 # optional, kind = "model-averaging" only: λ = rule / (rows_per_peer ε_T)
                            # (default 1.5), signed; the noise is calibrated to it, so ε is unchanged
# categorical_weight = 0.35 # optional, kind = "model-averaging" only, in (0, 1]: a public factor on the
                            # categorical columns before each peer scales its rows into the unit ball
                            # (default 0.35), signed; ε unchanged
quantiles = 3               # optional: cut points per numeric feature, found by the median search
                            # (default: each feature's own, 1 = the median; q cut points give q + 1 bins)

[learning]
k_p = 8                     # partitions
k_h = 2                     # subsets per partition ("one" plan: 1)
k_s = 2                     # features per subset
plan = "split"              # or "one"; or "auto": the planner simulates the round's plans (every peer answering the
                            # median search) for expected_peers and chooses k_p, k_h, k_s, vote and [task] quantiles
                            # (leave those out); `round new` prints its choice and simulated AUC
# expected_peers = 2000     # optional, with "auto": peers to plan for (default: min_participation)
learner = "logreg"          # or "tree"
vote = "weighted"           # optional: how partitions combine, "weighted" (eq. 6.2), "soft" or "naive-bayes"
# comparison_pool = 0.1     # optional (default 0.1 with plan = "one", else 0): this share of the peers answers the
                            # median search, one bit each at the full eps_total, and sends no data; the others send
                            # only data, each report at eps_total / k_h. 0: every peer answers it (median_share)

[privacy]
eps_total = 4.0             # promised to each peer, record level: the sum over every release, median bits included
oracle = "auto"             # or one of: {ORACLES}
median_share = 0.5          # optional: share of eps_total for the median search, without a comparison pool

[schedule]                  # durations in seconds from the round's start; each is optional
# start = 2026-12-01T09:00:00+01:00   # optional: when registration opens (a TOML date-time; without an
                            # offset it is local time); else when `round new` runs, or its --start
register = 1800             # default 30 min: peers join over minutes; `anonml aggregator run` must be serving by then
issue = 900                 # default 15 min
median_rounds = 4           # 0 without numeric features; without a comparison pool partition p answers in sub-round
                            # p % median_rounds (needs <= k_p); with one, pool partition k_p + s answers sub-round s
median_send = 300           # default 5 min: each sub-round's send window (delta) ...
median_delivery = 600       # default 10 min: ... then its delivery window (needs >= path_length + 2)
data_send = 900             # default 15 min
data_delivery = 1800        # default 30 min; every window must hold a relay or aggregator restart
check = 4                   # optional: after each delivery window, seconds to publish and compare receipt-log heads
# median_second_send, median_second_delivery, data_second_send, data_second_delivery: optional, each phase's
# second chance (every peer sends one packet per survey, its resend or a cover); default: the first windows' lengths
publish_gap = 2             # optional: seconds between publishing results and the next send window

[network]
path_length = 3             # relays per path
packet_size = 2048          # optional; relays must use the same geometry (their defaults match)
max_hops = 5                # optional: Sphinx routing slots, >= path_length + 1
http_host = "127.0.0.1"
http_port = 8080
sink_host = "127.0.0.1"     # where last relays deliver (the aggregator is the last Sphinx hop)
sink_port = 8081
# sink_workers = [{ host = "10.0.0.2", port = 8081 }]   # optional: further sink addresses, each an `aggregator worker`
                            # sharing the round's store; last relays spread their deliveries over all of them
relays = [                  # each: a file `anonml relay info --json > relay-1.json` wrote (relative to
  "relay-1.json",           # this spec), or its fields written out:
  { node_id = "<hex>", host = "127.0.0.1", port = 9001, public_key = "<hex>", key_epoch = 1 },
]

[participation]
min_participation = 100
registration = "invitation" # (invitations = N) or "allow-list" (allow_list = ["<hex identity key>", ...]) or "open"
invitations = 200
purpose = "production"      # optional: "demo" or "test" rounds may use open registration (Sybils cost nothing there)
max_roster = 100000         # optional: at most protocol.MAX_ROSTER, so every client can read the roster
max_per_client = 1          # optional, open registration only: identities one client address may register
min_reports_per_survey = 6  # optional: a survey with fewer accepted reports is short; default
                            # min_participation / k_p / 2 (at least 1), half a partition's share
on_shortfall = "degraded"   # optional: a round with a short survey still learns and ends "degraded";
                            # "fail": it ends "failed" when the short survey's phase closes, without a model
min_anonymity_set = 5       # optional (default 5), signed in the manifest: `round new` refuses a spec whose smallest
                            # survey (data or comparison-pool partition) at min_participation holds fewer peers,
                            # and a peer whose partition is smaller refuses to send
""".replace("{ORACLES}", ", ".join(name for name in OracleName if name != OracleName.AUTO))
