"""The demo's supervision and planning, without a round: children restarted
when they die and all stopped (descendants included) when the block ends;
windows sized by what each must achieve at the measured rate (anonml.demo._schedule)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import pytest
import trio

from anonml.aggregator import CREDENTIAL_HOLD_SECONDS, REVEAL_POLL_SECONDS
from anonml.demo import open_children
from anonml.demo._children import RESTART_DELAY, still_running
from anonml.demo import _calibrate
from anonml.demo._calibrate import PhaseCosts, measure_costs, measured_cpus, pinned_to
from anonml.demo._run import dead_workers
from anonml.demo._schedule import (
    AGGREGATOR_PROCESSES, HEADROOM, PACED_SHARE, PATH_LENGTH,
    RELAYS, plan_round, recovery_seconds, requests_in_flight,
)
from anonml.demo._swarm import SwarmConfig
from anonml.peer import RETRY_GAP_CAP
from anonml.protocol import SECOND_WINDOW_PATHS, hop_slice
from anonml.relay import DUE_POLL_SECONDS
from anonml.transport import MAX_BACKOFF, HttpLimits
from process_support import assert_sigkill_leaves_no_survivor

# A child that starts a grandchild in its process group (as the aggregator
# starts its issuer workers), then waits.
PARENT = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print('ready', flush=True); time.sleep(600)"
)


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    # Real processes start in real time: a hang guard, not a deadline.
    with trio.move_on_after(120):
        while not condition():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"still waiting for {what}")


async def test_a_killed_child_is_restarted_and_nothing_outlives_the_block(tmp_path: Path) -> None:
    restarted: list[int] = []
    seen: list[psutil.Process] = []
    async with open_children(tmp_path / "logs", restart_delay=0.0, on_restart=lambda _, code: restarted.append(code)) as children:
        child = await children.start("sleeper", [sys.executable, "-c", PARENT], restart=True)
        await wait_for(lambda: len(children.pids()) == 2, "the child and its grandchild")
        seen += [psutil.Process(pid) for pid in children.pids()]
        assert children.kill(child, signal.SIGKILL)
        await wait_for(lambda: child.starts == 2 and len(children.pids()) == 2, "the restart")
        seen += [psutil.Process(pid) for pid in children.pids()]
        once = await children.start("once", [sys.executable, "-c", "import sys; sys.exit(5)"])
        await wait_for(lambda: once.finished, "the one-shot child")
    assert restarted == [-signal.SIGKILL]
    assert once.starts == 1 and once.exits == [5]
    # The first grandchild was killed with its group when its parent died; the rest at the end.
    _, alive = psutil.wait_procs(seen, timeout=30)
    assert alive == []
    assert child.finished and child.exits[-1] == -signal.SIGTERM


def test_a_zombie_counts_as_exited_and_a_running_process_does_not() -> None:
    """Issue 26: every demo's end waited 1.5 s (psutil.wait_procs) for PID 1 to reap the issuer worker its
    killed aggregator left behind, an orphan that had exited long before."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watched = psutil.Process(process.pid)
    try:
        assert still_running(watched)
        process.kill()
        for _ in range(6000):  # nobody reaps it until process.wait(); the bound is a hang guard
            if watched.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.01)
        assert not still_running(watched)
    finally:
        process.kill()
        process.wait()
    assert not still_running(watched)


async def test_a_peer_worker_that_died_is_named_and_one_stopped_or_done_is_not(tmp_path: Path) -> None:
    """SIGKILL of one of `anonml demo --peers 40`'s two peer workers ended the demo with exit 7 ("20 of 40
    answered") and nothing said why: peer workers are not restarted, so none was listed as restarted."""
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    async with open_children(tmp_path / "logs", restart_delay=0.0) as children:
        workers = [await children.start("worker-0", sleep), await children.start("worker-1", sleep),
                   await children.start("worker-2", [sys.executable, "-c", "pass"])]
        assert children.kill(workers[0], signal.SIGKILL)
        await wait_for(lambda: workers[0].finished and workers[2].finished, "the killed and the finished worker")
        assert dead_workers(workers) == [f"worker-0 ({-signal.SIGKILL})"]
        children.stop(workers[1])
        await wait_for(lambda: workers[1].finished, "the stopped worker")
        assert dead_workers(workers) == [f"worker-0 ({-signal.SIGKILL})"]


