"""The demo's per-stage anonymity analysis (``anonml.demo._trace``) on synthetic traces written as the
workers, relays and aggregator write them: it follows each message by packet hashes, reports rho near
zero from the first release on when every hop draws independently, and finds a planted correlation at
the stage that carries it."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from anonml.demo._trace import TRACE_FILE, explain_lines, explain_work_dir, grouped_rho, relay_trace_file, stage_correlations, trace_messages

MESSAGES = 800
HOPS = 3
SURVEYS = 4
# Four standard errors of rho under independence at 800 pairs (1/sqrt(799) = 0.035).
INDEPENDENT = 4 / math.sqrt(MESSAGES - 1)

# A phase per window: send [0, 10), hop windows of 10 s each after it (the second window 100 s later).
SEND_SECONDS, HOP_SECONDS, SECOND_WINDOW = 10.0, 10.0, 100.0

Release = Callable[[int, float, float, np.random.Generator], float]
"""(hop index, drawn send time relative to its window, intake time, rng) -> release time."""


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def hop_window_start(hop: int) -> float:
    return SEND_SECONDS + hop * HOP_SECONDS


def independent(hop: int, _drawn: float, _taken_in: float, rng: np.random.Generator) -> float:
    start = hop_window_start(hop)  # ends a little early: the next hop takes it in before its window opens
    return float(rng.uniform(start, start + HOP_SECONDS - 0.1))


def write_round(work: Path, release: Release, *, seed: int = 0, mislabel: int = 0,
                opens: Callable[[int], float] = hop_window_start) -> None:
    """A demo work dir's trace files for MESSAGES messages over HOPS of 5 relays; ``mislabel`` messages get
    the other window in links.json; ``opens(hop)`` is when each hop's window opens."""
    rng = np.random.default_rng(seed)
    (work / "peers").mkdir(parents=True)
    rounds = work / "aggregator" / "rounds" / "r"
    rounds.mkdir(parents=True)
    relay_lines: dict[int, list[str]] = {i: [] for i in range(5)}
    sent_lines, links = [], []
    for m in range(MESSAGES):
        survey, window = f"s{m % SURVEYS}", 1 + (m // SURVEYS) % 2
        offset = 0.0 if window == 1 else SECOND_WINDOW
        drawn = float(rng.uniform(0, SEND_SECONDS - 0.1))
        packet = _digest("first", m)
        sent_lines.append({"identity": f"peer{m}", "survey": survey, "receipt": f"r{m}", "drawn_at": offset + drawn,
                           "sent_at": offset + drawn + 0.01, "packet": packet, "window": window})
        at = drawn + 0.02
        for hop, relay in enumerate(rng.choice(5, size=HOPS, replace=False)):
            out = _digest("hop", m, hop)
            released = release(hop, drawn, at, rng)
            start = opens(hop)
            relay_lines[int(relay)].append(json.dumps({"in": packet, "out": out, "taken_in": offset + at, "release_at": offset + released,
                                                       "window_start": offset + start, "window_end": offset + start + HOP_SECONDS}))
            relay_lines[int(relay)].append(json.dumps({"out": out, "forwarded": offset + released + 0.005}))
            packet, at = out, released + 0.006
        aggregator_window = window if m >= mislabel else 3 - window
        links.append({"survey": survey, "receipt": f"r{m}", "arrived": offset + at + 0.003, "window": aggregator_window,
                      "guess": f"peer{(m + 1) % MESSAGES}", "candidates": 10})
    (work / "peers" / "worker-0.sent.jsonl").write_text("".join(json.dumps(line) + "\n" for line in sent_lines))
    for relay, lines in relay_lines.items():
        path = relay_trace_file(work, relay)
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines))
    (rounds / "links.json").write_text(json.dumps(links))


