"""The aggregator's half of the round's anonymity report (DESIGN.md §11).

A malicious aggregator's full view is every HTTP request it served (the
address it came from, the path, when; for registration and credential
requests also the identity that signed them) and every arrival at its sink
(when, for which survey, which receipt). :class:`RequestLog` keeps the first
in memory (since the process started: a restarted aggregator forgets what
came before, which the report states), the round store keeps the second.

:func:`linking_report` makes the best timing guess that view allows
(``_linking.rank_link``): the peers of a survey's partition ordered by their
last request before the survey's send window closed (the request that could
betray a send), matched to the survey's arrivals in order. It writes every
guess to ``links.json`` and reports the chance level; it cannot score the
guess (it has no ground truth). Whoever knows who sent what (the demo, the
benchmark, a peer for its own receipts) scores it with ``_linking.score_links``.
Under the uniform protocol (DESIGN.md §2) every peer of a partition makes
the same requests at the same scheduled times and relays release
independently of send times, so the guess should sit at chance.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anonml.base.storage import replace_file
from anonml.protocol import SurveyId
from anonml.aggregator._linking import rank_link

LINKS_JSON = "links.json"
MAX_LOGGED_REQUESTS = 4_000_000
"""Requests kept (about 100 bytes each in memory): 400 per peer at 10,000 peers; later ones are counted, not kept."""


@dataclass(frozen=True)
class LoggedRequest:
    at: float
    address: str
    identity: bytes | None
    """Set for requests the peer signed with its identity key (registration, credential)."""


@dataclass
class RequestLog:
    """Every HTTP request the aggregator served, as a logging adversary keeps it."""

    limit: int = MAX_LOGGED_REQUESTS
    since: float | None = None
    """When the first request was logged (this process's; a restarted aggregator starts afresh)."""
    requests: list[LoggedRequest] = field(default_factory=list)
    dropped: int = 0

    def record(self, at: float, address: str, identity: bytes | None = None) -> None:
        if self.since is None:
            self.since = at
        if len(self.requests) >= self.limit:
            self.dropped += 1
            return
        self.requests.append(LoggedRequest(at, address, identity))

    def last_seen(self, before: float) -> tuple[dict[bytes, float], int]:
        """Each identity's last request before ``before``, and how many requests were attributed to an identity.

        A request is attributed to an identity when it was signed by that
        identity, or came from an address that only that identity's signed
        requests came from (on a real network an address names its peer; on
        loopback every peer shares 127.0.0.1 and only signed requests count).
        """
        identities_at: dict[str, set[bytes]] = defaultdict(set)
        for request in self.requests:
            if request.identity is not None:
                identities_at[request.address].add(request.identity)
        last: dict[bytes, float] = {}
        attributed = 0
        for request in self.requests:
            owners = identities_at.get(request.address, set())
            identity = request.identity if request.identity is not None else (next(iter(owners)) if len(owners) == 1 else None)
            if identity is None:
                continue
            attributed += 1
            if request.at < before and request.at > last.get(identity, -math.inf):
                last[identity] = request.at
        return last, attributed


@dataclass(frozen=True)
class FullView:
    """What the aggregator's guess is made from.

    ``arrivals`` are ``(survey, receipt digest, arrival time)``; ``partitions``
    maps each credentialed identity to its partition (a survey's candidates);
    ``send_end(survey)`` is when the survey's send window closes;
    ``second_window(survey)`` when its second send window opens (an arrival
    from then on was sent in the second window: each peer sends each report in
    one of the two at random, so send and arrival times correlate by window,
    and only within a window does mixing make them independent).
    """

    arrivals: list[tuple[SurveyId, bytes, float]]
    partitions: dict[bytes, int]
    send_end: Callable[[SurveyId], float]
    log: RequestLog
    round_id: bytes
    second_window: Callable[[SurveyId], float] = lambda survey: math.inf


def timing_guesses(view: FullView) -> tuple[list[dict[str, Any]], int]:
    """The guess for every accepted message, and how many logged requests named an identity.

    Each guess is ``{"survey", "receipt", "arrived", "window", "guess", "candidates", "reports"}`` (hex strings;
    ``window`` 1 or 2, the delivery window it arrived in; ``candidates`` the partition's peers the guess chooses among,
    ``reports`` the reports its survey accepted).
    """
    # Ties broken by a generator seeded from the round: the report is reproducible.
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(b"anonml-links" + view.round_id).digest()[:8], "big"))
    members: dict[int, list[bytes]] = defaultdict(list)
    for identity, partition in sorted(view.partitions.items()):
        members[partition].append(identity)
    by_survey: dict[SurveyId, list[tuple[bytes, float]]] = defaultdict(list)
    for survey, receipt, arrived in view.arrivals:
        by_survey[survey].append((receipt, arrived))
    links: list[dict[str, Any]] = []
    seen: dict[float, tuple[dict[bytes, float], int]] = {}
    attributed = 0
    for survey, received in sorted(by_survey.items(), key=lambda item: item[0].to_bytes()):
        candidates = members.get(survey.partition, [])
        if not candidates:
            continue
        cutoff = view.send_end(survey)
        if cutoff not in seen:
            seen[cutoff] = view.log.last_seen(cutoff)
        last, attributed = seen[cutoff]
        observed = {identity: last.get(identity, math.inf) for identity in candidates}
        guesses = rank_link(observed, [arrived for _, arrived in received], rng)
        links += [
            {"survey": survey.to_bytes().hex(), "receipt": receipt.hex(), "arrived": arrived,
             "window": 2 if arrived >= view.second_window(survey) else 1, "guess": guess.hex(),
             "candidates": len(candidates), "reports": len(received)}
            for (receipt, arrived), guess in zip(received, guesses, strict=True)
        ]
    return links, attributed


def linking_report(view: FullView, directory: Path) -> dict[str, Any]:
    """:func:`timing_guesses` written to ``links.json`` in ``directory``, and the report's summary: chance, sets, the log."""
    links, attributed = timing_guesses(view)
    log = view.log
    replace_file(directory / LINKS_JSON, json.dumps(links))
    # A report hides among the reports its survey accepted (a peer that sent nothing hides no one),
    # never among more than its partition's peers: the anonymity set the report states.
    sizes = [min(link["reports"], link["candidates"]) for link in links]
    return {
        "guess": "each survey's arrivals in order matched to its partition's peers ordered by their last "
                 "HTTP request before the send window closed (signed requests, and addresses only one identity used)",
        "messages": len(links),
        "anonymity_set_min": min(sizes, default=0),
        "anonymity_set_mean": float(np.mean(sizes)) if sizes else 0.0,
        "chance": float(np.mean([1.0 / link["candidates"] for link in links])) if links else 0.0,
        "requests_logged": len(log.requests),
        "requests_not_kept": log.dropped,
        "requests_attributed": attributed,
        "logged_since": log.since,
        "links": LINKS_JSON,
    }
