"""``anonml relay init / info / run``, the config file, and the data directory rules."""

from __future__ import annotations

import json
import stat
import tomllib
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner

from conftest import Tmpfs
from process_support import running_until

from anonml.cli import main
from anonml.crypto import node_id_of
from anonml.relay import (
    PinnedAggregator,
    RelayConfig,
    RelayConfigError,
    RelayDataDirError,
    load_config,
    parse_host_port,
    render_config,
    serve_relay,
)
from anonml.relay._config import config_from_mapping


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["relay", *args])
    return result.exit_code, result.output


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_creates_owner_only_keys_and_a_config_and_refuses_to_overwrite(tmp_path: Path) -> None:
    data_dir = tmp_path / "relay"
    code, output = invoke("init", "--data-dir", str(data_dir), "--listen", "127.0.0.1:9401", "--metrics", "9402")
    assert code == 0, output
    assert mode(data_dir) == 0o700 and mode(data_dir / "keys") == 0o700
    key_files = [data_dir / "identity.key", *sorted((data_dir / "keys").iterdir())]
    assert len(key_files) == 3  # identity, current and next epoch
    assert all(mode(p) == 0o600 and p.stat().st_size == 32 for p in key_files)
    assert mode(data_dir / "relay.toml") == 0o600
    identity = (data_dir / "identity.key").read_bytes()

    code, output = invoke("init", "--data-dir", str(data_dir), "--listen", "127.0.0.1:9500")
    assert code != 0 and "refusing to overwrite" in output
    assert (data_dir / "identity.key").read_bytes() == identity
    assert load_config(data_dir).listen == ("127.0.0.1", 9401)
    assert load_config(data_dir).metrics == ("127.0.0.1", 9402)  # localhost unless told otherwise


def test_info_prints_the_descriptor_the_aggregator_needs(tmp_path: Path) -> None:
    data_dir = tmp_path / "relay"
    assert invoke("init", "--data-dir", str(data_dir), "--listen", "127.0.0.1:9401", "--advertise",
                  "10.0.0.7:9000")[0] == 0
    code, output = invoke("info", "--data-dir", str(data_dir), "--json")
    assert code == 0, output
    descriptor = json.loads(output)
    assert descriptor["address"] == "10.0.0.7:9000"
    assert (descriptor["host"], descriptor["port"]) == ("10.0.0.7", 9000)
    public = bytes.fromhex(descriptor["public_key"])
    assert descriptor["keys"][0] == {
        "epoch": descriptor["key_epoch"],
        "public_key": descriptor["public_key"],
        "valid_from": descriptor["key_epoch"] * descriptor["key_epoch_seconds"],
        "valid_until": (descriptor["key_epoch"] + 1) * descriptor["key_epoch_seconds"],
    }
    assert len(public) == 32 and len(descriptor["keys"]) == 2
    assert descriptor["node_id"] == node_id_of(bytes.fromhex(descriptor["identity_public_key"])).hex()
    code, output = invoke("info", "--data-dir", str(data_dir))
    assert code == 0 and descriptor["node_id"] in output


