"""What will leave the peer's machine, in plain words, before it consents.

Issue 6: the peer is shown which features, binned how, perturbed with which
mechanism, in how many packets, and what epsilon the round costs against its
ledger, before anything is spent. The epsilon is record level (issue 11,
DESIGN.md §8): the sum over every release, each comparison bit and each
subset report; the thesis's eq. 7.4 appears only as a labelled per-attribute
figure beside it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from anonml.base.display import epsilon_in_words, local_time
from anonml.mechanisms import over_budget, per_attribute_epsilon, releases_from
from anonml.peer._framework import FeatureVector, FieldValue
from anonml.peer._join import releases_still_to_make
from anonml.peer._ledger import PeerLedger
from anonml.peer._store import PeerStore
from anonml.protocol import CategoricalFeature, FeatureSpec, NumericFeature
from anonml.protocol import RoundManifest, SgdLoss, SignedManifest, TaskKind


def _when(t: int) -> str:
    return local_time(t)


def _binning(spec: FeatureSpec, name: str) -> str:
    feature = spec.feature(name)
    if isinstance(feature, NumericFeature):
        if feature.quantiles == 1:
            return f"above or below the group's privately estimated median (public bounds {feature.low:g} to {feature.high:g})"
        return f"one of {feature.n_bins} bins cut at privately estimated quantiles"
    assert isinstance(feature, CategoricalFeature)
    if feature.buckets is None:
        return f"which of {feature.n_bins} categories"
    return f"which of {feature.n_bins} groups ({', '.join(feature.bin_names)})"


def _gradient_packet(manifest: RoundManifest) -> str:
    """An SGD round's one release (``learning.SgdRule.gradient_report``), in words."""
    median = manifest.schedule.median
    flip = 1 / (1 + math.exp(manifest.eps_total))
    return (
        f"  - 1 gradient report (in your partition's step, sent between {_when(median[0].t_s)} and "
        f"{_when(median[-1].send_end)}): the gradient of the {_sgd_loss(manifest)} loss of your record (every feature above and the "
        f"label) at the model the aggregator published for that step, each coordinate clipped to [-1, 1]; ONE coordinate, "
        f"picked at random, is sent as its index and one bit, 1 with a probability between {flip:.3f} and {1 - flip:.3f} that grows with "
        f"that coordinate (Harmony's 1-bit mechanism, epsilon {manifest.eps_total:g}: your whole budget for this round)"
    )


def _data_packets(manifest: RoundManifest, count: int) -> str:
    schedule = manifest.schedule
    return (
        f"  - {count} data packet(s), sent at random times between {_when(schedule.data.t_s)} and "
        f"{_when(schedule.data.send_end)}: each holds {manifest.k_s} of the features above (chosen by the round's "
        f"public seed){' and your label' if manifest.labelled_reports else ' and NOT your label (no query reads it)'}, "
        "binned, encoded as one value and perturbed with the "
        f"{manifest.oracle!r} frequency oracle at epsilon {manifest.eps_data:g}"
    )


def _pool_answer(manifest: RoundManifest, spec: FeatureSpec) -> str:
    schedule = manifest.schedule
    flip = 1 / (1 + math.exp(manifest.eps_median))
    return (
        f"  - 1 comparison answer (in your pool partition's sub-round, sent between {_when(schedule.median[0].t_s)} "
        f"and {_when(schedule.median[-1].send_end)}): one bit, 'is my value above the threshold', about ONE numeric "
        f"feature picked at random ({', '.join(spec.numeric_names)}) and one of its cut points picked at random, "
        f"flipped with probability {flip:.3f} (random response, epsilon {manifest.eps_median:g}); nothing else"
    )


def _pool_roles(manifest: RoundManifest, spec: FeatureSpec) -> list[str]:
    """Before the seed is revealed a peer of a round with a comparison pool does not know which kind it is."""
    return [
        f"  The round's public seed, revealed when registration closes, puts about {manifest.comparison_pool / 10:g}% of "
        "the peers in its comparison pool; you send what ONE of these says, never both:",
        "  if in the comparison pool:",
        "  " + _pool_answer(manifest, spec),
        "  otherwise:",
        "  " + _data_packets(manifest, manifest.k_h),
    ]


