"""The relay's configuration: a commented TOML file in its data directory.

``anonml relay init`` writes it (:func:`render_config`); ``anonml relay run``
reads it (:func:`load_config`, with ``tomllib``). Every key is optional except
``relay.listen``; unknown keys are errors, so a typo cannot silently fall back
to a default.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from anonml.crypto import DEFAULT_MAX_HOPS, DEFAULT_PACKET_SIZE
from anonml.protocol import LinkLimits
from anonml.relay._errors import RelayConfigError

CONFIG_FILE = "relay.toml"
_SYNCHRONOUS = ("FULL", "NORMAL")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_URL_PATTERN = re.compile(r"https?://[A-Za-z0-9.:\-\[\]]+(/[A-Za-z0-9._\-/]*)?")
_IDENTITY_HEX_DIGITS = 64  # an Ed25519 verify key is 32 bytes
_MAX_DIRECTORY_AGGREGATORS = 64

# A relay forwards only to next hops its directory lists: the sender chooses
# the next address inside the packet, so without a directory any client could
# make the relay an open forwarder. With no directory source configured
# ([directory] aggregators / file), `run` therefore refuses to start; an
# operator who really wants the open behaviour sets `require = false`.
REQUIRE_DIRECTORY_DEFAULT = True


def parse_host_port(text: str, *, what: str = "address") -> tuple[str, int]:
    """``"HOST:PORT"`` (IPv6 as ``"[::1]:PORT"``) to ``(host, port)``; port 0 allowed."""
    if not isinstance(text, str):
        raise RelayConfigError(f"{what} must be a 'HOST:PORT' string, got {text!r}")
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
        ipaddress.ip_address(host)
    except ValueError:
        raise RelayConfigError(f"{what} must be 'IP:PORT' with an IP literal, got {text!r}") from None
    if not sep or not 0 <= port < 2**16:
        raise RelayConfigError(f"{what} must be 'IP:PORT' with a port in [0, 65535], got {text!r}")
    return host, port


def format_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class PinnedAggregator:
    """An aggregator this relay serves: its base URL and the Ed25519 identity
    key its round manifests must be signed with.

    The key is pinned here, not taken from the manifest, because whoever
    answers the URL (plain http is allowed) could otherwise sign a manifest
    of their own listing any next hops (DESIGN.md §4, §7).
    """

    url: str
    identity: bytes

    def __post_init__(self) -> None:
        if not (isinstance(self.url, str) and _URL_PATTERN.fullmatch(self.url)):
            raise RelayConfigError(f"url must be an http(s)://HOST[:PORT][/PATH] URL, got {self.url!r}")
        if type(self.identity) is not bytes or len(self.identity) * 2 != _IDENTITY_HEX_DIGITS:
            raise RelayConfigError(f"identity must be a 32-byte Ed25519 key, got {self.identity!r}")

    @classmethod
    def from_text(cls, url: object, identity: object) -> PinnedAggregator:
        """From a URL and the key as 64 hex digits; RelayConfigError names the bad field."""
        if not (isinstance(identity, str) and len(identity) == _IDENTITY_HEX_DIGITS
                and all(c in "0123456789abcdefABCDEF" for c in identity)):
            raise RelayConfigError(
                f"identity must be the aggregator's Ed25519 key as {_IDENTITY_HEX_DIGITS} hex digits, got {identity!r}"
            )
        if not isinstance(url, str):
            raise RelayConfigError(f"url must be an http(s)://HOST[:PORT][/PATH] URL, got {url!r}")
        return cls(url, bytes.fromhex(identity))

    @classmethod
    def parse(cls, text: str) -> PinnedAggregator:
        """``IDENTITY@URL`` (the command-line form): 64 hex digits, ``@``, the base URL."""
        identity, sep, url = text.partition("@")
        if not sep:
            raise RelayConfigError(f"an aggregator must be given as IDENTITY@URL (hex key, '@', base URL), got {text!r}")
        return cls.from_text(url, identity)

    def __str__(self) -> str:
        return f"{self.identity.hex()}@{self.url}"


@dataclass(frozen=True)
class RelayConfig:
    """Everything ``serve_relay`` needs; see :func:`render_config` for each meaning."""

    data_dir: Path
    listen: tuple[str, int]
    advertise: tuple[str, int] | None = None
    max_hops: int = DEFAULT_MAX_HOPS
    packet_size: int = DEFAULT_PACKET_SIZE
    max_connections: int = 256
    max_held_packets: int = 100_000
    max_replay_tags_per_epoch: int = 5_000_000
    max_neighbours: int = 64
    link: LinkLimits = field(default_factory=LinkLimits)
    connect_timeout: float = 5.0
    ack_timeout: float = 30.0
    forward_batch: int = 128
    # A week: a round names one epoch key per relay in its manifest (DESIGN.md
    # §4) and must finish before that key is erased, so epochs are longer
    # than rounds; erasing keys weekly still bounds what a seized relay exposes.
    key_epoch_seconds: int = 604_800
    key_grace_seconds: int = 3_600
    synchronous: str = "FULL"
    metrics: tuple[str, int] | None = None
    # Where the read-only mirror of each pinned aggregator's signed documents
    # listens (relay._mirror); its port goes into the relay's descriptor.
    mirror: tuple[str, int] | None = None
    log_level: str = "INFO"
    # Next-hop directory sources (relay._directory): aggregators (URL and
    # pinned identity key) whose signed manifests list the allowed next hops,
    # and/or a static JSON file (relative to data_dir unless absolute).
    directory_aggregators: tuple[PinnedAggregator, ...] = ()
    directory_file: str | None = None
    require_directory: bool = REQUIRE_DIRECTORY_DEFAULT
    directory_min_refresh_seconds: float = 2.0
    directory_fetch_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_hops", "packet_size", "max_connections", "max_held_packets",
                     "max_replay_tags_per_epoch", "max_neighbours", "forward_batch", "key_epoch_seconds"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise RelayConfigError(f"{name} must be a positive integer, got {value!r}")
        if type(self.key_grace_seconds) is not int or not 0 <= self.key_grace_seconds < self.key_epoch_seconds:
            raise RelayConfigError(
                f"key_grace_seconds must be an integer in [0, key_epoch_seconds), got {self.key_grace_seconds!r}"
            )
        for name in ("connect_timeout", "ack_timeout", "directory_min_refresh_seconds", "directory_fetch_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise RelayConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.synchronous not in _SYNCHRONOUS:
            raise RelayConfigError(f"storage.synchronous must be one of {_SYNCHRONOUS}, got {self.synchronous!r}")
        if self.log_level not in _LOG_LEVELS:
            raise RelayConfigError(f"log.level must be one of {_LOG_LEVELS}, got {self.log_level!r}")
        if type(self.directory_aggregators) is not tuple or not all(
            isinstance(aggregator, PinnedAggregator) for aggregator in self.directory_aggregators
        ):
            raise RelayConfigError(
                f"directory.aggregators must be a tuple of PinnedAggregator, got {self.directory_aggregators!r}"
            )
        urls = [aggregator.url for aggregator in self.directory_aggregators]
        if len(set(urls)) != len(urls):
            # One URL is one directory source; two keys for it would be ambiguous.
            raise RelayConfigError(f"directory.aggregators lists a URL twice: {urls!r}")
        if self.directory_file is not None and not (isinstance(self.directory_file, str) and self.directory_file):
            raise RelayConfigError(f"directory.file must be a non-empty path, got {self.directory_file!r}")
        if type(self.require_directory) is not bool:
            raise RelayConfigError(f"directory.require must be true or false, got {self.require_directory!r}")

    @property
    def directory_path(self) -> Path | None:
        """The static directory file, resolved against the data directory."""
        return None if self.directory_file is None else self.data_dir / self.directory_file

    @property
    def has_directory(self) -> bool:
        """Whether any next-hop directory source is configured."""
        return bool(self.directory_aggregators) or self.directory_file is not None

    @property
    def advertised(self) -> tuple[str, int]:
        """The address other nodes use (``advertise``, else ``listen``)."""
        return self.advertise if self.advertise is not None else self.listen

    def with_listen(self, host: str, port: int) -> RelayConfig:
        return replace(self, listen=(host, port))


# (section, key) -> RelayConfig field (or "link.<LinkLimits field>").
_KEYS: dict[tuple[str, str], str] = {
    ("relay", "listen"): "listen",
    ("relay", "advertise"): "advertise",
    ("geometry", "max_hops"): "max_hops",
    ("geometry", "packet_size"): "packet_size",
    ("limits", "max_connections"): "max_connections",
    ("limits", "max_held_packets"): "max_held_packets",
    ("limits", "max_replay_tags_per_epoch"): "max_replay_tags_per_epoch",
    ("limits", "max_neighbours"): "max_neighbours",
    ("link", "hello_timeout"): "link.hello_timeout",
    ("link", "idle_timeout"): "link.idle_timeout",
    ("link", "frame_timeout"): "link.frame_timeout",
    ("link", "send_timeout"): "link.send_timeout",
    ("link", "max_pending_frames"): "link.max_pending_frames",
    ("link", "max_batch"): "link.max_batch",
    ("forward", "connect_timeout"): "connect_timeout",
    ("forward", "ack_timeout"): "ack_timeout",
    ("forward", "max_batch"): "forward_batch",
    ("keys", "epoch_seconds"): "key_epoch_seconds",
    ("keys", "grace_seconds"): "key_grace_seconds",
    ("storage", "synchronous"): "synchronous",
    ("metrics", "listen"): "metrics",
    ("mirror", "listen"): "mirror",
    ("log", "level"): "log_level",
    ("directory", "aggregators"): "directory_aggregators",
    ("directory", "file"): "directory_file",
    ("directory", "require"): "require_directory",
    ("directory", "min_refresh_seconds"): "directory_min_refresh_seconds",
    ("directory", "fetch_timeout"): "directory_fetch_timeout",
}
_ADDRESS_FIELDS = ("listen", "advertise", "metrics", "mirror")


def _pinned_aggregators(value: object) -> tuple[PinnedAggregator, ...]:
    """``directory.aggregators``: a list of ``{ url = "...", identity = "<64 hex>" }``."""
    if not isinstance(value, list) or len(value) > _MAX_DIRECTORY_AGGREGATORS:
        raise RelayConfigError(
            f"directory.aggregators must be a list of at most {_MAX_DIRECTORY_AGGREGATORS} "
            f'{{ url = "...", identity = "<64 hex>" }} tables, got {value!r:.200}'
        )
    aggregators = []
    for index, item in enumerate(value):
        where = f"directory.aggregators[{index}]"
        if not isinstance(item, dict) or set(item) != {"url", "identity"}:
            raise RelayConfigError(f"{where} must be a table with exactly url and identity, got {item!r:.200}")
        try:
            aggregators.append(PinnedAggregator.from_text(item["url"], item["identity"]))
        except RelayConfigError as exc:
            raise RelayConfigError(f"{where}.{exc}") from None
    return tuple(aggregators)


def config_from_mapping(data: dict[str, Any], data_dir: Path) -> RelayConfig:
    """Build a :class:`RelayConfig` from parsed TOML; :class:`RelayConfigError` on any problem."""
    values: dict[str, Any] = {}
    link_values: dict[str, Any] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise RelayConfigError(f"top-level key {section!r} must be a [section]")
        for key, value in table.items():
            target = _KEYS.get((section, key))
            if target is None:
                raise RelayConfigError(f"unknown config key {section}.{key} = {value!r}")
            if target in _ADDRESS_FIELDS:
                value = parse_host_port(value, what=f"{section}.{key}")
            if target == "directory_aggregators":
                value = _pinned_aggregators(value)
            if target.startswith("link."):
                link_values[target.removeprefix("link.")] = value
            else:
                values[target] = value
    if "listen" not in values:
        raise RelayConfigError("relay.listen is required")
    try:
        link = LinkLimits(**link_values)
    except ValueError as exc:
        raise RelayConfigError(f"[link]: {exc}") from None
    try:
        return RelayConfig(data_dir=data_dir, link=link, **values)
    except TypeError as exc:
        raise RelayConfigError(f"bad config value: {exc}") from None


def load_config(data_dir: Path) -> RelayConfig:
    """Read ``DATA_DIR/relay.toml``."""
    path = Path(data_dir) / CONFIG_FILE
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise RelayConfigError(f"no config at {str(path)!r}: run `anonml relay init` first") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RelayConfigError(f"cannot read {str(path)!r}: {exc}") from None
    return config_from_mapping(data, Path(data_dir))


def _optional_line(key: str, value: str | None, example: str) -> str:
    """``key = "value"``, or the example commented out when the value is unset."""
    return f"{key} = {json.dumps(value)}" if value is not None else f"# {key} = {json.dumps(example)}"


def render_config(config: RelayConfig) -> str:
    """The commented TOML that ``init`` writes (reads back to ``config``)."""
    link = config.link
    metrics = _optional_line(
        "listen", format_host_port(*config.metrics) if config.metrics is not None else None, "127.0.0.1:9464"
    )
    mirror = _optional_line(
        "listen", format_host_port(*config.mirror) if config.mirror is not None else None, "127.0.0.1:9465"
    )
    advertise = _optional_line(
        "advertise",
        format_host_port(*config.advertise) if config.advertise is not None else None,
        format_host_port(*config.listen),
    )
    aggregators = "".join(
        f"\n  {{ url = {json.dumps(a.url)}, identity = {json.dumps(a.identity.hex())} }}," for a in config.directory_aggregators
    ) + ("\n" if config.directory_aggregators else "")
    directory_file = _optional_line("file", config.directory_file, "directory.json")
    return f"""\
