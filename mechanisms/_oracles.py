"""The frequency-oracle policy (DESIGN.md §8): the oracles by name, and
``auto``, which picks the lowest exact expected error for (epsilon, m, n)
among those whose report fits the packet and whose estimation fits the
work budget. The oracles are in ``_unary`` and ``_hashing``, their shared
contract in ``_oracle_base``.
"""

from __future__ import annotations

from anonml.base.display import one_of
from anonml.mechanisms._errors import EpsilonOutOfRange
from anonml.mechanisms._hashing import HadamardResponse, OptimizedLocalHashing
from anonml.mechanisms._names import OracleName
from anonml.mechanisms._oracle_base import FrequencyOracle
from anonml.mechanisms._unary import (
    GeneralizedRandomResponse,
    OptimizedPQEncoding,
    OptimizedUnaryEncoding,
    SubsetSelection,
    SymmetricUnaryEncoding,
)
from anonml.mechanisms._validate import check_positive_int

# ``auto``'s defaults. A report travels inside one Sphinx packet (DESIGN.md
# §5, 2 KiB by default) beside the token (~300 bytes) and the survey id;
# 1 KiB leaves that room. Estimation work is counted in element operations
# (``FrequencyOracle.estimate_work``): OLH's hashing took 48 ns per element
# here (``anonml bench mechanisms``, 2 loaded cores), so 2^28 is about 13 s;
# OLH at n = 1e5 and m = 1e6 would be 1e11.
DEFAULT_MAX_REPORT_BYTES = 1024
DEFAULT_MAX_ESTIMATE_WORK = 1 << 28


_ORACLE_CLASSES: dict[str, type[FrequencyOracle]] = {
    cls.name: cls
    for cls in (
        GeneralizedRandomResponse,
        SymmetricUnaryEncoding,
        OptimizedPQEncoding,
        OptimizedUnaryEncoding,
        OptimizedLocalHashing,
        SubsetSelection,
        HadamardResponse,
    )
}

ORACLE_NAMES: tuple[str, ...] = tuple(OracleName)


def make_oracle(
    name: str,
    epsilon: float,
    m: int,
    *,
    n: int | None = None,
    max_report_bytes: int = DEFAULT_MAX_REPORT_BYTES,
    max_estimate_work: int = DEFAULT_MAX_ESTIMATE_WORK,
) -> FrequencyOracle:
    """Build the oracle called ``name`` (an :class:`OracleName`) for (epsilon, m).

    ``"auto"`` needs ``n`` and returns, among the concrete oracles whose
    epsilon range holds ``epsilon``, whose report fits ``max_report_bytes``
    (what fits the packet: the caller passes its budget) and whose
    estimation for ``n`` reports costs at most ``max_estimate_work`` element
    operations (memory is bounded for all of them: estimation is blockwise),
    the one with the lowest exact expected error ``variance(n)``. Ties go to
    the earlier name in :class:`OracleName`. A concrete name ignores the two
    limits. Raises :class:`EpsilonOutOfRange` when nothing qualifies.
    """
    try:
        chosen = OracleName(name)
    except ValueError:
        raise ValueError(f"name must be one of {one_of(ORACLE_NAMES)}, got {name!r}") from None
    if chosen != OracleName.AUTO:
        return _ORACLE_CLASSES[chosen](epsilon, m)
    if n is None:
        raise ValueError("n is required for the 'auto' oracle, got None")
    n = check_positive_int(n, "n", minimum=1)
    best: FrequencyOracle | None = None
    for cls in _ORACLE_CLASSES.values():
        try:
            candidate = cls(epsilon, m)
        except EpsilonOutOfRange:
            continue
        except ValueError:
            if cls is OptimizedLocalHashing:  # m too large for its hash family
                continue
            raise
        if candidate.report_bytes > max_report_bytes or candidate.estimate_work(n) > max_estimate_work:
            continue
        # Relative slack so that mathematically equal variances (SS with
        # k = 1 is GRR) tie on rounding and go to the earlier name.
        if best is None or candidate.variance(n) < best.variance(n) * (1 - 1e-12):
            best = candidate
    if best is None:
        raise EpsilonOutOfRange(
            f"no frequency oracle holds epsilon={epsilon!r} for m={m!r} with reports of at most "
            f"{max_report_bytes!r} bytes and estimation work of at most {max_estimate_work!r} for n={n!r}"
        )
    return best
