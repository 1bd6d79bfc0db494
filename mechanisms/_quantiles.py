"""Private quantiles by binary search across partitions (thesis §7.2.1, Algorithm 1).

The aggregator splits the peers into disjoint groups and queries one group per
sub-round (in a networked round a group is every partition whose peers answer
in that sub-round, ``RoundManifest.median_partitions``). Each peer answers one
question, "is your value greater than t?", with binary random response
(``answer_is_greater``), so each peer spends ``epsilon`` once per feature. After each sub-round the aggregator moves its
estimate towards the side the debiased answers point to, by a step that halves
every sub-round, unless the answers are within the margin of error of eq. 7.2.

Generalisation to q quantiles: in every sub-round each member of the answering
group draws one of the q quantiles uniformly at random and answers about its
current threshold (``assign_quantiles``; a round's peer draws the same way, so
that its choice depends on neither its data nor its identity). All q searches
advance together, one step per sub-round, and every peer still answers exactly
one question per feature. The
answer carries the index of the quantile it is for (the aggregator cannot
tell who sent an anonymous answer), which ``QuantileSearch.update`` takes as
``which``.

Two deliberate departures from the printed Algorithm 1: the initial estimate
is the midpoint ``low + (high - low)/2`` (the printed ``(max - min)/2`` is only
right when min = 0), and the comparison uses the debiased fraction of "greater"
answers, in the same units as eq. 7.2's error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from anonml.mechanisms._sampling import MIN_PROBABILITY, bernoulli, epsilon_range, floor_dyadic, refuse
from anonml.mechanisms._validate import check_epsilon


def _binary_rr_holds(epsilon: float) -> bool:
    try:
        keep = floor_dyadic(math.exp(epsilon) / (1.0 + math.exp(epsilon)))
    except OverflowError:
        return False
    return 1.0 - keep >= MIN_PROBABILITY and 2 * keep - 1.0 >= MIN_PROBABILITY


def comparison_epsilon_range() -> tuple[float, float]:
    """The epsilon interval in which the "is greater" answer stays randomised
    in floating point (``mechanisms._sampling``); outside it, ``EpsilonOutOfRange``."""
    return epsilon_range(_binary_rr_holds)


def _binary_rr_keep_probability(epsilon: float) -> float:
    # Binary random response: the truth with probability e^eps / (1 + e^eps),
    # rounded down (the loss is ln(p / (1-p)) <= eps).
    epsilon = check_epsilon(epsilon)
    if not _binary_rr_holds(epsilon):
        raise refuse("the 'is greater' answer", epsilon, comparison_epsilon_range(), "binary random response")
    return floor_dyadic(math.exp(epsilon) / (1.0 + math.exp(epsilon)))


def answers_are_greater(
    values: np.ndarray, thresholds: np.ndarray, epsilon: float, rng: np.random.Generator
) -> np.ndarray:
    """Vectorised ``answer_is_greater``: one perturbed bit per (value, threshold) pair."""
    keep_probability = _binary_rr_keep_probability(epsilon)
    value_array = np.asarray(values, dtype=np.float64)
    threshold_array = np.broadcast_to(np.asarray(thresholds, dtype=np.float64), value_array.shape)
    if not (np.all(np.isfinite(value_array)) and np.all(np.isfinite(threshold_array))):
        raise ValueError(f"values and thresholds must be finite, got {values!r}, {thresholds!r}")
    truth = value_array > threshold_array
    keep = bernoulli(rng, keep_probability, value_array.shape)
    return np.where(keep, truth, ~truth).astype(np.int64)


def answer_is_greater(value: float, threshold: float, epsilon: float, rng: np.random.Generator) -> int:
    """The peer's answer to ISGREATER (Algorithm 1): 1 if ``value > threshold``,
    flipped with probability ``1 / (1 + e^eps)``; epsilon-LDP."""
    return int(answers_are_greater(np.array([value]), np.array([threshold]), epsilon, rng)[0])


def assign_quantiles(n_members: int, n_quantiles: int, rng: np.random.Generator) -> np.ndarray:
    """Which quantile each member of a sub-round's group answers about: each draws
    one uniformly at random, independently, as a peer of a networked round does
    (``peer.PeerRound.answer_median``), so the in-process search is the round's."""
    if n_members < 0 or n_quantiles < 1:
        raise ValueError(f"n_members must be >= 0 and n_quantiles >= 1, got {n_members!r}, {n_quantiles!r}")
    return rng.integers(0, n_quantiles, size=n_members)