# A demo in miniature: two children, one with a grandchild, then a wait to be killed.
KILLED_DEMO = f"""
import sys, trio
from pathlib import Path
from anonml.aggregator import CREDENTIAL_HOLD_SECONDS, REVEAL_POLL_SECONDS
from anonml.demo import open_children
from anonml.demo._children import RESTART_DELAY, still_running

async def main() -> None:
    async with open_children(Path(sys.argv[1])) as children:
        await children.start("parent", [sys.executable, "-c", {PARENT!r}])
        await children.start("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
        while len(children.pids()) < 3:
            await trio.sleep(0.05)
        print(*children.pids(), flush=True)
        await trio.sleep(600)

trio.run(main)
"""


def test_a_killed_demo_leaves_no_child_behind(tmp_path: Path) -> None:
    """A SIGKILLed `anonml demo` left 9 of its 11 processes running (relays, the aggregator and its workers,
    the peers' workers), their ports still bound: each child runs in a session of its own, and SIGKILL runs
    no clean-up. Its reaper ends them."""
    demo = subprocess.Popen([sys.executable, "-c", KILLED_DEMO, str(tmp_path / "logs")], stdout=subprocess.PIPE, text=True)
    try:
        assert demo.stdout is not None
        family = [psutil.Process(int(pid)) for pid in demo.stdout.readline().split()]
        assert len(family) == 3
        assert_sigkill_leaves_no_survivor(demo, family)
    finally:
        demo.kill()


def test_the_reaper_ends_the_groups_still_listed_and_skips_other_lines() -> None:
    from anonml.demo._reaper import read_groups

    lines = io.BytesIO(b"+101\n+102\n-101\n+103\n-103\n-999\nkill 1\n+1\n+" + b"9" * 40 + b"\n+104\n")
    assert read_groups(lines) == {102, 104}


def costs(scale: float) -> PhaseCosts:
    return PhaseCosts(register=1e-3 * scale, issue=10e-3 * scale, roster_entry=0.1e-3 * scale, token=10e-3 * scale, relay_hop=1.5e-3 * scale,
                      verify=8e-3 * scale, http=8e-3 * scale, process_start=1.5 * scale,
                      serving_start=3.0 * scale)


def test_windows_hold_their_work_at_the_measured_rate_across_the_cores() -> None:
    """The rule in anonml.demo._schedule: each window holds its work spread over the cores, with headroom."""
    data = SimpleNamespace(name="breast-cancer")
    c = costs(3.0)
    plan = plan_round(data, 4000, 2.0, 2, 0, c, n_cores=2)  # type: ignore[arg-type]
    # Every peer's one data message, made (token and packet) and taken in at its first relay (a Sphinx hop),
    # all on both cores, at half the measured rate.
    assert plan.data_send_window >= HEADROOM * 4000 * (c.token + c.relay_hop) / 2
    # Each relay's slice holds every packet of the phase at its one process's Sphinx rate; the last slice
    # the aggregator's last hop and token check on its processes.
    slice_seconds = hop_slice(plan.data_delivery_window, PATH_LENGTH)  # after the first hop's guard
    assert slice_seconds >= HEADROOM * 4000 * c.relay_hop
    assert slice_seconds >= HEADROOM * 4000 * (c.verify - PATH_LENGTH * c.relay_hop) / AGGREGATOR_PROCESSES
    # The second attempt's slices hold each message over SECOND_WINDOW_PATHS paths (issue 27).
    second_slice = hop_slice(plan.data_second_delivery_window, PATH_LENGTH)
    assert second_slice >= HEADROOM * SECOND_WINDOW_PATHS * 4000 * c.relay_hop > slice_seconds
    # Registration and issuance hold their work and one restart of the aggregator: nothing repairs them later.
    # Registration is answered before the issuer processes start, so its restart does not wait for them.
    assert plan.register_seconds >= HEADROOM * 4000 * (c.register + c.http) / 2 + recovery_seconds(c, issuing=False)
    # Issuance also holds each worker's reading of the whole roster (every entry's signature) before it asks.
    assert plan.issue_seconds >= HEADROOM * 4000 * (c.issue + c.http) / 2 + HEADROOM * 4000 * c.roster_entry + recovery_seconds(c)
    assert recovery_seconds(c) - recovery_seconds(c, issuing=False) == pytest.approx(c.process_start)
    # The work spreads over the cores: one core needs longer windows than two.
    one_core = plan_round(data, 4000, 2.0, 2, 0, c, n_cores=1)  # type: ignore[arg-type]
    assert one_core.data_send_window > plan.data_send_window and one_core.issue_seconds > plan.issue_seconds


