"""AnonML: anonymous, locally differentially private learning.

Everything installs under this one name. The packages, lowest layer first:

- ``anonml.crypto``, ``anonml.mechanisms``: Sphinx packets and anonymous
  tokens; local-DP mechanisms and the privacy ledger;
- ``anonml.protocol``, ``anonml.learning``: the vocabulary every role shares
  (manifest, survey ids, wire formats, schedules, plans); the learner;
- ``anonml.relay``, ``anonml.peer``, ``anonml.aggregator``: the three roles;
- ``anonml.cli``, the demo and ``anonml.bench``: the ``anonml`` command.

Each lives in its own top-level folder of the source tree (``relay/``,
``peer/``, …) and is linked into this package.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
