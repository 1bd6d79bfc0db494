"""The peer's long-term identity: one Ed25519 key pair in its data directory.

Registration proves control of this key (DESIGN.md §3 step 2); the roster lists
peers by its public half. Like the relay's keys (DESIGN.md §7) the files are
owner-only, ``init`` never overwrites them and loading never creates them.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

from nacl.signing import SigningKey

from anonml.base.errors import ConfigError
from anonml.base.storage import make_private_dir, read_secret_file, write_secret_file

IDENTITY_FILE = "identity.key"
PUBLIC_FILE = "identity.pub"
_SEED_BYTES = 32


class IdentityError(ConfigError):
    """Raised by :func:`init_identity` when an identity already exists and by
    :func:`load_identity` when there is none or its file is malformed or
    readable by others."""


@dataclass(frozen=True)
class PeerIdentity:
    """An Ed25519 signing key (the API's request builders take it) and its 32-byte public key."""

    signing_key: SigningKey

    @property
    def public_key(self) -> bytes:
        return bytes(self.signing_key.verify_key)

    @classmethod
    def generate(cls) -> PeerIdentity:
        return cls(SigningKey.generate())


def init_identity(data_dir: Path) -> PeerIdentity:
    """Create ``data_dir`` (mode 0700) and a fresh identity in it; never overwrite."""
    make_private_dir(data_dir)
    key_path = data_dir / IDENTITY_FILE
    if key_path.exists():
        raise IdentityError(f"an identity already exists at {str(key_path)!r}; refusing to overwrite it")
    identity = PeerIdentity.generate()
    seed = bytes(identity.signing_key)
    write_secret_file(key_path, seed.hex().encode() + b"\n")
    (data_dir / PUBLIC_FILE).write_text(identity.public_key.hex() + "\n")
    return identity


def load_identity(data_dir: Path) -> PeerIdentity:
    """Load the identity ``init_identity`` created; never create one."""
    key_path = data_dir / IDENTITY_FILE
    if not key_path.exists():
        raise IdentityError(f"no identity at {str(key_path)!r}; run `anonml peer init --data-dir {data_dir}` first")
    text = read_secret_file(key_path, what="the peer identity key", max_bytes=256).decode(errors="replace").strip()
    try:
        seed = bytes.fromhex(text)
    except ValueError:
        raise IdentityError(f"{str(key_path)!r} does not hold a hex key") from None
    if len(seed) != _SEED_BYTES:
        raise IdentityError(f"{str(key_path)!r} holds {len(seed)} bytes, expected {_SEED_BYTES}")
    return PeerIdentity(SigningKey(seed))
