"""AnonML: anonymous, locally differentially private learning.

Everything installs under this one name. The packages, lowest layer first:

- ``anonml.base``: the ground floor (typed errors, SQLite storage, display,
  process set-up);
- ``anonml.crypto``, ``anonml.mechanisms``: Sphinx packets and anonymous
  tokens; local-DP mechanisms and the privacy ledger;
- ``anonml.protocol``: the vocabulary every role shares (manifest, survey
  ids, documents, wire formats, schedules, plans);
- ``anonml.transport``, ``anonml.learning``: the link and HTTP servers and
  clients that carry it; the learner;
- ``anonml.relay``, ``anonml.peer``, ``anonml.aggregator``: the three roles;
- this folder, the top floor: ``anonml.cli`` (the ``anonml`` command), the
  demo, ``anonml.bench``, ``anonml.fuzz`` and ``anonml.testing``.

Each package below the top floor is a top-level folder of the source tree
(``relay/``, ``base/``, …) that ``pyproject.toml`` maps to its name here.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
