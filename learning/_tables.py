"""The built-in tables of ``anonml experiment`` and their feature specs.

Each spec is a feature-spec file (``FeatureSpec.from_toml``) in
``learning/specs/``. Adult is read from a directory holding its two files;
breast cancer and affairs ship offline inside scikit-learn and statsmodels
and have no published split, so they are split here (seeded, stratified).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from anonml.learning._data import DataError, Table, load_adult, split_table
from anonml.learning._vocabulary import TableName
from anonml.protocol import FeatureSpec


def builtin_spec(name: TableName | str) -> FeatureSpec:
    """The feature spec shipped for a built-in table."""
    table = TableName(name)
    text = resources.files("anonml.learning").joinpath("specs", f"{table.value}.toml").read_text(encoding="utf-8")
    return FeatureSpec.from_toml(text)


def adult_spec(quantiles: int = 1) -> FeatureSpec:
    """Adult's spec with ``quantiles`` cut points per numeric feature (1 = the thesis's median)."""
    return builtin_spec(TableName.ADULT).with_quantiles(quantiles)


def _breast_cancer() -> Table:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    columns: dict[str, npt.NDArray[np.generic]] = {str(name): np.asarray(data.data[:, j], dtype=np.float64) for j, name in enumerate(data.feature_names)}
    # scikit-learn's target 0 is malignant, 1 benign.
    labels = np.where(data.target == 0, "malignant", "benign")
    return Table(columns, labels)


def _affairs() -> Table:
    from statsmodels.datasets import fair

    frame = fair.load_pandas().data
    columns: dict[str, npt.NDArray[np.generic]] = {
        name: np.asarray(frame[name], dtype=np.float64)
        for name in ("rate_marriage", "age", "yrs_married", "children", "religious", "educ")
    }
    for name in ("occupation", "occupation_husb"):
        columns[name] = np.asarray(frame[name]).astype(np.int64).astype(str)
    labels = np.where(np.asarray(frame["affairs"]) > 0, "yes", "no")
    return Table(columns, labels)


def load_builtin(name: TableName | str, *, data_dir: Path | None, test_fraction: float, rng: np.random.Generator) -> tuple[FeatureSpec, Table, Table]:
    """``(spec, train, test)`` of a built-in table: Adult's own split (from
    ``data_dir``), otherwise a seeded stratified split with ``test_fraction``
    of the rows held out."""
    table = TableName(name)
    spec = builtin_spec(table)
    if table == TableName.ADULT:
        if data_dir is None:
            raise DataError("adult needs --data-dir, a directory with adult.data and adult.test")
        train, test = load_adult(data_dir)
        return spec, train, test
    whole = _breast_cancer() if table == TableName.BREAST_CANCER else _affairs()
    train, test = split_table(whole, test_fraction, rng)
    return spec, train, test
