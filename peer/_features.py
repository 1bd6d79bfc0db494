"""The round's instancer and featurizer, built from the manifest's feature spec.

The aggregator dictates them (thesis §4.2 step 1, Figure 4-2); here they are
not code shipped by the aggregator but derived from the declared
:class:`protocol.FeatureSpec`, so a peer runs nothing it did not agree to.
Every error names the feature and, when it can, the line of the raw file the
value came from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from anonml.peer._framework import (
    CsvImporter,
    Dataset,
    EntityIsPeerInstancer,
    FeatureError,
    FeatureFunction,
    FeatureVector,
    Featurizer,
    FieldValue,
)
from anonml.protocol import CategoricalFeature, Feature, FeatureSpec, NumericFeature, RoundManifest, TaskKind

PREDICTED_LABEL = "the label the round's model predicts"
"""What reads the label of a round that learns a model (every kind but statistics)."""


def _where(dataset: Dataset, name: str) -> str:
    line = dataset.latest(name).line
    return f" (line {line})" if line else ""


def _numeric_function(feature: NumericFeature) -> Callable[[Dataset], FieldValue]:
    def compute(dataset: Dataset) -> FieldValue:
        value = dataset.latest(feature.name).fields[feature.name]
        if not isinstance(value, float):
            raise FeatureError(f"feature {feature.name!r}{_where(dataset, feature.name)}: {value!r} is not a number")
        return value

    return compute


def _categorical_function(feature: CategoricalFeature) -> Callable[[Dataset], FieldValue]:
    known = frozenset(feature.categories)

    def compute(dataset: Dataset) -> FieldValue:
        value = dataset.latest(feature.name).fields[feature.name]
        if not isinstance(value, str) or value not in known:
            raise FeatureError(
                f"feature {feature.name!r}{_where(dataset, feature.name)}: {value!r} is not one of "
                f"the declared categories {list(feature.categories)!r}"
            )
        return value

    return compute


def _feature_function(feature: Feature) -> FeatureFunction:
    if isinstance(feature, NumericFeature):
        return FeatureFunction(feature.name, _numeric_function(feature))
    return FeatureFunction(feature.name, _categorical_function(feature))


def _label_function(spec: FeatureSpec) -> Callable[[Dataset], int]:
    label = spec.label

    def compute(dataset: Dataset) -> int:
        value = dataset.latest(label.name).fields[label.name]
        if value in label.positive:
            return 1
        # A spec without negative values counts every other value as negative.
        if label.negative is None or value in label.negative:
            return 0
        raise FeatureError(
            f"label {label.name!r}{_where(dataset, label.name)}: {value!r} is neither positive "
            f"{list(label.positive)!r} nor negative {list(label.negative)!r}"
        )

    return compute


def label_use(manifest: RoundManifest) -> str | None:
    """What reads the label in ``manifest``'s round, so a peer's file must hold it; None: nothing does
    (a statistics round whose queries never count it: its reports carry no label)."""
    if not manifest.labelled_reports:
        return None
    if manifest.task_kind == TaskKind.STATISTICS:
        return "the label the round's 'count:label' query counts"
    return PREDICTED_LABEL


@dataclass(frozen=True)
class RoundPipeline:
    """Importer, instancer and featurizer for one round's feature spec."""

    spec: FeatureSpec
    importer: CsvImporter
    instancer: EntityIsPeerInstancer
    featurizer: Featurizer

    @classmethod
    def for_spec(cls, spec: FeatureSpec, *, reads_label: str | None = PREDICTED_LABEL) -> RoundPipeline:
        """The pipeline of a round over ``spec``. ``reads_label``: what reads the label (a file must then
        hold its column, and a missing one is refused saying so); None: nothing does, and the label's
        column is neither required nor read."""
        labels = {spec.label.name: reads_label} if reads_label is not None else {}
        return cls(
            spec,
            CsvImporter(numeric=frozenset(spec.numeric_names), required=frozenset((*spec.names, *labels)), reasons=labels),
            EntityIsPeerInstancer(_label_function(spec) if reads_label is not None else None),
            Featurizer(tuple(_feature_function(f) for f in spec.features)),
        )

    @classmethod
    def for_manifest(cls, manifest: RoundManifest) -> RoundPipeline:
        """The pipeline of ``manifest``'s round: its features, and its label only if the round reads it."""
        return cls.for_spec(FeatureSpec.from_dict(dict(manifest.features)), reads_label=label_use(manifest))

    def vector_of(self, dataset: Dataset) -> FeatureVector:
        """The peer's one feature vector (the entity is the peer, thesis §6.1)."""
        (vector,) = self.featurizer.featurize(self.instancer.make_instances(dataset))
        return vector

    def vector_from_file(self, path: Path) -> FeatureVector:
        return self.vector_of(self.importer.import_file(path))

    def bins(self, vector: FeatureVector, cut_points: Mapping[str, Sequence[float]]) -> dict[str, int]:
        """Each feature's bin index, numeric features cut at the published points."""
        columns = {name: np.asarray([vector.features[name]]) for name in self.spec.names}
        row = self.spec.bin_columns(columns, cut_points)[0]
        return {name: int(row[i]) for i, name in enumerate(self.spec.names)}

    def encode_subset(self, subset: Sequence[str], bins: Mapping[str, int], label: int | None) -> int:
        """The subset's bins and the label as one value in ``[0, m)`` (thesis §7.1); ``label=None``:
        the bins alone (a report without the label, for a round that never reads it)."""
        row = np.asarray([[bins[name] for name in subset]], dtype=np.int64)
        return int(self.spec.encode(subset, row, None if label is None else np.asarray([label]))[0])
