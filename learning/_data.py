"""Tables: a CSV with a header (any table a feature spec describes) and the
UCI Adult ("Census Income") files.

Adult: ``adult.data`` (training) and ``adult.test`` from any directory. The
files are comma-separated with a space after each comma; ``adult.test`` starts
with a ``|1x3 Cross validator`` comment line and its labels end with a period;
missing values are ``?`` (kept as a category so the feature specification
decides where they go); blank lines are skipped.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from anonml.base.errors import InputError
from anonml.protocol import FeatureSpec

ADULT_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
)
ADULT_NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
ADULT_LABEL = "income"
ADULT_FILES = ("adult.data", "adult.test")
# A line longer than this is malformed, not data (bounded parser).
MAX_LINE_CHARS = 4096
# A CSV with more rows than this is refused (bounded parser).
MAX_CSV_ROWS = 10_000_000


class DataError(InputError):
    """Raised by the loaders for a missing directory or file, a malformed row
    (naming the file and line number) or an unknown column name."""


@dataclass(frozen=True)
class Table:
    """Raw columns (numeric as float64, categorical as str) and raw labels."""

    columns: dict[str, npt.NDArray[np.generic]]
    labels: npt.NDArray[np.str_]

    @property
    def n_rows(self) -> int:
        return int(self.labels.shape[0])

    def column(self, name: str) -> npt.NDArray[np.generic]:
        try:
            return self.columns[name]
        except KeyError:
            raise DataError(f"unknown feature {name!r}; columns are {sorted(self.columns)!r}") from None

    def rows(self, index: npt.ArrayLike) -> Table:
        """The table restricted to the given row indices."""
        rows = np.asarray(index)
        return Table({name: col[rows] for name, col in self.columns.items()}, self.labels[rows])


def finite_number(where: str, name: str, field: str) -> float:
    """``field`` of column ``name`` as a finite float; DataError naming ``where`` (``file:line``) otherwise."""
    try:
        number = float(field)
    except ValueError:
        raise DataError(f"{where}: {name!r} is not a number: {field[:40]!r}") from None
    if not math.isfinite(number):
        raise DataError(f"{where}: {name!r} is not finite: {field[:40]!r}")
    return number


def read_adult_file(path: Path) -> Table:
    """Parse one Adult file; see the module docstring for the format."""
    if not path.is_file():
        raise DataError(f"missing data file {str(path)!r}")
    values: list[list[str]] = [[] for _ in ADULT_COLUMNS]
    labels: list[str] = []
    numeric = [name in ADULT_NUMERIC for name in ADULT_COLUMNS]
    with path.open("r", encoding="utf-8", errors="strict", newline="") as handle:
        try:
            for line_number, line in enumerate(handle, start=1):
                if len(line) > MAX_LINE_CHARS:
                    raise DataError(f"{path.name}:{line_number}: line longer than {MAX_LINE_CHARS} characters")
                text = line.strip()
                if not text or text.startswith("|"):
                    continue
                fields = [f.strip() for f in text.split(",")]
                if len(fields) != len(ADULT_COLUMNS) + 1:
                    raise DataError(f"{path.name}:{line_number}: expected {len(ADULT_COLUMNS) + 1} fields, got {len(fields)}: {text[:80]!r}")
                for j, field in enumerate(fields[:-1]):
                    if not field:
                        raise DataError(f"{path.name}:{line_number}: empty field {ADULT_COLUMNS[j]!r}")
                    if numeric[j]:
                        finite_number(f"{path.name}:{line_number}", ADULT_COLUMNS[j], field)
                    values[j].append(field)
                label = fields[-1].removesuffix(".")
                if label not in (">50K", "<=50K"):
                    raise DataError(f"{path.name}:{line_number}: unknown label {fields[-1]!r}")
                labels.append(label)
        except UnicodeDecodeError as exc:
            raise DataError(f"{path.name}: not UTF-8 text ({exc.reason})") from None
    if not labels:
        raise DataError(f"{path.name}: no data rows")
    columns: dict[str, npt.NDArray[np.generic]] = {}
    for j, name in enumerate(ADULT_COLUMNS):
        columns[name] = np.asarray(values[j], dtype=np.float64) if numeric[j] else np.asarray(values[j], dtype=str)
    return Table(columns, np.asarray(labels, dtype=str))


def load_adult(directory: Path | str) -> tuple[Table, Table]:
    """``(train, test)`` from ``adult.data`` and ``adult.test`` in ``directory``."""
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"data directory {str(root)!r} does not exist")
    missing = [name for name in ADULT_FILES if not (root / name).is_file()]
    if missing:
        raise DataError(f"data directory {str(root)!r} lacks {missing!r}")
    return read_adult_file(root / "adult.data"), read_adult_file(root / "adult.test")


def read_csv_table(path: Path, spec: FeatureSpec) -> Table:
    """A table as CSV with a header naming every feature of ``spec`` and its
    label (other columns are ignored; numeric features must parse as finite
    numbers). Raises :class:`DataError` naming the line of the first
    malformed row."""
    needed = [*spec.names, spec.label.name]
    numeric = set(spec.numeric_names)
    values: dict[str, list[Any]] = {name: [] for name in needed}
    if not path.is_file():
        raise DataError(f"missing data file {str(path)!r}")
    try:
        with path.open("r", encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [name for name in needed if name not in (reader.fieldnames or [])]
            if missing:
                raise DataError(f"{path.name}:1: header lacks columns {missing!r}")
            for row in reader:
                line = reader.line_num
                if line > MAX_CSV_ROWS:
                    raise DataError(f"{path.name}:{line}: more than {MAX_CSV_ROWS} rows")
                for name in needed:
                    field = (row.get(name) or "").strip()
                    if not field:
                        raise DataError(f"{path.name}:{line}: empty field {name!r}")
                    values[name].append(finite_number(f"{path.name}:{line}", name, field) if name in numeric else field)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path.name}: not a readable CSV file ({exc})") from None
    if not values[spec.label.name]:
        raise DataError(f"{path.name}: no data rows")
    columns = {name: np.asarray(values[name], dtype=np.float64 if name in numeric else str) for name in spec.names}
    return Table(columns, np.asarray(values[spec.label.name], dtype=str))


def clip_table(spec: FeatureSpec, table: Table) -> tuple[Table, dict[str, int]]:
    """The table with every numeric feature clipped into its public bounds,
    and how many values of each were outside (``FeatureSpec.clip_columns``)."""
    columns, clipped = spec.clip_columns(table.columns)
    return Table({name: np.asarray(col) for name, col in columns.items()}, table.labels), clipped


def split_table(table: Table, test_fraction: float, rng: np.random.Generator) -> tuple[Table, Table]:
    """A seeded split into ``(train, test)``, stratified by label value."""
    test_rows = []
    for value in np.unique(table.labels):
        rows = np.flatnonzero(table.labels == value)
        test_rows.append(rng.choice(rows, size=int(round(test_fraction * rows.size)), replace=False))
    test_mask = np.zeros(table.n_rows, dtype=bool)
    test_mask[np.concatenate(test_rows)] = True
    return table.rows(np.flatnonzero(~test_mask)), table.rows(np.flatnonzero(test_mask))
