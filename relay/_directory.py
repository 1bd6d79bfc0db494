"""The next hops a relay may forward to (DESIGN.md §7; issue 5 security fix).

The routing slot of a Sphinx packet names the next hop's node id and address,
and the *sender* chooses both. A relay that forwarded to whatever address a
packet names would be an open forwarder of fixed-size frames to any host and
port. So a relay forwards only to the nodes of its directory, and only at the
address the directory gives for that node id; anything else is dropped and
counted ("unknown-next-hop", "next-hop-address-mismatch").

The directory is the union of its sources:

* the signed manifest of each aggregator the operator chose to serve
  (``GET {url}/v1/manifest``, DESIGN.md §4): every listed relay and the
  aggregator's own final hop. The operator configures each aggregator as a
  URL *and* its Ed25519 identity key; the manifest's signature, its signer
  (that pinned key, not the key the manifest itself names) and its
  ``round_id`` are checked with :class:`protocol.SignedManifest`, so a
  manifest altered in transit, or signed by anyone else who answers the URL
  (plain http is allowed), adds nothing. Trust in *which* aggregator to
  serve is the operator's choice of key, as it is in which round a peer
  joins.
* a static JSON file, for operators without an aggregator URL and for tests
  (:func:`render_directory_file` writes one).

Each source replaces only its own entries when it is re-read, so a relay
that left a round's directory stops being a next hop. A manifest's source
also tells the relay the round's phases: a packet's release window must lie
inside one of them (DESIGN.md §5; issue 13: far-future windows filled the
hold queue). The directory also answers the link's questions: which node
sits at an address (so a forwarder insists on it), which addresses and
node ids are neighbours (for the connection slots reserved for them), and how
many relays are listed (each neighbour's share of the held packets,
:mod:`relay._shares`).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from anonml.base.errors import TransportError
from anonml.crypto import NodeAddress
from anonml.relay._metrics import DropReason
from anonml.protocol import MAX_MANIFEST_BYTES, PATH_MANIFEST, InvalidManifest, SignedManifest
from anonml.transport import TCP_NETWORK, Network, tls_context

logger = logging.getLogger("anonml.relay")

# A signed manifest is its JSON plus a signature and round id (protocol
# SignedManifest.from_json's own bound).
_MAX_MANIFEST_RESPONSE_BYTES = MAX_MANIFEST_BYTES + 1024
_MAX_DIRECTORY_FILE_BYTES = 1024 * 1024
_MAX_DIRECTORY_ENTRIES = 4096
_MAX_NODE_ID_BYTES = 64

Span = tuple[int, int]
"""A phase of a known round, ``(t_s, t_r)``: every hop window of its packets lies inside."""


class DirectoryError(TransportError):
    """Raised by :func:`parse_directory_file`, :func:`load_directory_file` and
    :func:`fetch_manifest` for a directory source that cannot be read:
    malformed or oversized JSON, an unreachable aggregator, an HTTP error, or
    a manifest whose signature or round id does not verify or that is signed
    by a key other than the aggregator's pinned identity."""


@dataclass(frozen=True)
class DirectoryEntry:
    """One allowed next hop: a node id and the address it listens on."""

    node_id: bytes
    host: str
    port: int


@functools.lru_cache(maxsize=4096)
def _normalised_host(host: str) -> str:
    """The host as a Sphinx :class:`NodeAddress` spells it after parsing, so
    ``::ffff:127.0.0.1`` and ``127.0.0.1`` compare equal; a host name (never
    in a Sphinx address) is kept as written and so never matches. A manifest
    may bracket an IPv6 literal (``[::1]``).

    Cached (a pure function of the string): every released packet asks for its next hop's sink addresses
    (``sink_endpoints``), and parsing the address cost more than the lookup."""
    try:
        parsed = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return host
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return str(parsed)


@dataclass(frozen=True)
class _Source:
    """What one source (a static file, a round's manifest) lists."""

    entries: tuple[DirectoryEntry, ...]
    spans: tuple[Span, ...] | None
    relays: frozenset[bytes]
    sink: tuple[tuple[str, int], ...]
    """A round's final hop's addresses (its own, then its workers'); empty for a static file."""


