"""``anonml demo``: one complete round of the whole system on loopback.

Three relays and the aggregator run as separate processes, started with their
own operators' commands (``anonml relay init/info/run``, ``anonml aggregator
init / round new / run``) in a temporary work directory; N peers run as
concurrent :func:`peer.join_round` tasks in a few worker processes
(:mod:`anonml._swarm`), each peer with its own identity, credential, ledger
and randomness. The demo watches the round's public status, shows each phase,
and ends with a summary: participation, packets, rejections by reason,
epsilon per peer (local eq. 7.4 and the shuffle-amplified central figure),
AUC on held-out data beside the non-private baseline, wall time and where the
report is.
"""

from __future__ import annotations

import csv
import json
import os
import resource
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
import trio

from anonml._swarm import SwarmConfig

RELAYS = 3
HOST = "127.0.0.1"


class DemoError(click.ClickException):
    """Raised when a demo process fails to start or the round does not complete; names the step and its log."""


@dataclass(frozen=True)
class DemoData:
    """Peers' raw rows (one per peer), the held-out test rows, and the task."""

    name: str
    spec: Any  # protocol.FeatureSpec
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

    from protocol._features import FeatureSpec, LabelSpec, NumericFeature

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
    from aggregator._adult import adult_spec
    from aggregator._data import load_adult

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


def free_port() -> int:
    """A port the OS says is free now (the relays' descriptors need it before they start)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def anonml_command(*args: str) -> list[str]:
    """The same ``anonml`` this process runs, as a child process."""
    return [sys.executable, "-c", "import sys; from anonml.cli import main; sys.exit(main())", *args]


@dataclass
class Processes:
    """The demo's child processes and their log files; all stopped on exit."""

    logs: Path
    running: list[tuple[str, trio.Process]] = field(default_factory=list)

    async def run(self, name: str, *args: str) -> str:
        """Run one operator command to completion; its stdout, or DemoError naming its log."""
        log = self.logs / f"{name}.log"
        result = await trio.run_process(anonml_command(*args), capture_stdout=True, capture_stderr=True, check=False)
        log.write_bytes(result.stdout + result.stderr)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).decode(errors="replace").strip().splitlines()[-5:]
            raise DemoError(f"`anonml {' '.join(args)}` failed ({result.returncode}); see {log}:\n" + "\n".join(tail))
        return result.stdout.decode()

    async def start(self, name: str, command: Sequence[str], *, stdout: int | None = None) -> trio.Process:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
        process = await trio.lowlevel.open_process(
            list(command), stdout=stdout if stdout is not None else log, stderr=log, start_new_session=True
        )
        self.running.append((name, process))
        return process

    async def stop_all(self) -> None:
        for _, process in reversed(self.running):
            if process.returncode is None:
                process.terminate()
        with trio.move_on_after(10):
            for _, process in self.running:
                await process.wait()
        for _, process in self.running:
            if process.returncode is None:
                process.kill()


def _max_rss_mb(who: int) -> float:
    # ru_maxrss is in KiB on Linux; for RUSAGE_CHILDREN it is the largest child.
    return resource.getrusage(who).ru_maxrss / 1024.0


@dataclass(frozen=True)
class DemoParams:
    peers: int | None
    epsilon: float
    workers: int
    seed: int
    k_p: int
    k_h: int
    k_s: int
    plan: str
    median_rounds: int
    send_window: int
    delivery_window: int
    data_send_window: int
    register_seconds: int
    issue_seconds: int


def default_params(data: DemoData, peers: int, epsilon: float, workers: int, seed: int) -> DemoParams:
    """Short windows for loopback, sized to the number of peers this machine must serve."""
    scale = max(1, peers // 1000)
    return DemoParams(
        peers=peers, epsilon=epsilon, workers=workers, seed=seed,
        k_p=4 if data.name == "breast-cancer" else 8, k_h=2, k_s=2 if data.name == "breast-cancer" else 3,
        plan="split", median_rounds=4 if data.name == "breast-cancer" else 8,
        send_window=1 + scale // 4, delivery_window=4 + scale // 4,
        data_send_window=3 + 4 * scale, register_seconds=4 + 4 * scale, issue_seconds=4 + 8 * scale,
    )


def write_peer_files(data: DemoData, rows: list[list[str]], work: Path, workers: int) -> list[Path]:
    """One CSV per worker process: a header row, then one row per peer."""
    paths = []
    for w in range(workers):
        path = work / "peers" / f"worker-{w}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(data.header)
            writer.writerows(rows[w::workers])
        paths.append(path)
    return paths


def baseline_auc(data: DemoData) -> float:
    """Non-private logistic regression on the raw features of the same training rows."""
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

    scaler, encoder = StandardScaler(), OneHotEncoder(handle_unknown="ignore")
    model = LogisticRegression(max_iter=5000).fit(design(data.train_columns, True), data.train_labels)
    return float(roc_auc_score(data.test_labels, model.predict_proba(design(data.test_columns, False))[:, 1]))
