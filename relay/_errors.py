"""The relay's exceptions (each raised only where its docstring says)."""

from __future__ import annotations

from anonml.base.errors import ConfigError


class RelayConfigError(ConfigError):
    """Raised by :func:`relay.load_config` and ``anonml relay init`` for a
    config file or option that is missing, malformed or out of range."""


class RelayDataDirError(ConfigError):
    """Raised by the key store when the data directory is not initialised
    (``run``/``info`` never create an identity), is already initialised
    (``init`` never overwrites), or has unsafe permissions."""
