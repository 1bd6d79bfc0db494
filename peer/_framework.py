"""The thesis's framework for personal machine learning (chapter 3, §3.2).

Three functional units turn a peer's raw data into the one feature vector the
round asks for, on the peer's own machine (thesis Figure 4-2):

* an **importer** turns raw data from one source into timestamped *events*
  (a *dataset*; Table 3.1);
* an **instancer** defines the problem: it splits a dataset into *training
  examples*, each an instance dataset with its label (§3.1.3);
* a **featurizer** applies one *feature function* per feature to each training
  example and returns *feature vectors* (§3.1.4).

The aggregator dictates the instancer and featurizer (thesis §4.2, step 1): the
peer builds them from the round manifest's feature specification
(:mod:`peer._features`). Importers are per data source; :class:`CsvImporter`
reads a CSV file with a header row.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from anonml.base.errors import InputError

# A field's value: numbers for numeric measurements, text for categories
# (Table 3.1: "a field has a static type ... its value is immutable").
FieldValue = float | str

# Bounds on what the CSV importer will read: a peer's own file is not hostile,
# but a parser must be bounded and total (team rule; DESIGN.md §2).
MAX_CSV_BYTES = 64 * 1024 * 1024
MAX_CSV_FIELDS = 1024
MAX_FIELD_CHARS = 4096


class MalformedData(InputError):
    """Raised by an importer for raw data it cannot turn into events.

    ``line`` is the 1-based line number in the source file of the offending row
    (0 when the problem is the file as a whole).
    """

    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        where = f"line {line}: " if line else ""
        super().__init__(f"{where}{reason}")


class FeatureError(InputError):
    """Raised by an instancer or featurizer when a dataset lacks what a feature
    or the label needs, or holds a value outside the declared domain."""


@dataclass(frozen=True)
class Event:
    """One unit of measured data: named fields and an optional timestamp.

    ``timestamp`` is ``None`` for a static property (thesis Table 3.1);
    ``line`` is where the importer found it, so later errors can point there.
    """

    fields: Mapping[str, FieldValue]
    timestamp: float | None = None
    line: int = 0


@dataclass(frozen=True)
class Dataset:
    """A set of events belonging to one user (thesis Table 3.1)."""

    events: tuple[Event, ...]

    def __len__(self) -> int:
        return len(self.events)

    def latest(self, name: str) -> Event:
        """The most recent event carrying field ``name``.

        Static properties (no timestamp) rank before timed events; among equals
        the later-imported event wins.
        """
        best: Event | None = None
        for event in self.events:
            if name not in event.fields:
                continue
            if best is None or _sort_key(event) >= _sort_key(best):
                best = event
        if best is None:
            raise FeatureError(f"no event in the dataset has the field {name!r}")
        return best


def _sort_key(event: Event) -> float:
    return -math.inf if event.timestamp is None else event.timestamp


@dataclass(frozen=True)
class TrainingExample:
    """An instance dataset and its label (thesis §3.1.3); None when the round reads no label."""

    dataset: Dataset
    label: int | None


@dataclass(frozen=True)
class FeatureVector:
    """Named features and the label of one instance (thesis Table 3.1); the label is None when the round
    reads none (a statistics round whose queries never count it), and was then never computed."""

    features: Mapping[str, FieldValue]
    label: int | None

    def known_label(self) -> int:
        """The label, for a release that carries it; raises :class:`FeatureError` if none was computed."""
        if self.label is None:
            raise FeatureError("this round's pipeline reads no label, but a release needs one")
        return self.label


class Importer(Protocol):
    """Turns raw data from one source into a dataset (thesis Table 3.2, phase 2)."""

    def import_file(self, path: Path) -> Dataset: ...


class Instancer(Protocol):
    """Turns a dataset into labelled training examples (thesis §3.2, phase 3)."""

    def make_instances(self, dataset: Dataset) -> list[TrainingExample]: ...


@dataclass(frozen=True)
class FeatureFunction:
    """Computes one feature, a single field, from an instance dataset (§3.1.4)."""

    name: str
    compute: Callable[[Dataset], FieldValue]


@dataclass(frozen=True)
class Featurizer:
    """A set of feature functions (thesis §3.2, phase 4)."""

    functions: Sequence[FeatureFunction]

    def featurize(self, examples: Iterable[TrainingExample]) -> list[FeatureVector]:
        return [
            FeatureVector({f.name: f.compute(example.dataset) for f in self.functions}, example.label)
            for example in examples
        ]


@dataclass(frozen=True)
class EntityIsPeerInstancer:
    """The AnonML case (thesis §6.1): the entity is the peer, so its whole
    dataset is one training example; ``label`` computes the label from it
    (None: the round reads no label, and the example carries none)."""

    label: Callable[[Dataset], int] | None

    def make_instances(self, dataset: Dataset) -> list[TrainingExample]:
        if not dataset.events:
            raise FeatureError("the dataset has no events")
        return [TrainingExample(dataset, None if self.label is None else self.label(dataset))]


@dataclass(frozen=True)
class CsvImporter:
    """Reads a CSV file with a header row; each data row becomes one event.

    ``numeric`` names the columns whose values are numbers (parsed as floats,
    finite only); every other column is categorical text, stripped of
    surrounding blanks. ``required`` columns must be in the header; a missing
    one's entry in ``reasons`` (if any) says what needs it.
    ``timestamp_column``, if given, is parsed as the event's timestamp (seconds)
    and an empty cell means a static property. Empty lines are skipped.
    """

    numeric: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()
    reasons: Mapping[str, str] = field(default_factory=dict)
    timestamp_column: str | None = None
    missing_markers: frozenset[str] = field(default_factory=lambda: frozenset({""}))

    def import_file(self, path: Path) -> Dataset:
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise MalformedData(0, f"cannot read {str(path)!r}: {exc.strerror}") from None
        if size > MAX_CSV_BYTES:
            raise MalformedData(0, f"{str(path)!r} is {size} bytes, more than the limit {MAX_CSV_BYTES}")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise MalformedData(0, f"cannot read {str(path)!r}: {exc.strerror}") from None
        return self.import_bytes(raw)

    def import_bytes(self, raw: bytes) -> Dataset:
        if len(raw) > MAX_CSV_BYTES:
            raise MalformedData(0, f"input is {len(raw)} bytes, more than the limit {MAX_CSV_BYTES}")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise MalformedData(line, f"not UTF-8 text (byte {raw[exc.start]:#04x})") from None
        return self._import_lines(text.splitlines())

    def _import_lines(self, lines: list[str]) -> Dataset:
        header: list[str] | None = None
        header_line = 0
        events: list[Event] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            row = self._split(line, number)
            if header is None:
                header = self._check_header(row, number)
                header_line = number
                continue
            if len(row) != len(header):
                raise MalformedData(number, f"expected {len(header)} fields (header on line {header_line}), got {len(row)}: {line[:200]!r}")
            events.append(self._event(dict(zip(header, row, strict=True)), number))
        if header is None:
            raise MalformedData(0, "the file is empty (no header row)")
        return Dataset(tuple(events))

    @staticmethod
    def _split(line: str, number: int) -> list[str]:
        if len(line) > MAX_CSV_FIELDS * MAX_FIELD_CHARS:
            raise MalformedData(number, f"line is {len(line)} characters long")
        try:
            # One physical line per record: a quoted newline would shift every
            # later line number, so it is an error, not a continuation.
            rows = list(csv.reader(io.StringIO(line), strict=True))
        except csv.Error as exc:
            raise MalformedData(number, f"bad CSV quoting ({exc})") from None
        if len(rows) != 1:
            raise MalformedData(number, "a record spans several lines")
        row = rows[0]
        if len(row) > MAX_CSV_FIELDS:
            raise MalformedData(number, f"{len(row)} fields, more than the limit {MAX_CSV_FIELDS}")
        for cell in row:
            if len(cell) > MAX_FIELD_CHARS:
                raise MalformedData(number, f"a field of {len(cell)} characters, more than the limit {MAX_FIELD_CHARS}")
        return row

    def _check_header(self, row: list[str], number: int) -> list[str]:
        header = [name.strip() for name in row]
        if len(set(header)) != len(header):
            raise MalformedData(number, f"duplicate column names in the header: {header!r}")
        missing = sorted(self.required - set(header))
        if missing:
            why = "; ".join(f"{name!r} is {self.reasons[name]}" for name in missing if name in self.reasons)
            raise MalformedData(number, f"the header lacks the required columns {missing!r}" + (f" ({why})" if why else ""))
        return header

    def _event(self, row: dict[str, str], number: int) -> Event:
        fields: dict[str, FieldValue] = {}
        timestamp: float | None = None
        for name, cell in row.items():
            value = cell.strip()
            if name == self.timestamp_column:
                timestamp = None if value == "" else self._number(name, value, number)
                continue
            if value in self.missing_markers:
                continue  # a missing value: the event simply lacks the field
            fields[name] = self._number(name, value, number) if name in self.numeric else value
        return Event(fields, timestamp, number)

    @staticmethod
    def _number(name: str, value: str, number: int) -> float:
        try:
            parsed = float(value)
        except ValueError:
            raise MalformedData(number, f"column {name!r}: {value!r} is not a number") from None
        if not math.isfinite(parsed):
            raise MalformedData(number, f"column {name!r}: {value!r} is not a finite number")
        return parsed
