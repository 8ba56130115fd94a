"""Labelled arrays read in chunks and written as flat files, rows sorted by class. Blocking, bounded memory.

Sources: ``.npy`` pairs are not a format users bring, so the inputs are the ones of
:mod:`._datasets`: ``.npz`` (members read as streams, nothing unpickled), ``.pt`` (memory-mapped,
``weights_only``), ``.csv`` (the stdlib reader, twice). Memory holds the labels (8 bytes a row)
and one chunk of features; the features go straight to a memory-mapped output file.
Within a class rows keep a seeded shuffle, so a split that takes a class's tail is a random one. A values
target (``y.f32``, float32 [N, width]) or no target (features only) is one seeded shuffle of all rows.
"""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.records._datasets import ArrayLayout, TargetKind
from aitbc_agent_sdk.data._datasets import (
    class_indices, numeric_text, pick_arrays, target_kind, target_values)

ARRAY_SUFFIXES = (".npz", ".pt", ".csv")
CHUNK_BYTES = 4 << 20  # rows scatter over the output: a chunk maps at most this many rows' pages
_SHUFFLE_SEED = 0  # fixed: the same file always becomes the same dataset (and CID)


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


_Rows = tuple[np.ndarray | None, Iterator[np.ndarray], tuple[int, ...], str]  # target, features, shape, where