# AnonML relay configuration, written by `anonml relay init`.
# Times are seconds. Unknown keys are errors. See DESIGN.md §7.

[relay]
# Where the link server listens for Sphinx packets (IP:PORT).
listen = "{format_host_port(*config.listen)}"
# The address other nodes should use, printed by `anonml relay info`
# (defaults to listen; set it when listening on 0.0.0.0 or behind NAT).
{advertise}

[geometry]
# Must equal the round manifest's path length and packet size: the link
# hello carries the geometry hash and other geometries are refused.
max_hops = {config.max_hops}
packet_size = {config.packet_size}

[limits]
# Open link connections; more are closed at once and counted.
max_connections = {config.max_connections}
# Packets held (durably) waiting for release; beyond this, packets are
# refused with BUSY and counted ("capacity").
max_held_packets = {config.max_held_packets}
# Replay tags remembered per key epoch (about 100 bytes each on disk). A full
# cache refuses new packets under that key until it rotates: forgetting tags
# would let replays through.
max_replay_tags_per_epoch = {config.max_replay_tags_per_epoch}
# Distinct next hops this relay will forward to.
max_neighbours = {config.max_neighbours}

[link]
# The whole hello must arrive within hello_timeout; a connection idle longer
# than idle_timeout between frames is closed; a started frame must complete
# within frame_timeout; acks must be read by the sender within send_timeout.
hello_timeout = {link.hello_timeout}
idle_timeout = {link.idle_timeout}
frame_timeout = {link.frame_timeout}
send_timeout = {link.send_timeout}
# Frames read but not yet stored, per connection (memory: frames x packet size).
max_pending_frames = {link.max_pending_frames}
# Frames stored in one SQLite transaction before their acks go out (group commit).
max_batch = {link.max_batch}

