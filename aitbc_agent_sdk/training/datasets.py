"""Labelled datasets: load from a bundled name or a local file, split train/test.

Files are read without unpickling anything: ``.npz`` with ``allow_pickle=False``,
``.pt`` with ``weights_only=True``, ``.csv`` with the stdlib reader.
"""

from __future__ import annotations

import csv
import importlib.util
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.limits import MAX_CLASSES

DATASET_NAMES: tuple[str, ...] = ("digits",)

# Accepted (features, labels) key pairs in .npz / .pt files, first match wins.
_KEY_PAIRS = (("x", "y"), ("X", "y"), ("features", "labels"))


@dataclass(frozen=True)
class LabeledData:
    features: torch.Tensor  # float32, [N, *feature_shape]
    labels: torch.Tensor  # int64, [N]
    num_classes: int

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.features.shape[1:])

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: np.ndarray | torch.Tensor) -> LabeledData:
        # num_classes stays global so every shard's model has the same head size.
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.int64)
        return LabeledData(self.features[idx], self.labels[idx], self.num_classes)


def class_indices(raw: np.ndarray, source: str) -> tuple[np.ndarray, int]:
    """Labels as 0..C-1 (integer labels keep their values, others map by sort), as datasets._make does."""
    if raw.ndim != 1:
        raise DatasetError(f"{source}: labels must be 1-D, got shape {raw.shape}")
    if len(raw) == 0:
        raise DatasetError(f"{source}: dataset is empty")
    if np.issubdtype(raw.dtype, np.integer) and raw.min() >= 0:
        if int(raw.max()) >= MAX_CLASSES:
            raise DatasetError(f"{source}: label {int(raw.max())} would make {int(raw.max()) + 1} classes; "
                               f"labels must be at most {MAX_CLASSES - 1}")
        y, num_classes = raw.astype(np.int64), int(raw.max()) + 1
    else:
        classes, y = np.unique(raw, return_inverse=True)
        num_classes = len(classes)
        if num_classes > MAX_CLASSES:
            raise DatasetError(f"{source}: {num_classes} distinct labels; at most {MAX_CLASSES} classes are supported")
    if len(np.unique(y)) < 2:
        raise DatasetError(f"{source}: need at least 2 classes, found {len(np.unique(y))}")
    return y.astype(np.int64), num_classes


def _make(features: object, labels: object, source: str) -> LabeledData:
    """Validate raw arrays and convert to the canonical dtypes."""
    try:
        x = torch.as_tensor(np.asarray(features, dtype=np.float32))
    except (TypeError, ValueError) as exc:
        raise DatasetError(f"{source}: features are not numeric ({exc})") from exc
    y_raw = np.asarray(labels)
    if x.ndim < 2:
        raise DatasetError(f"{source}: features must have shape [N, ...], got {tuple(x.shape)}")
    if y_raw.ndim != 1:
        raise DatasetError(f"{source}: labels must be 1-D, got shape {y_raw.shape}")
    if x.shape[0] != y_raw.shape[0]:
        raise DatasetError(f"{source}: {x.shape[0]} feature rows but {y_raw.shape[0]} labels")
    if x.shape[0] == 0:
        raise DatasetError(f"{source}: dataset is empty")
    if not torch.isfinite(x).all():
        raise DatasetError(f"{source}: features contain NaN or infinity")

    y, num_classes = class_indices(y_raw, source)
    return LabeledData(x.contiguous(), torch.as_tensor(y.astype(np.int64)), num_classes)


def _pick(arrays: dict[str, object], source: str) -> tuple[object, object]:
    for fx, fy in _KEY_PAIRS:
        if fx in arrays and fy in arrays:
            return arrays[fx], arrays[fy]
    wanted = ", ".join(f"{a}/{b}" for a, b in _KEY_PAIRS)
    raise DatasetError(f"{source}: expected arrays {wanted}; found {sorted(arrays)}")


