"""A relay's mirror asks a real aggregator (served on loopback) only for what the round's schedule says can
exist by then, and does not parse or verify again a body it has already checked: a refresh of an unchanged
aggregator costs its requests only (``relay._mirror.refresh_one``). It refreshes at each scheduled
publication and polls quickly until the document is there (``MirroredAggregator.next_refresh``)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import anonml.relay._mirror as mirror_module
from anonml.protocol import PATH_HEADS, PATH_MANIFEST, PATH_MEDIAN, PATH_MEDIANS, PATH_ROSTER_HEAD, Check, SignedDocument, SignedManifest
from anonml.relay import PinnedAggregator
from anonml.relay._mirror import DUE_POLL_SECONDS, DUE_SECONDS, IN_ROUND_REFRESH_SECONDS, MirroredAggregator, refresh_one
from test_peer_aggregator import T0, home, served  # noqa: F401 - pytest fixtures


class CountingManifest:
    """``SignedManifest`` as the mirror module sees it, counting how often a body is parsed and verified."""

    parsed = 0

    @classmethod
    def from_json(cls, body: bytes, **kwargs: Any) -> SignedManifest:
        cls.parsed += 1
        return SignedManifest.from_json(body, **kwargs)


async def test_a_mirror_asks_for_what_the_schedule_has_published_and_checks_each_body_once(
    served: Any, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 - the imported fixture
) -> None:
    state, url, _ = served
    schedule = state.manifest.schedule
    assert len(schedule.median) == 2
    monkeypatch.setattr(mirror_module, "SignedManifest", CountingManifest)
    asked: list[str] = []

    async def record(request: httpx.Request) -> None:
        asked.append(request.url.path)

    mirrored = MirroredAggregator(PinnedAggregator(url, state.manifest.identity_key))
    async with httpx.AsyncClient(event_hooks={"request": [record]}) as client:
        # Registration is open: no roster yet, and only sub-round 0's thresholds are public.
        await refresh_one(client, mirrored, float(T0))
        assert asked == [PATH_MANIFEST, PATH_MEDIAN.format(i=0), PATH_HEADS]
        assert mirrored.manifest is not None and mirrored.manifest.round_id == state.round_id
        assert "median/0" in mirrored.published
        # The same aggregator a second later: its unchanged manifest is not parsed and verified again,
        # and the thresholds it holds are not asked for again.
        asked.clear()
        await refresh_one(client, mirrored, float(T0 + 1))
        assert asked == [PATH_MANIFEST, PATH_HEADS] and CountingManifest.parsed == 1
        # Sub-round 0 has ended: the roster head and sub-round 1's thresholds can exist, the medians not yet.
        asked.clear()
        await refresh_one(client, mirrored, float(schedule.median[0].t_r))
        assert asked == [PATH_MANIFEST, PATH_ROSTER_HEAD, PATH_MEDIAN.format(i=1), PATH_HEADS]
        asked.clear()
        await refresh_one(client, mirrored, float(schedule.median[1].t_r))
        assert PATH_MEDIANS in asked


async def test_a_mirror_refreshes_at_each_scheduled_publication_and_polls_until_the_document_is_here(
    served: Any,  # noqa: F811 - the imported fixture
) -> None:
    state, url, _ = served
    schedule = state.manifest.schedule
    mirrored = MirroredAggregator(PinnedAggregator(url, state.manifest.identity_key))
    assert mirrored.next_refresh(float(T0), 1.0) == 1.0  # nothing known yet: the usual period
    mirrored.reset(state.signed)
    # Registration open, nothing due: the usual period, or the end of registration if that comes sooner.
    assert not mirrored.due(float(T0))
    assert mirrored.next_refresh(float(T0), 1.0) == 1.0
    assert mirrored.next_refresh(schedule.t_register_end - 0.25, 1.0) == pytest.approx(0.25)
    # The roster head is due and not here: polled at the quick pace, for a few seconds at most.
    assert mirrored.next_refresh(float(schedule.t_register_end), 1.0) == DUE_POLL_SECONDS
    # Once registration has closed, everything the aggregator publishes is on the schedule: the slower
    # in-round pace, or the next publication if that comes sooner; after the round's last one, the usual.
    after_due = schedule.t_register_end + DUE_SECONDS
    first_check = schedule.median[0].check_time(Check.FIRST)
    assert mirrored.next_refresh(after_due, 1.0) == pytest.approx(min(IN_ROUND_REFRESH_SECONDS, first_check - after_due))
    times = sorted(phase.check_time(check) for phase in schedule.phases for check in Check)
    quiet, following = next((a + DUE_SECONDS, b) for a, b in zip(times, times[1:]) if b - a > DUE_SECONDS + 2)
    assert mirrored.next_refresh(quiet, 1.0) == pytest.approx(min(IN_ROUND_REFRESH_SECONDS, following - quiet))
    assert mirrored.next_refresh(quiet, 1.0) > 1.0
    assert mirrored.next_refresh(times[-1] + DUE_SECONDS, 1.0) == 1.0
    async with httpx.AsyncClient() as client:
        # Served from the start: a stand-in for a held roster head (only its presence matters here).
        mirrored.roster_head = SignedDocument.from_json(await client_get(client, url + PATH_MEDIAN.format(i=0)), max_bytes=1 << 20)
        await refresh_one(client, mirrored, float(schedule.t_register_end))
    assert not mirrored.due(float(schedule.t_register_end))
    # Sub-round 0's first check: its heads are due until the mirror holds them.
    assert mirrored.due(float(first_check)) and not mirrored.due(first_check + DUE_SECONDS)
    # Sub-round 1's thresholds are due once sub-round 0 has ended.
    mirrored.heads = {}
    assert "median/1" in mirrored.wanted(float(schedule.median[0].t_r)) and mirrored.due(float(schedule.median[0].t_r))


async def client_get(client: httpx.AsyncClient, url: str) -> bytes:
    response = await client.get(url)
    response.raise_for_status()
    return response.content


async def test_a_mirror_serves_each_document_once_held_and_what_it_holds_after_every_change(
    served: Any,  # noqa: F811 - the imported fixture
) -> None:
    """The mirror encodes what it serves once per change (``MirroredAggregator.body``): a document it
    comes to hold replaces the 404 it served before, and a new round's manifest the last round's documents."""
    state, url, _ = served
    identity = state.manifest.identity_key
    mirrored = MirroredAggregator(PinnedAggregator(url, identity))
    app = mirror_module.build_mirror_app([mirrored])
    base = f"http://mirror/v1/mirror/{identity.hex()}"
    async with httpx.AsyncClient() as aggregator, httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as peer:
        assert (await peer.get(base + "/manifest")).status_code == 404
        await refresh_one(aggregator, mirrored, float(T0))
        assert (await peer.get(base + "/manifest")).content == state.signed.to_json()
        thresholds = mirrored.published["median/0"]
        assert (await peer.get(base + "/median/0")).content == thresholds.to_json()
        assert (await peer.get(base + "/heads")).content == mirrored.heads_json()
        # Stand-ins for documents the mirror comes to hold (only which bytes are served matters here).
        for path in ("/roster/head", "/median/1", "/medians"):
            assert (await peer.get(base + path)).status_code == 404
        mirrored.keep_roster_head(thresholds)
        mirrored.keep_published("median/1", thresholds)
        mirrored.keep_published("medians", thresholds)
        for path in ("/roster/head", "/median/1", "/medians"):
            assert (await peer.get(base + path)).content == thresholds.to_json()
        # A new round: nothing of the last one is served any more.
        mirrored.reset(state.signed)
        for path in ("/roster/head", "/median/0", "/median/1", "/medians"):
            assert (await peer.get(base + path)).status_code == 404