class Disclosure(NamedTuple):
    """What :func:`describe_release` tells the peer before it consents."""

    text: str
    cost: float
    """The round's worst-case record-level ε (its ledger's releases included)."""
    lifetime_total: float
    """The record-level ε over every round of this identity if the round costs ``cost``."""
    lifetime_epsilon: float


def _value_words(spec: FeatureSpec, name: str, value: FieldValue) -> str:
    """A feature's value as computed, and the value it is binned as when the spec's range clips it."""
    feature = spec.feature(name)
    if isinstance(feature, NumericFeature) and isinstance(value, float):
        clipped = min(max(value, feature.low), feature.high)
        if clipped != value:
            return f"{value!r} (clipped to {clipped:g}, the end of the round's range {feature.low:g} to {feature.high:g})"
    return repr(value)


def _label_words(spec: FeatureSpec, label: int, value: FieldValue | None) -> str:
    """The label as sent; a value the spec does not name is said to be unknown, not passed off as a known class."""
    positive, negative = spec.label.positive, spec.label.negative
    if value is None or str(value) in positive or (negative is not None and str(value) in negative):
        return f"your label is {label}" + ("" if value is None else f" ({value!r})")
    return (f"your label value {value!r} is unknown to this round (its positive values: {', '.join(map(repr, positive))}); "
            f"it is sent as {label}, like every value that is not positive")


def _sgd_loss(manifest: RoundManifest) -> SgdLoss:
    """The loss an SGD round signs (logistic for a manifest made before ``[task] loss``)."""
    return SgdLoss.LOGISTIC if manifest.sgd_loss is None else SgdLoss(manifest.sgd_loss)


def _task_words(manifest: RoundManifest) -> str:
    """What the round computes from everyone's perturbed reports (its signed ``task_kind``)."""
    if manifest.task_kind == TaskKind.SGD:
        return (f"a {_sgd_loss(manifest).model} predicting {manifest.label!r}, trained by local-DP gradient descent on the "
                f"{_sgd_loss(manifest)} loss over {manifest.median_rounds} steps (each peer takes part in one)")
    if manifest.task_kind == TaskKind.STATISTICS and manifest.statistic_queries:
        counted = f" ('count:label' counts positive {manifest.label!r})" if manifest.labelled_reports else ""
        return f"statistics: the requester's queries {', '.join(manifest.statistic_queries)}{counted}, each published with its error (no model)"
    if manifest.task_kind == TaskKind.STATISTICS:
        return (f"statistics: every feature's histogram, the count of positive {manifest.label!r} and each numeric "
                "feature's mean and median, each published with its error (no model)")
    if manifest.task_kind == TaskKind.MODEL_AVERAGING:
        from anonml.learning import RoundModel

        model = RoundModel.of_manifest(manifest)
        scaled = (f"your categorical columns scaled by {model.categorical_weight:g} (a public map) before every row is scaled into the unit ball; "
                  if model.encoding.categorical_columns.any() else "every row scaled into the unit ball; ")
        return (f"predict {manifest.label!r} by averaging the peers' models: a logistic regression trained on your "
                f"{manifest.rows_per_peer} or more rows ({scaled}regularisation λ = {model.mechanism.regularization:.4g}, "
                f"which sets the noise), released once with noise at the whole promise, in blocks of its coordinates")
    return f"predict {manifest.label!r}"


