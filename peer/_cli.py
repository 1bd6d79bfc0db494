"""``anonml peer init`` and ``anonml peer join``."""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click

from anonml.base.display import local_time
from anonml.base.errors import ConfigError

if TYPE_CHECKING:
    from anonml.peer._identity import PeerIdentity
    from anonml.protocol import RoundSchedule

# trio and the peer's own modules are imported by the commands that use them,
# so `anonml peer join --help` loads click alone (issue 29).

STORE_FILE = "peer.sqlite"


@click.group()
def peer() -> None:
    """Take part in a round from your own data."""


@peer.command("init")
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="Where the identity and ledger live.")
def init(data_dir: Path) -> None:
    """Create this peer's Ed25519 identity (owner-only files; never overwrites)."""
    from anonml.peer._identity import init_identity

    try:
        identity = init_identity(data_dir)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"identity {identity.public_key.hex()} created in {data_dir}")
    click.echo(f"next: `anonml peer join --data-dir {data_dir} --aggregator URL --data YOUR.csv --dry-run` shows what would leave this machine", err=True)


@peer.command("budget")
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="The directory `peer init` made.")
@click.option("--lifetime", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Set the lifetime budget: the most record-level epsilon this peer spends over all rounds.")
def budget(data_dir: Path, lifetime: float | None) -> None:
    """Show what this peer's ledger holds per round against its lifetime budget (and set that budget)."""
    from anonml.mechanisms import record_level_epsilon
    from anonml.peer._identity import load_identity
    from anonml.peer._ledger import releases_by_round
    from anonml.peer._store import PeerStore

    identity = load_identity(data_dir)
    store = PeerStore(data_dir / STORE_FILE)
    try:
        if lifetime is not None:
            try:
                store.set_lifetime_epsilon(lifetime)
            except ValueError as exc:  # inf or nan pass click's range check
                raise click.BadParameter(str(exc), param_hint="--lifetime") from None
        per_round = {round_id: record_level_epsilon(releases)
                     for round_id, releases in releases_by_round(store.spends(identity.public_key)).items()}
        cap = store.lifetime_epsilon()
    finally:
        store.close()
    for round_id, epsilon in per_round.items():
        click.echo(f"round {round_id.hex()[:16]}…  epsilon {epsilon:.4g}")
    spent = math.fsum(per_round.values())
    click.echo(f"spent {spent:.4g} of the lifetime budget {cap:g} over {len(per_round)} round(s); "
               f"{max(cap - spent, 0.0):.4g} left (epsilons add up across rounds)")


@peer.command("join")
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="The directory `peer init` made.")
@click.option("--aggregator", "url", required=True, help="The aggregator's URL, e.g. http://127.0.0.1:8080")
@click.option("--data", "data_file", type=click.Path(path_type=Path), required=True, help="Your data: a CSV file with a header row.")
@click.option("--invitation", default=None, help="The invitation code, if the round requires one.")
@click.option("--dry-run", is_flag=True, help="Show what would leave this machine and stop.")
@click.option("--yes", is_flag=True, help="Do not ask before spending privacy budget.")
def join(data_dir: Path, url: str, data_file: Path, invitation: str | None, dry_run: bool, yes: bool) -> None:
    """Join the round the aggregator is running, from the data in FILE.csv."""
    import trio

    from anonml.peer._client import check_aggregator_url
    from anonml.peer._identity import load_identity

    check_aggregator_url(url)
    if not data_file.is_file():
        raise click.ClickException(f"no data file {str(data_file)!r}: pass --data a CSV file with a header row naming the round's features")
    identity = load_identity(data_dir)
    code = trio.run(_join, identity, data_dir, url, data_file, invitation, dry_run, yes)
    sys.exit(code)


def _windows(manifest: object) -> list[str]:
    """When this peer's packets leave and arrive, in local time (told before anything is sent)."""
    from anonml.protocol import RoundManifest

    assert isinstance(manifest, RoundManifest)
    schedule = manifest.schedule
    lines = [f"  registration closes {local_time(schedule.t_register_end)}; credentials until {local_time(schedule.t_issue_end)}"]
    either = manifest.comparison_pool and schedule.median
    if schedule.median:
        first, last = schedule.median[0], schedule.median[-1]
        answer = "if in the comparison pool, your one comparison answer" if either else "your one median answer"
        lines.append(f"  {answer} (in your partition's sub-round) leaves between {local_time(first.t_s)} and {local_time(last.send_end)}")
    data = schedule.data
    lines.append(f"  {'otherwise, ' if either else ''}your data packet(s) leave at random times between {local_time(data.t_s)} and "
                 f"{local_time(data.send_end)}; relays deliver them by {local_time(data.t_r)}, then receipts are checked")
    return lines


def peer_heartbeat(schedule: RoundSchedule, events: Mapping[str, int], now: float | None = None) -> str:
    """What a quiet ``peer join`` says each minute: the round's phase and this peer's packets so far."""
    from anonml.protocol import phase_at

    phase, _ = phase_at(schedule, int(time.time() if now is None else now))
    return (f"still in the round ({phase} phase, ends {local_time(schedule.end)}): "
            f"{events.get('sent', 0) + events.get('resent', 0)} packet(s) sent, {events.get('acknowledged', 0)} receipt(s) found")