def test_every_core_is_measured_in_turn_and_the_plan_takes_the_slowest_cores_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine's cores differ (here: a credential in 0.83 ms on core 0, 1.0-1.2 ms on core 1) and the round
    runs on all of them: measure_costs times each core, its crypto and HTTP figures there, and keeps the largest."""
    measured: list[int | None] = []

    async def costs_on(cpu: int | None, path_length: int, samples: int, concurrency: int) -> dict[str, float]:
        # The HTTP exchange is timed with as many requests in flight as the round's workers keep.
        assert concurrency == requests_in_flight(2) == 2 * SwarmConfig.max_connections
        measured.append(cpu)
        slow = 2.0 if cpu == 1 else 1.0  # core 1 is the slow one, as on this machine
        return {"register": 1e-4 * slow, "issue": 2e-3 * slow, "roster_entry": 1e-4, "token": 1e-3 * slow,
                "relay_hop": 2e-4 * slow, "verify": 1e-3, "http": 1e-3 / slow}

    async def serving_start() -> float:
        return 1.0

    monkeypatch.setattr(_calibrate, "_costs_on", costs_on)
    monkeypatch.setattr(_calibrate, "serving_start_seconds", serving_start)
    monkeypatch.setattr(_calibrate, "allowed_cpus", lambda: [0, 1])
    costs = trio.run(partial(measure_costs, PATH_LENGTH, 0.5, requests_in_flight=requests_in_flight(2)))
    assert measured == [0, 1]
    assert (costs.issue, costs.token, costs.relay_hop, costs.http, costs.verify) == (4e-3, 2e-3, 4e-4, 1e-3, 1e-3)
    assert (costs.process_start, costs.serving_start) == (0.5, 1.0)
    # Many cores: at most MAX_MEASURED_CORES of them, spread over the range, each once.
    spread = measured_cpus(list(range(64)), most=8)
    assert spread == [0, 8, 16, 24, 32, 40, 48, 56]
    assert measured_cpus([3, 5]) == [3, 5] and measured_cpus([None]) == [None]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="the platform cannot pin a thread to a core")
def test_a_measurement_pinned_to_a_core_runs_there_and_gives_its_thread_back_every_core() -> None:
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    with pinned_to(cpu):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == allowed
    with pytest.raises(ZeroDivisionError), pinned_to(cpu):
        1 / 0
    assert os.sched_getaffinity(0) == allowed
    # The real measurement on that core: every per-unit figure, each a positive time; the thread unpinned after.
    figures = trio.run(_calibrate._costs_on, cpu, PATH_LENGTH, 2, 4)
    assert set(figures) == {"register", "issue", "roster_entry", "token", "relay_hop", "verify", "http"}
    assert all(seconds > 0 for seconds in figures.values())
    assert os.sched_getaffinity(0) == allowed


def test_the_timed_credential_is_the_whole_exchange_but_its_transport(tmp_path: Path) -> None:
    """The calibration's credential figure times what the round runs for one: the peer's stored and signed
    request, the aggregator's check and blind answer, the peer's check and its stored credential."""
    from nacl.signing import SigningKey

    from anonml.crypto import CredentialSecret, IssuerSecretKey, make_token, verify_token
    from anonml.peer import PeerStore

    issuer, identity = IssuerSecretKey.generate(), SigningKey.generate()
    store = PeerStore(tmp_path / "peer.sqlite", durable=False)
    credential = _calibrate._credential_exchange(issuer, CredentialSecret.generate(), identity, store)
    # A credential the issuer's tokens accept, in partition 0, kept where a resumed peer finds it.
    token = make_token(issuer.public_key(), credential, b"survey", b"message")
    verify_token(issuer, b"survey", b"message", token, expected_partition=0)
    registration = store.registration(bytes(identity.verify_key), b"\x01" * 32)
    assert registration is not None and registration.credential == credential.to_bytes() and registration.partition == 0


def test_registration_and_issuance_hold_a_restart_as_long_as_the_serving_aggregator_takes_to_answer() -> None:
    """A restarted `aggregator run` answers only after importing its stack (serving_start, seconds under load),
    not after `aggregator init`'s short run: the allowance, and the windows holding it, grow with the former."""
    data = SimpleNamespace(name="breast-cancer")
    quick, slow = costs(1.0), dataclasses.replace(costs(1.0), serving_start=10.0)
    assert recovery_seconds(slow) - recovery_seconds(quick) == pytest.approx(10.0 - quick.serving_start)
    assert recovery_seconds(slow) >= RESTART_DELAY + slow.serving_start + RETRY_GAP_CAP
    # The fault bench's supervisor waits its --downtime before a restart, not the demo's RESTART_DELAY.
    assert recovery_seconds(slow, restart_delay=3.0) - recovery_seconds(slow) == pytest.approx(3.0 - RESTART_DELAY)
    downtime = plan_round(data, 398, 2.0, 2, 0, quick, n_cores=2, restart_delay=3.0)  # type: ignore[arg-type]
    for window in ("register_seconds", "issue_seconds"):
        quick_plan = getattr(plan_round(data, 398, 2.0, 2, 0, quick, n_cores=2), window)  # type: ignore[arg-type]
        assert getattr(downtime, window) >= quick_plan + 3.0 - RESTART_DELAY - 1, window
    for window in ("register_seconds", "issue_seconds"):
        fast_plan = getattr(plan_round(data, 398, 2.0, 2, 0, quick, n_cores=2), window)  # type: ignore[arg-type]
        slow_plan = getattr(plan_round(data, 398, 2.0, 2, 0, slow, n_cores=2), window)  # type: ignore[arg-type]
        assert slow_plan >= fast_plan + 10.0 - quick.serving_start - 1, window


