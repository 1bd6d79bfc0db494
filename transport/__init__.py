"""The network servers and clients every role runs: the relay link and the public HTTP servers.

``anonml.protocol`` says *what* the roles exchange (documents, wire formats,
rules); this package carries it: the relay link's framed TCP stream and its
client (:func:`serve_link`, :class:`LinkClient`), the HTTP/1.1 servers behind
our own listener (:func:`serve_http`), and the admission that bounds what one
source may take of either (:class:`ConnectionGate`, :class:`RequestPacer`).
All of them reach the network through a :class:`Network`: TCP
(:data:`TCP_NETWORK`, the default) or, in the round simulator, a
:class:`MemoryNetwork` on trio's clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    from anonml.transport._admission import (
        ConnectionGate,
        GateRefusal,
        GateSlot,
        RequestPacer,
        holding_room,
        peer_address,
        source_prefix,
    )
    from anonml.transport._fair import FairTurns
    from anonml.transport._http import HttpLimits, serve_http, serve_http_on, tls_context
    from anonml.transport._memory import (
        ConnectHook,
        Dial,
        MemoryHost,
        MemoryListener,
        MemoryNetwork,
        MemorySocket,
        MemoryStream,
        connection_pair,
    )
    from anonml.transport._network import (
        TCP_NETWORK,
        Listeners,
        Network,
        SocketAddresses,
        TcpNetwork,
        listening_address,
        serve_streams,
        socket_of,
    )
    from anonml.transport._link import (
        HELLO_BYTES,
        HELLO_REPLY_BYTES,
        LINK_VERSION,
        AckStatus,
        AuthVerdict,
        HelloStatus,
        LinkError,
        LinkErrorReason,
        LinkIdentity,
        LinkLimits,
        LinkSessionStats,
        check_positive_seconds,
        encode_hello,
        encode_hello_reply,
        parse_acks,
        parse_hello_reply,
        receive_exactly,
        serve_link,
        WorkDemand,
        FixedWork,
    )
    from anonml.transport._link_client import CONNECT_TIMEOUT, DEFAULT_MAX_WORK_BITS, MAX_BACKOFF, LinkClient
    from anonml.transport._descriptors import DescriptorLimitError, fit_connection_caps, raise_descriptor_limit
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "DEFAULT_MAX_WORK_BITS",
    "WorkDemand",
    "FixedWork",
    "HELLO_BYTES",
    "HELLO_REPLY_BYTES",
    "LINK_VERSION",
    "TCP_NETWORK",
    "AckStatus",
    "AuthVerdict",
    "ConnectHook",
    "ConnectionGate",
    "Dial",
    "FairTurns",
    "GateRefusal",
    "GateSlot",
    "HelloStatus",
    "HttpLimits",
    "LinkClient",
    "LinkError",
    "LinkErrorReason",
    "LinkIdentity",
    "LinkLimits",
    "CONNECT_TIMEOUT",
    "MAX_BACKOFF",
    "LinkSessionStats",
    "Listeners",
    "MemoryHost",
    "MemoryListener",
    "MemoryNetwork",
    "MemorySocket",
    "MemoryStream",
    "Network",
    "RequestPacer",
    "SocketAddresses",
    "TcpNetwork",
    "check_positive_seconds",
    "connection_pair",
    "encode_hello",
    "encode_hello_reply",
    "listening_address",
    "parse_acks",
    "parse_hello_reply",
    "peer_address",
    "receive_exactly",
    "serve_http",
    "serve_http_on",
    "serve_link",
    "serve_streams",
    "socket_of",
    "tls_context",
    "DescriptorLimitError",
    "fit_connection_caps",
    "holding_room",
    "raise_descriptor_limit",
    "source_prefix",
]
