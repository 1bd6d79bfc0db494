"""Parameter checks shared by every mechanism.

Each check raises ``ValueError`` naming the parameter and quoting the offending
value; nothing is clipped or coerced silently.
"""

from __future__ import annotations

import math

import numpy as np


def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    """Return ``epsilon`` as a float if it is a real number (not a string or
    bool), finite and > 0."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a positive finite number, got {epsilon!r}")
    value = float(epsilon)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be a positive finite number, got {epsilon!r}")
    return value


def check_probability(value: float, name: str) -> float:
    """Return ``value`` as a float if it is a real number strictly inside (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    result = float(value)
    if not (0.0 < result < 1.0):
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    return result


def check_positive_int(value: int, name: str, minimum: int = 1) -> int:
    """Return ``value`` if it is an integer (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_values(values: np.ndarray, m: int, name: str = "values") -> np.ndarray:
    """Return ``values`` as an int64 vector after checking every entry is in {0..m-1}."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {array.shape!r}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must have an integer dtype, got {array.dtype!r}")
    array = array.astype(np.int64, copy=False)
    if array.size:
        bad = (array < 0) | (array >= m)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name}[{first}] = {int(array[first])!r} is outside the domain {{0..{m - 1}}}")
    return array


def check_counts(counts: np.ndarray, m: int, n: int) -> np.ndarray:
    """Return ``counts`` as floats after checking it is a length-``m`` vector of
    non-negative counts summing to ``n``."""
    array = np.asarray(counts, dtype=np.float64)
    if array.shape != (m,):
        raise ValueError(f"counts must have shape ({m},), got {array.shape!r}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"counts must be finite and non-negative, got {array!r}")
    if not math.isclose(float(array.sum()), n, rel_tol=1e-9, abs_tol=1e-9):
        raise ValueError(f"counts must sum to n={n!r}, got sum {float(array.sum())!r}")
    return array