class NextHopDirectory:
    """node id -> allowed addresses, and the phases of known rounds, merged over named sources."""

    def __init__(self) -> None:
        self._sources: dict[str, _Source] = {}
        self._allowed: dict[bytes, frozenset[tuple[str, int]]] = {}
        self._endpoints: dict[tuple[str, int], tuple[tuple[str, int], ...]] = {}
        self._at: dict[tuple[str, int], bytes] = {}
        self._hosts: frozenset[str] = frozenset()
        self._spans: tuple[Span, ...] | None = None
        self._relays: frozenset[bytes] = frozenset()

    def replace_source(self, source: str, entries: Iterable[DirectoryEntry], spans: Iterable[Span] | None = None,
                       relays: Iterable[bytes] | None = None, sink: Sequence[tuple[str, int]] = ()) -> None:
        """Set the entries (and, for a round manifest, the phase spans, the node ids of its relays, not its
        final hop, and its final hop's addresses, ``sink``) that ``source`` provides; ``relays`` None: every
        entry is a relay (a static file)."""
        entries = tuple(entries)
        listed = frozenset(entry.node_id for entry in entries) if relays is None else frozenset(relays)
        sink = tuple((_normalised_host(host), port) for host, port in sink)
        self._sources[source] = _Source(entries, None if spans is None else tuple(spans), listed, sink)
        self._merge()

    def remove_source(self, source: str) -> None:
        self._sources.pop(source, None)
        self._merge()

    def _merge(self) -> None:
        allowed: dict[bytes, set[tuple[str, int]]] = {}
        spans: list[Span] | None = None
        endpoints: dict[tuple[str, int], tuple[tuple[str, int], ...]] = {}
        for source in self._sources.values():
            for entry in source.entries:
                allowed.setdefault(entry.node_id, set()).add((_normalised_host(entry.host), entry.port))
            if source.spans is not None:
                spans = [*(spans or []), *source.spans]
            # A round's own sink addresses only: another round's (another sink, perhaps the same key) would refuse
            # a packet of this one, so a relay never spreads over addresses of one node id merged from two sources.
            endpoints.update((address, source.sink) for address in source.sink if len(source.sink) > 1)
        self._endpoints = endpoints
        self._allowed = {node_id: frozenset(addresses) for node_id, addresses in allowed.items()}
        self._at = {address: node_id for node_id, addresses in allowed.items() for address in addresses}
        # Asked on every accepted connection (a flood's too): built here, once per directory change.
        self._hosts = frozenset(host for host, _ in self._at)
        self._spans = None if spans is None else tuple(sorted(spans))
        self._relays = frozenset(node_id for source in self._sources.values() for node_id in source.relays)

    def __len__(self) -> int:
        return len(self._allowed)

    def sources(self) -> Mapping[str, int]:
        """Entries per source (for logs)."""
        return {name: len(source.entries) for name, source in self._sources.items()}

    def check(self, node_id: bytes, address: NodeAddress) -> DropReason | None:
        """None if ``node_id`` is a next hop at ``address``, else the drop reason."""
        addresses = self._allowed.get(node_id)
        if addresses is None:
            return DropReason.UNKNOWN_NEXT_HOP
        if (address.host, address.port) not in addresses:
            return DropReason.NEXT_HOP_ADDRESS_MISMATCH
        return None

    def window_known(self, start: int, end: int) -> bool:
        """Whether ``[start, end]`` lies inside a phase of a known round (always, when none is known)."""
        if self._spans is None:
            return True
        return any(t_s <= start and end <= t_r for t_s, t_r in self._spans)

    def phase_end(self, window_end: float) -> int | None:
        """The end ``t_r`` of the known round phase a hop window ending at ``window_end`` lies in (the
        latest of them if rounds overlap); None when no known phase holds it (or no round is known).

        Every later hop's window of a packet ends by its phase's ``t_r`` (the aggregator accepts until
        then, ``protocol.acceptance_window``): after it, no next hop can take the packet."""
        ends = [t_r for t_s, t_r in self._spans or () if t_s < window_end <= t_r]
        return max(ends) if ends else None

    def sink_endpoints(self, host: str, port: int) -> tuple[tuple[str, int], ...]:
        """The addresses a packet for the next hop at ``host:port`` may be delivered to: every sink address
        of the round whose final hop is listed there (its ingest workers'), or that address alone."""
        return self._endpoints.get((_normalised_host(host), port), ((host, port),))

    def node_at(self, host: str, port: int) -> bytes | None:
        """The node id listed at ``host:port``, if exactly one source names one."""
        return self._at.get((_normalised_host(host), port))

    def is_neighbour(self, node_id: bytes) -> bool:
        return node_id in self._allowed

    def relays_besides(self, node_id: bytes | None) -> int:
        """How many relays the sources list, not counting ``node_id`` (this relay's own)."""
        return len(self._relays) - (node_id is not None and node_id in self._relays)

    def neighbour_hosts(self) -> frozenset[str]:
        """The IP addresses of every listed node (their connections get reserved slots)."""
        return self._hosts


def entries_from_manifest(signed: SignedManifest) -> tuple[DirectoryEntry, ...]:
    """Every relay of a verified manifest's directory and its final hop, at each of its sink addresses."""
    network = signed.manifest
    entries = [DirectoryEntry(relay.node_id, relay.host, relay.port) for relay in network.relays]
    hop = network.aggregator_hop
    entries.extend(DirectoryEntry(hop.node_id, host, port) for host, port in hop.endpoints)
    return tuple(entries)