def test_run_and_info_never_create_an_identity(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    for command in ("run", "info"):
        code, output = invoke(command, "--data-dir", str(empty))
        assert code != 0 and "anonml relay init" in output
    assert not empty.exists()
    # A config without an identity (e.g. the key was deleted) is refused too.
    data_dir = tmp_path / "relay"
    assert invoke("init", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0")[0] == 0
    (data_dir / "identity.key").unlink()
    with pytest.raises(RelayDataDirError, match="relay init"):
        trio.run(serve_relay, load_config(data_dir))
    assert not (data_dir / "identity.key").exists()


def test_keys_readable_by_others_are_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "relay"
    assert invoke("init", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0")[0] == 0
    (data_dir / "identity.key").chmod(0o644)
    code, output = invoke("info", "--data-dir", str(data_dir))
    assert code != 0 and "chmod 600" in output


def test_rendered_config_reads_back_and_documents_every_key(tmp_path: Path) -> None:
    config = RelayConfig(data_dir=tmp_path, listen=("::1", 9000), metrics=("127.0.0.1", 9464), max_held_packets=7,
                         synchronous="NORMAL")
    text = render_config(config)
    assert config_from_mapping(tomllib.loads(text), tmp_path) == config
    assert text.count("\n# ") + text.count("\n#") > 20  # commented


def test_rendered_config_reads_back_the_pinned_aggregators(tmp_path: Path) -> None:
    aggregators = (PinnedAggregator("http://127.0.0.1:8080", bytes(range(32))),
                   PinnedAggregator("https://[::1]:8443/a", b"\xff" * 32))
    config = RelayConfig(data_dir=tmp_path, listen=("127.0.0.1", 9000), directory_aggregators=aggregators)
    text = render_config(config)
    assert f'identity = "{bytes(range(32)).hex()}"' in text
    assert config_from_mapping(tomllib.loads(text), tmp_path) == config
    assert str(aggregators[1]) == f"{'ff' * 32}@https://[::1]:8443/a"
    assert PinnedAggregator.parse(str(aggregators[1])) == aggregators[1]


KEY_HEX = "ab" * 32


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("limits", "max_held_packet", 5, "unknown config key"),
        ("limits", "max_held_packets", 0, "positive integer"),
        ("limits", "max_held_packets", "many", "positive integer"),
        ("link", "frame_timeout", -1.0, "frame_timeout"),
        ("keys", "grace_seconds", 10**9, "grace_seconds"),
        ("storage", "synchronous", "OFF", "synchronous"),
        ("relay", "advertise", "example.org:80", "IP literal"),
        ("directory", "aggregators", "http://127.0.0.1:8080", r"directory\.aggregators must be a list"),
        ("directory", "aggregators", ["http://127.0.0.1:8080"], r"directory\.aggregators\[0\] must be a table"),
        ("directory", "aggregators", [{"url": "http://127.0.0.1:8080"}], r"\[0\] must be a table with exactly url and identity"),
        ("directory", "aggregators", [{"url": "http://127.0.0.1:1", "identity": KEY_HEX, "x": 1}], r"exactly url and identity"),
        ("directory", "aggregators", [{"url": "ftp://x", "identity": KEY_HEX}], r"directory\.aggregators\[0\]\.url .*'ftp://x'"),
        ("directory", "aggregators", [{"url": 5, "identity": KEY_HEX}], r"directory\.aggregators\[0\]\.url"),
        ("directory", "aggregators", [{"url": "http://127.0.0.1:1", "identity": KEY_HEX},
                                      {"url": "http://127.0.0.1:2", "identity": "ab" * 31}],
         r"directory\.aggregators\[1\]\.identity .*64 hex digits"),
        ("directory", "aggregators", [{"url": "http://127.0.0.1:1", "identity": "zz" * 32}], r"\[0\]\.identity"),
        ("directory", "aggregators", [{"url": "http://127.0.0.1:1", "identity": 7}], r"\[0\]\.identity"),
        ("directory", "aggregators", [{"url": "http://127.0.0.1:1", "identity": KEY_HEX}] * 2, "URL twice"),
        ("directory", "aggregators", [{"url": "http://127.0.0.1:1", "identity": KEY_HEX}] * 65, "at most 64"),
    ],
)
def test_bad_config_values_raise_one_typed_error(section: str, key: str, value: object, message: str) -> None:
    data = {"relay": {"listen": "127.0.0.1:9000"}, section: {key: value}}
    with pytest.raises(RelayConfigError, match=message):
        config_from_mapping(data, Path("."))


@pytest.mark.parametrize("text", ["127.0.0.1", "127.0.0.1:70000", ":80", "localhost:80", "1.2.3.4:x", ""])
def test_bad_addresses_are_config_errors(text: str) -> None:
    with pytest.raises(RelayConfigError):
        parse_host_port(text)


def test_help_everywhere() -> None:
    for args in (["--help"], ["init", "--help"], ["info", "--help"], ["run", "--help"]):
        code, output = invoke(*args)
        assert code == 0 and "Usage" in output


def test_init_without_an_aggregator_warns_and_run_names_the_fix_in_one_line(tmp_path: Path) -> None:
    """Issue 15: `relay init` succeeded silently and `relay run` then printed a traceback."""
    data_dir = tmp_path / "relay"
    result = CliRunner().invoke(main, ["relay", "init", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"])
    assert result.exit_code == 0 and "--aggregator" in result.output
    code, output = invoke("run", "--data-dir", str(data_dir))
    assert code == 1 and "Traceback" not in output
    assert output.startswith("Error: no next-hop directory") and "--aggregator IDENTITY@URL" in output
    assert len(output.strip().splitlines()) == 1


def test_run_with_its_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data_dir = tmp_path / "relay"
        key = "ab" * 32
        assert invoke("init", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}",
                      "--aggregator", f"{key}@http://127.0.0.1:1")[0] == 0
        code, output = invoke("run", "--data-dir", str(data_dir))
    assert code == 1 and "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert f"cannot listen for links on 127.0.0.1:{port}" in output and "relay.toml" in output


@pytest.mark.parametrize("what", ["metrics", "mirror"])
def test_run_with_its_metrics_or_mirror_port_in_use_says_so_in_one_line(tmp_path: Path, what: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data_dir = tmp_path / "relay"
        assert invoke("init", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", f"--{what}", f"127.0.0.1:{port}",
                      "--aggregator", f"{'ab' * 32}@http://127.0.0.1:1")[0] == 0
        code, output = invoke("run", "--data-dir", str(data_dir))
    assert code == 1 and "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert f"cannot listen for {what} on 127.0.0.1:{port}" in output and "relay.toml" in output


def test_a_second_run_on_a_directory_in_use_says_so_and_sigterm_stops_the_first(tmp_path: Path) -> None:
    """Issue 14: a second `relay run` on a data directory in use started anyway."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    data_dir = tmp_path / "relay"
    assert invoke("init", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0",
                  "--aggregator", f"{'ab' * 32}@http://127.0.0.1:1")[0] == 0
    command = [sys.executable, "-m", "anonml.relay", "run", "--data-dir", str(data_dir)]
    with running_until(command, "event=listening", within=60) as first:
        second = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and "Traceback" not in second.stderr
        assert f"in use by pid {first.pid}" in second.stderr and "relay run" in second.stderr
        family = [first.pid, *(child.pid for child in psutil.Process(first.pid).children(recursive=True))]
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
        time.sleep(0.2)
        assert not [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_run_on_a_full_or_read_only_disk_says_so_in_one_line(tmpfs: Tmpfs) -> None:
    """Issue 13: `relay run` on a full or read-only disk printed a raw sqlite traceback. A small tmpfs
    stands in for the disk."""
    data_dir = tmpfs.path / "relay"
    assert invoke("init", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0",
                  "--aggregator", f"{'ab' * 32}@http://127.0.0.1:1")[0] == 0
    tmpfs.fill()
    code, output = invoke("run", "--data-dir", str(data_dir))
    assert code == 1 and "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert "relay store" in output and "full" in output
    tmpfs.free()
    tmpfs.remount_read_only()
    code, output = invoke("run", "--data-dir", str(data_dir))
    assert code == 1 and "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert str(data_dir) in output and "read-only" in output.lower()
