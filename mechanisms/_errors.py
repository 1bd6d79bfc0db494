"""The exceptions of the ``mechanisms`` package.

:class:`InvalidReport` is an :class:`~anonml.base.errors.InputError` (a bad value
from outside); :class:`BudgetExceeded` is a refusal, not a failure.
"""

from __future__ import annotations

from anonml.base.errors import AnonMLError, InputError


class InvalidReport(InputError):
    """A perturbed report that no honest peer could have produced.

    Raised by ``FrequencyOracle.decode_reports`` (wrong length, wrong type,
    impossible value such as a set padding bit or a subset of the wrong size)
    and by ``FrequencyOracle.estimate`` and the numeric mechanisms' ``estimate``
    when a report array holds an impossible value. The aggregator counts these
    as rejections by reason; the message names the first offending report.
    """


class BudgetExceeded(AnonMLError):
    """A release would push a peer's total epsilon past the
    ``epsilon_total`` it was promised.

    Raised by ``PrivacyLedger.record_median`` and ``PrivacyLedger.record_subset``;
    when it is raised the ledger has recorded nothing.
    """


class EpsilonOutOfRange(InputError):
    """An epsilon outside the range in which a mechanism's probabilities stay
    randomised in floating point (see ``mechanisms._sampling``), or one that
    is degenerate (too small for its probabilities to differ).

    Raised by every mechanism's constructor and by ``make_oracle``; the
    message quotes the epsilon and the mechanism's range. It is a
    ``ValueError`` (through :class:`~anonml.base.errors.InputError`).
    """