[forward]
# Per attempt; retries continue until the packet's release window ends.
connect_timeout = {config.connect_timeout}
ack_timeout = {config.ack_timeout}
# Frames sent to one neighbour before waiting for their acks.
max_batch = {config.forward_batch}

[keys]
# Sphinx keys rotate every epoch_seconds (epochs are counted from the Unix
# epoch, so all relays rotate together). A packet built for the previous
# epoch's key is still accepted for grace_seconds after the boundary; then
# that key and its replay tags are erased. A round must end before the key
# its manifest names is erased (`anonml relay info` lists the next key too).
epoch_seconds = {config.key_epoch_seconds}
grace_seconds = {config.key_grace_seconds}

[storage]
# SQLite synchronous mode for held packets and replay tags (WAL journal).
# FULL: a packet acknowledged to the sender survives power loss.
# NORMAL: it survives a crash of the relay process, not of the machine.
synchronous = "{config.synchronous}"

[metrics]
# Prometheus text format over HTTP at /metrics; off unless listen is set.
# Keep it on 127.0.0.1 unless a firewall protects the port.
{metrics}

[mirror]
# A read-only HTTP mirror of each pinned aggregator's signed manifest, roster
# head and receipt-log heads, which peers compare with what the aggregator
# showed them (DESIGN.md §5); off unless listen is set.
{mirror}

