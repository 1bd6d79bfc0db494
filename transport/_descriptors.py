"""The process's open-file limit, and connection caps that fit inside it (issue 25).

Every admitted connection holds a file descriptor. Issue 25 measured a relay
and an aggregator under ``RLIMIT_NOFILE`` 256 (a common default): the HTTP
gate admitted 512 connections whatever the limit, slow bodies used up the
descriptors, and accept() failed with EMFILE for everyone (1 HTTP answer and
1 relay-to-sink packet in 8 s). So a server, at start:

1. raises its soft limit to the hard limit (:func:`raise_descriptor_limit`);
2. sizes its connection caps to what is left after the descriptors it needs
   for itself (its store, listeners, outgoing links, worker pipes):
   :func:`fit_connection_caps` gives each listener its minimum, then shares
   the rest in proportion to what it asks for, so the gates refuse or evict
   before the kernel does;
3. refuses to start, with one line that says how to fix it, when even the
   minimums do not fit.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping

from anonml.base.errors import ConfigError
from anonml.transport._admission import holding_room


class DescriptorLimitError(ConfigError):
    """Raised by :func:`fit_connection_caps` when the open-file limit cannot hold a server's minimum."""


def raise_descriptor_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # macOS refuses RLIM_INFINITY (and values above kern.maxfilesperproc)
            pass
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def fit_connection_caps(
    wanted: Mapping[str, int], minimum: Mapping[str, int], *, reserve: int, limit: int, server: str
) -> dict[str, int]:
    """Connection caps per listener that, with ``reserve`` other descriptors, fit in ``limit``.

    Each listener gets what it wants when everything fits; otherwise its
    minimum plus a share of the rest in proportion to what it wanted beyond
    it. A listener of cap ``c`` also holds up to ``holding_room(c)`` refused
    connections open (:meth:`ConnectionGate.turn_away`), so it is counted as
    ``c + holding_room(c)`` descriptors. Raises :class:`DescriptorLimitError`
    (one line naming ``server`` and the limit it needs) when the minimums and
    the reserve do not fit.
    """

    def descriptors(caps: Mapping[str, int]) -> int:
        return sum(cap + holding_room(cap) for cap in caps.values())

    needed = reserve + descriptors(minimum)
    if limit < needed:
        raise DescriptorLimitError(
            f"{server}: the open-file limit (RLIMIT_NOFILE) is {limit}, below the {needed} it needs "
            f"({reserve} for itself, {', '.join(f'{n} {name}' for name, n in minimum.items())} connections "
            f"and the refused ones each holds a moment); raise it (`ulimit -n {max(needed, 1024)}`, or "
            f"LimitNOFILE= in a systemd unit)"
        )
    if reserve + descriptors(wanted) <= limit:
        return dict(wanted)
    # holding_room(c) <= c // 4 + 1: slots of at most 4/5 of what is left after one held connection each.
    spare = (limit - reserve - len(wanted)) * 4 // 5 - sum(minimum.values())
    beyond = {name: max(0, wanted[name] - minimum[name]) for name in wanted}
    total_beyond = sum(beyond.values())
    return {name: minimum[name] + (max(0, spare) * beyond[name] // total_beyond if total_beyond else 0)
            for name in wanted}
