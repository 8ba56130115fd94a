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
from aitbc_agent_sdk.records._datasets import MAX_TARGET_WIDTH, TARGET_KINDS, TargetKind

DATASET_NAMES: tuple[str, ...] = ("digits",)

# Accepted (features, labels) key pairs in .npz / .pt files, first match wins.
_KEY_PAIRS = (("x", "y"), ("X", "y"), ("features", "labels"))


@dataclass(frozen=True)
class LabeledData:
    features: torch.Tensor  # float32, [N, *feature_shape]
    labels: torch.Tensor  # classes: int64 [N]; values: float32 [N, width]; none: float32 [N, 0]
    num_classes: int  # classes only; 0 for values and none
    target: TargetKind = "classes"

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.features.shape[1:])

    @property
    def target_width(self) -> int:
        """Floats per row of a values target; 1 otherwise."""
        return int(self.labels.shape[1]) if self.target == "values" else 1

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: np.ndarray | torch.Tensor) -> LabeledData:
        # num_classes stays global so every shard's model has the same head size.
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.int64)
        return LabeledData(self.features[idx], self.labels[idx], self.num_classes, self.target)


# Floats that happen to be whole numbers (0.0/1.0 labels, but also ages or prices) are classes only when
# this few; an untyped column of integers (a CSV's) is classes unless most rows hold a value of their own.
_FEW_DISTINCT = 10


def _integral(raw: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(raw)) and np.all(np.floor(raw) == raw))


