"""``anonml fuzz``: every parser's target exists, starts from inputs that parse, and a short
coverage-guided run through each ends with every input parsed or refused with a typed error."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from anonml.base.process import anonml_command
from anonml.base.errors import AnonMLError
from anonml.fuzz import TARGET_NAMES
from anonml.fuzz._targets import build_targets
from anonml.protocol import BeaconStatement, InvalidBeacon
from process_support import assert_sigkill_leaves_no_survivor



def test_every_target_is_listed_and_its_seeds_parse(tmp_path: Path) -> None:
    targets = build_targets(tmp_path)
    assert sorted(targets) == sorted(TARGET_NAMES)
    for name, target in targets.items():
        assert target.seeds, name
        for seed in target.seeds:
            try:
                target.run(seed)
            except AnonMLError as exc:
                raise AssertionError(f"{name} refused its own seed: {exc}") from None


def short_run(tmp_path: Path, *options: str) -> None:
    """``anonml fuzz --runs 1000`` through every target: each input parsed or refused with a typed error, no crash."""
    runs = 1000
    done = subprocess.run(
        [*anonml_command("fuzz", "--runs", str(runs), "--json", "--work-dir", str(tmp_path), *options)],
        capture_output=True, text=True, timeout=3600,
    )
    report = json.loads(done.stdout)
    results = {r["target"]: r for r in report["targets"]}
    assert sorted(results) == sorted(TARGET_NAMES)
    for name, result in results.items():
        assert result["inputs"] == runs, (name, result.get("log_tail"))
        assert result["parsed"] + sum(result["refused"].values()) == runs, name
        assert result["untyped"] == {}, (name, result["untyped"])
        assert result["crashes"] == 0, (name, result.get("log_tail"))
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_short_blind_run_through_every_parser_has_no_untyped_error_and_no_crash(tmp_path: Path) -> None:
    # libFuzzer's mutations of each target's valid inputs, uninstrumented: 10 s for all 27 targets.
    short_run(tmp_path, "--no-coverage")


# System suite (instrumenting every anonml module: 11 s; about 100 s when each target imported it anew).
# `anonml fuzz --runs 1000000` is the real campaign (minutes per target).
@pytest.mark.system
def test_a_short_coverage_guided_run_through_every_parser_has_no_untyped_error_and_no_crash(tmp_path: Path) -> None:
    short_run(tmp_path)


def test_the_targets_leave_no_thread_spinning_once_built(tmp_path: Path) -> None:
    # The link target's trio loop (a daemon thread) autojumped its MockClock
    # with nothing scheduled: it spun holding the GIL for the rest of the
    # pytest worker's life, and every later test there ran several times slower.
    targets = build_targets(tmp_path)
    targets["link-session"].run(targets["link-session"].seeds[-1])
    started = time.process_time()
    time.sleep(1.0)
    assert time.process_time() - started < 0.2


def test_the_beacon_seed_is_a_signed_reveal_that_passes_every_check_an_unsigned_copy_does_not(tmp_path: Path) -> None:
    # The seed used to be unsigned: every input the fuzzer derived from it stopped at the
    # signature check a reader makes, never reaching the opening check behind it.
    target = build_targets(tmp_path)["beacon-statement"]
    (seed,) = target.seeds
    statement = BeaconStatement.from_json(seed)
    assert statement.signature is not None and statement.reveal is not None and statement.opened()
    target.run(seed)  # relay, round, signature and opening all hold
    unsigned = BeaconStatement(statement.node_id, statement.round_id, statement.commitment, statement.reveal)
    with pytest.raises(InvalidBeacon, match="signature"):
        target.run(unsigned.to_json())
    wrong_value = bytes(32)
    forged = BeaconStatement(statement.node_id, statement.round_id, statement.commitment, wrong_value, statement.signature)
    with pytest.raises(InvalidBeacon, match="signature"):
        target.run(forged.to_json())


def test_a_killed_fuzz_command_leaves_no_fuzzing_process_behind(tmp_path: Path) -> None:
    """A SIGKILLed `anonml fuzz` left its worker and the child fuzzing a target running on, a core busy
    for up to --hang-seconds (six hours by default)."""
    import psutil

    command = anonml_command("fuzz", "--runs", "100000000", "--no-coverage", "--target", "manifest",
                             "--work-dir", str(tmp_path))
    fuzz = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(family := psutil.Process(fuzz.pid).children(recursive=True)) < 2:  # the worker and its child
            assert time.monotonic() < deadline and fuzz.poll() is None
            time.sleep(0.2)
        assert_sigkill_leaves_no_survivor(fuzz, family)
    finally:
        fuzz.kill()
