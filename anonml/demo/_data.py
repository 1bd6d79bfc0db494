"""The demo's data: each training row is one peer's data; held-out rows score the model.

scikit-learn's breast cancer set ships with scikit-learn (offline); UCI Adult
is read from ``../shared/data/adult``. Also the non-private baseline and the
published model's held-out AUC, which the summary sets side by side.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from anonml.protocol import FeatureSpec

@dataclass(frozen=True)
class DemoData:
    """Peers' raw rows (one per peer), the held-out test rows, and the task."""

    name: str
    spec: FeatureSpec
    header: tuple[str, ...]
    train_rows: list[list[str]]
    test_columns: dict[str, np.ndarray]
    test_labels: np.ndarray  # 0/1
    train_columns: dict[str, np.ndarray]
    train_labels: np.ndarray  # 0/1


# Public bounds for the breast-cancer features: ranges a clinician would give
# before seeing the data (Algorithm 1 needs "an educated guess about the
# minimum and maximum"), wider than the Wisconsin set's observed ranges.
_BREAST_CANCER_FEATURES = {
    "mean radius": (5.0, 30.0),
    "mean texture": (5.0, 40.0),
    "mean perimeter": (40.0, 200.0),
    "mean area": (100.0, 2600.0),
    "mean smoothness": (0.04, 0.18),
    "mean compactness": (0.0, 0.4),
    "mean concavity": (0.0, 0.5),
    "mean concave points": (0.0, 0.25),
    "worst radius": (5.0, 40.0),
    "worst texture": (10.0, 50.0),
    "worst perimeter": (40.0, 260.0),
    "worst area": (100.0, 4500.0),
}


