"""The ``anonml`` command.

Each role package owns its own click commands; this module only names them.
Subcommands are imported when they are invoked, not when the CLI starts or
lists its commands (each entry carries its one-line help), so ``anonml
--help`` imports click alone and ``anonml relay run`` does not pay for
scikit-learn.

It is also the one place that turns a refusal into a message: every
:class:`anonml.base.errors.AnonMLError` a command lets through (and an ``OSError``
such as a file that cannot be read) ends the command with one line naming
what to do, exit status 1, and no traceback. ``--debug`` (or
``ANONML_DEBUG=1``, which child processes inherit) shows the traceback.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NoReturn

import click

from anonml import __version__
from anonml.base.errors import explain

DEBUG_ENV = "ANONML_DEBUG"

# Each subcommand is loaded by a function that imports its module when the
# subcommand runs (a plain import, so the layer contract sees it), beside its
# one-line help for the listing.
CommandLoader = Callable[[], click.Command]


def _aggregator() -> click.Command:
    from anonml.aggregator import command

    return command


def _demo() -> click.Command:
    from anonml.demo import demo

    return demo


def _fuzz() -> click.Command:
    from anonml.fuzz import fuzz

    return fuzz


def _simulate() -> click.Command:
    from anonml.simulate import simulate

    return simulate


def _experiment() -> click.Command:
    from anonml.learning import experiment

    return experiment


def _peer() -> click.Command:
    from anonml.peer import command

    return command


def _relay() -> click.Command:
    from anonml.relay import command

    return command


ROLE_COMMANDS: dict[str, tuple[CommandLoader, str]] = {
    "aggregator": (_aggregator, "Run rounds: announce, register peers, issue credentials, collect, learn."),
    "demo": (_demo, "Run one complete round on loopback: 5 relays (paths of 3), the aggregator, N peers."),
    "fuzz": (_fuzz, "Coverage-guided fuzzing of every parser: each input parses or is refused with a typed error."),
    "experiment": (_experiment, "The thesis's chapter-8 experiments, in process (no network)."),
    "simulate": (_simulate, "Whole rounds in process on a virtual clock, each against an adversary; checks anonymity."),
    "peer": (_peer, "Take part in a round from your own data."),
    "relay": (_relay, "Run a mix relay: hold Sphinx packets and release them inside their windows."),
}


def _bench_abuse() -> click.Command:
    from anonml.bench.commands import bench_abuse

    return bench_abuse


def _bench_aggregator() -> click.Command:
    from anonml.bench.commands import bench_aggregator

    return bench_aggregator


def _bench_ingest() -> click.Command:
    from anonml.bench.commands import bench_ingest

    return bench_ingest


def _bench_crypto() -> click.Command:
    from anonml.bench.commands import bench_crypto

    return bench_crypto


def _bench_mechanisms() -> click.Command:
    from anonml.bench.commands import bench_mechanisms

    return bench_mechanisms


def _bench_relay() -> click.Command:
    from anonml.bench.commands import bench_relay

    return bench_relay


def _bench_anonymity() -> click.Command:
    from anonml.bench.commands import bench_anonymity

    return bench_anonymity


def _bench_startup() -> click.Command:
    from anonml.bench.startup import bench_startup

    return bench_startup


def _bench_faults() -> click.Command:
    from anonml.bench.commands import bench_faults

    return bench_faults


def _bench_round() -> click.Command:
    from anonml.bench.commands import bench_round

    return bench_round


def _bench_netns() -> click.Command:
    from anonml.bench.commands import bench_netns

    return bench_netns


def _bench_demo() -> click.Command:
    from anonml.bench.commands import bench_demo

    return bench_demo


# ``anonml bench NAME``: one benchmark per component, each printing ratios
# against a baseline measured in the same run.
BENCH_COMMANDS: dict[str, tuple[CommandLoader, str]] = {
    "abuse": (_bench_abuse, "Honest delivery and latency under each abuse scenario, beside an unloaded baseline."),
    "aggregator": (_bench_aggregator, "Token verification and packet processing at the aggregator."),
    "ingest": (_bench_ingest, "Accepted reports/s through ingest workers: SQLite, PostgreSQL with 1 and 2; SIGKILL audits."),
    "crypto": (_bench_crypto, "Sphinx packets and tokens beside one X25519 / P-256 multiplication."),
    "mechanisms": (_bench_mechanisms, "Oracle error against its formula, and throughput."),
    "relay": (_bench_relay, "Relay forwarding throughput."),
    "anonymity": (_bench_anonymity, "Send-vs-arrival correlation and timing-linking accuracy through real relays, vs chance."),
    "startup": (_bench_startup, "`anonml --help` start-up time beside `python -c pass`."),
    "faults": (_bench_faults, "A demo round under killed relays and aggregator and lossy links; audits every message."),
    "round": (_bench_round, "One real round of N synthetic peers: wall time per phase, CPU and memory per role beside the crypto floor."),
    "netns": (_bench_netns, "A demo round across network namespaces with netem delay and loss on every link (root)."),
    "demo": (_bench_demo, "The demo run N times beside CPU-bound processes: exit codes, accepted fractions."),
}


def debugging() -> bool:
    """Whether tracebacks are wanted (``anonml --debug`` sets the variable for child processes too)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use; listing them imports nothing."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[CommandLoader, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            return self._lazy[cmd_name][0]()
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
