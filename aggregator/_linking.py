"""How well timing links a report to its sender (DESIGN.md §11 "anonymity").

Two parties compute these figures, each from what it can see:

* the aggregator, from its full view (every HTTP request it logged, with
  the identity or address behind it and the time, and every arrival),
  makes the best timing guess it can (:func:`rank_link`) and publishes it
  with its chance level; it cannot score the guess, having no ground truth;
* whoever knows the truth (the demo, which plays every peer; the benchmark;
  a peer, for its own messages) scores the guess (:func:`score_links`) and
  measures Spearman's rank correlation between send and arrival times
  (:func:`timing_figures`).

The guess is rank matching: if the network kept any monotone relation
between a peer's observable time and its message's arrival, the k-th
arrival would be the k-th peer; order statistics are what a timing
adversary can use, and if the two are independent every guess is at chance.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

K = TypeVar("K", bound=Hashable)


def rank_link(observed: Mapping[K, float], arrivals: Sequence[float], rng: np.random.Generator) -> list[K]:
    """The k-th arrival guessed to be the candidate at the same quantile of observed times.

    ``observed`` maps every candidate sender to the time the adversary saw
    it act (candidates it never saw act get ``math.inf``: ranked last).
    With as many arrivals as candidates this is a one-to-one matching of
    order statistics. Ties, in either order, are broken at random (``rng``):
    a tie carries no information, and breaking it by input order could
    align with the truth by accident.
    """
    keys = list(observed)
    if not keys:
        raise ValueError("no candidate senders")
    times = np.array([observed[k] for k in keys], dtype=np.float64)
    by_time = np.lexsort((rng.permutation(len(keys)), times))
    arrived = np.asarray(arrivals, dtype=np.float64)
    by_arrival = np.lexsort((rng.permutation(len(arrived)), arrived))
    guesses: list[K] = [keys[0]] * len(arrived)
    for rank, index in enumerate(by_arrival):
        # The candidate at the same quantile (identity when the counts match).
        guesses[int(index)] = keys[int(by_time[rank * len(keys) // len(arrived)])]
    return guesses


@dataclass(frozen=True)
class LinkScore:
    """A linking guess scored against the truth."""

    messages: int
    correct: int
    chance: float
    """Expected accuracy of a blind guess: the mean over messages of 1 / (candidates for that message)."""

    @property
    def accuracy(self) -> float:
        return self.correct / self.messages if self.messages else 0.0

    @property
    def standard_error(self) -> float:
        """Binomial standard error of the accuracy if every guess were at chance."""
        return math.sqrt(self.chance * (1 - self.chance) / self.messages) if self.messages else 0.0

    def to_dict(self) -> dict[str, float | int]:
        return {
            "messages": self.messages, "correct": self.correct, "accuracy": self.accuracy,
            "chance": self.chance, "standard_error_at_chance": self.standard_error,
            "above_chance_percentage_points": 100.0 * (self.accuracy - self.chance),
        }


def score_links(guesses: Sequence[Hashable], truth: Sequence[Hashable], candidates: Sequence[int]) -> LinkScore:
    """How many guesses name the true sender; ``candidates[i]`` is message i's anonymity set size."""
    if not len(guesses) == len(truth) == len(candidates):
        raise ValueError("guesses, truth and candidate counts differ in length")
    correct = sum(1 for guess, true in zip(guesses, truth, strict=True) if guess == true)
    chance = float(np.mean([1.0 / c for c in candidates])) if candidates else 0.0
    return LinkScore(len(guesses), correct, chance)


def timing_figures(send: npt.ArrayLike, arrival: npt.ArrayLike, rng: np.random.Generator) -> dict[str, float]:
    """Spearman's rho between paired send and arrival times, and two timing guesses scored against the pairing.

    * exact: the k-th arrival guessed to be the k-th sender (:func:`rank_link`), chance 1/n;
    * half: "sent in the first half of the sends" guessed from "arrived in the first half", chance 1/2.
    """
    sent, arrived = np.asarray(send, dtype=np.float64), np.asarray(arrival, dtype=np.float64)
    n = len(sent)
    if n < 2 or len(arrived) != n:
        raise ValueError(f"need at least 2 paired times, got {n} and {len(arrived)}")
    # scipy.stats takes a second to import: every relay, peer and aggregator
    # process imports this module, and only audits call this function.
    from scipy.stats import spearmanr

    rho = float(spearmanr(sent, arrived).statistic)
    guesses = rank_link(dict(enumerate(sent.tolist())), arrived.tolist(), rng)
    exact = score_links(guesses, list(range(n)), [n] * n)
    half = float(np.mean((sent < np.median(sent)) == (arrived < np.median(arrived))))
    return {
        "spearman_rho": rho, "rho_standard_error": 1.0 / math.sqrt(n - 1),
        "exact_link_accuracy": exact.accuracy, "exact_link_chance": exact.chance,
        "half_link_accuracy": half, "half_link_chance": 0.5, "half_link_standard_error": 0.5 / math.sqrt(n),
    }