def _split(n: int, test_fraction: float, seed: int, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(np.arange(n), test_size=test_fraction, random_state=seed, stratify=labels)
    return np.sort(train), np.sort(test)


def breast_cancer_data(seed: int) -> DemoData:
    """scikit-learn's Wisconsin breast cancer set (ships with sklearn; offline): 70% peers, 30% held out."""
    from sklearn.datasets import load_breast_cancer

    from anonml.protocol import LabelSpec, NumericFeature

    bunch = load_breast_cancer()
    names = list(bunch.feature_names)
    columns = {name.replace(" ", "_"): bunch.data[:, names.index(name)] for name in _BREAST_CANCER_FEATURES}
    # sklearn codes malignant as 0; the task predicts malignancy.
    labels = (bunch.target == 0).astype(np.int64)
    spec = FeatureSpec(
        tuple(NumericFeature(name.replace(" ", "_"), low, high) for name, (low, high) in _BREAST_CANCER_FEATURES.items()),
        LabelSpec("diagnosis", ("malignant",), ("benign",)),
    )
    train, test = _split(len(labels), 0.3, seed, labels)
    header = (*columns, "diagnosis")
    rows = [[repr(float(columns[c][i])) for c in columns] + ["malignant" if labels[i] else "benign"] for i in train]
    return DemoData(
        "breast-cancer", spec, header, rows,
        {c: v[test] for c, v in columns.items()}, labels[test],
        {c: v[train] for c, v in columns.items()}, labels[train],
    )


def adult_data(data_dir: Path) -> DemoData:
    """UCI Adult: every ``adult.data`` row is a peer; ``adult.test`` is held out."""
    from anonml.learning import adult_spec, load_adult

    train, test = load_adult(data_dir)
    spec = adult_spec()
    names = list(spec.names)
    header = (*names, spec.label.name)
    rows = [
        [_cell(train.columns[name][i]) for name in names] + [str(train.labels[i])]
        for i in range(train.n_rows)
    ]
    positive = set(spec.label.positive)
    return DemoData(
        "adult", spec, header, rows,
        {name: test.columns[name] for name in names}, np.isin(test.labels, list(positive)).astype(np.int64),
        {name: train.columns[name] for name in names}, np.isin(train.labels, list(positive)).astype(np.int64),
    )


def _cell(value: object) -> str:
    return repr(float(value)) if isinstance(value, (float, np.floating)) else str(value)


def write_peer_files(data: DemoData, rows: list[list[str]], work: Path, workers: int, rows_per_peer: int = 1) -> list[Path]:
    """One CSV per worker process: a header row, then each of its peers' ``rows_per_peer`` rows, one peer after another
    (peer ``g`` holds ``rows[g·r:(g+1)·r]``; the peers are dealt to the workers in turn)."""
    peers = [rows[g * rows_per_peer:(g + 1) * rows_per_peer] for g in range(len(rows) // rows_per_peer)]
    paths = []
    for w in range(workers):
        path = work / "peers" / f"worker-{w}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(data.header)
            for peer in peers[w::workers]:
                writer.writerows(peer)
        paths.append(path)
    return paths


def write_test_file(data: DemoData, work: Path) -> Path:
    """The held-out rows as the labelled CSV ``aggregator run --test-file`` reads: the report then carries the AUC."""
    path = work / "held-out.csv"
    label = data.spec.label
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(data.header)
        for i, y in enumerate(data.test_labels):
            cells = [_cell(data.test_columns[name][i]) for name in data.spec.names]
            # A spec without negative values counts any other value as negative.
            writer.writerow([*cells, label.positive[0] if y else (label.negative or ("",))[0]])
    return path


def write_experiment_files(data: DemoData, rows: list[list[str]], work: Path) -> list[str]:
    """The demo's feature spec and every peer's row as files ``anonml
    experiment csv`` reads; returns its arguments naming them and the held-out rows."""
    import tomli_w

    spec_path, train_path = work / "feature-spec.toml", work / "peers.csv"
    spec_path.write_text(tomli_w.dumps(data.spec.to_dict()))
    with train_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(data.header)
        writer.writerows(rows)
    return ["csv", "--spec", str(spec_path), "--train", str(train_path), "--test", str(write_test_file(data, work))]


def baseline_auc(data: DemoData, rows: int) -> float | None:
    """Non-private logistic regression on the raw features of the first ``rows`` training rows, scored on the
    held-out rows: with ``rows`` the rows the round's peers held (``run_demo`` deals them the first ones), the
    yardstick of a round that learnt from exactly those rows. None when they hold one class only."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    numeric = list(data.spec.numeric_names)
    categorical = [n for n in data.spec.names if n not in numeric]

    def design(columns: dict[str, np.ndarray], fit: bool) -> np.ndarray:
        parts = [np.column_stack([columns[n].astype(np.float64) for n in numeric])]
        parts[0] = scaler.fit_transform(parts[0]) if fit else scaler.transform(parts[0])
        if categorical:
            raw = np.column_stack([columns[n].astype(str) for n in categorical])
            parts.append((encoder.fit_transform(raw) if fit else encoder.transform(raw)).toarray())
        return np.hstack(parts)

    if not 0 < rows <= len(data.train_labels):
        raise ValueError(f"rows={rows!r}: the table has {len(data.train_labels)} training rows")
    labels = data.train_labels[:rows]
    if np.unique(labels).size < 2:
        return None
    scaler, encoder = StandardScaler(), OneHotEncoder(handle_unknown="ignore")
    model = LogisticRegression(max_iter=5000).fit(design({n: c[:rows] for n, c in data.train_columns.items()}, True), labels)
    return float(roc_auc_score(data.test_labels, model.predict_proba(design(data.test_columns, False))[:, 1]))


def held_out_auc(data: DemoData, model_path: Path) -> float | None:
    """AUC of the round's published model (JSON: its binner, then the ensemble) on the held-out rows."""
    from sklearn.metrics import roc_auc_score

    from anonml.learning import model_from_json

    if not model_path.is_file():
        return None
    model = model_from_json(model_path.read_text())
    rows = np.column_stack([np.asarray(data.test_columns[name]).astype(object) for name in data.spec.names])
    return float(roc_auc_score(data.test_labels, model.decision_function(rows)))
