"""The root of every exception AnonML raises on purpose, and its four branches.

A caller that wants "anything AnonML refused or could not do" catches
:class:`AnonMLError`; one that must tell the kinds apart catches a branch:

- :class:`InputError`: something that came from outside (a packet, a token, a
  signed document, an API body, a CSV row, a round spec) is malformed or
  fails a check. Also a ``ValueError``: it is a bad value.
- :class:`TransportError`: talking to another machine failed (a link session,
  an HTTP request). Retrying later may help.
- :class:`ConfigError`: the operator's own setup cannot be used (a data
  directory, a key file's permissions, a config file, a flag).
- :class:`StorageError`: a local database could not be opened or a commit
  failed (a full or read-only disk, a schema from another version).

Refusals that are decisions rather than failures (a privacy budget that would
be exceeded, a peer declining a round) derive from :class:`AnonMLError`
directly. Each concrete class says who raises it and when.

:func:`explain` turns one of them (or an ``OSError``), also inside trio's
exception groups, into the one line a command-line user reads.
"""

from __future__ import annotations

__all__ = ["AnonMLError", "ConfigError", "InputError", "StorageError", "TransportError", "explain"]


class AnonMLError(Exception):
    """Base of every exception AnonML raises on purpose."""


class InputError(AnonMLError, ValueError):
    """Input from outside the process is malformed or fails a check."""


class TransportError(AnonMLError):
    """Talking to another machine failed (connection, timeout, protocol error)."""


class ConfigError(AnonMLError):
    """The operator's own configuration, keys or data directory cannot be used."""


class StorageError(AnonMLError):
    """A local database cannot be opened, read or committed."""


def explain(exc: BaseException) -> str | None:
    """The one-line message for a failure that is the operator's to fix, or None for a bug.

    AnonML's own errors carry their message (each names the fix where there
    is one); an ``OSError`` names the file or address it is about. trio
    wraps failures of concurrent tasks in exception groups: the first leaf
    that explains itself speaks for the group.
    """
    if isinstance(exc, BaseExceptionGroup):
        for leaf in exc.exceptions:
            message = explain(leaf)
            if message is not None:
                return message
        return None
    if isinstance(exc, AnonMLError):
        return " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    return None
