"""The statistic queries a requester names for a statistics round (``[task] queries``, issue 28).

A query is one short string, ``KIND:SUBJECT[:LEVEL]``:

* ``count:label``: how many peers hold a positive label (the only query about the label);
* ``count:F=V``: how many peers hold value ``V`` of categorical feature ``F`` (``V`` one of its
  bins: a category, or a bucket's name when ``F`` groups its categories), and their share;
* ``histogram:F``: the count of every bin of feature ``F``;
* ``mean:F``: the mean of numeric feature ``F`` (of its bins' midpoints);
* ``quantile:F:Q``: the level-``Q`` quantile of numeric ``F``, ``0 < Q < 1``, on the grid of its cut points.

The manifest signs the queries in their canonical spelling (:attr:`StatisticQuery.text`)
and, beside them, exactly the features they need: a peer releases nothing a query does
not use, and no label when no query counts it (:func:`uses_label`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from anonml.base.errors import InputError
from anonml.protocol._features import CategoricalFeature, FeatureSpec

MAX_QUERIES = 64
LABEL_SUBJECT = "label"
"""The subject of ``count:label``: the round's label, whatever its name."""


class QueryError(InputError):
    """A statistic query that does not parse or does not fit the round's features."""


class QueryKind(StrEnum):
    COUNT = "count"
    HISTOGRAM = "histogram"
    MEAN = "mean"
    QUANTILE = "quantile"


QUERY_KINDS = tuple(QueryKind)


@dataclass(frozen=True)
class StatisticQuery:
    """One parsed query: its kind, its subject (a feature, or ``label``), a quantile's level and
    the value a count of a categorical feature counts."""

    kind: QueryKind
    subject: str
    level: float | None = None
    category: str | None = None

    @property
    def text(self) -> str:
        """The canonical spelling (what the manifest signs): the level as Python's shortest repr."""
        counted = "" if self.category is None else f"={self.category}"
        return f"{self.kind}:{self.subject}{counted}" + ("" if self.level is None else f":{self.level!r}")

    @property
    def uses_label(self) -> bool:
        return self.kind == QueryKind.COUNT and self.category is None

    @property
    def feature(self) -> str | None:
        """The feature the query reads (None for the label count)."""
        return None if self.uses_label else self.subject

    @classmethod
    def parse(cls, text: object) -> StatisticQuery:
        """Parse one query's syntax (:func:`check_queries` checks it against the features)."""
        if not isinstance(text, str) or not 0 < len(text) <= 200:
            raise QueryError(f"expected a string such as 'mean:age', got {text!r}")
        kind_text, _, rest = text.partition(":")
        if kind_text not in QUERY_KINDS:
            raise QueryError(f"{text!r}: the kind must be one of {', '.join(QUERY_KINDS)}, got {kind_text!r}")
        kind = QueryKind(kind_text)
        if kind == QueryKind.COUNT:
            return cls._parse_count(text, rest)
        parts = rest.split(":")
        if kind == QueryKind.QUANTILE:
            if len(parts) != 2 or not parts[0]:
                raise QueryError(f"{text!r}: a quantile query is 'quantile:FEATURE:LEVEL', e.g. 'quantile:age:0.5'")
            try:
                level = float(parts[1])
            except ValueError:
                raise QueryError(f"{text!r}: the level {parts[1]!r} is not a number") from None
            if not 0 < level < 1:
                raise QueryError(f"{text!r}: the level must lie strictly between 0 and 1, got {parts[1]}")
            return cls(kind, parts[0], level)
        if len(parts) != 1 or not parts[0]:
            raise QueryError(f"{text!r}: a {kind} query is '{kind}:FEATURE'")
        return cls(kind, parts[0])

    @classmethod
    def _parse_count(cls, text: str, rest: str) -> StatisticQuery:
        """``count:label``, or ``count:F=V`` (split at the first ``=``: a value may hold one, a feature's name may not)."""
        feature, equals, category = rest.partition("=")
        if not equals:
            if rest != LABEL_SUBJECT:
                raise QueryError(f"{text!r}: a count query is 'count:{LABEL_SUBJECT}' (the positive labels) "
                                 "or 'count:FEATURE=VALUE' (a categorical feature's value), e.g. 'count:sex=Female'")
            return cls(QueryKind.COUNT, LABEL_SUBJECT)
        if not feature or not category:
            raise QueryError(f"{text!r}: a count of a value is 'count:FEATURE=VALUE', e.g. 'count:sex=Female'")
        return cls(QueryKind.COUNT, feature, category=category)