def describe_release(signed: SignedManifest, spec: FeatureSpec, vector: FeatureVector, store: PeerStore, peer: bytes, *,
                     label_value: FieldValue | None = None) -> Disclosure:
    """The text shown before consent, the worst-case record-level epsilon of
    the round, and where that would leave the peer's lifetime budget.

    The cost is what this round's ledger already holds plus what the round
    can still ask for (:func:`releases_still_to_make`), so a peer resuming
    after it spent sees each release counted once.
    """
    manifest: RoundManifest = signed.manifest
    schedule = manifest.schedule
    geometry = manifest.sphinx_geometry()
    ledger = PeerLedger(store, peer, signed.round_id, manifest.eps_total)
    medians, subsets = releases_still_to_make(manifest, spec, store.spends(peer, signed.round_id))
    cost = ledger.total_after(medians=medians, subsets=subsets)
    lifetime_total = ledger.lifetime_after(medians=medians, subsets=subsets)
    per_attribute = per_attribute_epsilon([*ledger.releases(), *releases_from(medians, subsets)])
    earlier = ledger.earlier_rounds()
    lines = [
        f"Round {manifest.name!r} ({signed.round_id.hex()[:16]}…) at {manifest.aggregator_url}",
        f"  task: {_task_words(manifest)}; "
        + (f"{_label_words(spec, vector.known_label(), label_value)} (computed here from your file)." if manifest.labelled_reports
           else "your label is never sent: no query reads it."),
        f"  registration: your public identity key {peer.hex()[:16]}… goes on the round's public roster.",
        "",
        "Computed on this machine from your file (the file itself never leaves it):",
    ]
    sgd = manifest.task_kind == TaskKind.SGD
    for name in spec.names:
        shared = "used only inside your one perturbed gradient (below)" if sgd else f"shared only as {_binning(spec, name)}"
        lines.append(f"  - {name} = {_value_words(spec, name, vector.features[name])}, {shared}")
    lines += ["", "What leaves this machine, each as one fixed-size packet "
              f"({geometry.packet_size} bytes) through {manifest.path_length} relays, unlinkable to you:"]
    if ledger.releases():
        lines.append(
            f"  - already sealed in an earlier run and recorded in your ledger: {len(ledger.releases())} release(s), "
            f"epsilon {ledger.spent():.4g}; they are re-sent unchanged, never made again"
        )
    # With a pool, a peer that has spent nothing yet does not know which kind of peer it is.
    either_kind = bool(manifest.comparison_pool and manifest.median_rounds) and not ledger.releases()
    if either_kind:
        lines += _pool_roles(manifest, spec)
    elif medians and manifest.median_rounds and manifest.comparison_pool:
        lines.append(_pool_answer(manifest, spec))
    elif medians and manifest.median_rounds:
        flip = 1 / (1 + math.exp(manifest.eps_median))
        lines.append(
            f"  - 1 median answer (in your partition's sub-round, sent between {_when(schedule.median[0].t_s)} "
            f"and {_when(schedule.median[-1].send_end)}): one bit per numeric feature "
            f"({', '.join(spec.numeric_names)}), 'is my value above the threshold' (with several cut points, the "
            f"threshold of one of them, picked at random), each flipped with "
            f"probability {flip:.3f} (random response, epsilon {manifest.eps_median:g} per bit)"
        )
    if sgd and subsets:
        lines.append(_gradient_packet(manifest))
    elif subsets and not either_kind:
        lines.append(_data_packets(manifest, len(subsets)))
    lines += [
        "",
        f"Privacy cost (record level: the sum of the epsilon of every release above): at most epsilon {cost:.4g}"
        f" of the {manifest.eps_total:g} this round promises (this round's ledger already holds {ledger.spent():.4g}).",
        "  " + epsilon_in_words(cost),
        f"  (Per-attribute figure, thesis eq. 7.4: {per_attribute:.4g}. It is the most any one feature or the label"
        " costs, not a bound on what your record reveals.)",
    ]
    # Epsilons add up across rounds (DESIGN.md §8): the lifetime budget caps the sum.
    spent_before = f"{math.fsum(earlier.values()):.4g} in {len(earlier)} earlier round(s)" if earlier else "nothing in earlier rounds"
    lines.append(
        f"  Lifetime budget: {ledger.lifetime_epsilon:g} over all rounds; your ledger records {spent_before}, "
        f"so after this round at most {lifetime_total:.4g} ({'OVER it: the round is refused' if over_budget(lifetime_total, ledger.lifetime_epsilon) else 'within it'})."
    )
    return Disclosure("\n".join(lines), cost, lifetime_total, ledger.lifetime_epsilon)