class QuantileSearch:
    """The aggregator's state for estimating q quantiles of one feature.

    ``thresholds()`` gives the value each quantile asks about in the current
    sub-round; ``update(bits, which)`` consumes one sub-round's perturbed
    answers; ``estimates()`` gives the current estimates. Each update halves
    every quantile's step; a quantile whose debiased "greater" fraction is
    more than ``margin`` times eq. 7.2's expected error away from its target
    ``1 - quantile`` moves its estimate by the new step, otherwise it stays.
    A quantile that received no answers in a sub-round is left unchanged
    (its step is not spent).
    """

    def __init__(
        self,
        low: float,
        high: float,
        epsilon: float,
        quantiles: Sequence[float] = (0.5,),
        *,
        margin: float = 1.0,
    ) -> None:
        low_f, high_f = float(low), float(high)
        if not (math.isfinite(low_f) and math.isfinite(high_f) and low_f < high_f):
            raise ValueError(f"low and high must be finite with low < high, got {low!r}, {high!r}")
        levels = np.asarray(quantiles, dtype=np.float64)
        if levels.ndim != 1 or levels.size == 0 or not np.all((levels > 0) & (levels < 1)):
            raise ValueError(f"quantiles must be a non-empty sequence of levels in (0, 1), got {quantiles!r}")
        if not (math.isfinite(margin) and margin >= 0):
            raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
        self.low, self.high = low_f, high_f
        _binary_rr_keep_probability(epsilon)
        self.epsilon = check_epsilon(epsilon)
        self.quantiles = levels
        self.margin = float(margin)
        self._estimates = np.full(levels.size, low_f + (high_f - low_f) / 2)
        self._steps = np.full(levels.size, (high_f - low_f) / 2)
        self.sub_rounds = 0

    def thresholds(self) -> np.ndarray:
        """The threshold each quantile asks about in the next sub-round."""
        return self._estimates.copy()

    def estimates(self) -> np.ndarray:
        """The current estimate of each quantile."""
        return self._estimates.copy()

    def margin_of_error(self, n_answers: int) -> float:
        """Eq. 7.2 for binary random response (m = 2, q = 1 - p) over n answers,
        scaled by ``margin``: the thesis's MARGINOFERROR."""
        p = _binary_rr_keep_probability(self.epsilon)
        q = 1.0 - p
        return self.margin * math.sqrt(q * (1 - q) + p * (1 - p)) / ((p - q) * math.sqrt(n_answers))

    def update(self, bits: np.ndarray, which: np.ndarray | None = None) -> None:
        """Consume one sub-round's answers (its whole group's): ``bits[k]`` in {0, 1} answers the
        question of quantile ``which[k]`` (all quantile 0 when ``which`` is None)."""
        bit_array = np.asarray(bits)
        if bit_array.ndim != 1 or (bit_array.size and not np.issubdtype(bit_array.dtype, np.integer)):
            raise ValueError(f"bits must be a 1-D integer array, got {bit_array.dtype!r} {bit_array.shape!r}")
        if np.any((bit_array != 0) & (bit_array != 1)):
            raise ValueError(f"bits must be 0 or 1, got {bit_array!r}")
        if which is None:
            if self.quantiles.size != 1:
                raise ValueError(f"which is required with {self.quantiles.size} quantiles, got None")
            which_array = np.zeros(bit_array.shape, dtype=np.int64)
        else:
            which_array = np.asarray(which)
            if which_array.shape != bit_array.shape or (
                which_array.size and not np.issubdtype(which_array.dtype, np.integer)
            ):
                raise ValueError(f"which must be an integer array shaped like bits, got {which_array.shape!r}")
            if np.any((which_array < 0) | (which_array >= self.quantiles.size)):
                raise ValueError(f"which must be in 0..{self.quantiles.size - 1}, got {which_array!r}")
        p = _binary_rr_keep_probability(self.epsilon)
        q = 1.0 - p
        answers = np.bincount(which_array, minlength=self.quantiles.size)
        greater = np.bincount(which_array, weights=bit_array, minlength=self.quantiles.size)
        for j in range(self.quantiles.size):
            if answers[j] == 0:
                continue
            # Debiased fraction of values above the threshold (thesis §7.3.4).
            fraction = (greater[j] / answers[j] - q) / (p - q)
            target = 1.0 - self.quantiles[j]
            error = self.margin_of_error(int(answers[j]))
            self._steps[j] /= 2
            if fraction - error > target:
                self._estimates[j] += self._steps[j]
            elif fraction + error < target:
                self._estimates[j] -= self._steps[j]
        self.sub_rounds += 1


def estimate_quantiles(
    values_by_partition: Sequence[np.ndarray],
    low: float,
    high: float,
    epsilon: float,
    quantiles: Sequence[float],
    rng: np.random.Generator,
    *,
    margin: float = 1.0,
) -> np.ndarray:
    """Run the whole search in process: one sub-round per group of
    ``values_by_partition``, each member answering once about its assigned quantile."""
    search = QuantileSearch(low, high, epsilon, quantiles, margin=margin)
    for values in values_by_partition:
        members = np.asarray(values, dtype=np.float64)
        if members.ndim != 1:
            raise ValueError(f"each partition must be a 1-D array of values, got shape {members.shape!r}")
        which = assign_quantiles(members.size, search.quantiles.size, rng)
        bits = answers_are_greater(members, search.thresholds()[which], epsilon, rng)
        search.update(bits, which)
    return search.estimates()
