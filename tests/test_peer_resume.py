"""A crashed ``anonml peer join`` resumes (issue 10): killed with SIGKILL once its credential is stored, run
again, it continues with its stored registration and credential (before: it asked for a new credential and
was refused, 409) and the round completes for it. Real processes: the peer CLI, relays with mirrors; the
aggregator served on loopback."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import trio

from anonml.demo import free_port
from anonml.aggregator._service import AggregatorConfig, serve_aggregator
from anonml.aggregator._setup import create_round
from anonml.aggregator._spec import parse_round_spec
from anonml.base.process import anonml_command
from anonml.peer._store import PeerStore
from test_e2e_round import aggregator_with_relays, spec_document

# System suite: relay and peer processes, a round in wall-clock windows (two minutes and more).
pytestmark = pytest.mark.system


async def test_a_killed_peer_join_resumes_with_its_stored_credential(tmp_path: Path, relay_processes: list[trio.Process]) -> None:
    relays = relay_processes
    http_port = free_port()
    home, _, descriptors = await aggregator_with_relays(tmp_path, http_port, relays)
    document = spec_document(descriptors, http_port)
    # One peer, started as a process on a loaded machine: generous registration and issuance.
    document["schedule"].update({"register": 25, "issue": 25})
    document["participation"]["min_participation"] = 1
    # One peer answers one partition's surveys: the others stay empty by design, so none is judged short.
    document["participation"]["min_reports_per_survey"] = 0
    spec = parse_round_spec(document)
    state, _ = create_round(home, spec, now=int(time.time()))
    data_dir, csv = tmp_path / "me", tmp_path / "me.csv"
    csv.write_text("age,colour,y\n41,green,1\n")
    await trio.run_process(anonml_command("peer", "init", "--data-dir", str(data_dir)), capture_stdout=True)
    join = anonml_command("peer", "join", "--data-dir", str(data_dir), "--aggregator", state.manifest.aggregator_url,
                          "--data", str(csv), "--yes")
    outcome: list[str] = []
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            outcome.append(await serve_aggregator(AggregatorConfig(state, http_port=http_port, sink_port=spec.network.sink_port, linger=5.0)))

        nursery.start_soon(serve)
        first_log = open(tmp_path / "join-1.log", "wb")  # noqa: SIM115 - the child writes it
        first = await trio.lowlevel.open_process(join, stdout=first_log, stderr=first_log)
        # Kill it the moment its credential is durable in its store.
        with trio.fail_after(120):
            while True:
                await trio.sleep(0.2)
                if not (data_dir / "peer.sqlite").exists():
                    continue
                store = PeerStore(data_dir / "peer.sqlite", durable=False)
                try:
                    registrations = [store.registration(key, state.round_id) for key in [state.store.roster_entries()[0].identity_key]] \
                        if state.store.roster_entries() else []
                finally:
                    store.close()
                if registrations and registrations[0] is not None and registrations[0].credential is not None:
                    break
        first.send_signal(signal.SIGKILL)
        await first.wait()
        assert state.store.counts()["credentials"] == 1
        second = await trio.run_process(join, capture_stdout=True, capture_stderr=True, check=False)
        # The round ends at the data phase's last check (when the second join returns) plus the linger.
        ends = state.manifest.schedule.data.t_r + 5.0
        while not outcome:
            assert time.time() < ends + 120, f"the round did not end: {state.store.counts()}, inbox pending: {state.store.inbox_pending_before(state.manifest.schedule.data.t_r)}"
            await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    output = second.stdout.decode() + second.stderr.decode()
    assert second.returncode == 0, output
    # Progress lines read "[HH:MM:SS] <event words>"; the status lines after them are not events.
    events = [line.split("] ", 1)[1].split(":")[0] for line in output.splitlines() if line.startswith("[")]
    assert "resumed" in events and "credential received (blind" not in events and "registered" not in events, output
    assert "registered yes; credential yes" in output, output
    assert outcome == ["done"]
    # One credential ever issued; every message of the peer counted, once.
    assert state.store.counts()["credentials"] == 1
    assert " 0 missing" in output, output
    assert state.store.counts()["accepted"] >= 2
