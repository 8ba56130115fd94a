"""Labelled arrays read in chunks and written as two flat files, rows sorted by class. Blocking, bounded memory.

Sources: ``.npy`` pairs are not a format users bring, so the inputs are the ones of
:mod:`.datasets`: ``.npz`` (members read as streams, nothing unpickled), ``.pt`` (memory-mapped,
``weights_only``), ``.csv`` (the stdlib reader, twice). Memory holds the labels (8 bytes a row)
and one chunk of features; the features go straight to a memory-mapped output file.
Within a class rows keep a seeded shuffle, so a split that takes a class's tail is a random one.
"""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.models.datasets import ArrayLayout
from aitbc_agent_sdk.training.datasets import class_indices

ARRAY_SUFFIXES = (".npz", ".pt", ".csv")
CHUNK_BYTES = 4 << 20  # rows scatter over the output: a chunk maps at most this many rows' pages
_KEY_PAIRS = (("x", "y"), ("X", "y"), ("features", "labels"))
_SHUFFLE_SEED = 0  # fixed: the same file always becomes the same dataset (and CID)


def _pick(names: list[str], source: Path) -> tuple[str, str]:
    for fx, fy in _KEY_PAIRS:
        if fx in names and fy in names:
            return fx, fy
    wanted = ", ".join(f"{a}/{b}" for a, b in _KEY_PAIRS)
    raise DatasetError(f"{source}: expected arrays {wanted}; found {sorted(names)}")


def _npz_member(archive: zipfile.ZipFile, name: str, source: Path) -> tuple[tuple[int, ...], np.dtype, object]:
    stream = archive.open(name + ".npy")
    try:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(stream)  # the header only: the data is read in chunks
    except ValueError as exc:
        raise DatasetError(f"{source}: member {name} is not a .npy array ({exc})") from exc
    if fortran or dtype.hasobject:
        raise DatasetError(f"{source}: member {name} must be a C-ordered numeric array")
    return tuple(shape), dtype, stream