def test_windows_grow_with_the_measured_costs_and_the_default_round_is_not_padded_per_window() -> None:
    data = SimpleNamespace(name="breast-cancer")
    idle = plan_round(data, 398, 2.0, 2, 0, costs(1.0), n_cores=2)  # type: ignore[arg-type]
    busy = plan_round(data, 398, 2.0, 2, 0, costs(3.0), n_cores=2)  # type: ignore[arg-type]
    windows = ("register_seconds", "issue_seconds", "send_window", "delivery_window", "second_delivery_window",
               "data_send_window", "data_delivery_window", "data_second_delivery_window")
    for name in windows:
        assert getattr(busy, name) > getattr(idle, name), name
    # More peers, more time for the per-peer phases.
    bigger = plan_round(data, 4000, 2.0, 2, 0, costs(1.0), n_cores=2)  # type: ignore[arg-type]
    assert bigger.register_seconds > idle.register_seconds and bigger.data_send_window > idle.data_send_window
    # The default demo's 398 peers: about 30 s of CPU work in all at these costs. A restart's worth of
    # padding in each of the query phases' windows and slices (the old rule) planned 578 s. The delivery
    # windows of the second attempt hold its two paths per message (protocol.SECOND_WINDOW_PATHS): 126 s, was 110 s.
    # Issuance holds the wait for the relays' reveals and the peers' retry after it (issue 27): 133 s.
    # A restart in registration or issuance is allowed the serving aggregator's start, not init's: 137 s.
    # Send windows hold the first relays' intake too (a Sphinx hop per message): 139 s.
    assert idle.total_seconds() <= 139


