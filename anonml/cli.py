"""The ``anonml`` command.

Each role package owns its own click commands; this module only names them.
Subcommands are imported when they are invoked, not when the CLI starts or
lists its commands (each entry carries its one-line help), so ``anonml
--help`` imports click alone and ``anonml relay run`` does not pay for
scikit-learn.

It is also the one place that turns a refusal into a message: every
:class:`anonml.errors.AnonMLError` a command lets through (and an ``OSError``
such as a file that cannot be read) ends the command with one line naming
what to do, exit status 1, and no traceback. ``--debug`` (or
``ANONML_DEBUG=1``, which child processes inherit) shows the traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, NoReturn

import click

from anonml import __version__
from anonml.errors import explain

DEBUG_ENV = "ANONML_DEBUG"

# Subcommand name -> ("module:attribute" of a click command or group, its one-line help).
ROLE_COMMANDS: dict[str, tuple[str, str]] = {
    "aggregator": ("anonml.aggregator._cli:aggregator", "Run rounds: announce, register peers, issue credentials, collect, learn."),
    "demo": ("anonml.demo:demo", "Run one complete round on loopback: 3 relays, the aggregator, N peers."),
    "fuzz": ("anonml.fuzz:fuzz", "Coverage-guided fuzzing of every parser: each input parses or is refused with a typed error."),
    "experiment": ("anonml.learning:experiment", "The thesis's chapter-8 experiments, in process (no network)."),
    "peer": ("anonml.peer._cli:peer", "Take part in a round from your own data."),
    "relay": ("anonml.relay._cli:relay", "Run a mix relay: hold Sphinx packets and release them inside their windows."),
}

# ``anonml bench NAME``: one benchmark per component, each printing ratios
# against a baseline measured in the same run.
BENCH_COMMANDS: dict[str, tuple[str, str]] = {
    "abuse": ("anonml.bench.abuse:bench_abuse", "Honest delivery and latency under each abuse of issue 13."),
    "aggregator": ("anonml.bench.aggregator:bench_aggregator", "Token verification and packet processing at the aggregator."),
    "crypto": ("anonml.bench.crypto:bench_crypto", "Sphinx packets and tokens beside one X25519 / P-256 multiplication."),
    "mechanisms": ("anonml.bench.mechanisms:bench_mechanisms", "Oracle error against its formula, and throughput."),
    "relay": ("anonml.bench.relay:bench_relay", "Relay forwarding throughput."),
    "anonymity": ("anonml.bench.anonymity:bench_anonymity", "Send-vs-arrival correlation and timing-linking accuracy through real relays, vs chance."),
    "startup": ("anonml.bench.startup:bench_startup", "`anonml --help` start-up time beside `python -c pass`."),
    "faults": ("anonml.bench.faults:bench_faults", "A demo round under killed relays and aggregator and lossy links; audits every message."),
    "demo": ("anonml.bench.demo:bench_demo", "The demo run N times beside CPU-bound processes: exit codes, accepted fractions."),
}


def anonml_command(*args: str) -> list[str]:
    """The argv that runs this same ``anonml`` (this interpreter, this install) as a child process."""
    return [sys.executable, "-c", "import sys; from anonml.cli import main; sys.exit(main())", *args]


def debugging() -> bool:
    """Whether tracebacks are wanted (``anonml --debug`` sets the variable for child processes too)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use; listing them imports nothing."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            module_name, attribute = self._lazy[cmd_name][0].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{self._lazy[cmd_name][0]!r} is not a click command")
            return command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in self._lazy:
                rows.append((name, self._lazy[name][1]))
            elif (command := super().get_command(ctx, name)) is not None:
                rows.append((name, command.get_short_help_str()))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _fail(message: str) -> NoReturn:
    raise click.ClickException(message + "  (run with --debug for the traceback)")


class RootGroup(LazyGroup):
    """The top-level group: one message per refusal instead of a traceback (``--debug`` keeps it)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - only explained failures become messages; the rest re-raise
            message = None if debugging() else explain(exc)
            if message is None:
                raise
            _fail(message)


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        os.environ[DEBUG_ENV] = "1"
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return value


@click.group(cls=RootGroup, lazy=ROLE_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="anonml")
@click.option("--debug", is_flag=True, is_eager=True, expose_value=False, callback=_set_debug,
              help="Show tracebacks and debug logs (also ANONML_DEBUG=1; child processes inherit it).")
def main() -> None:
    """AnonML: train a classifier on data that peers will not hand over.

    Relay operators use `anonml relay`, peers `anonml peer`, aggregator
    operators `anonml aggregator`; `anonml demo` runs the whole system on
    loopback and `anonml experiment` the thesis's experiments in process.
    """


@main.group(cls=LazyGroup, lazy=BENCH_COMMANDS)
def bench() -> None:
    """Benchmarks; each prints its figures beside a same-run baseline."""
