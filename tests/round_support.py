"""Shared by the round tests: the spec of a small round over two features."""

from __future__ import annotations

from typing import Any


def two_feature_spec(
    *, name: str, eps_total: float, schedule: dict[str, int], network: dict[str, Any], min_participation: int
) -> dict[str, Any]:
    """A round spec document over a numeric ``age`` (0 to 100) and a
    categorical ``colour`` (red, green, blue) with a 0/1 label ``y``: split
    plan, two partitions of one single-feature subset, GRR, open
    registration. ``network`` gives the relays and the aggregator's ports
    (path length 2); ``schedule`` the phase lengths in seconds."""
    return {
        "name": name,
        "task": {
            "features": [
                {"name": "age", "type": "numeric", "low": 0, "high": 100},
                {"name": "colour", "type": "categorical", "categories": ["red", "green", "blue"]},
            ],
            "label": {"name": "y", "positive": ["1"], "negative": ["0"]},
        },
        "learning": {"k_p": 2, "k_h": 1, "k_s": 1, "plan": "split", "learner": "logreg"},
        "privacy": {"eps_total": eps_total, "oracle": "grr"},
        "schedule": schedule,
        "network": {"path_length": 2, "http_host": "127.0.0.1", "sink_host": "127.0.0.1", **network},
        "participation": {"min_participation": min_participation, "registration": "open", "purpose": "test", "max_per_client": 1000,
                          "min_anonymity_set": 1},
    }