def test_registration_opens_after_twice_the_aggregators_measured_serving_start() -> None:
    """Issue 27: `aggregator run` took 4-8 s to answer at load 12-17 while the round opened 2-3 s after `round new`
    (sized by `aggregator init`'s 0.3-0.8 s); registration had closed, or nearly, before it answered."""
    data = SimpleNamespace(name="breast-cancer")
    light_init = dataclasses.replace(costs(1.0), process_start=0.3, serving_start=6.0)
    plan = plan_round(data, 40, 2.0, 2, 0, light_init, n_cores=2)  # type: ignore[arg-type]
    assert plan.start_seconds >= 2 * light_init.serving_start
    assert plan_round(data, 40, 2.0, 2, 0, dataclasses.replace(light_init, serving_start=1.0),  # type: ignore[arg-type]
                      n_cores=2).start_seconds < plan.start_seconds


def test_issuance_holds_the_wait_for_the_relays_reveals_and_the_peers_retry_after_it() -> None:
    """Issue 27: the reveals were in 1.7 s into a 5 s issuance window (the aggregator polls each mirror once a
    second) and a worker's 20 peers, answered 503 until then, came back after it had closed. Since issue 26 a
    request waits for them up to CREDENTIAL_HOLD_SECONDS: past that, its peer's retry gap counts too."""
    data = SimpleNamespace(name="breast-cancer")
    c = costs(1.0)
    for round_trip in (0.01, 0.2):
        plan = plan_round(data, 40, 2.0, 2, 0, c, n_cores=2, round_trip=round_trip)  # type: ignore[arg-type]
        reveals = HEADROOM * (DUE_POLL_SECONDS + REVEAL_POLL_SECONDS + RELAYS * round_trip)
        retry = RETRY_GAP_CAP if reveals > CREDENTIAL_HOLD_SECONDS else 0.0
        assert retry == (RETRY_GAP_CAP if round_trip == 0.2 else 0.0)
        assert plan.issue_seconds >= HEADROOM * 40 * (c.issue + c.http) / 2 + reveals + retry + recovery_seconds(c)


def test_under_planned_kills_every_delivery_slice_holds_one_outage_and_a_link_retry() -> None:
    """Issue 27: the fault bench's 398-peer round had two-second slices; a relay killed for a second stayed
    away three or four, and what its upstream relays held for it reached it after its window (refused late)."""
    data = SimpleNamespace(name="breast-cancer")
    quiet = plan_round(data, 398, 2.0, 2, 0, costs(1.0), n_cores=2)  # type: ignore[arg-type]
    outage = 1.0 + 2 * costs(1.0).process_start
    killed = plan_round(data, 398, 2.0, 2, 0, costs(1.0), n_cores=2, outage=outage)  # type: ignore[arg-type]
    for window in ("delivery_window", "data_delivery_window", "second_delivery_window", "data_second_delivery_window"):
        assert getattr(quiet, window) / (PATH_LENGTH + 1) < outage + MAX_BACKOFF
        assert getattr(killed, window) / (PATH_LENGTH + 1) >= outage + MAX_BACKOFF
    # Only the delivery windows change: the rest holds no packet in flight to a hop that is down.
    assert (killed.data_send_window, killed.register_seconds) == (quiet.data_send_window, quiet.register_seconds)


