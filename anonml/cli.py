"""The ``anonml`` command.

Each role package owns its own click commands; this module only names them.
Subcommands are imported when they are invoked, not when the CLI starts, so
``anonml relay run`` does not pay for importing scikit-learn and a broken
optional role cannot break the others.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from anonml import __version__

# Subcommand name -> "module:attribute" of a click command or group.
ROLE_COMMANDS: dict[str, str] = {
    "experiment": "anonml.learning._experiment:experiment",
    "aggregator": "anonml.aggregator._cli:aggregator",
    "peer": "anonml.peer._cli:peer",
    "demo": "anonml._demo:demo",
    "relay": "anonml.relay._cli:relay",
}

# ``anonml bench NAME``: one benchmark per component, each printing ratios
# against a baseline measured in the same run.
BENCH_COMMANDS: dict[str, str] = {
    "aggregator": "anonml.bench.aggregator:bench_aggregator",
    "mechanisms": "anonml.bench.mechanisms:bench_mechanisms",
    "crypto": "anonml.bench.crypto:bench_crypto",
    "relay": "anonml.bench.relay:bench_relay",
}


def anonml_command(*args: str) -> list[str]:
    """The argv that runs this same ``anonml`` (this interpreter, this install) as a child process."""
    return [sys.executable, "-c", "import sys; from anonml.cli import main; sys.exit(main())", *args]


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