def test_independent_hops_give_rho_near_zero_from_the_first_release_on(tmp_path: Path) -> None:
    write_round(tmp_path, independent)
    figures = explain_work_dir(tmp_path, 5)
    assert figures["traced"] == MESSAGES and figures["hop_counts"] == {HOPS: MESSAGES}
    stages = figures["rho_drawn_send_vs"]
    # Until the first relay releases, times follow the send (rho 1); from then on nothing does.
    assert stages["first relay's ack"] == pytest.approx(1.0) and stages["hop 1 taken in"] == pytest.approx(1.0)
    after = [name for name in stages if name not in ("first relay's ack", "hop 1 taken in")]
    assert after[0] == "hop 1 release drawn" and after[-1] == "arrived"
    assert all(abs(stages[name]) < INDEPENDENT for name in after), stages
    assert all(abs(rho) < INDEPENDENT for rho in figures["rho_intake_vs_release"].values())
    assert abs(figures["rho_headline_way"]) < INDEPENDENT
    assert figures["window_mismatches"] == 0 and figures["tied_arrivals"] == 0
    assert figures["taken_in_after_window_opened"] == {"hop 1": 0, "hop 2": 0, "hop 3": 0}
    # The per-message trace is on disk, one line per message, with its hops in path order.
    lines = (tmp_path / TRACE_FILE).read_text().splitlines()
    assert len(lines) == MESSAGES
    first = json.loads(lines[0])
    assert len(first["hops"]) == HOPS and first["hops"][0]["taken_in"] < first["hops"][1]["taken_in"] < first["arrived"]


def test_a_correlation_planted_at_the_third_hop_shows_from_there_and_not_before(tmp_path: Path) -> None:
    def third_hop_follows_send(hop: int, drawn: float, taken_in: float, rng: np.random.Generator) -> float:
        if hop < 2:
            return independent(hop, drawn, taken_in, rng)
        start = SEND_SECONDS + hop * HOP_SECONDS  # half the window by the send's place in its own, half noise
        return start + 0.5 * drawn + float(rng.uniform(0, HOP_SECONDS / 2))

    write_round(tmp_path, third_hop_follows_send)
    figures = explain_work_dir(tmp_path, 5)
    stages = figures["rho_drawn_send_vs"]
    for quiet in ("hop 1 release drawn", "hop 2 forwarded", "hop 3 taken in"):
        assert abs(stages[quiet]) < INDEPENDENT, (quiet, stages)
    for loud in ("hop 3 release drawn", "hop 3 forwarded", "arrived"):
        assert stages[loud] > 0.5, (loud, stages)
    assert figures["rho_headline_way"] > 0.5
    # The relay's own intake does not explain it: its release follows the send, not its intake.
    assert abs(figures["rho_intake_vs_release"]["hop 3"]) < INDEPENDENT


def test_late_intake_at_the_first_hop_shows_as_intake_following_release(tmp_path: Path) -> None:
    def first_hop_late(hop: int, drawn: float, taken_in: float, rng: np.random.Generator) -> float:
        # Its window opened with the send window (no guard): each packet, taken in after the window
        # opened, draws its release from what is left of it.
        if hop == 0:
            return float(rng.uniform(taken_in, SEND_SECONDS + 2.0))
        return independent(hop, drawn, taken_in, rng)

    write_round(tmp_path, first_hop_late, opens=lambda hop: 0.0 if hop == 0 else hop_window_start(hop))
    figures = explain_work_dir(tmp_path, 5)
    assert figures["taken_in_after_window_opened"] == {"hop 1": MESSAGES, "hop 2": 0, "hop 3": 0}
    assert figures["rho_drawn_send_vs"]["hop 1 release drawn"] > 0.5
    assert figures["rho_intake_vs_release"]["hop 1"] > 0.5
    assert abs(figures["rho_drawn_send_vs"]["hop 2 release drawn"]) < INDEPENDENT


def test_messages_the_aggregator_put_in_the_other_window_are_counted(tmp_path: Path) -> None:
    write_round(tmp_path, independent, mislabel=7)
    figures = explain_work_dir(tmp_path, 5)
    assert figures["window_mismatches"] == 7
    rows = dict(explain_lines(figures))
    assert any("window mismatches" in what for what in rows)


