"""The relay's configuration: a commented TOML file in its data directory.

``anonml relay init`` writes it (:func:`render_config`: each value through
tomli-w, each preceded by its documentation from :data:`_KEYS`);
``anonml relay run`` reads it (:func:`load_config`, with ``tomllib``). Every
key is optional except ``relay.listen``; unknown keys are errors, so a typo
cannot silently fall back to a default.
"""

from __future__ import annotations

import ipaddress
import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomli_w

from anonml.crypto import DEFAULT_MAX_HOPS, DEFAULT_PACKET_SIZE
from anonml.protocol import format_host_port
from anonml.transport import CONNECT_TIMEOUT, DEFAULT_MAX_WORK_BITS, LinkLimits
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
    max_connections_per_source: int = 32
    neighbour_connections: int = 32
    # 2 KiB packets: about 400 MiB of disk when full. A source may hold 1/64 of it and a /24 1/32
    # (max_held_per_source, max_held_per_prefix), from the first packet (issue 25).
    max_held_packets: int = 200_000
    # Shares of max_held_packets (relay._shares): issue 25's attacker holds addresses in up to 16
    # /24s, so 32 prefix shares leave it half the queue. 1 and 1: one source may take the queue
    # (the loopback demo, whose thousands of peers all send from 127.0.0.1).
    source_shares: int = 64
    prefix_shares: int = 32
    # A day: a packet is held until its window, and a round's windows come
    # minutes to hours after its packets are sent (DESIGN.md §3). Issue 13:
    # without a bound, far-future packets filled the hold queue.
    max_hold_seconds: int = 86_400
    max_replay_tags: int = 5_000_000
    max_neighbours: int = 64
    # Refused frames per second (and burst) a source that is not a neighbour may send before its
    # batches wait (relay._budget): ~0.3 ms of Sphinx each, so 50/s bounds a flood to ~2% of a core.
    refusals_per_second: float = 50.0
    refusal_burst: int = 200
    # The most work asked of a first-hop frame (relay._work): what a peer's link client pays by default,
    # so a loaded relay still serves every honest peer; 0 asks no work.
    max_work_bits: int = DEFAULT_MAX_WORK_BITS
    link: LinkLimits = field(default_factory=LinkLimits)
    connect_timeout: float = CONNECT_TIMEOUT
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
        for name in ("max_hops", "packet_size", "max_connections", "max_connections_per_source", "max_held_packets",
                     "source_shares", "prefix_shares", "max_hold_seconds", "max_replay_tags", "max_neighbours", "forward_batch", "key_epoch_seconds"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise RelayConfigError(f"{name} must be a positive integer, got {value!r}")
        if type(self.neighbour_connections) is not int or not 0 <= self.neighbour_connections < self.max_connections:
            raise RelayConfigError(
                f"neighbour_connections must be an integer in [0, max_connections), got {self.neighbour_connections!r}"
            )
        if type(self.key_grace_seconds) is not int or not 0 <= self.key_grace_seconds < self.key_epoch_seconds:
            raise RelayConfigError(
                f"key_grace_seconds must be an integer in [0, key_epoch_seconds), got {self.key_grace_seconds!r}"
            )
        if self.prefix_shares > self.source_shares:
            raise RelayConfigError(f"prefix_shares ({self.prefix_shares}) must not exceed source_shares "
                                   f"({self.source_shares}): a network may hold at least what one of its addresses may")
        if type(self.refusal_burst) is not int or self.refusal_burst < 1:
            raise RelayConfigError(f"refusal_burst must be a positive integer, got {self.refusal_burst!r}")
        if type(self.max_work_bits) is not int or not 0 <= self.max_work_bits <= DEFAULT_MAX_WORK_BITS:
            raise RelayConfigError(f"max_work_bits must be an integer in [0, {DEFAULT_MAX_WORK_BITS}] (what a peer "
                                   f"pays at most), got {self.max_work_bits!r}")
        for name in ("connect_timeout", "ack_timeout", "directory_min_refresh_seconds", "directory_fetch_timeout",
                     "refusals_per_second"):
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
    def max_held_per_source(self) -> int:
        """Held packets one source address may hold (relay._shares)."""
        return max(1, self.max_held_packets // self.source_shares)

    @property
    def max_held_per_prefix(self) -> int:
        """Held packets one /24 (or IPv6 /48) may hold: an attacker in 16 of them holds at most half."""
        return max(1, self.max_held_packets // self.prefix_shares)

    def max_held_per_neighbour(self, other_relays: int) -> int:
        """Held packets one authenticated directory neighbour may hold while the directory lists
        ``other_relays`` relays besides this one (relay._shares): the packets of one hop window come from
        the other listed relays in equal parts, so each gets an equal part of the queue; never more than
        half, so one colluding relay leaves half the queue to this relay's peers and other neighbours."""
        return max(1, self.max_held_packets // max(2, other_relays))

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


@dataclass(frozen=True)
class _Key:
    """One config key: where it lives, the RelayConfig field it sets
    (``link.<LinkLimits field>`` for the link), and its documentation."""

    section: str
    key: str
    target: str
    doc: str
    example: object = None  # shown commented out when the value is unset


_SECTION_DOCS: dict[str, str] = {
    "relay": "",
    "geometry": "Must equal the round manifest's path length and packet size: the link\n"
                "hello carries the geometry hash and other geometries are refused.",
    "limits": "",
    "link": "Per connection: the whole handshake must arrive within hello_timeout, the\n"
            "first frame within first_frame_timeout after it (a silent connection is\n"
            "closed early), each later frame's first byte within idle_timeout, a\n"
            "started frame within frame_timeout; acks must be read within send_timeout.",
    "forward": "",
    "keys": "Sphinx keys rotate every epoch_seconds (epochs are counted from the Unix\n"
            "epoch, so all relays rotate together). A packet built for the previous\n"
            "epoch's key is still accepted for grace_seconds after the boundary; then\n"
            "that key is erased. A round must end before the key its manifest names is\n"
            "erased (`anonml relay info` lists the next key too).",
    "storage": "SQLite synchronous mode for held packets and replay tags (WAL journal).\n"
               "FULL: a packet acknowledged to the sender survives power loss.\n"
               "NORMAL: it survives a crash of the relay process, not of the machine.",
    "metrics": "Prometheus text format over HTTP at /metrics; off unless listen is set.\n"
               "Keep it on 127.0.0.1 unless a firewall protects the port.",
    "mirror": "A read-only HTTP mirror of each pinned aggregator's signed manifest, roster\n"
              "head and receipt-log heads, which peers compare with what the aggregator\n"
              "showed them (DESIGN.md §5); off unless listen is set.",
    "log": "",
    "directory": "The only next hops this relay forwards to. A packet naming any other node\n"
                 "id, or a known node id at another address, is refused BUSY and counted\n"
                 "(\"unknown-next-hop\", \"next-hop-address-mismatch\") while the directory is\n"
                 "fetched again: the sender chooses the next hop, so without this a relay\n"
                 "forwards frames to any host and port.",
}

_KEYS: tuple[_Key, ...] = (
    _Key("relay", "listen", "listen", "Where the link server listens for Sphinx packets (IP:PORT)."),
    _Key("relay", "advertise", "advertise", "The address other nodes use, printed by `anonml relay info`\n"
         "(defaults to listen; set it when listening on 0.0.0.0 or behind NAT).", "203.0.113.7:9000"),
    _Key("geometry", "max_hops", "max_hops", "Routing slots of a packet."),
    _Key("geometry", "packet_size", "packet_size", "Bytes of every packet."),
    _Key("limits", "max_connections", "max_connections", "Open link connections; more are closed at once and counted."),
    _Key("limits", "max_connections_per_source", "max_connections_per_source",
         "Open connections from one IP address that is not an authenticated directory\n"
         "neighbour (peers, strangers), and twice that from one /24, from the first\n"
         "connection; when full, the connection idle longest is closed for a new one.\n"
         "Both caps are lowered at start if RLIMIT_NOFILE cannot hold them."),
    _Key("limits", "neighbour_connections", "neighbour_connections",
         "Of max_connections, slots kept for relays and aggregators of the directory\n"
         "(they authenticate with the key their node id names): a flood of strangers\n"
         "leaves these to the relays upstream."),
    _Key("limits", "max_held_packets", "max_held_packets",
         "Packets held (durably) waiting for release; beyond this, packets are\n"
         "refused with BUSY and counted (\"capacity\"). Whatever the fill, one IP\n"
         "address may hold 1/64 of it and one /24 1/32 (\"source-share\",\n"
         "\"prefix-share\"), and one directory neighbour (a relay, by its key) 1/N for\n"
         "N other listed relays, at most 1/2 (\"neighbour-share\"): a flood, or a\n"
         "colluding relay's, cannot crowd out peers."),
    _Key("limits", "source_shares", "source_shares",
         "One IP address (not a directory neighbour) may hold max_held_packets /\n"
         "source_shares packets at once. 1 gives one address the whole queue: only for\n"
         "a relay whose peers all send from one address (the loopback demo)."),
    _Key("limits", "prefix_shares", "prefix_shares",
         "One /24 (or IPv6 /48) may hold max_held_packets / prefix_shares packets at\n"
         "once; at most source_shares."),
    _Key("limits", "max_hold_seconds", "max_hold_seconds",
         "A packet is accepted only if its window ends within this many seconds\n"
         "(and, once a round manifest is known, lies inside one of its phases)."),
    _Key("limits", "max_replay_tags", "max_replay_tags",
         "Replay tags remembered (about 100 bytes each on disk), each until its\n"
         "packet's window ends. A full cache refuses new packets BUSY: forgetting\n"
         "tags would let replays through."),
    _Key("limits", "max_neighbours", "max_neighbours", "Distinct next hops this relay will forward to."),
    _Key("limits", "refusals_per_second", "refusals_per_second",
         "Frames per second a source (not a directory neighbour) may send that the relay\n"
         "refuses (late, too far ahead, bad MAC, replays...); beyond that and a burst of\n"
         "refusal_burst, its next batch waits: a flood of useless packets costs a bounded\n"
         "share of the CPU, and nothing is refused for it."),
    _Key("limits", "refusal_burst", "refusal_burst", ""),
    _Key("limits", "max_work_bits", "max_work_bits",
         "Most work asked of a frame from a sender that is not a directory neighbour:\n"
         "2**bits hashes, asked while the first-hop intake is busy (0: never asked).\n"
         "Peers pay at most 2**20 by default; more would leave them refused."),
    _Key("link", "hello_timeout", "link.hello_timeout", ""),
    _Key("link", "first_frame_timeout", "link.first_frame_timeout", ""),
    _Key("link", "idle_timeout", "link.idle_timeout", ""),
    _Key("link", "frame_timeout", "link.frame_timeout", ""),
    _Key("link", "send_timeout", "link.send_timeout", ""),
    _Key("link", "max_pending_frames", "link.max_pending_frames",
         "Frames read but not yet stored, per connection (memory: frames x packet size)."),
    _Key("link", "max_batch", "link.max_batch",
         "Frames stored in one SQLite transaction before their acks go out (group commit)."),
    _Key("forward", "connect_timeout", "connect_timeout",
         "Per attempt; retries continue until the packet's round phase ends (no next hop can take it after)."),
    _Key("forward", "ack_timeout", "ack_timeout", ""),
    _Key("forward", "max_batch", "forward_batch", "Frames sent to one neighbour before waiting for their acks."),
    _Key("keys", "epoch_seconds", "key_epoch_seconds", ""),
    _Key("keys", "grace_seconds", "key_grace_seconds", ""),
    _Key("storage", "synchronous", "synchronous", ""),
    _Key("metrics", "listen", "metrics", "", "127.0.0.1:9464"),
    _Key("mirror", "listen", "mirror", "", "127.0.0.1:9465"),
    _Key("log", "level", "log_level", "One of DEBUG, INFO, WARNING, ERROR."),
    _Key("directory", "file", "directory_file",
         "A static JSON file {\"hops\": [{\"node_id\": HEX, \"host\": IP, \"port\": N}]}\n"
         "(relative to the data directory), re-read with the aggregators. It names no\n"
         "rounds, so with only a file the window check is max_hold_seconds alone.", "directory.json"),
    _Key("directory", "require", "require_directory",
         "With neither source: true refuses to start; false starts with a warning and\n"
         "forwards anywhere (legacy, insecure)."),
    _Key("directory", "min_refresh_seconds", "directory_min_refresh_seconds", ""),
    _Key("directory", "fetch_timeout", "directory_fetch_timeout", "Per manifest fetch (connect, read, whole body)."),
    # Last in the file: tomli-w writes a long list of tables as [[directory.aggregators]] blocks.
    _Key("directory", "aggregators", "directory_aggregators",
         "The aggregators this relay serves, each its base URL and its Ed25519\n"
         "identity key (64 hex digits, printed by `anonml aggregator init`):\n"
         "  aggregators = [{ url = \"http://127.0.0.1:8080\", identity = \"<64 hex>\" }]\n"
         "Their round manifests (GET URL/v1/manifest) give every listed relay and the\n"
         "aggregator's final hop, and the round's phases, and count only if signed by\n"
         "that pinned key: whoever answers the URL cannot add next hops. Verified\n"
         "manifests are kept in the data directory, so a restarted relay forwards at\n"
         "once; they are fetched at start and again when a packet names a next hop or\n"
         "a window the directory does not know, at most once per min_refresh_seconds."),
)
# Keys of older releases, still read: their meaning is unchanged or wider.
_RENAMED: dict[tuple[str, str], str] = {("limits", "max_replay_tags_per_epoch"): "max_replay_tags"}
_TARGETS: dict[tuple[str, str], str] = {
    **{(k.section, k.key): k.target for k in _KEYS},
    **_RENAMED,
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
            target = _TARGETS.get((section, key))
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


def _toml_value(config: RelayConfig, target: str) -> object:
    """The TOML value of ``target`` in ``config`` (None: unset)."""
    if target.startswith("link."):
        return getattr(config.link, target.removeprefix("link."))
    value = getattr(config, target)
    if target in _ADDRESS_FIELDS:
        return None if value is None else format_host_port(*value)
    if target == "directory_aggregators":
        return [{"url": a.url, "identity": a.identity.hex()} for a in value]
    return value


def _comment(text: str) -> str:
    return "".join(f"# {line}\n".replace("# \n", "#\n") for line in text.splitlines())


def render_config(config: RelayConfig) -> str:
    """The commented TOML that ``init`` writes (reads back to ``config``).

    Each value is written by tomli-w (quoting and escaping are its job);
    each key is preceded by its documentation, and an unset optional key is
    shown commented out with an example.
    """
    parts = ["# AnonML relay configuration, written by `anonml relay init`.\n"
             "# Times are seconds. Unknown keys are errors. See DESIGN.md §7.\n"]
    for section, doc in _SECTION_DOCS.items():
        parts.append(f"\n[{section}]\n" + _comment(doc))
        for key in (k for k in _KEYS if k.section == section):
            value = _toml_value(config, key.target)
            parts.append(_comment(key.doc))
            line = _in_section(section, key.key, key.example if value is None else value)
            parts.append(_comment(line.rstrip("\n")) if value is None else line)
    return "".join(parts)


def _in_section(section: str, key: str, value: object) -> str:
    """``key = value`` as tomli-w writes it inside ``[section]`` (so a list of tables stays inline)."""
    header = f"[{section}]\n"
    text = tomli_w.dumps({section: {key: value}})
    if text.startswith(header):
        return text.removeprefix(header)
    if text.startswith(f"[[{section}.{key}]]\n") and (section, key) == (_KEYS[-1].section, _KEYS[-1].key):
        return text  # blocks of an array of tables: valid only at the end of the file, where this key is
    raise ValueError(f"unexpected TOML for {section}.{key}: {text!r}")
