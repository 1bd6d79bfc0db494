from __future__ import annotations

from click.testing import CliRunner

from anonml.cli import BENCH_COMMANDS, ROLE_COMMANDS, main


def test_every_registered_command_loads_and_has_help() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    for name in ROLE_COMMANDS:
        assert name in result.output
        sub = runner.invoke(main, [name, "--help"])
        assert sub.exit_code == 0, sub.output
    for name in BENCH_COMMANDS:
        sub = runner.invoke(main, ["bench", name, "--help"])
        assert sub.exit_code == 0, sub.output


def test_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["no-such-role"])
    assert result.exit_code == 2
    assert "No such command" in result.output


# What no `--help` may load: each takes longer to import than 5 x `python -c pass` allows (issue 29);
# libsodium and OpenSSL (nacl, cryptography) took `relay init --help` to 4.9 x under load.
HEAVY_MODULES = ("trio", "numpy", "scipy", "sklearn", "petlib", "httpx", "starlette", "hypercorn", "matplotlib", "nacl", "cryptography")

_PRINT_EVERY_HELP = """
import contextlib, io, sys
import click
from anonml.bench.startup import command_paths
from anonml.cli import main
for path in command_paths(main):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main.main([*path, "--help"], prog_name="anonml", standalone_mode=False)
        except SystemExit:
            pass
print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_no_help_imports_a_heavy_module() -> None:
    """Every command's `--help`, in one fresh interpreter: none of them loads trio, numpy, scikit-learn or petlib."""
    import subprocess
    import sys

    loaded = subprocess.run([sys.executable, "-c", _PRINT_EVERY_HELP], capture_output=True, text=True, check=True).stdout.split()
    assert "anonml" in loaded
    assert sorted(set(HEAVY_MODULES) & set(loaded)) == []


def test_bench_startup_lists_every_command() -> None:
    from anonml.bench.startup import command_paths

    paths = list(command_paths(main))
    assert () in paths and ("relay", "run") in paths and ("aggregator", "round", "new") in paths and ("bench", "startup") in paths
    assert ("relay",) in paths and ("experiment",) in paths


def test_bench_startup_names_a_command_it_does_not_know_instead_of_a_traceback() -> None:
    result = CliRunner().invoke(main, ["bench", "startup", "--command", "anonml", "--repetitions", "1"])
    assert result.exit_code == 2 and "no such command: anonml" in result.output, result.output
