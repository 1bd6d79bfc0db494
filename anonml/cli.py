"""The ``anonml`` command.

Each role package owns its own click commands; this module only names them.
Subcommands are imported when they are invoked, not when the CLI starts, so
``anonml relay run`` does not pay for importing scikit-learn and a broken
optional role cannot break the others.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from anonml import __version__

# Subcommand name -> "module:attribute" of a click command or group.
ROLE_COMMANDS: dict[str, str] = {
    "experiment": "aggregator._experiment:experiment",
    "aggregator": "aggregator._cli:aggregator",
    "peer": "peer._cli:peer",
    "demo": "anonml._demo:demo",
    "relay": "relay._cli:relay",
}

# ``anonml bench NAME``: one benchmark per component, each printing ratios
# against a baseline measured in the same run.
BENCH_COMMANDS: dict[str, str] = {
    "aggregator": "aggregator._bench:bench_aggregator",
    "mechanisms": "mechanisms._bench:bench_mechanisms",
    "crypto": "crypto._bench:bench_crypto",
    "relay": "relay._bench:bench_relay",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            module_name, attribute = self._lazy[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{self._lazy[cmd_name]!r} is not a click command")
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, lazy=ROLE_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="anonml")
def main() -> None:
    """AnonML: train a classifier on data that peers will not hand over.

    Relay operators use `anonml relay`, peers `anonml peer`, aggregator
    operators `anonml aggregator`; `anonml demo` runs the whole system on
    loopback and `anonml experiment` the thesis's experiments in process.
    """


@main.group(cls=LazyGroup, lazy=BENCH_COMMANDS)
def bench() -> None:
    """Benchmarks; each prints its figures beside a same-run baseline."""