def test_a_request_counts_at_least_its_pacing_when_every_peer_is_one_address() -> None:
    """The HTTP server paces one address to HttpLimits.request_rate: on a machine where a request
    takes less than 1 / request_rate, windows sized from the measured cost alone were too short."""
    data = SimpleNamespace(name="breast-cancer")
    fast = dataclasses.replace(costs(1.0), register=1e-6, issue=1e-6, http=1e-5)
    plan = plan_round(data, 8000, 2.0, 2, 0, fast, n_cores=2)  # type: ignore[arg-type]
    paced = 8000 / (HttpLimits().request_rate * PACED_SHARE)
    roster = HEADROOM * 8000 * fast.roster_entry  # each worker reads the roster before it asks
    register_floor, issue_floor = paced + recovery_seconds(fast, issuing=False), paced + roster + recovery_seconds(fast)
    assert plan.register_seconds >= register_floor and plan.issue_seconds >= issue_floor
    # The pacer's rate is exact whatever the load (issue 26): no headroom doubles it. At 100,000
    # peers a doubled pacing term alone was 500 s of registration and 500 s of issuance.
    reveals = HEADROOM * (DUE_POLL_SECONDS + REVEAL_POLL_SECONDS)  # no round trip here: within the hold
    assert plan.register_seconds <= math.ceil(register_floor) and plan.issue_seconds <= math.ceil(issue_floor + reveals)


def test_the_exit_code_says_failed_degraded_lost_or_left_out() -> None:
    from anonml.demo._summary import (
        EXIT_MESSAGES_LOST,
        EXIT_PEERS_LEFT_OUT,
        EXIT_REASONS,
        EXIT_ROUND_DEGRADED,
        EXIT_ROUND_FAILED,
        exit_code,
    )

    def summary(phase: str, prepared: int = 1000, accepted: int = 1000, twice: int = 0, acknowledged_lost: int = 0,
                joined: int = 500) -> dict[str, object]:
        audit = {"prepared": prepared, "accepted": accepted, "lost": prepared - accepted, "counted_twice": twice,
                 "peer_acknowledged_but_lost": acknowledged_lost}
        return {"phase": phase, "audit": audit, "peers": 500, "joined": joined}

    assert exit_code(summary("done")) == 0
    assert exit_code(summary("done", accepted=990)) == 0  # 99% accepted: the demo's bar
    assert exit_code(summary("done", accepted=989)) == EXIT_MESSAGES_LOST
    assert exit_code(summary("done", twice=1)) == EXIT_MESSAGES_LOST
    assert exit_code(summary("done", accepted=999, acknowledged_lost=1)) == EXIT_MESSAGES_LOST
    assert exit_code(summary("done", prepared=0, accepted=0)) == 0
    assert exit_code(summary("degraded")) == EXIT_ROUND_DEGRADED
    assert exit_code(summary("degraded", accepted=10)) == EXIT_ROUND_DEGRADED  # the round's own verdict comes first
    assert exit_code(summary("failed")) == EXIT_ROUND_FAILED
    assert exit_code(summary("unknown")) == EXIT_ROUND_FAILED
    # Half the peers shut out of registration, every message of the other half accepted: exited 0 before.
    assert exit_code(summary("done", prepared=500, accepted=500, joined=250)) == EXIT_PEERS_LEFT_OUT
    assert exit_code(summary("done", joined=495)) == 0  # 99% of the peers answered
    assert exit_code(summary("done", joined=494)) == EXIT_PEERS_LEFT_OUT
    assert len({0, EXIT_MESSAGES_LOST, EXIT_ROUND_DEGRADED, EXIT_ROUND_FAILED, EXIT_PEERS_LEFT_OUT}) == 5
    assert set(EXIT_REASONS) == {EXIT_MESSAGES_LOST, EXIT_ROUND_DEGRADED, EXIT_ROUND_FAILED, EXIT_PEERS_LEFT_OUT}


async def test_until_quiet_waits_for_the_children_start_up_and_no_longer(tmp_path: Path) -> None:
    """Issue 26: the demo measured its costs while its own workers and relays were starting (imports on
    every core) and planned a registration window six times its work; it now waits for them to be quiet."""
    busy = "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass\ntime.sleep(600)"
    async with open_children(tmp_path / "logs", restart_delay=0.0) as children:
        await children.start("idle", [sys.executable, "-c", "import time; time.sleep(600)"])
        waited = await children.until_quiet(0.1, timeout=60.0, interval=0.25)
        assert waited < 5.0
        child = await children.start("starting", [sys.executable, "-c", busy])
        # The busy child's 1.5 s of CPU is spent before until_quiet returns (it may get less than a core:
        # a share of 0.02 holds while it gets more than that, so beside up to about 100 busy processes).
        waited = await children.until_quiet(0.02, timeout=120.0, interval=1.0)
        assert waited >= 1.5 and sum(s for (name, _), s in children.cpu_seconds().items() if name == "starting") >= 1.5
        assert not child.finished
        # A child that never goes quiet is waited for at most the timeout.
        await children.start("spinning", [sys.executable, "-c", "while True: pass"])
        waited = await children.until_quiet(0.02, timeout=2.0, interval=0.5)
        assert 2.0 <= waited < 5.0