def _load_digits() -> LabeledData:
    # The UCI digits file ships inside scikit-learn. Read it directly: importing
    # sklearn itself costs seconds, paid again in every worker process.
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("the bundled 'digits' dataset needs scikit-learn installed")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    except OSError as exc:
        raise DatasetError(f"digits data file missing from scikit-learn: {path}") from exc
    # 64 pixel columns (0..16) then the label; scale pixels to [0, 1] so default learning rates behave.
    return _make(table[:, :-1] / 16.0, table[:, -1].astype(np.int64), "digits")


def _load_npz(path: Path) -> LabeledData:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{path}: not a readable .npz file ({exc})") from exc
    return _make(*_pick(arrays, str(path)), str(path))


def _load_pt(path: Path) -> LabeledData:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types (UnpicklingError, RuntimeError, ...)
        raise DatasetError(f"{path}: not a readable tensor file ({exc})") from exc
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: expected a dict of tensors, got {type(obj).__name__}")
    x, y = _pick(obj, str(path))
    return _make(torch.as_tensor(x).numpy(), torch.as_tensor(y).numpy(), str(path))


def _load_csv(path: Path, label_column: str | None) -> LabeledData:
    if label_column is None:
        raise DatasetError(f"{path}: label_column is required for .csv files")
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise DatasetError(f"{path}: dataset is empty (no header row)")
        header = [h.strip() for h in header]
        if label_column not in header:
            raise DatasetError(f"{path}: no label column {label_column!r}; columns are {header}")
        label_at = header.index(label_column)
        feature_names = [h for i, h in enumerate(header) if i != label_at]
        rows: list[list[float]] = []
        labels: list[str] = []
        for line_no, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise DatasetError(f"{path}:{line_no}: {len(row)} fields, header has {len(header)}")
            labels.append(row[label_at].strip())
            try:
                rows.append([float(v) for i, v in enumerate(row) if i != label_at])
            except ValueError as exc:
                raise DatasetError(f"{path}:{line_no}: non-numeric feature value ({exc})") from exc
    if not rows:
        raise DatasetError(f"{path}: dataset is empty")
    if not feature_names:
        raise DatasetError(f"{path}: no feature columns besides {label_column!r}")
    # Labels like "0","1" should stay integers so they match other files; others map by sort.
    try:
        label_arr: np.ndarray = np.array([int(v) for v in labels], dtype=np.int64)
    except ValueError:
        label_arr = np.array(labels)
    return _make(np.array(rows, dtype=np.float32), label_arr, str(path))


def load_dataset(source: str | Path, *, label_column: str | None = None) -> LabeledData:
    """Load a bundled dataset by name (see ``DATASET_NAMES``) or a .npz/.pt/.csv file."""
    if isinstance(source, str) and source in DATASET_NAMES:
        return _load_digits()
    path = Path(source)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file, and not a bundled dataset {list(DATASET_NAMES)}")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _load_npz(path)
    if suffix == ".pt":
        return _load_pt(path)
    if suffix == ".csv":
        return _load_csv(path, label_column)
    raise DatasetError(f"{path}: unknown extension {suffix!r}; use .npz, .pt or .csv")


def train_test_split(data: LabeledData, test_fraction: float, seed: int) -> tuple[LabeledData, LabeledData]:
    """Deterministic stratified split: each class contributes ~test_fraction of its samples."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    labels = data.labels.numpy()
    train_parts: list[np.ndarray] = []
    test_parts: list[np.ndarray] = []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        # Round per class; a class with >= 2 samples keeps at least one on each side.
        n_test = int(round(len(members) * test_fraction))
        if len(members) >= 2:
            n_test = min(max(n_test, 1), len(members) - 1)
        test_parts.append(members[:n_test])
        train_parts.append(members[n_test:])
    train_idx = np.sort(np.concatenate(train_parts))
    test_idx = np.sort(np.concatenate(test_parts))
    if len(train_idx) == 0 or len(test_idx) == 0:
        raise DatasetError(f"split of {len(data)} samples at {test_fraction} leaves an empty side")
    return data.subset(train_idx), data.subset(test_idx)