def _npz_rows(path: Path) -> tuple[np.ndarray, Iterator[np.ndarray], tuple[int, ...]]:
    try:
        archive = zipfile.ZipFile(path)
        names = [n[:-4] for n in archive.namelist() if n.endswith(".npy")]
    except (OSError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{path}: not a readable .npz file ({exc})") from exc
    fx, fy = _pick(names, path)
    shape_y, dtype_y, stream_y = _npz_member(archive, fy, path)
    labels = np.frombuffer(stream_y.read(), dtype=dtype_y).reshape(shape_y)
    shape_x, dtype_x, stream_x = _npz_member(archive, fx, path)

    def chunks() -> Iterator[np.ndarray]:
        row = int(np.prod(shape_x[1:], dtype=np.int64)) * dtype_x.itemsize
        per = max(1, CHUNK_BYTES // max(row, 1))
        left = shape_x[0] if shape_x else 0
        with archive:
            while left > 0:
                n = min(per, left)
                raw = stream_x.read(n * row)
                if len(raw) != n * row:
                    raise DatasetError(f"{path}: member {fx} ends early")
                yield np.frombuffer(raw, dtype=dtype_x).reshape((n, *shape_x[1:]))
                left -= n
    return labels, chunks(), shape_x


def _pt_rows(path: Path) -> tuple[np.ndarray, Iterator[np.ndarray], tuple[int, ...]]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises many types (UnpicklingError, RuntimeError, ...)
        raise DatasetError(f"{path}: not a readable tensor file ({exc})") from exc
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: expected a dict of tensors, got {type(obj).__name__}")
    fx, fy = _pick([k for k in obj if isinstance(k, str)], path)
    x, y = torch.as_tensor(obj[fx]), torch.as_tensor(obj[fy])
    per = max(1, CHUNK_BYTES // max(1, x[0].numel() * x.element_size())) if len(x) else 1
    return (y.numpy(), (x[i:i + per].numpy() for i in range(0, len(x), per)), tuple(x.shape))


def _csv_rows(path: Path, label_column: str | None) -> tuple[np.ndarray, Iterator[np.ndarray], tuple[int, ...]]:
    if label_column is None:
        raise DatasetError(f"{path}: label_column is required for .csv files")
    with path.open(newline="") as fh:
        header = [h.strip() for h in next(csv.reader(fh), [])]
        if label_column not in header:
            raise DatasetError(f"{path}: no label column {label_column!r}; columns are {header}")
        at = header.index(label_column)
        labels = [row[at].strip() for row in csv.reader(fh) if row]
    if len(header) < 2:
        raise DatasetError(f"{path}: no feature columns besides {label_column!r}")
    try:
        label_arr: np.ndarray = np.array([int(v) for v in labels], dtype=np.int64)
    except ValueError:
        label_arr = np.array(labels)

    def chunks() -> Iterator[np.ndarray]:
        per = max(1, CHUNK_BYTES // (4 * len(header)))
        with path.open(newline="") as fh:
            reader = csv.reader(fh)
            next(reader)
            rows: list[list[float]] = []
            for line_no, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) != len(header):
                    raise DatasetError(f"{path}:{line_no}: {len(row)} fields, header has {len(header)}")
                try:
                    rows.append([float(v) for i, v in enumerate(row) if i != at])
                except ValueError as exc:
                    raise DatasetError(f"{path}:{line_no}: non-numeric feature value ({exc})") from exc
                if len(rows) == per:
                    yield np.array(rows, dtype=np.float32)
                    rows = []
            if rows:
                yield np.array(rows, dtype=np.float32)
    return label_arr, chunks(), (len(labels), len(header) - 1)


def write_class_sorted(source: Path, out_dir: Path, *, label_column: str | None = None) -> ArrayLayout:
    """Convert ``source`` into ``out_dir/x.f32`` and ``out_dir/y.i64``; return their layout."""
    suffix = source.suffix.lower()
    if suffix == ".csv":
        labels_raw, chunks, shape = _csv_rows(source, label_column)
    elif suffix == ".npz":
        labels_raw, chunks, shape = _npz_rows(source)
    elif suffix == ".pt":
        labels_raw, chunks, shape = _pt_rows(source)
    else:
        raise DatasetError(f"{source}: unknown extension {suffix!r}; use .npz, .pt or .csv")
    return _write_sorted(np.asarray(labels_raw), chunks, shape, str(source), out_dir)


def write_labeled(features: np.ndarray, labels: np.ndarray, out_dir: Path, *, source: str = "(in memory)") -> ArrayLayout:
    """The same files from arrays in memory (a bundled dataset, or data an SDK user hands over)."""
    per = max(1, CHUNK_BYTES // max(1, features[0].nbytes)) if len(features) else 1
    chunks = (features[i:i + per] for i in range(0, len(features), per))
    return _write_sorted(np.asarray(labels), chunks, tuple(features.shape), source, out_dir)


def _write_sorted(labels_raw: np.ndarray, chunks: Iterator[np.ndarray], shape: tuple[int, ...], source: str,
                  out_dir: Path) -> ArrayLayout:
    y, num_classes = class_indices(labels_raw, source)
    if len(shape) < 2 or shape[0] != len(y):
        raise DatasetError(f"{source}: features must have shape [N, ...] with N = {len(y)} labels, got {shape}")
    rng = np.random.default_rng(_SHUFFLE_SEED)
    order = np.lexsort((rng.permutation(len(y)), y))  # by class, shuffled within a class
    dest = np.empty_like(order)
    dest[order] = np.arange(len(order))
    out_dir.mkdir(parents=True, exist_ok=True)
    # Raw files, not .npy: a shard is then a plain byte range of each. The output is mapped per
    # chunk only, so the pages a chunk scatters to leave the process's RSS with it.
    shape_out = (len(y), *shape[1:])
    np.memmap(out_dir / "x.f32", dtype=np.float32, mode="w+", shape=shape_out).flush()
    at = 0
    for chunk in chunks:
        block = np.asarray(chunk, dtype=np.float32)
        if block.shape[1:] != tuple(shape[1:]) or at + len(block) > len(y):
            raise DatasetError(f"{source}: feature rows do not match the declared shape {shape}")
        if not np.isfinite(block).all():
            raise DatasetError(f"{source}: features contain NaN or infinity")
        features = np.memmap(out_dir / "x.f32", dtype=np.float32, mode="r+", shape=shape_out)
        features[dest[at:at + len(block)]] = block
        features.flush()
        del features
        at += len(block)
    if at != len(y):
        raise DatasetError(f"{source}: {at} feature rows but {len(y)} labels")
    y[order].astype("<i8").tofile(out_dir / "y.i64")
    counts = np.bincount(y, minlength=num_classes)
    return ArrayLayout(feature_shape=tuple(int(d) for d in shape[1:]), num_classes=num_classes,
                       class_rows=tuple(int(c) for c in counts))
