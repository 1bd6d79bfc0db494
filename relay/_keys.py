"""The relay's keys: a long-term identity and rotating Sphinx epoch keys.

Layout of the data directory (mode 0700; every key file 0600)::

    identity.key          32-byte X25519 private key; names the relay (node id)
    keys/epoch-<n>.key    32-byte X25519 private key for Sphinx key epoch n

The identity key only names the relay (``node_id_of`` its public key), so the
id stays stable while the packet keys rotate. Epoch ``n`` covers wall time
``[n·E, (n+1)·E)`` for the configured epoch length ``E``; the relay keeps the
current and the next epoch's key (the next is published ahead, so a round
manifest can name it before it starts) and erases the previous one once the
grace period after the boundary has passed. Erasing a key is what makes
packets processed under it undecryptable later (forward secrecy), and its
replay tags are erased with it (DESIGN.md §5: "erased with the epoch key"):
once the key is gone no packet built for it can be processed, so its tags
protect nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from anonml.crypto import generate_keypair, node_id_of, public_key_of
from anonml.base.storage import make_private_dir, read_secret_file, write_secret_file
from anonml.relay._errors import RelayDataDirError

IDENTITY_FILE = "identity.key"
KEYS_DIR = "keys"
_EPOCH_FILE = re.compile(r"^epoch-(\d{1,12})\.key$")
_KEY_BYTES = 32


@dataclass(frozen=True)
class EpochKey:
    """One Sphinx key epoch: ``epoch`` covers ``[valid_from, valid_until)``."""

    epoch: int
    private_key: bytes
    public_key: bytes
    valid_from: int
    valid_until: int


def _read_secret(path: Path) -> bytes:
    secret = read_secret_file(path, what="the relay key", max_bytes=_KEY_BYTES)
    if len(secret) != _KEY_BYTES:
        raise RelayDataDirError(f"{str(path)!r} does not hold a {_KEY_BYTES}-byte key")
    return secret


def create_identity(data_dir: Path, *, rng_bytes: Callable[[int], bytes] = os.urandom) -> bytes:
    """Create the identity key in ``data_dir``; returns its public key.

    Raises :class:`RelayDataDirError` if an identity already exists.
    ``rng_bytes`` (the round simulator's seeded source) draws the key.
    """
    make_private_dir(data_dir)
    make_private_dir(data_dir / KEYS_DIR)
    private, public = generate_keypair(rng_bytes=rng_bytes)
    try:
        write_secret_file(data_dir / IDENTITY_FILE, private)
    except FileExistsError:
        raise RelayDataDirError(
            f"{str(data_dir / IDENTITY_FILE)!r} exists: this relay is already initialised; refusing to overwrite"
        ) from None
    return public


def load_identity(data_dir: Path) -> tuple[bytes, bytes]:
    """``(node_id, identity public key)``; :class:`RelayDataDirError` if not initialised."""
    path = data_dir / IDENTITY_FILE
    if not path.exists():
        raise RelayDataDirError(f"no identity at {str(path)!r}: run `anonml relay init` first")
    dir_mode = data_dir.stat().st_mode
    if dir_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise RelayDataDirError(f"{str(data_dir)!r} is accessible by others (mode {oct(dir_mode & 0o777)}); chmod 700 it")
    public = public_key_of(_read_secret(path))
    return node_id_of(public), public


def load_identity_key(data_dir: Path) -> bytes:
    """The identity's X25519 private key: it authenticates the relay's links (protocol.LinkIdentity)."""
    load_identity(data_dir)  # the same checks: initialised, private
    return _read_secret(data_dir / IDENTITY_FILE)


class KeyRing:
    """The epoch keys on disk and which of them accept packets at a given time."""

    def __init__(self, data_dir: Path, *, epoch_seconds: int, grace_seconds: int) -> None:
        self._dir = data_dir / KEYS_DIR
        if not self._dir.is_dir():
            raise RelayDataDirError(f"no key directory {str(self._dir)!r}: run `anonml relay init` first")
        self.epoch_seconds = epoch_seconds
        self.grace_seconds = grace_seconds
        self._keys: dict[int, EpochKey] = {}
        for path in self._dir.iterdir():
            match = _EPOCH_FILE.match(path.name)
            if match:
                epoch = int(match.group(1))
                self._keys[epoch] = self._make(epoch, _read_secret(path))

    def _make(self, epoch: int, private: bytes) -> EpochKey:
        start = epoch * self.epoch_seconds
        return EpochKey(epoch, private, public_key_of(private), start, start + self.epoch_seconds)

    def epoch_of(self, now: float) -> int:
        return int(now // self.epoch_seconds)

    def rotate(self, now: float, *, rng_bytes: Callable[[int], bytes] = os.urandom) -> list[int]:
        """Create the current and next epoch keys if missing; erase expired ones.

        Returns the erased epochs (the caller erases their replay tags). A key
        for epoch ``n`` is erased once ``now >= (n+1)·E + grace``.
        """
        current = self.epoch_of(now)
        for epoch in (current, current + 1):
            if epoch not in self._keys:
                private, _ = generate_keypair(rng_bytes=rng_bytes)
                write_secret_file(self._dir / f"epoch-{epoch}.key", private)
                self._keys[epoch] = self._make(epoch, private)
        erased = [e for e, key in self._keys.items() if now >= key.valid_until + self.grace_seconds]
        for epoch in erased:
            (self._dir / f"epoch-{epoch}.key").unlink(missing_ok=True)
            del self._keys[epoch]
        return sorted(erased)

    def next_rotation(self, now: float) -> float:
        """The next wall time at which :meth:`rotate` has work to do."""
        current = self.epoch_of(now)
        candidates = [(current + 1) * self.epoch_seconds]
        candidates += [k.valid_until + self.grace_seconds for k in self._keys.values()]
        return min(t for t in candidates if t > now)

    def accepting(self, now: float) -> list[EpochKey]:
        """Keys that process packets at ``now``, current epoch first.

        The previous epoch's key stays accepted for the grace period after the
        boundary (packets built just before it are still in flight); the next
        epoch's key is accepted for the grace period before it (a sender whose
        clock runs slightly ahead).
        """
        current = self.epoch_of(now)
        accepted = [self._keys[current]] if current in self._keys else []
        previous = self._keys.get(current - 1)
        if previous is not None and now < previous.valid_until + self.grace_seconds:
            accepted.append(previous)
        upcoming = self._keys.get(current + 1)
        if upcoming is not None and now >= upcoming.valid_from - self.grace_seconds:
            accepted.append(upcoming)
        return accepted

    def published(self, now: float) -> list[EpochKey]:
        """The current and next epoch keys (what a directory should list)."""
        current = self.epoch_of(now)
        return [self._keys[e] for e in (current, current + 1) if e in self._keys]