def relays_from_manifest(signed: SignedManifest) -> frozenset[bytes]:
    """The node ids of a verified manifest's relays (its final hop is no relay: it forwards nothing)."""
    return frozenset(relay.node_id for relay in signed.manifest.relays)


def spans_from_manifest(signed: SignedManifest) -> tuple[Span, ...]:
    """Each query phase ``(t_s, t_r)`` of a verified manifest's schedule: every hop window lies in one."""
    return tuple((phase.t_s, phase.t_r) for phase in signed.manifest.schedule.phases)


def parse_directory_file(data: bytes) -> tuple[DirectoryEntry, ...]:
    """Strictly parse ``{"hops": [{"node_id": HEX, "host": IP, "port": N}, ...]}``."""
    if len(data) > _MAX_DIRECTORY_FILE_BYTES:
        raise DirectoryError(f"directory file of {len(data)!r} bytes exceeds {_MAX_DIRECTORY_FILE_BYTES!r}")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise DirectoryError(f"directory file is not JSON: {exc}") from None
    if not isinstance(document, dict) or set(document) != {"hops"} or not isinstance(document["hops"], list):
        raise DirectoryError(f"directory file must be an object with one key 'hops' (a list), got {document!r:.200}")
    hops = document["hops"]
    if len(hops) > _MAX_DIRECTORY_ENTRIES:
        raise DirectoryError(f"directory file lists {len(hops)!r} hops, more than {_MAX_DIRECTORY_ENTRIES!r}")
    entries: list[DirectoryEntry] = []
    for item in hops:
        if not isinstance(item, dict) or set(item) != {"node_id", "host", "port"}:
            raise DirectoryError(f"a hop must have exactly node_id, host and port, got {item!r:.200}")
        node_id, host, port = item["node_id"], item["host"], item["port"]
        try:
            node_id_bytes = bytes.fromhex(node_id) if isinstance(node_id, str) else b""
            NodeAddress(host, port)
        except ValueError:
            raise DirectoryError(f"a hop needs a hex node_id, an IP literal host and a port, got {item!r:.200}") from None
        if not 0 < len(node_id_bytes) <= _MAX_NODE_ID_BYTES:
            raise DirectoryError(f"node_id must be 1..{_MAX_NODE_ID_BYTES} bytes of hex, got {node_id!r:.200}")
        entries.append(DirectoryEntry(node_id_bytes, host, port))
    return tuple(entries)


def render_directory_file(entries: Iterable[DirectoryEntry]) -> str:
    """The JSON that :func:`parse_directory_file` reads."""
    hops = [{"node_id": e.node_id.hex(), "host": e.host, "port": e.port} for e in entries]
    return json.dumps({"hops": hops}, indent=2) + "\n"


def load_directory_file(path: Path) -> tuple[DirectoryEntry, ...]:
    """Read and parse a static directory file (bounded read)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_DIRECTORY_FILE_BYTES + 1)
    except OSError as exc:
        raise DirectoryError(f"cannot read the directory file {str(path)!r}: {exc}") from None
    return parse_directory_file(data)


async def fetch_manifest(url: str, *, identity: bytes, timeout: float, network: Network = TCP_NETWORK) -> SignedManifest:
    """``GET {url}/v1/manifest`` over ``network`` and verify it was signed by ``identity`` (the
    aggregator's pinned Ed25519 key).

    The whole exchange is bounded by ``timeout`` seconds and the body by the
    manifest size limit, so a slow or hostile server costs bounded time and
    memory.
    """
    body = bytearray()
    try:
        with trio.fail_after(timeout):
            async with (
                network.http_client(timeout=httpx.Timeout(timeout), verify=tls_context()) as client,
                client.stream("GET", url.rstrip("/") + PATH_MANIFEST) as response,
            ):
                if response.status_code != 200:
                    raise DirectoryError(f"{url!r} answered HTTP {response.status_code!r} for the manifest")
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > _MAX_MANIFEST_RESPONSE_BYTES:
                        raise DirectoryError(f"{url!r} sent a manifest over {_MAX_MANIFEST_RESPONSE_BYTES!r} bytes")
    except trio.TooSlowError:
        raise DirectoryError(f"{url!r} did not serve its manifest within {timeout!r} s") from None
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        raise DirectoryError(f"cannot fetch the manifest from {url!r}: {exc!r}") from None
    return verify_manifest(bytes(body), identity=identity, source=url)


def verify_manifest(data: bytes, *, identity: bytes, source: str) -> SignedManifest:
    """A signed manifest from ``source``, verified against the pinned ``identity``, or DirectoryError."""
    try:
        # The pinned key, never the one the manifest carries: anyone can sign a
        # manifest naming their own key (the issue-5 open-forwarder hole).
        return SignedManifest.from_json(data, expected_identity=identity)
    except InvalidManifest as exc:
        raise DirectoryError(f"the manifest from {source!r} does not verify: {exc}") from None
