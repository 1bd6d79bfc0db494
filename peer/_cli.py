"""``anonml peer init`` and ``anonml peer join``."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import numpy as np
import trio

from anonml.errors import ConfigError
from anonml.peer._identity import PeerIdentity, init_identity, load_identity

STORE_FILE = "peer.sqlite"


@click.group()
def peer() -> None:
    """Take part in a round from your own data."""


@peer.command("init")
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="Where the identity and ledger live.")
def init(data_dir: Path) -> None:
    """Create this peer's Ed25519 identity (owner-only files; never overwrites)."""
    try:
        identity = init_identity(data_dir)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"identity {identity.public_key.hex()} created in {data_dir}")


@peer.command("join")
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="The directory `peer init` made.")
@click.option("--aggregator", "url", required=True, help="The aggregator's URL, e.g. http://127.0.0.1:8080")
@click.option("--data", "data_file", type=click.Path(path_type=Path), required=True, help="Your data: a CSV file with a header row.")
@click.option("--invitation", default=None, help="The invitation code, if the round requires one.")
@click.option("--dry-run", is_flag=True, help="Show what would leave this machine and stop.")
@click.option("--yes", is_flag=True, help="Do not ask before spending privacy budget.")
def join(data_dir: Path, url: str, data_file: Path, invitation: str | None, dry_run: bool, yes: bool) -> None:
    """Join the round the aggregator is running, from the data in FILE.csv."""
    try:
        identity = load_identity(data_dir)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    code = trio.run(_join, identity, data_dir, url, data_file, invitation, dry_run, yes)
    sys.exit(code)


async def _join(identity: PeerIdentity, data_dir: Path, url: str, data_file: Path, invitation: str | None, dry_run: bool, yes: bool) -> int:
    from anonml.mechanisms import BudgetExceeded
    from anonml.peer._client import AggregatorClient, AggregatorError
    from anonml.peer._disclosure import describe_release
    from anonml.peer._features import RoundPipeline
    from anonml.peer._framework import FeatureError, MalformedData
    from anonml.peer._join import JoinRefused, Peer, RoundSession, join_round
    from anonml.peer._store import PeerStore, StoreError
    from anonml.peer._transport import open_transport
    from anonml.protocol._features import FeatureSpec, FeatureSpecError

    client = AggregatorClient(url, max_connections=4)
    store = PeerStore(data_dir / STORE_FILE)
    try:
        signed = await client.manifest()
        manifest = signed.manifest
        spec = FeatureSpec.from_dict(dict(manifest.features))
        pipeline = RoundPipeline.for_spec(spec)
        vector = pipeline.vector_from_file(data_file)
        text, cost = describe_release(signed, spec, vector, store, identity.public_key)
        click.echo(text)
        if cost > manifest.eps_total * (1 + 1e-9):
            raise click.ClickException(f"this round would cost epsilon {cost:.4g}, more than the {manifest.eps_total:g} it promises; refusing")
        if dry_run:
            click.echo("\n--dry-run: nothing was sent.")
            return 0
        if not yes and not click.confirm("\nSpend this budget and join the round?", default=False):
            click.echo("Nothing was sent.")
            return 1
        geometry = manifest.sphinx_geometry()
        async with open_transport(packet_size=geometry.packet_size, geometry_hash=geometry.canonical_hash()) as transport:
            session = RoundSession(client, transport)
            peer = Peer(identity, store, vector, np.random.default_rng(), invitation)
            result = await join_round(peer, session, signed, pipeline, listener=lambda event: click.echo(f"  {event}"))
        click.echo(
            f"done: partition {result.partition}, {result.packets} packet(s), {result.acknowledged} acknowledged, "
            f"{result.resends} resent, {result.missing} missing; epsilon spent {result.epsilon_spent:.4g}"
        )
        return 0 if result.missing == 0 else 3
    except MalformedData as exc:
        raise click.ClickException(f"{data_file}: {exc}") from None
    except (FeatureError, FeatureSpecError) as exc:
        raise click.ClickException(f"{data_file}: {exc}") from None
    except (AggregatorError, JoinRefused, BudgetExceeded, StoreError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        store.close()
        await client.aclose()