def detect_target(raw: np.ndarray, *, typed: bool = True) -> TargetKind:
    """The kind of a target array: strings, booleans and integers of an integer dtype are classes; a vector per
    row and non-integral numbers are values; whole-number floats are classes only when there are few distinct
    ones. An untyped column (a CSV's, ``typed=False``) of integers is classes unless more than half of its rows
    hold a value of their own (then it is more likely a count or a price than a label)."""
    if raw.dtype.kind in "USO":
        return "classes"
    if raw.ndim != 1:  # a vector per row, of whatever number type
        return "values"
    if raw.dtype.kind == "b" or (typed and raw.dtype.kind in "iu"):
        return "classes"
    if not _integral(raw):
        return "values"
    few = _FEW_DISTINCT if typed else max(_FEW_DISTINCT, len(raw) // 2)
    return "classes" if len(np.unique(raw)) <= min(few, MAX_CLASSES) else "values"


def target_kind(raw: np.ndarray | None, wanted: TargetKind | None, where: str, *, typed: bool = True) -> TargetKind:
    """The target kind of ``raw`` (None: the data has no target), ``wanted`` if given and possible.
    ``where`` names the file and column or array in errors."""
    if wanted is not None and wanted not in TARGET_KINDS:
        raise DatasetError(f"{where}: unknown target kind {wanted!r}; use one of {', '.join(TARGET_KINDS)}")
    if raw is None:
        if wanted not in (None, "none"):
            raise DatasetError(f"{where}: there is no target, so --target {wanted} cannot apply; "
                               f"pass --target none or add one")
        return "none"
    found = detect_target(raw, typed=typed)
    if wanted == "classes" and raw.dtype.kind == "f" and not _integral(raw):
        raise DatasetError(f"{where} holds non-integer numbers, which cannot be classes; "
                           f"pass --target values to train on them as values")
    if wanted == "values" and raw.dtype.kind not in "biuf":
        raise DatasetError(f"{where} holds text, which cannot be regression values; "
                           f"pass --target classes, or make the target numeric")
    return wanted or found


def target_values(raw: np.ndarray, source: str) -> np.ndarray:
    """A values target as float32 [N, width]: one value or a vector per row, finite, bounded width."""
    y = np.asarray(raw, dtype=np.float32)
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2 or len(y) == 0:
        raise DatasetError(f"{source}: a values target is one number or a vector per row, got shape {raw.shape}")
    if y.shape[1] < 1 or y.shape[1] > MAX_TARGET_WIDTH:
        raise DatasetError(f"{source}: a target of {y.shape[1]} values per row; at most {MAX_TARGET_WIDTH}")
    if not np.isfinite(y).all():
        raise DatasetError(f"{source}: the target contains NaN or infinity")
    return y


def numeric_text(values: list[str]) -> np.ndarray:
    """A CSV column as the array it spells: int64 if every cell is an integer, float64 if every cell is a number,
    else the strings."""
    try:
        return np.array([int(v) for v in values], dtype=np.int64)
    except ValueError:
        pass
    try:
        return np.array([float(v) for v in values], dtype=np.float64)
    except ValueError:
        return np.array(values)


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


def _make(features: object, labels: object | None, source: str, *, target: TargetKind | None = None,
          where: str | None = None, typed: bool = True) -> LabeledData:
    """Validate raw arrays and convert to the canonical dtypes; ``labels`` None: no target."""
    try:
        x = torch.as_tensor(np.asarray(features, dtype=np.float32))
    except (TypeError, ValueError) as exc:
        raise DatasetError(f"{source}: features are not numeric ({exc})") from exc
    y_raw = None if labels is None else np.asarray(labels)
    kind = target_kind(y_raw, target, where or source, typed=typed)
    if x.ndim < 2:
        raise DatasetError(f"{source}: features must have shape [N, ...], got {tuple(x.shape)}")
    if kind == "classes" and y_raw is not None and y_raw.ndim != 1:
        raise DatasetError(f"{source}: labels must be 1-D, got shape {y_raw.shape}")
    if y_raw is not None and kind != "none" and x.shape[0] != y_raw.shape[0]:
        raise DatasetError(f"{source}: {x.shape[0]} feature rows but {y_raw.shape[0]} labels")
    if x.shape[0] == 0:
        raise DatasetError(f"{source}: dataset is empty")
    if not torch.isfinite(x).all():
        raise DatasetError(f"{source}: features contain NaN or infinity")
    if kind == "none":
        return LabeledData(x.contiguous(), torch.zeros((x.shape[0], 0)), 0, "none")
    assert y_raw is not None
    if kind == "values":
        return LabeledData(x.contiguous(), torch.from_numpy(target_values(y_raw, source)), 0, "values")
    y, num_classes = class_indices(y_raw, source)
    return LabeledData(x.contiguous(), torch.as_tensor(y.astype(np.int64)), num_classes)


def pick_arrays(names: list[str], source: object) -> tuple[str, str | None]:
    """The names of the features and the target among a file's arrays; a file holding the features alone has
    no target (an unknown second array is an error, not a silently dropped target)."""
    for fx, fy in _KEY_PAIRS:
        if fx in names and fy in names:
            return fx, fy
    if len(names) == 1 and names[0] in {fx for fx, _ in _KEY_PAIRS}:
        return names[0], None
    wanted = ", ".join(f"{a}/{b}" for a, b in _KEY_PAIRS)
    raise DatasetError(f"{source}: expected arrays {wanted} (or features alone); found {sorted(names)}")


def _pick(arrays: dict[str, object], source: str) -> tuple[object, object | None, str]:
    """The (features, target, target's name) arrays; a file with features only has no target."""
    fx, fy = pick_arrays(list(arrays), source)
    return arrays[fx], None if fy is None else arrays[fy], fy or ""


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


def _load_npz(path: Path, target: TargetKind | None) -> LabeledData:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{path}: not a readable .npz file ({exc})") from exc
    x, y, name = _pick(arrays, str(path))
    return _make(x, y, str(path), target=target, where=f"{path}: array {name!r}")


def _load_pt(path: Path, target: TargetKind | None) -> LabeledData:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types (UnpicklingError, RuntimeError, ...)
        raise DatasetError(f"{path}: not a readable tensor file ({exc})") from exc
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: expected a dict of tensors, got {type(obj).__name__}")
    x, y, name = _pick(obj, str(path))
    return _make(torch.as_tensor(x).numpy(), None if y is None else torch.as_tensor(y).numpy(), str(path),
                 target=target, where=f"{path}: tensor {name!r}")


def _load_csv(path: Path, label_column: str | None, target: TargetKind | None) -> LabeledData:
    if label_column is None and target != "none":
        raise DatasetError(f"{path}: name the target column with --label-column, or pass --target none")
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise DatasetError(f"{path}: dataset is empty (no header row)")
        header = [h.strip() for h in header]
        if label_column is not None and label_column not in header:
            raise DatasetError(f"{path}: no label column {label_column!r}; columns are {header}")
        label_at = -1 if label_column is None else header.index(label_column)
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
    # Labels like "0","1" stay integers so they match other files; other text maps by sort.
    label_arr = numeric_text(labels) if label_column is not None else None
    return _make(np.array(rows, dtype=np.float32), label_arr, str(path), target=target,
                 where=f"{path}: column {label_column!r}", typed=False)


def load_dataset(source: str | Path, *, label_column: str | None = None,
                 target: TargetKind | None = None) -> LabeledData:
    """Load a bundled dataset by name (see ``DATASET_NAMES``) or a .npz/.pt/.csv file."""
    if isinstance(source, str) and source in DATASET_NAMES:
        return _load_digits()
    path = Path(source)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file, and not a bundled dataset {list(DATASET_NAMES)}")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _load_npz(path, target)
    if suffix == ".pt":
        return _load_pt(path, target)
    if suffix == ".csv":
        return _load_csv(path, label_column, target)
    raise DatasetError(f"{path}: unknown extension {suffix!r}; use .npz, .pt or .csv")


def train_test_split(data: LabeledData, test_fraction: float, seed: int) -> tuple[LabeledData, LabeledData]:
    """Deterministic split: each class contributes ~test_fraction of its samples (values and none: all rows as
    one class)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    labels = data.labels.numpy() if data.target == "classes" else np.zeros(len(data), dtype=np.int64)
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