[log]
level = "{config.log_level}"

[directory]
# The only next hops this relay forwards to. A packet naming any other node
# id, or a known node id at another address, is dropped and counted
# ("unknown-next-hop", "next-hop-address-mismatch"): the sender chooses the
# next hop, so without this a relay forwards frames to any host and port.
# aggregators: the aggregators this relay serves, each its base URL and its
# Ed25519 identity key (64 hex digits, printed by `anonml aggregator init`):
#   aggregators = [{{ url = "http://127.0.0.1:8080", identity = "<64 hex>" }}]
# Their round manifests (GET URL/v1/manifest) give every listed relay and the
# aggregator's final hop, and count only if signed by that pinned key (round
# id verified too): whoever answers the URL cannot add next hops. Fetched at
# start (an unreachable aggregator is retried every min_refresh_seconds) and
# again when a packet names a next hop the directory refuses, at most once
# per min_refresh_seconds (the packet itself is dropped).
aggregators = [{aggregators}]
# A static JSON file {{"hops": [{{"node_id": HEX, "host": IP, "port": N}}]}}
# (relative to the data directory), re-read with the aggregators.
{directory_file}
# With neither source: true refuses to start; false starts with a warning and
# forwards anywhere (legacy, insecure).
require = {"true" if config.require_directory else "false"}
min_refresh_seconds = {config.directory_min_refresh_seconds}
# Per manifest fetch (connect, read, whole body).
fetch_timeout = {config.directory_fetch_timeout}
"""