def _refuse_ended_round(name: str, ends: int, now: float) -> None:
    """A round that has ended takes nothing more: say so instead of going through its steps and exiting 0."""
    if now >= ends:
        raise click.ClickException(f"round {name!r} ended at {local_time(ends)}: nothing can be sent to it any more; "
                                   "ask the aggregator operator for the next round")


def _reasons(reasons: Mapping[str, int]) -> str:
    """`` (1 never-sent, 2 no-receipt-after-second-chance)``, or nothing when there are none."""
    return f" ({', '.join(f'{count} {reason}' for reason, count in sorted(reasons.items()))})" if reasons else ""


async def _join(identity: PeerIdentity, data_dir: Path, url: str, data_file: Path, invitation: str | None, dry_run: bool, yes: bool) -> int:
    import trio

    from anonml.base.display import StatusBoard
    from anonml.base.heartbeat import heartbeat
    from anonml.mechanisms import over_budget
    from anonml.peer._client import AggregatorClient
    from anonml.peer._events import EVENT_WORDS, PeerEvent
    from anonml.peer._disclosure import describe_release
    from anonml.peer._features import RoundPipeline
    from anonml.peer._framework import FeatureError, MalformedData
    from anonml.peer._join import Peer, join_round, peer_generator
    from anonml.peer._session import RoundSession
    from anonml.peer._store import PeerStore
    from anonml.peer._transport import open_transport
    from anonml.protocol import FeatureSpec, FeatureSpecError

    client = AggregatorClient(url, max_connections=4, on_retry=lambda message: click.echo(f"  {message}", err=True))
    store = PeerStore(data_dir / STORE_FILE)
    try:
        signed = await client.manifest()
        manifest = signed.manifest
        spec = FeatureSpec.from_dict(dict(manifest.features))
        pipeline = RoundPipeline.for_manifest(manifest)
        _refuse_ended_round(manifest.name, manifest.schedule.end, time.time())
        try:
            dataset = pipeline.importer.import_file(data_file)
            vector = pipeline.vector_of(dataset)
            label_value = dataset.latest(spec.label.name).fields[spec.label.name] if vector.label is not None else None
        except (MalformedData, FeatureError, FeatureSpecError) as exc:
            raise click.ClickException(f"{data_file}: {exc}") from None
        disclosure = describe_release(signed, spec, vector, store, identity.public_key, label_value=label_value)
        click.echo(disclosure.text)
        click.echo("\nWhen:")
        for line in _windows(manifest):
            click.echo(line)
        if over_budget(disclosure.cost, manifest.eps_total):
            raise click.ClickException(f"this round would cost epsilon {disclosure.cost:.4g}, more than the {manifest.eps_total:g} it promises; refusing")
        if over_budget(disclosure.lifetime_total, disclosure.lifetime_epsilon):
            raise click.ClickException(
                f"this round would bring your epsilon over all rounds to {disclosure.lifetime_total:.4g}, over your lifetime "
                f"budget of {disclosure.lifetime_epsilon:g}; refusing (`anonml peer budget --data-dir {data_dir}` shows it)")
        if dry_run:
            click.echo("\n--dry-run: nothing was sent.")
            return 0
        if not yes and not click.confirm("\nSpend this budget and join the round?", default=False):
            click.echo("Nothing was sent.")
            return 1
        geometry = manifest.sphinx_geometry()
        events: Counter[str] = Counter()
        with StatusBoard(f"round {manifest.name}") as board:
            client.on_retry = board.note

            def heard(event: PeerEvent) -> None:
                events[event] += 1
                board.note(EVENT_WORDS[event])
                # A resumed join was registered and given its credential by the run before it.
                board.update([
                    ("registered", "yes" if events["registered"] or events["resumed"] else "not yet"),
                    ("credential", "yes" if events["credential"] or events["resumed"] else "not yet"),
                    ("packets sent", str(events["sent"] + events["resent"])),
                    ("receipts", f"{events['acknowledged']} found, {events['missing']} missing"),
                ], key=event)

            async with open_transport(packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash()) as transport:
                session = RoundSession(client, transport)
                peer = Peer(identity, store, vector, peer_generator(), invitation)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(heartbeat, partial(peer_heartbeat, manifest.schedule, events), board.note)
                    result = await join_round(peer, session, signed, pipeline, listener=heard)
                    nursery.cancel_scope.cancel()
        click.echo(
            f"done: partition {result.partition}, {result.packets} packet(s): {result.acknowledged} acknowledged, "
            f"{result.missing} missing{_reasons(result.missing_reasons)}, {result.unconfirmed} unconfirmed "
            f"(receipt log unreadable); {result.resends} resent; epsilon spent {result.epsilon_spent:.4g}"
        )
        return 0 if result.missing == 0 else 3
    finally:
        store.close()
        await client.aclose()