def test_a_batch_taken_in_twice_keeps_its_last_intake_and_a_broken_chain_counts_as_untraced(tmp_path: Path) -> None:
    write_round(tmp_path, independent)
    # Relay 0's first record again, later (a commit that failed and a resend), and one hop's record lost.
    path = relay_trace_file(tmp_path, 0)
    lines = path.read_text().splitlines()
    retaken = {**json.loads(lines[0]), "taken_in": 1e6}
    path.write_text("\n".join([*lines, json.dumps(retaken)]) + "\n")
    other = relay_trace_file(tmp_path, 1)
    other_lines = other.read_text().splitlines()
    other.write_text("\n".join(other_lines[2:]) + "\n")
    links = json.loads(next((tmp_path / "aggregator" / "rounds").glob("*/links.json")).read_text())
    messages = trace_messages([tmp_path / "peers" / "worker-0.sent.jsonl"], {i: relay_trace_file(tmp_path, i) for i in range(5)}, links)
    assert sum(1 for m in messages for hop in m.hops if hop.taken_in == 1e6) == 1
    figures = stage_correlations(messages)
    assert figures["traced"] == MESSAGES - 1


def test_grouped_rho_ranks_within_groups_and_refuses_mismatched_lengths() -> None:
    # Across the two groups x and y rise together; within each they run opposite ways.
    groups = ["a"] * 4 + ["b"] * 4
    x = [1.0, 2.0, 3.0, 4.0, 11.0, 12.0, 13.0, 14.0]
    y = [4.0, 3.0, 2.0, 1.0, 14.0, 13.0, 12.0, 11.0]
    assert grouped_rho(groups, x, y) == pytest.approx(-1.0)
    assert math.isnan(grouped_rho(["a", "a"], [1.0, 2.0], [2.0, 1.0]))
    with pytest.raises(ValueError, match="differ in length"):
        grouped_rho(groups, x, y[:-1])


def test_the_demo_command_explains_a_finished_work_dir_and_refuses_another(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from anonml.cli import main

    work = tmp_path / "demo"
    write_round(work, independent)
    out = tmp_path / "stages.json"
    done = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["demo", "--explain-anonymity", str(work), "--json", str(out)])
    assert done.exit_code == 0, done.output
    assert "hop 3 release drawn" in done.output and (work / TRACE_FILE).is_file()
    assert json.loads(out.read_text())["traced"] == MESSAGES
    refused = CliRunner().invoke(main, ["demo", "--explain-anonymity", str(tmp_path / "demo" / "peers")])
    assert refused.exit_code == 1 and "links.json" in refused.output


def test_what_a_worker_writes_of_a_sent_message_is_what_the_trace_reads(tmp_path: Path) -> None:
    from anonml.demo._swarm import sent_record
    from anonml.peer import SentMessage
    from anonml.protocol import Attempt, SurveyId

    survey = SurveyId.data(bytes(32), 1, 0)
    packet = b"the first hop's packet"
    message = SentMessage(survey, b"\x07" * 32, 105.5, 105.25, hashlib.sha256(packet).digest(), Attempt.SECOND)
    sent = tmp_path / "worker-0.sent.jsonl"
    sent.write_text(json.dumps(sent_record("ab" * 32, message)) + "\n")
    relay = tmp_path / "relay-2.jsonl"
    relay.write_text(json.dumps({"in": hashlib.sha256(packet).hexdigest(), "out": "0f" * 32, "taken_in": 105.4,
                                 "release_at": 130.0, "window_start": 120.0, "window_end": 140.0}) + "\n")
    links = [{"survey": survey.to_bytes().hex(), "receipt": "07" * 32, "arrived": 150.0, "window": 2, "guess": "ab" * 32}]
    (traced,) = trace_messages([sent], {2: relay}, links)
    assert (traced.survey, traced.window, traced.drawn_at, traced.sent_at) == (survey.to_bytes().hex(), 2, 105.25, 105.5)
    assert [(hop.relay, hop.taken_in, hop.release_at, hop.forwarded) for hop in traced.hops] == [(2, 105.4, 130.0, None)]
    assert (traced.arrived, traced.aggregator_window, traced.guessed_right) == (150.0, 2, True)
