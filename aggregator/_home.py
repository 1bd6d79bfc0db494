"""The aggregator's data directory: its two keys, written once, and one folder per round."""

from __future__ import annotations

from pathlib import Path

from nacl.signing import SigningKey

from anonml.base.errors import ConfigError
from anonml.base.storage import make_private_dir, read_secret_file, write_secret_file


class AggregatorHome:
    """The aggregator's data directory (owner-only).

    ``identity.key`` (Ed25519 seed) and ``final_hop.key`` (X25519 private key)
    are created once by ``anonml aggregator init``; each round lives in
    ``rounds/<round_id hex>/`` with its SQLite database and report files.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def identity_path(self) -> Path:
        return self.root / "identity.key"

    @property
    def final_hop_path(self) -> Path:
        return self.root / "final_hop.key"

    def initialise(self, identity_seed: bytes, final_hop_private: bytes) -> None:
        """Write both keys; refuses to overwrite an existing identity (FileExistsError)."""
        make_private_dir(self.root)
        for path, secret in ((self.identity_path, identity_seed), (self.final_hop_path, final_hop_private)):
            write_secret_file(path, secret)

    def signing_key(self) -> SigningKey:
        """The aggregator's Ed25519 identity: it signs manifests and rosters; relays pin its public half."""
        return SigningKey(self.read_key(self.identity_path))

    def read_key(self, path: Path) -> bytes:
        """A 32-byte key file of this home; ConfigError (naming the fix) if it is missing, open to others or malformed."""
        if not path.exists():
            raise ConfigError(f"{str(path)!r} is missing: run `anonml aggregator init --data-dir {self.root}` first")
        data = read_secret_file(path, what="the aggregator key", max_bytes=32)
        if len(data) != 32:
            raise ConfigError(f"{str(path)!r} holds {len(data)} bytes, expected 32")
        return data

    def round_dir(self, round_id: bytes) -> Path:
        return self.root / "rounds" / round_id.hex()

    def rounds(self) -> list[str]:
        base = self.root / "rounds"
        return sorted(p.name for p in base.iterdir()) if base.is_dir() else []
