"""Exact random draws for mechanisms, and the epsilon range they hold in.

Every random choice a mechanism makes about a secret is either a uniform
integer (``Generator.integers``, exactly uniform) or a Bernoulli draw. A
Bernoulli draw here compares a uniform integer in ``[0, 2^53)`` with an
integer numerator, so its probability is exactly the dyadic rational
``numerator / 2^53``: nothing depends on how a float happens to round.
Each mechanism rounds its ideal probabilities to that grid in the direction
that can only lower its privacy loss (the "keep" probability down, a "set"
probability of a non-true bit up), computes its estimator from the rounded
values, and so states an epsilon that bounds the sampler it actually runs.

The range. Rounding moves a probability by at most 2^-53. A mechanism is
refused (:class:`EpsilonOutOfRange`) when

* some probability it draws is below ``MIN_PROBABILITY`` (2^-32): at large
  epsilon the "tell the truth" probability would round to exactly 1 (measured
  before this module: GRR and Subset Selection at epsilon ~40, Hadamard and
  binary random response at ~38, OLH at ~100), and well before that the
  rounding is a large relative change of the rare outcome's probability; or
* the gap ``p - q`` between the probability that a report supports the true
  value and another value (the estimator's denominator, thesis §7.3.4) is
  below ``MIN_PROBABILITY``: at tiny epsilon rounding would erase it
  (measured before: epsilon below ~1e-16 gave infinite estimates or
  ZeroDivisionError).

Inside the range every drawn probability keeps at least 21 significant bits,
so the stated epsilon is within a relative 2^-20 of the sampler's exact loss
and never below it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from anonml.mechanisms._errors import EpsilonOutOfRange

DYADIC_BITS = 53
DYADIC_ONE = 1 << DYADIC_BITS
MIN_PROBABILITY = 2.0**-32
# Where epsilon_range searches: below 2^-40 or above 2^10 no mechanism here is usable.
_SEARCH_LOW, _SEARCH_HIGH = 2.0**-40, 2.0**10


def floor_dyadic(probability: float) -> float:
    """The largest multiple of 2^-53 that is <= ``probability`` (in [0, 1])."""
    return math.floor(probability * DYADIC_ONE) / DYADIC_ONE


def ceil_dyadic(probability: float) -> float:
    """The smallest multiple of 2^-53 that is >= ``probability`` (in [0, 1])."""
    return math.ceil(probability * DYADIC_ONE) / DYADIC_ONE


def bernoulli(rng: np.random.Generator, probability: float | npt.NDArray[np.float64], size: int | tuple[int, ...]) -> npt.NDArray[np.bool_]:
    """Independent draws that are True with probability exactly ``probability``.

    ``probability`` must be a multiple of 2^-53 (from :func:`floor_dyadic` or
    :func:`ceil_dyadic`), a scalar or an array broadcastable to ``size``.
    """
    numerator = np.asarray(probability, dtype=np.float64) * DYADIC_ONE
    draws = rng.integers(0, DYADIC_ONE, size=size, dtype=np.int64)
    return np.asarray(draws < numerator)


def in_range(probabilities: list[float], p: float, q: float) -> bool:
    """The module docstring's rule for one mechanism instance."""
    return min(probabilities) >= MIN_PROBABILITY and p - q >= MIN_PROBABILITY


def epsilon_range(holds: Callable[[float], bool]) -> tuple[float, float]:
    """The interval of epsilon on which ``holds`` (the range rule for a fixed
    domain) is true, found by bisection on a log scale; the rule fails at
    small epsilon (the gap) and at large epsilon (the rare outcome), and both
    conditions are monotone in epsilon."""
    middle = 1.0
    if not holds(middle):
        raise ValueError("the range rule fails at epsilon = 1")
    low, high = _SEARCH_LOW, middle
    for _ in range(80):
        trial = math.sqrt(low * high)
        low, high = (low, trial) if holds(trial) else (trial, high)
    bottom = high
    low, high = middle, _SEARCH_HIGH
    for _ in range(80):
        trial = math.sqrt(low * high)
        low, high = (trial, high) if holds(trial) else (low, trial)
    return bottom, low


def refuse(name: str, epsilon: float, bounds: tuple[float, float], detail: str) -> EpsilonOutOfRange:
    """The error for an epsilon outside a mechanism's range."""
    return EpsilonOutOfRange(
        f"epsilon={epsilon!r} is outside the range [{bounds[0]:.6g}, {bounds[1]:.6g}] in which {name} stays "
        f"randomised in floating point ({detail})"
    )
