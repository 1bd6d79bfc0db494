"""The published model as plain JSON (not a pickle, which runs code when loaded).

A round's model is ``Pipeline([("bins", SpecBinner(spec, cut_points)),
("ensemble", PartitionEnsemble)])``: raw rows in feature order in, scores
out. Every fitted part is a table (each member's prediction per cell, naive
Bayes's log-likelihood ratios per bin), so the JSON holds the whole model and
:func:`model_from_json` rebuilds the same predictions without running any
code from the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sklearn.pipeline import Pipeline

from anonml.learning._binning import SpecBinner
from anonml.learning._data import DataError
from anonml.learning._ensemble import PartitionEnsemble
from anonml.protocol import FeatureSpec

MODEL_FORMAT = "anonml-model/1"
# A model file larger than this is not a model (bounded parser).
MAX_MODEL_BYTES = 64 << 20


def published_model(spec: FeatureSpec, cut_points: Mapping[str, Sequence[float]], ensemble: PartitionEnsemble) -> Pipeline:
    """The pipeline a round publishes: the spec's binner, then the fitted ensemble."""
    binner = SpecBinner(spec=spec.to_dict(), cut_points={k: [float(c) for c in v] for k, v in cut_points.items()})
    binner.fit(np.zeros((0, len(spec.names)), dtype=object))
    return Pipeline([("bins", binner), ("ensemble", ensemble)])


def model_to_json(model: Pipeline) -> str:
    """The pipeline of :func:`published_model` as JSON text."""
    binner, ensemble = model.named_steps["bins"], model.named_steps["ensemble"]
    state: dict[str, Any] = {
        "format": MODEL_FORMAT,
        "spec": binner.spec,
        "cut_points": binner.cut_points_,
        "params": {k: v for k, v in ensemble.get_params().items() if k != "random_state"},
        "n_bins": list(ensemble.n_bins_),
        "members": [
            {"columns": list(c), "n_bins": list(b), "partition": int(p), "table": t.tolist(), "score": float(s)}
            for c, b, p, t, s in zip(ensemble.histogram_columns_, ensemble.histogram_bins_, ensemble.partitions_, ensemble.tables_, ensemble.scores_)
        ],
        "naive_bayes": {
            "log_prior": float(ensemble.log_prior_),
            "log_likelihood": [{"column": int(c), "table": t.tolist()} for c, t in ensemble.log_likelihood_],
        },
    }
    return json.dumps(state, allow_nan=False)


def model_from_json(text: str) -> Pipeline:
    """Rebuild the pipeline from :func:`model_to_json`'s text; raises
    :class:`DataError` for anything that is not such a model."""
    if len(text) > MAX_MODEL_BYTES:
        raise DataError(f"model: larger than {MAX_MODEL_BYTES} bytes")
    try:
        state = json.loads(text)
        if state.get("format") != MODEL_FORMAT:
            raise DataError(f"model: format is {state.get('format')!r}, expected {MODEL_FORMAT!r}")
        spec = FeatureSpec.from_dict(state["spec"])
        ensemble = PartitionEnsemble(**state["params"])
        ensemble.n_bins_ = tuple(int(k) for k in state["n_bins"])
        ensemble.n_features_in_ = len(ensemble.n_bins_)
        ensemble.classes_ = np.array([0, 1])
        members = state["members"]
        ensemble.histogram_columns_ = [tuple(int(c) for c in m["columns"]) for m in members]
        ensemble.histogram_bins_ = [tuple(int(b) for b in m["n_bins"]) for m in members]
        ensemble.partitions_ = np.array([int(m["partition"]) for m in members], dtype=np.int64)
        ensemble.tables_ = [np.asarray(m["table"], dtype=np.float64) for m in members]
        ensemble.scores_ = np.asarray([float(m["score"]) for m in members], dtype=np.float64)
        bayes = state["naive_bayes"]
        ensemble.log_prior_ = float(bayes["log_prior"])
        ensemble.log_likelihood_ = [(int(e["column"]), np.asarray(e["table"], dtype=np.float64)) for e in bayes["log_likelihood"]]
        for columns, bins, table in zip(ensemble.histogram_columns_, ensemble.histogram_bins_, ensemble.tables_):
            if any(not 0 <= c < len(ensemble.n_bins_) or ensemble.n_bins_[c] != b for c, b in zip(columns, bins)) or table.shape != (int(np.prod(bins)),):
                raise DataError(f"model: member over columns {columns!r} does not match its bins")
        for column, table in ensemble.log_likelihood_:
            if not 0 <= column < len(ensemble.n_bins_) or table.shape != (ensemble.n_bins_[column],):
                raise DataError(f"model: naive Bayes table of column {column!r} does not match its bins")
        ensemble._validate_params()
        return published_model(spec, state["cut_points"], ensemble)
    except DataError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"model: not a valid {MODEL_FORMAT} document ({exc})") from None
