"""The feature specification: what a peer computes, how it bins it, and how a
feature subset plus the label becomes one categorical value.

Peer and aggregator must bin and encode identically, so both take the rules
from one declared :class:`FeatureSpec`, carried in the round manifest
(DESIGN.md §4: "features with type, domain or bounds, binning rule"). Thesis
§7.1–7.2: numeric features are binned around privately estimated medians (or
``q`` quantiles, giving ``q + 1`` bins); high-cardinality categoricals are
bucketed; each partial feature vector (a subset's bins and the label) is then
one value of a domain of size ``m = (prod of the subset's bins) * 2``
(``2^(k_s+1)`` for binary features).
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Union

import numpy as np
import numpy.typing as npt

from anonml.base.errors import InputError

# Bounds on what a manifest may declare, so a hostile document cannot make a
# peer allocate without limit (every parser is bounded).
MAX_FEATURES = 256
MAX_CATEGORIES = 1024
MAX_QUANTILES = 64
MAX_NAME_CHARS = 128
MAX_DOMAIN = 1 << 20
# A feature-spec file larger than this is not a feature spec (bounded parser).
MAX_SPEC_BYTES = 1 << 20

IntArray = npt.NDArray[np.int64]


class FeatureSpecError(InputError):
    """Raised when a feature specification, a feature subset, or values to bin
    do not fit the declared rules; the message names the field and the value."""


def _check_name(field: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise FeatureSpecError(f"{field}: expected a non-empty string of at most {MAX_NAME_CHARS} characters, got {value!r}")
    return value


def _check_str_list(field: str, value: object, limit: int) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not value or len(value) > limit:
        raise FeatureSpecError(f"{field}: expected a non-empty list of at most {limit} strings, got {value!r}")
    items = tuple(_check_name(f"{field}[{i}]", v) for i, v in enumerate(value))
    if len(set(items)) != len(items):
        raise FeatureSpecError(f"{field}: duplicate entries in {value!r}")
    return items


def _check_keys(field: str, data: object, required: Collection[str], optional: Collection[str] = ()) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise FeatureSpecError(f"{field}: expected a mapping, got {data!r}")
    keys = set(data)
    missing = set(required) - keys
    if missing:
        raise FeatureSpecError(f"{field}: missing key(s) {sorted(missing)!r}")
    unknown = keys - set(required) - set(optional)
    if unknown:
        raise FeatureSpecError(f"{field}: unknown key(s) {sorted(map(str, unknown))!r}")
    return data


def encode_cells(radices: Sequence[int], bins: IntArray, labels: IntArray) -> IntArray:
    """Mixed-radix code of ``(bins, label)``: the first feature most
    significant, the label least significant, so ``code // 2`` is the cell of
    the features alone. Inputs are assumed in range (callers validate)."""
    code = np.zeros(bins.shape[0], dtype=np.int64)
    for j, radix in enumerate(radices):
        code = code * radix + bins[:, j]
    return code * 2 + labels


def decode_cells(radices: Sequence[int], codes: IntArray) -> tuple[IntArray, IntArray]:
    """Inverse of :func:`encode_cells`: ``(bins (n, k), labels (n,))``."""
    labels = codes % 2
    rest = codes // 2
    bins = np.empty((codes.shape[0], len(radices)), dtype=np.int64)
    for j in range(len(radices) - 1, -1, -1):
        bins[:, j] = rest % radices[j]
        rest = rest // radices[j]
    return bins, labels


@dataclass(frozen=True)
class NumericFeature:
    """A numeric feature with public bounds for the private quantile search
    (thesis Algorithm 1 needs "an educated guess about the minimum and maximum").

    ``quantiles`` cut points split it into ``quantiles + 1`` bins; 1 means the
    thesis's median binning (§7.2). A value ``v`` falls in bin
    ``#{cut points c : v > c}``.
    """

    name: str
    low: float
    high: float
    quantiles: int = 1

    def __post_init__(self) -> None:
        _check_name("feature.name", self.name)
        for field in ("low", "high"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                raise FeatureSpecError(f"feature {self.name!r}.{field}: expected a finite number, got {value!r}")
        if not self.low < self.high:
            raise FeatureSpecError(f"feature {self.name!r}.high: must exceed low={self.low!r}, got {self.high!r}")
        if isinstance(self.quantiles, bool) or not isinstance(self.quantiles, int) or not 1 <= self.quantiles <= MAX_QUANTILES:
            raise FeatureSpecError(f"feature {self.name!r}.quantiles: expected an integer in [1, {MAX_QUANTILES}], got {self.quantiles!r}")

    kind = "numeric"

    @property
    def n_bins(self) -> int:
        return self.quantiles + 1

    @property
    def quantile_levels(self) -> tuple[float, ...]:
        """The probability levels of the cut points: (1/2,) for the median."""
        return tuple((i + 1) / (self.quantiles + 1) for i in range(self.quantiles))

    def clip(self, values: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], int]:
        """``values`` clipped into the public bounds ``[low, high]`` (what the
        quantile search assumes), and how many were outside them."""
        column = np.asarray(values, dtype=np.float64)
        outside = int(np.count_nonzero((column < self.low) | (column > self.high)))
        return np.clip(column, self.low, self.high), outside

    def bin(self, values: npt.ArrayLike, cut_points: Sequence[float]) -> IntArray:
        cuts = np.asarray(cut_points, dtype=np.float64)
        if cuts.shape != (self.quantiles,) or not np.all(np.isfinite(cuts)) or np.any(np.diff(cuts) < 0):
            raise FeatureSpecError(f"feature {self.name!r}: expected {self.quantiles} finite non-decreasing cut points, got {cut_points!r}")
        column = np.asarray(values, dtype=np.float64)
        if column.ndim != 1 or not np.all(np.isfinite(column)):
            raise FeatureSpecError(f"feature {self.name!r}: values must be a 1-d array of finite numbers")
        # side="left" counts cut points strictly below v, i.e. "v > c" as the
        # peer's ISGREATER answer in Algorithm 1 defines it.
        return np.searchsorted(cuts, column, side="left").astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": "numeric", "low": self.low, "high": self.high, "quantiles": self.quantiles}


@dataclass(frozen=True)
class CategoricalFeature:
    """A categorical feature: its raw categories, optionally grouped into
    buckets to lower the histogram's cardinality (thesis §7.1, §8.1.2).

    Without ``buckets`` each category is its own bin, in the listed order.
    With ``buckets`` (bucket name -> categories) every category must be in
    exactly one bucket; the bins are the buckets in the listed order.
    """

    name: str
    categories: tuple[str, ...]
    buckets: tuple[tuple[str, tuple[str, ...]], ...] | None = None

    def __post_init__(self) -> None:
        _check_name("feature.name", self.name)
        object.__setattr__(self, "categories", _check_str_list(f"feature {self.name!r}.categories", self.categories, MAX_CATEGORIES))
        if self.buckets is None:
            return
        if not isinstance(self.buckets, (list, tuple)) or not self.buckets:
            raise FeatureSpecError(f"feature {self.name!r}.buckets: expected a non-empty list, got {self.buckets!r}")
        seen: dict[str, str] = {}
        buckets: list[tuple[str, tuple[str, ...]]] = []
        for entry in self.buckets:
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise FeatureSpecError(f"feature {self.name!r}.buckets: expected (name, categories) pairs, got {entry!r}")
            bucket = _check_name(f"feature {self.name!r}.buckets name", entry[0])
            members = _check_str_list(f"feature {self.name!r}.buckets[{bucket!r}]", entry[1], MAX_CATEGORIES)
            for category in members:
                if category not in self.categories:
                    raise FeatureSpecError(f"feature {self.name!r}.buckets[{bucket!r}]: unknown category {category!r}")
                if category in seen:
                    raise FeatureSpecError(f"feature {self.name!r}.buckets: category {category!r} is in both {seen[category]!r} and {bucket!r}")
                seen[category] = bucket
            buckets.append((bucket, members))
        if len({b for b, _ in buckets}) != len(buckets):
            raise FeatureSpecError(f"feature {self.name!r}.buckets: duplicate bucket names")
        unbucketed = [c for c in self.categories if c not in seen]
        if unbucketed:
            raise FeatureSpecError(f"feature {self.name!r}.buckets: categories {unbucketed!r} are in no bucket")
        object.__setattr__(self, "buckets", tuple(buckets))

    kind = "categorical"

    @property
    def bin_names(self) -> tuple[str, ...]:
        return self.categories if self.buckets is None else tuple(b for b, _ in self.buckets)

    @property
    def n_bins(self) -> int:
        return len(self.bin_names)

    def bin_of(self) -> dict[str, int]:
        """Raw category -> bin index."""
        if self.buckets is None:
            return {c: i for i, c in enumerate(self.categories)}
        return {c: i for i, (_, members) in enumerate(self.buckets) for c in members}

    def bin(self, values: npt.ArrayLike) -> IntArray:
        column = np.asarray(values)
        if column.ndim != 1:
            raise FeatureSpecError(f"feature {self.name!r}: values must be a 1-d array of strings")
        # Map each distinct raw value once, then index: fast on 10^5 rows.
        distinct, inverse = np.unique(column.astype(str), return_inverse=True)
        lookup = self.bin_of()
        try:
            codes = np.array([lookup[str(v)] for v in distinct], dtype=np.int64)
        except KeyError as exc:
            raise FeatureSpecError(f"feature {self.name!r}: unknown category {exc.args[0]!r}") from None
        return codes[inverse.reshape(-1)] if len(distinct) else np.zeros(0, dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": "categorical", "categories": list(self.categories)}
        if self.buckets is not None:
            out["buckets"] = [[b, list(members)] for b, members in self.buckets]
        return out


Feature = Union[NumericFeature, CategoricalFeature]


@dataclass(frozen=True)
class LabelSpec:
    """The binary label: which raw values mean 1, and which mean 0 (``None``:
    every other value)."""

    name: str
    positive: tuple[str, ...]
    negative: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _check_name("label.name", self.name)
        object.__setattr__(self, "positive", _check_str_list("label.positive", self.positive, MAX_CATEGORIES))
        if self.negative is None:
            return
        object.__setattr__(self, "negative", _check_str_list("label.negative", self.negative, MAX_CATEGORIES))
        both = set(self.positive) & set(self.negative)
        if both:
            raise FeatureSpecError(f"label.negative: values {sorted(both)!r} are also positive")

    def encode(self, values: npt.ArrayLike) -> IntArray:
        column = np.asarray(values).astype(str)
        positive = np.isin(column, self.positive)
        if self.negative is not None:
            known = positive | np.isin(column, self.negative)
            if not np.all(known):
                raise FeatureSpecError(f"label {self.name!r}: unknown value {str(column[~known][0])!r}")
        return positive.astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "positive": list(self.positive)}
        if self.negative is not None:
            out["negative"] = list(self.negative)
        return out


@dataclass(frozen=True)
class FeatureSpec:
    """The task's features (in order) and label; see the module docstring."""

    features: tuple[Feature, ...]
    label: LabelSpec

    def __post_init__(self) -> None:
        if not isinstance(self.features, (list, tuple)) or not self.features or len(self.features) > MAX_FEATURES:
            raise FeatureSpecError(f"features: expected 1 to {MAX_FEATURES} features, got {self.features!r}")
        object.__setattr__(self, "features", tuple(self.features))
        names = [f.name for f in self.features]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise FeatureSpecError(f"features: duplicate feature names {duplicates!r}")
        if self.label.name in names:
            raise FeatureSpecError(f"label.name: {self.label.name!r} is also a feature name")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    @property
    def numeric_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features if isinstance(f, NumericFeature))

    @property
    def n_bins(self) -> tuple[int, ...]:
        return tuple(f.n_bins for f in self.features)

    def feature(self, name: str) -> Feature:
        for f in self.features:
            if f.name == name:
                return f
        raise FeatureSpecError(f"unknown feature {name!r}; known: {list(self.names)!r}")

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise FeatureSpecError(f"unknown feature {name!r}; known: {list(self.names)!r}") from None

    def check_subset(self, subset: Sequence[str]) -> tuple[str, ...]:
        """Validate a feature subset: known names, no repeats, bounded domain."""
        names = tuple(subset)
        if not names:
            raise FeatureSpecError("subset: a feature subset needs at least one feature")
        for name in names:
            self.index(name)
        if len(set(names)) != len(names):
            raise FeatureSpecError(f"subset: repeated feature in {list(names)!r}")
        if self.domain_size(names, _checked=True) > MAX_DOMAIN:
            raise FeatureSpecError(f"subset: domain of {list(names)!r} exceeds {MAX_DOMAIN}")
        return names

    def domain_size(self, subset: Sequence[str], *, labelled: bool = True, _checked: bool = False) -> int:
        """``m`` for a subset: the product of its features' bins, times 2 for the label
        (``labelled=False``: reports without the label, a statistics round that never counts it)."""
        names = tuple(subset) if _checked else self.check_subset(subset)
        m = 2 if labelled else 1
        for name in names:
            m *= self.features[self.index(name)].n_bins
        return m

    def bin_columns(self, columns: Mapping[str, npt.ArrayLike], cut_points: Mapping[str, Sequence[float]]) -> IntArray:
        """Bin raw columns into an ``(n, k_f)`` array of bin indices, columns in
        feature order; numeric features use the published ``cut_points``."""
        out: list[IntArray] = []
        for f in self.features:
            if f.name not in columns:
                raise FeatureSpecError(f"columns: missing feature {f.name!r}")
            if isinstance(f, NumericFeature):
                if f.name not in cut_points:
                    raise FeatureSpecError(f"cut_points: missing numeric feature {f.name!r}")
                out.append(f.bin(columns[f.name], cut_points[f.name]))
            else:
                out.append(f.bin(columns[f.name]))
        lengths = {len(c) for c in out}
        if len(lengths) != 1:
            raise FeatureSpecError(f"columns: features have different lengths {sorted(lengths)!r}")
        return np.stack(out, axis=1)

    def encode(self, subset: Sequence[str], bins: npt.ArrayLike, labels: npt.ArrayLike | None) -> IntArray:
        """Encode ``bins`` (``(n, k_s)``, the subset's bin indices in subset
        order) and ``labels`` (0/1) as values in ``[0, m)``: mixed radix with
        the first feature most significant and the label least significant.
        ``labels=None``: the bins alone, in ``[0, m/2)`` (a label-free report)."""
        names = self.check_subset(subset)
        radices = [self.features[self.index(n)].n_bins for n in names]
        b = np.asarray(bins, dtype=np.int64)
        if labels is None:
            return encode_cells(radices, self._checked_bins(names, radices, b), np.zeros(b.shape[0], dtype=np.int64)) // 2
        y = np.asarray(labels, dtype=np.int64)
        if b.ndim != 2 or b.shape[1] != len(names) or y.shape != (b.shape[0],):
            raise FeatureSpecError(f"bins: expected shape (n, {len(names)}) and labels (n,), got {b.shape!r} and {y.shape!r}")
        if np.any((y != 0) & (y != 1)):
            raise FeatureSpecError("labels: expected 0/1 values")
        return encode_cells(radices, self._checked_bins(names, radices, b), y)

    @staticmethod
    def _checked_bins(names: Sequence[str], radices: Sequence[int], b: IntArray) -> IntArray:
        if b.ndim != 2 or b.shape[1] != len(names):
            raise FeatureSpecError(f"bins: expected shape (n, {len(names)}), got {b.shape!r}")
        for j, radix in enumerate(radices):
            column = b[:, j]
            if np.any((column < 0) | (column >= radix)):
                raise FeatureSpecError(f"bins[{names[j]!r}]: expected bin indices in [0, {radix}), got {int(column[(column < 0) | (column >= radix)][0])!r}")
        return b

    def decode(self, subset: Sequence[str], codes: npt.ArrayLike) -> tuple[IntArray, IntArray]:
        """Inverse of :meth:`encode`: ``(bins (n, k_s), labels (n,))``."""
        names = self.check_subset(subset)
        m = self.domain_size(names, _checked=True)
        code = np.asarray(codes, dtype=np.int64)
        if code.ndim != 1 or np.any((code < 0) | (code >= m)):
            raise FeatureSpecError(f"codes: expected a 1-d array of values in [0, {m})")
        return decode_cells([self.features[self.index(n)].n_bins for n in names], code)

    def with_quantiles(self, quantiles: int | Mapping[str, int]) -> FeatureSpec:
        """The same spec with ``quantiles`` cut points for every numeric
        feature (an int) or for the features named (a mapping)."""
        def chosen(feature: NumericFeature) -> int:
            return quantiles if isinstance(quantiles, int) else quantiles.get(feature.name, feature.quantiles)

        features = tuple(replace(f, quantiles=chosen(f)) if isinstance(f, NumericFeature) else f for f in self.features)
        return FeatureSpec(features, self.label)

    def clip_columns(self, columns: Mapping[str, npt.ArrayLike]) -> tuple[dict[str, npt.ArrayLike], dict[str, int]]:
        """Numeric columns clipped into their public bounds (what a peer is
        told before it consents), and per numeric feature how many values
        were outside; other columns pass through."""
        out: dict[str, npt.ArrayLike] = dict(columns)
        clipped: dict[str, int] = {}
        for f in self.features:
            if isinstance(f, NumericFeature) and f.name in columns:
                out[f.name], clipped[f.name] = f.clip(columns[f.name])
        return out, clipped

    def to_dict(self) -> dict[str, Any]:
        return {"features": [f.to_dict() for f in self.features], "label": self.label.to_dict()}

    @classmethod
    def from_toml(cls, text: str) -> FeatureSpec:
        """Parse a feature-spec file: TOML with the layout of :meth:`to_dict`
        (``[label]`` with ``name``, ``positive`` and optionally ``negative``;
        one ``[[features]]`` table per feature with ``name``, ``type``
        ("numeric": ``low``, ``high``, optional ``quantiles``;
        "categorical": ``categories``, optional ``buckets`` as
        ``[[bucket name, [categories...]], ...]``))."""
        if len(text.encode("utf-8", errors="replace")) > MAX_SPEC_BYTES:
            raise FeatureSpecError(f"feature spec: larger than {MAX_SPEC_BYTES} bytes")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise FeatureSpecError(f"feature spec: not valid TOML ({exc})") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> FeatureSpec:
        """Parse and validate; raises :class:`FeatureSpecError` naming the bad field."""
        top = _check_keys("feature spec", data, {"features", "label"})
        raw_features = top["features"]
        if not isinstance(raw_features, list) or not raw_features or len(raw_features) > MAX_FEATURES:
            raise FeatureSpecError(f"features: expected a list of 1 to {MAX_FEATURES} features, got {raw_features!r}")
        features: list[Feature] = []
        for i, raw in enumerate(raw_features):
            entry = _check_keys(f"features[{i}]", raw, {"name", "type"}, {"low", "high", "quantiles", "categories", "buckets"})
            kind = entry["type"]
            if kind == "numeric":
                _check_keys(f"features[{i}]", raw, {"name", "type", "low", "high"}, {"quantiles"})
                features.append(NumericFeature(entry["name"], entry["low"], entry["high"], entry.get("quantiles", 1)))
            elif kind == "categorical":
                _check_keys(f"features[{i}]", raw, {"name", "type", "categories"}, {"buckets"})
                buckets = entry.get("buckets")
                features.append(CategoricalFeature(entry["name"], entry["categories"], None if buckets is None else tuple(tuple(b) if isinstance(b, list) else b for b in buckets)))
            else:
                raise FeatureSpecError(f"features[{i}].type: expected 'numeric' or 'categorical', got {kind!r}")
        label = _check_keys("label", top["label"], {"name", "positive"}, {"negative"})
        return cls(tuple(features), LabelSpec(label["name"], label["positive"], label.get("negative")))