def test_the_demos_baseline_is_fitted_on_exactly_the_rows_its_peers_held(tmp_path: Path) -> None:
    """Model averaging's yardstick (issue 28): non-private logistic regression on the peers' own rows, the AUC on
    every training row beside it only as a second, labelled figure."""
    from anonml.demo._audit import Audit
    from anonml.demo._data import baseline_auc, breast_cancer_data
    from anonml.demo._progress import Progress
    from anonml.demo._summary import baseline_lines, summarise

    data = breast_cancer_data(0)
    params = plan_round(data, 60, 2.0, 2, 0, costs(1.0), n_cores=2)
    summary = summarise(data, params, Progress(peers=60), {}, Audit(), tmp_path, 1.0)
    first = dataclasses.replace(data, train_rows=data.train_rows[:60], train_labels=data.train_labels[:60],
                                train_columns={name: column[:60] for name, column in data.train_columns.items()})
    assert (summary["baseline_rows"], summary["training_rows"]) == (60, len(data.train_rows)) == (60, 398)
    assert summary["baseline_auc"] == baseline_auc(first, 60)
    assert summary["baseline_auc_all_rows"] == baseline_auc(data, 398) != summary["baseline_auc"]
    assert baseline_lines(summary) == [("the rows the peers held", 60, f"{summary['baseline_auc']:.4f}"),
                                       ("every training row", 398, f"{summary['baseline_auc_all_rows']:.4f}")]
    # Rows of one class: no baseline, said so rather than a crash at the end of a round.
    one_class = int(np.flatnonzero(data.train_labels != data.train_labels[0])[0])  # rows before the other class's first
    assert baseline_auc(data, one_class) is None
    with pytest.raises(ValueError, match="399"):
        baseline_auc(data, 399)


async def test_a_workers_peers_start_in_step_with_their_registrations_and_a_stopped_peer_frees_its_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Issue 26: each of a worker's 16,000 Adult peers started at once (about a millisecond each) and held back
    the first 20 s of registration. At most ``ahead`` are between their start and their registration; a peer
    gives its slot back when it registers (not at another event) or when it stops before that."""
    from anonml.demo._swarm import StartSlots
    from anonml.peer import PeerEvent

    ahead, peers = 4, 40
    slots, between, most, registered_at = StartSlots(ahead), [0], [0], []

    async def peer(index: int) -> None:
        with contextlib.suppress(ValueError):
            async with slots.holding() as listener:
                between[0] += 1
                most[0] = max(most[0], between[0])
                await trio.sleep(1)
                listener(PeerEvent.MANIFEST_UNMIRRORED)  # not a registration: the slot stays taken
                await trio.sleep(1)  # a slot given back at that event would let a fifth peer in here
                between[0] -= 1
                if index % 5 == 0:
                    raise ValueError("stopped before registering")
                listener(PeerEvent.REGISTERED)
                registered_at.append(trio.current_time())
                await trio.sleep(30)  # the rest of its round, on no slot

    started = trio.current_time()
    with trio.fail_after(1000):  # a slot never given back leaves the last peers waiting for ever
        async with trio.open_nursery() as nursery:
            for index in range(peers):
                nursery.start_soon(peer, index)
    assert most[0] == ahead and len(registered_at) == peers - peers // 5
    # Two seconds each, ahead at a time: the last registers after 2 * peers / ahead seconds, not after 32 s per batch.
    assert max(registered_at) - started == pytest.approx(2 * peers / ahead)
