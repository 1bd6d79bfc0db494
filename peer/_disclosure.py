"""What will leave the peer's machine, in plain words, before it consents.

Issue 6: the peer is shown which features, binned how, perturbed with which
mechanism, in how many packets, and what epsilon the round costs against its
ledger (thesis eq. 7.4), before anything is spent.
"""

from __future__ import annotations

import math

from anonml.display import epsilon_in_words, local_time
from anonml.peer._framework import FeatureVector
from anonml.peer._join import planned_releases
from anonml.peer._ledger import PeerLedger
from anonml.peer._store import PeerStore
from anonml.protocol._features import CategoricalFeature, FeatureSpec, NumericFeature
from anonml.protocol._manifest import RoundManifest, SignedManifest
from anonml.protocol._survey import SurveyId


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


def describe_release(signed: SignedManifest, spec: FeatureSpec, vector: FeatureVector, store: PeerStore, peer: bytes) -> tuple[str, float]:
    """The text shown before consent, and the worst-case eq. 7.4 epsilon of the round."""
    manifest: RoundManifest = signed.manifest
    schedule = manifest.schedule
    geometry = manifest.sphinx_geometry()
    medians, subsets = planned_releases(manifest, spec)
    ledger = PeerLedger(store, peer, signed.round_id, manifest.eps_total)
    cost = ledger.total_after(medians=medians, subsets=subsets)
    earlier = sorted({SurveyId.from_bytes(s.survey).round_id for s in store.spends(peer)} - {signed.round_id})
    lines = [
        f"Round {manifest.name!r} ({signed.round_id.hex()[:16]}…) at {manifest.aggregator_url}",
        f"  task: predict {manifest.label!r}; your label is {vector.label} (computed here from your file).",
        f"  registration: your public identity key {peer.hex()[:16]}… goes on the round's public roster.",
        "",
        "Computed on this machine from your file (the file itself never leaves it):",
    ]
    for name in spec.names:
        lines.append(f"  - {name} = {vector.features[name]!r}, shared only as {_binning(spec, name)}")
    lines += ["", "What leaves this machine, each as one fixed-size packet "
              f"({geometry.packet_size} bytes) through {manifest.path_length} relays, unlinkable to you:"]
    if medians and manifest.median_rounds:
        flip = 1 / (1 + math.exp(manifest.eps_median))
        lines.append(
            f"  - at most 1 median answer (only if your partition is queried, between {_when(schedule.median[0].t_s)} "
            f"and {_when(schedule.median[-1].send_end)}): one bit per numeric feature "
            f"({', '.join(spec.numeric_names)}), 'is my value above the threshold', each flipped with "
            f"probability {flip:.3f} (random response, epsilon {manifest.eps_median:g} per feature)"
        )
    lines.append(
        f"  - {manifest.k_h} data packet(s), sent at random times between {_when(schedule.data.t_s)} and "
        f"{_when(schedule.data.send_end)}: each holds {manifest.k_s} of the features above (chosen by the round's "
        f"public seed) and your label, binned, encoded as one value and perturbed with the "
        f"{manifest.oracle!r} frequency oracle at epsilon {manifest.eps_data:g}"
    )
    lines += [
        "",
        f"Privacy cost (thesis eq. 7.4): at most epsilon {cost:.4g} of the {manifest.eps_total:g} this round promises"
        f" (this round's ledger already holds {ledger.spent():.4g}).",
        "  " + epsilon_in_words(cost),
    ]
    if earlier:
        lines.append(f"  Your ledger also records releases in {len(earlier)} earlier round(s); epsilons add up across rounds.")
    return "\n".join(lines), cost
