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
