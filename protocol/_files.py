"""Key files every role writes the same way (DESIGN.md §7: keys are never silently replaced)."""

from __future__ import annotations

import os
from pathlib import Path


def write_secret_file(path: Path, secret: bytes) -> None:
    """Create ``path`` readable by its owner only (0600) and write ``secret`` durably.

    Raises FileExistsError if ``path`` exists: ``O_EXCL`` makes the check and
    the creation one step, so two concurrent ``init`` runs cannot both believe
    they created the key.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(secret)
        while view:
            view = view[os.write(descriptor, view) :]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
