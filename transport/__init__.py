"""The network servers and clients every role runs: the relay link and the public HTTP servers.

``anonml.protocol`` says *what* the roles exchange (documents, wire formats,
rules); this package carries it: the relay link's framed TCP stream and its
client (:func:`serve_link`, :class:`LinkClient`), the HTTP/1.1 servers behind
our own listener (:func:`serve_http`), and the admission that bounds what one
source may take of either (:class:`ConnectionGate`, :class:`RequestPacer`).
"""

from __future__ import annotations

from anonml.transport._admission import ConnectionGate, GateRefusal, GateSlot, RequestPacer, peer_address
from anonml.transport._http import HttpLimits, serve_http, serve_http_on, tls_context
from anonml.transport._link import (
    HELLO_BYTES,
    HELLO_REPLY_BYTES,
    LINK_VERSION,
    AckStatus,
    AuthVerdict,
    HelloStatus,
    LinkClient,
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
)

__all__ = [
    "HELLO_BYTES",
    "HELLO_REPLY_BYTES",
    "LINK_VERSION",
    "AckStatus",
    "AuthVerdict",
    "ConnectionGate",
    "GateRefusal",
    "GateSlot",
    "HelloStatus",
    "HttpLimits",
    "LinkClient",
    "LinkError",
    "LinkErrorReason",
    "LinkIdentity",
    "LinkLimits",
    "LinkSessionStats",
    "RequestPacer",
    "check_positive_seconds",
    "encode_hello",
    "encode_hello_reply",
    "parse_acks",
    "parse_hello_reply",
    "peer_address",
    "receive_exactly",
    "serve_http",
    "serve_http_on",
    "serve_link",
    "tls_context",
]