def check_queries(texts: object, spec: FeatureSpec) -> tuple[StatisticQuery, ...]:
    """Parse a list of queries against the round's features (``spec``).

    Raises :class:`QueryError` whose message starts with the offending entry's index
    (``[2] ...``) so the caller can name the field.
    """
    if not isinstance(texts, list) or not 1 <= len(texts) <= MAX_QUERIES:
        raise QueryError(f"expected a list of 1 to {MAX_QUERIES} queries, got {texts!r}")
    queries: list[StatisticQuery] = []
    for index, text in enumerate(texts):
        try:
            query = StatisticQuery.parse(text)
        except QueryError as exc:
            raise QueryError(f"[{index}] {exc}") from None
        if query.feature is not None and query.feature not in spec.names:
            raise QueryError(f"[{index}] {text!r}: {query.feature!r} is not a feature of the task ({', '.join(spec.names)})")
        if query.kind in (QueryKind.MEAN, QueryKind.QUANTILE) and query.subject not in spec.numeric_names:
            raise QueryError(f"[{index}] {text!r}: a {query.kind} needs a numeric feature; {query.subject!r} is categorical")
        if query.category is not None:
            _check_counted_value(f"[{index}] {text!r}", spec, query.subject, query.category)
        if query in queries:
            raise QueryError(f"[{index}] {text!r}: asked twice")
        queries.append(query)
    return tuple(queries)


def counted_bin(feature: CategoricalFeature, value: str) -> int:
    """The bin of ``feature`` that ``count:F=value`` counts (raises :class:`QueryError` if none is ``value``)."""
    if value in feature.bin_names:
        return feature.bin_names.index(value)
    if feature.buckets is not None and value in feature.categories:
        bucket = next(name for name, members in feature.buckets if value in members)
        raise QueryError(f"{value!r} is in bucket {bucket!r} of {feature.name!r}, and a report carries only the bucket: "
                         f"count 'count:{feature.name}={bucket}'")
    shown = ", ".join(feature.bin_names[:12]) + (", ..." if feature.n_bins > 12 else "")
    raise QueryError(f"{value!r} is not a value of {feature.name!r} ({shown})")


def _check_counted_value(where: str, spec: FeatureSpec, name: str, value: str) -> None:
    feature = spec.feature(name)
    if not isinstance(feature, CategoricalFeature):
        raise QueryError(f"{where}: a count of a value needs a categorical feature; {name!r} is numeric (ask 'histogram:{name}')")
    try:
        counted_bin(feature, value)
    except QueryError as exc:
        raise QueryError(f"{where}: {exc}") from None


def queried_features(queries: Sequence[StatisticQuery], order: Sequence[str]) -> tuple[str, ...]:
    """The features the queries read, in the task's ``order``."""
    read = {query.feature for query in queries}
    return tuple(name for name in order if name in read)


def uses_label(queries: Sequence[StatisticQuery]) -> bool:
    """Whether the reports must carry the label: only ``count:label`` reads it."""
    return any(query.uses_label for query in queries)


def default_queries(features: Sequence[str], numeric: Sequence[str]) -> tuple[StatisticQuery, ...]:
    """What a statistics round without ``queries`` answers: the positive count, every feature's
    histogram, every numeric feature's mean and median."""
    queries = [StatisticQuery(QueryKind.COUNT, LABEL_SUBJECT)]
    for name in features:
        queries.append(StatisticQuery(QueryKind.HISTOGRAM, name))
        if name in numeric:
            queries += [StatisticQuery(QueryKind.MEAN, name), StatisticQuery(QueryKind.QUANTILE, name, 0.5)]
    return tuple(queries)