def _npz_rows(path: Path) -> _Rows:
    try:
        archive = zipfile.ZipFile(path)
        names = [n[:-4] for n in archive.namelist() if n.endswith(".npy")]
    except (OSError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{path}: not a readable .npz file ({exc})") from exc
    fx, fy = pick_arrays(names, path)
    labels = None
    if fy is not None:
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
    return labels, chunks(), shape_x, f"{path}: array {fy!r}"


def _pt_rows(path: Path) -> _Rows:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises many types (UnpicklingError, RuntimeError, ...)
        raise DatasetError(f"{path}: not a readable tensor file ({exc})") from exc
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: expected a dict of tensors, got {type(obj).__name__}")
    fx, fy = pick_arrays([k for k in obj if isinstance(k, str)], path)
    x = torch.as_tensor(obj[fx])
    y = None if fy is None else torch.as_tensor(obj[fy]).numpy()
    per = max(1, CHUNK_BYTES // max(1, x[0].numel() * x.element_size())) if len(x) else 1
    return (y, (x[i:i + per].numpy() for i in range(0, len(x), per)), tuple(x.shape), f"{path}: tensor {fy!r}")


def _csv_rows(path: Path, label_column: str | None, target: TargetKind | None) -> _Rows:
    if label_column is None and target != "none":
        raise DatasetError(f"{path}: name the target column with --label-column, or pass --target none")
    with path.open(newline="") as fh:
        header = [h.strip() for h in next(csv.reader(fh), [])]
        if label_column is not None and label_column not in header:
            raise DatasetError(f"{path}: no label column {label_column!r}; columns are {header}")
        at = -1 if label_column is None else header.index(label_column)
        labels = [row[at].strip() for row in csv.reader(fh) if row]
    if len(header) < 1 + (at >= 0):
        raise DatasetError(f"{path}: no feature columns besides {label_column!r}")
    label_arr = numeric_text(labels) if at >= 0 else None

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
    return label_arr, chunks(), (len(labels), len(header) - (at >= 0)), f"{path}: column {label_column!r}"


def write_class_sorted(source: Path, out_dir: Path, *, label_column: str | None = None,
                       target: TargetKind | None = None) -> ArrayLayout:
    """Convert ``source`` into ``out_dir/x.f32`` and its target file; return their layout. ``target``: the
    target's kind, detected from the data when None."""
    suffix = source.suffix.lower()
    if suffix == ".csv":
        labels_raw, chunks, shape, where = _csv_rows(source, label_column, target)
    elif suffix == ".npz":
        labels_raw, chunks, shape, where = _npz_rows(source)
    elif suffix == ".pt":
        labels_raw, chunks, shape, where = _pt_rows(source)
    else:
        raise DatasetError(f"{source}: unknown extension {suffix!r}; use .npz, .pt or .csv")
    kind = target_kind(labels_raw, target, where, typed=suffix != ".csv")
    return _write_sorted(labels_raw, kind, chunks, shape, str(source), out_dir)


def write_labeled(features: np.ndarray, labels: np.ndarray | None, out_dir: Path, *, source: str = "(in memory)",
                  target: TargetKind | None = None) -> ArrayLayout:
    """The same files from arrays in memory (a bundled dataset, or data an SDK user hands over)."""
    per = max(1, CHUNK_BYTES // max(1, features[0].nbytes)) if len(features) else 1
    chunks = (features[i:i + per] for i in range(0, len(features), per))
    kind = target_kind(labels, target, f"{source}: the target")
    return _write_sorted(labels, kind, chunks, tuple(features.shape), source, out_dir)


def _target_order(labels_raw: np.ndarray | None, kind: TargetKind, rows: int,
                  source: str) -> tuple[np.ndarray, np.ndarray | None, int]:
    """(the rows' order on disk, the target in that order, classes). Classes: by class, shuffled within one;
    values and none: one seeded shuffle. Pure."""
    rng = np.random.default_rng(_SHUFFLE_SEED)
    if kind == "none":
        return rng.permutation(rows), None, 0
    assert labels_raw is not None
    if kind == "values":
        values = target_values(labels_raw, source)
        order = rng.permutation(len(values))
        return order, values[order].astype("<f4"), 0
    y, num_classes = class_indices(labels_raw, source)
    order = np.lexsort((rng.permutation(len(y)), y))  # by class, shuffled within a class
    return order, y[order].astype("<i8"), num_classes


def _write_sorted(labels_raw: np.ndarray | None, kind: TargetKind, chunks: Iterator[np.ndarray],
                  shape: tuple[int, ...], source: str, out_dir: Path) -> ArrayLayout:
    rows = shape[0] if kind == "none" and shape else (0 if labels_raw is None else len(labels_raw))
    order, target, num_classes = _target_order(labels_raw, kind, rows, source)
    if len(shape) < 2 or shape[0] != len(order):
        raise DatasetError(f"{source}: features must have shape [N, ...] with N = {len(order)} labels, got {shape}")
    if len(order) == 0:
        raise DatasetError(f"{source}: dataset is empty")
    dest = np.empty_like(order)
    dest[order] = np.arange(len(order))
    out_dir.mkdir(parents=True, exist_ok=True)
    # Raw files, not .npy: a shard is then a plain byte range of each. The output is mapped per
    # chunk only, so the pages a chunk scatters to leave the process's RSS with it.
    shape_out = (len(order), *shape[1:])
    np.memmap(out_dir / "x.f32", dtype=np.float32, mode="w+", shape=shape_out).flush()
    at = 0
    for chunk in chunks:
        block = np.asarray(chunk, dtype=np.float32)
        if block.shape[1:] != tuple(shape[1:]) or at + len(block) > len(order):
            raise DatasetError(f"{source}: feature rows do not match the declared shape {shape}")
        if not np.isfinite(block).all():
            raise DatasetError(f"{source}: features contain NaN or infinity")
        features = np.memmap(out_dir / "x.f32", dtype=np.float32, mode="r+", shape=shape_out)
        features[dest[at:at + len(block)]] = block
        features.flush()
        del features
        at += len(block)
    if at != len(order):
        raise DatasetError(f"{source}: {at} feature rows but {len(order)} labels")
    feature_shape = tuple(int(d) for d in shape[1:])
    if kind == "none":
        return ArrayLayout(feature_shape=feature_shape, labels=None, target="none", num_classes=0,
                           class_rows=(len(order),))
    assert target is not None
    if kind == "values":
        target.tofile(out_dir / "y.f32")
        return ArrayLayout(feature_shape=feature_shape, labels="y.f32", target="values",
                           target_width=int(target.shape[1]), num_classes=0, class_rows=(len(order),))
    target.tofile(out_dir / "y.i64")
    counts = np.bincount(target, minlength=num_classes)
    return ArrayLayout(feature_shape=feature_shape, num_classes=num_classes, class_rows=tuple(int(c) for c in counts))
