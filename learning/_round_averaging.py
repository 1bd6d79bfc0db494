"""A model-averaging round (``[task] kind = "model-averaging"``, issue 28):
the networked form of :class:`ModelAveraging` (seed 003).

Every data peer holds many rows (at least the ``rows_per_peer`` the round
signs; :class:`TooFewRows` otherwise), trains its L2-regularised logistic
regression on them and releases it ONCE, output-perturbed on the integer
grid of :class:`OutputPerturbation` at the round's whole ε_T. The released
vector of grid steps travels through the round's surveys, relays and tokens
like any report, but one packet carries at most
:func:`protocol.report_capacity` bytes, so :class:`ModelBlocks` cuts the
model into fixed blocks of coordinates, block ``b`` always the same
coordinates, each block the report of its own data survey ``b``. Every data
peer sends exactly one packet per block, so the packets of a model round say
nothing about which peer sent what beyond the ensemble's.

The aggregator never needs to know which blocks came from one peer:
averaging is coordinate-wise, so each survey's reports are averaged on
their own (:func:`average_blocks`) and the blocks' means put side by side
are the average model.

Privacy: the blocks are a deterministic function of the one released vector
(post-processing), so splitting costs no ε: the whole model is one release
at ε_T, charged once in the peer's ledger (``PeerLedger.spend_model``), and
each row's record-level ε is ε_T (parallel composition over the peers'
disjoint rows).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from anonml.base.errors import InputError
from anonml.learning._averaging import FloatArray, OutputPerturbation, local_model, unit_ball_rows
from anonml.learning._data import Table
from anonml.learning._linear import LinearEncoding, wide_range_features
from anonml.learning._vocabulary import AVERAGING_CATEGORICAL_WEIGHT, AVERAGING_RULE
from anonml.protocol import FeatureSpec, RoundManifest, report_capacity

STEP = struct.Struct(">q")
"""One coordinate of a released model on the wire: its grid steps as a signed 64-bit integer
(the noise's Gamma norm would need ~2^63 / (Δint/ε) times its scale to overflow)."""


class InvalidModelReport(InputError):
    """Raised by :meth:`ModelBlocks.decode` for a report that is not one block of grid steps."""


@dataclass(frozen=True)
class ModelBlocks:
    """How a model of ``dimension`` coordinates is cut into fixed blocks, one per data survey:
    ``blocks`` blocks of ``per_block`` coordinates (the last one holding the rest)."""

    dimension: int
    per_block: int

    def __post_init__(self) -> None:
        if isinstance(self.dimension, bool) or not isinstance(self.dimension, int) or self.dimension < 1:
            raise ValueError(f"a model has at least one coordinate, got dimension {self.dimension!r}")
        if isinstance(self.per_block, bool) or not isinstance(self.per_block, int) or not 1 <= self.per_block <= self.dimension:
            raise ValueError(f"a block holds 1..{self.dimension} coordinates, got {self.per_block!r}")

    @classmethod
    def fitting(cls, dimension: int, report_bytes: int) -> ModelBlocks:
        """The fewest blocks whose reports fit ``report_bytes`` each, the coordinates dealt evenly over them."""
        most = report_bytes // STEP.size
        if most < 1:
            raise ValueError(f"a report of {report_bytes} bytes cannot hold one {STEP.size}-byte coordinate")
        blocks = math.ceil(dimension / most)
        return cls(dimension, math.ceil(dimension / blocks))

    @property
    def blocks(self) -> int:
        return math.ceil(self.dimension / self.per_block)

    def coordinates(self, block: int) -> range:
        """The model's coordinates block ``block`` carries."""
        if not 0 <= block < self.blocks:
            raise ValueError(f"block must be in [0, {self.blocks}), got {block!r}")
        return range(block * self.per_block, min((block + 1) * self.per_block, self.dimension))

    def split(self, steps: npt.ArrayLike) -> list[bytes]:
        """One report per block: its coordinates' grid steps, big-endian signed 64-bit each."""
        vector = np.asarray(steps)
        if vector.shape != (self.dimension,) or not np.issubdtype(vector.dtype, np.integer):
            raise ValueError(f"expected {self.dimension} integer grid steps, got {vector.dtype} of shape {vector.shape!r}")
        return [b"".join(STEP.pack(int(vector[i])) for i in self.coordinates(block)) for block in range(self.blocks)]

    def decode(self, block: int, report: bytes) -> npt.NDArray[np.int64]:
        """Inverse of :meth:`split` for one block's report (:class:`InvalidModelReport` unless it is exactly one)."""
        count = len(self.coordinates(block))
        if len(report) != count * STEP.size:
            raise InvalidModelReport(f"block {block} is {count} coordinates of {STEP.size} bytes, got a report of {len(report)} bytes")
        return np.array([value for (value,) in STEP.iter_unpack(report)], dtype=np.int64)


def model_reports(X: npt.ArrayLike, y: npt.ArrayLike, mechanism: OutputPerturbation, norm_bound: float, blocks: ModelBlocks,
                  rng: np.random.Generator) -> list[bytes]:
    """What one data peer sends: its local model (:func:`local_model`, which refuses too few rows),
    released once in grid steps (:meth:`OutputPerturbation.release_steps`), cut into the blocks' reports."""
    if blocks.dimension != mechanism.dimension:
        raise ValueError(f"the blocks cut {blocks.dimension} coordinates, the mechanism releases {mechanism.dimension}")
    return blocks.split(mechanism.release_steps(local_model(X, y, mechanism, norm_bound), rng))


@dataclass(frozen=True)
class AveragedModel:
    """The aggregator's average: ``coef`` in model units (over unit-ball rows) and how many reports each block averaged."""

    coef: FloatArray
    reports: tuple[int, ...]


def average_blocks(blocks: ModelBlocks, reports: Sequence[Sequence[bytes]], grid: float) -> AveragedModel:
    """Each block's reports (``reports[b]``: every report of survey ``b``) averaged coordinate-wise,
    the blocks side by side, in model units (``grid`` per step). Equal weights: every peer's noise has the
    same public scale. A block no report reached is refused: there is no model to average."""
    if len(reports) != blocks.blocks:
        raise ValueError(f"expected the reports of {blocks.blocks} block surveys, got {len(reports)}")
    if any(not block for block in reports):
        empty = [b for b, block in enumerate(reports) if not block]
        raise ValueError(f"no report reached block survey(s) {empty}: the model cannot be averaged")
    means = [np.mean([blocks.decode(b, report) for report in block], axis=0) for b, block in enumerate(reports)]
    coef: FloatArray = np.concatenate(means) * grid
    return AveragedModel(coef, tuple(len(block) for block in reports))


@dataclass(frozen=True)
class RoundModel:
    """What every party of a model-averaging round derives from the signed manifest alone: the rows'
    encoding (:class:`LinearEncoding`, wide-range features on a log scale, categorical columns weighted
    by ``categorical_weight`` as in ``anonml experiment``), the public norm bound the rows are
    divided by, the output perturbation (λ = ``regularization_rule / (rows_per_peer ε_T)``) and the blocks.

    Neither setting changes the ε: λ enters the noise's calibration (sensitivity 2 / (rows_per_peer λ)), and
    the weight is a public map of each row before the peer itself clips it into the unit ball."""

    encoding: LinearEncoding
    weights: FloatArray
    mechanism: OutputPerturbation
    blocks: ModelBlocks
    regularization_rule: float
    """λ · rows_per_peer · ε_T, as the round signs it."""
    categorical_weight: float
    """The factor of the categorical columns in ``weights``, as the round signs it."""

    @classmethod
    def of(cls, spec: FeatureSpec, epsilon: float, rows_per_peer: int, report_bytes: int, *,
           regularization_rule: float = AVERAGING_RULE, categorical_weight: float = AVERAGING_CATEGORICAL_WEIGHT) -> RoundModel:
        if not (math.isfinite(regularization_rule) and regularization_rule > 0):
            raise ValueError(f"the λ rule must be finite and > 0, got {regularization_rule!r}")
        if not 0 < categorical_weight <= 1:
            raise ValueError(f"the categorical weight must be in (0, 1], got {categorical_weight!r}")
        encoding = LinearEncoding(spec, wide_range_features(spec))
        weights: FloatArray = np.where(encoding.categorical_columns, categorical_weight, 1.0)
        regularization = regularization_rule / (rows_per_peer * epsilon)
        mechanism = OutputPerturbation(epsilon, rows_per_peer, regularization, encoding.dimension)
        return cls(encoding, weights, mechanism, ModelBlocks.fitting(encoding.dimension, report_bytes), regularization_rule, categorical_weight)

    @classmethod
    def of_manifest(cls, manifest: RoundManifest) -> RoundModel:
        """The round's model from its signed fields: the features, ε_T, ``rows_per_peer``, the λ rule and the
        categorical weight (a manifest made before those fields: the settings rounds used then) and the packet geometry."""
        spec = FeatureSpec.from_dict(dict(manifest.features))
        rule = AVERAGING_RULE if manifest.regularization_rule is None else manifest.regularization_rule
        weight = AVERAGING_CATEGORICAL_WEIGHT if manifest.categorical_weight is None else manifest.categorical_weight
        return cls.of(spec, manifest.eps_total, manifest.rows_per_peer, report_capacity(manifest.sphinx_geometry().message_size),
                      regularization_rule=rule, categorical_weight=weight)

    @property
    def norm_bound(self) -> float:
        """A public bound on a weighted row's norm (every encoded coordinate lies in [-1, 1])."""
        return float(np.linalg.norm(self.weights))

    def matrix(self, rows: Sequence[Mapping[str, object]], labels: Sequence[int]) -> tuple[FloatArray, FloatArray]:
        """``(X, y)``: rows of feature values (by name, as the spec's featurizer gives them) weighted and
        encoded, and their labels (0/1) as -1/+1."""
        numeric = set(self.encoding.spec.numeric_names)
        columns = {name: np.array([row[name] for row in rows], dtype=np.float64) if name in numeric
                   else np.array([str(row[name]) for row in rows]) for name in self.encoding.spec.names}
        y: FloatArray = 2.0 * np.asarray(labels, dtype=np.float64) - 1.0
        return self.table_matrix(Table(columns, np.array([str(label) for label in labels]))), y

    def table_matrix(self, table: Table) -> FloatArray:
        """A table's rows weighted and encoded (not yet divided by :attr:`norm_bound`)."""
        X: FloatArray = self.encoding.transform(table) * self.weights
        return X

    def reports(self, rows: Sequence[Mapping[str, object]], labels: Sequence[int], rng: np.random.Generator) -> list[bytes]:
        """A data peer's block reports from its rows (:func:`model_reports`)."""
        X, y = self.matrix(rows, labels)
        return model_reports(X, y, self.mechanism, self.norm_bound, self.blocks, rng)

    def scores(self, coef: FloatArray, table: Table) -> FloatArray:
        """The averaged model's scores of a table's rows (weighted, encoded, into the unit ball as the peers' were)."""
        scored: FloatArray = unit_ball_rows(self.table_matrix(table), self.norm_bound) @ coef
        return scored
