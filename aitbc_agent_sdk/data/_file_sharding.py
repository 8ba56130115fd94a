"""Shards as slices of a dataset's files: the split is planned on the manifest, nothing is copied. Pure.

* arrays: rows are stored sorted by class, so a class is one row range; a test split takes the
  tail of each class, IID cuts every class into one contiguous piece per shard (rotated so
  shard sizes differ by at most one row), Dirichlet cuts each class by Dirichlet weights.
  A values target or none is one range of shuffled rows (as one class; no Dirichlet partition).
* tokens: whole files are held out for the test split; the rest is one virtual token stream
  cut into equal contiguous ranges (a shard spans file boundaries where it must).
* images and files: a file is a sample; IID and Dirichlet split files (images by their label).

Every plan is deterministic in its seed, and its shards are disjoint and cover the train split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aitbc_agent_sdk.records._datasets import DataSlices, DatasetManifest, FileSlice, ShardData
from aitbc_agent_sdk.data._sharding import dirichlet_partition

RowRange = tuple[int, int]  # [start, stop) of one class


@dataclass(frozen=True)
class SplitPlan:
    test: DataSlices
    shards: list[DataSlices]
    label_counts: list[tuple[int, ...]]  # per shard; () where the dataset has no labels
    test_label_counts: tuple[int, ...]


def plan_split(manifest: DatasetManifest, *, num_shards: int, test_fraction: float, partition: str,
               alpha: float, seed: int) -> SplitPlan:
    """The test split and ``num_shards`` training shards of ``manifest``."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if manifest.kind == "arrays":
        return _plan_arrays(manifest, num_shards, test_fraction, partition, alpha, seed)
    if manifest.kind == "tokens":
        return _plan_tokens(manifest, num_shards, test_fraction, seed)
    return _plan_files(manifest, num_shards, test_fraction, partition, alpha, seed)


def partition_problem(manifest: DatasetManifest, partition: str) -> str | None:
    """Why ``partition`` cannot split ``manifest`` (a Dirichlet partition skews classes), or None."""
    target = manifest.arrays.target if manifest.arrays is not None else "classes"
    if partition != "dirichlet" or target == "classes":
        return None
    return (f"--partition dirichlet skews classes, and this dataset's target is {target}, not classes; "
            f"use --partition iid (or --target classes for integer labels)")


def shard_data(manifest: DatasetManifest, slices: DataSlices) -> ShardData:
    """``slices`` of ``manifest`` as a job carries them: with the dataset's kind, layout and labels."""
    labels: tuple[int, ...] = ()
    if manifest.kind == "images":
        label_of = {f.path: f.label or 0 for f in manifest.files}
        labels = tuple(label_of[s.path] for s in slices.slices)
    if manifest.sealed is not None:  # a sealed file's last chunk is found from its plaintext size
        size_of = {f.path: f.size for f in manifest.files}
        slices = slices.model_copy(update={"slices": tuple(
            s.model_copy(update={"file_size": size_of[s.path]}) for s in slices.slices)})
    return ShardData(kind=manifest.kind, data=slices, classes=manifest.classes, labels=labels,
                     arrays=manifest.arrays, tokens=manifest.tokens, images=manifest.images,
                     sealed=manifest.sealed, dataset=manifest.root if manifest.sealed is not None else None)


# --- arrays -------------------------------------------------------------------------------

def class_ranges(class_rows: tuple[int, ...]) -> list[RowRange]:
    bounds = np.concatenate([[0], np.cumsum(class_rows, dtype=np.int64)])
    return [(int(bounds[c]), int(bounds[c + 1])) for c in range(len(class_rows))]


def _test_rows(n: int, test_fraction: float) -> int:
    # As train_test_split: round per class; a class of >= 2 rows keeps one on each side.
    n_test = int(round(n * test_fraction))
    return min(max(n_test, 1), n - 1) if n >= 2 else n_test


def _iid_pieces(train: list[RowRange], num_shards: int) -> list[list[RowRange]]:
    shards: list[list[RowRange]] = [[] for _ in range(num_shards)]
    offset = 0
    for start, stop in train:
        n = stop - start
        sizes = np.full(num_shards, n // num_shards, dtype=np.int64)
        sizes[: n % num_shards] += 1
        at = start
        for j, size in enumerate(sizes):  # piece j goes to shard (j + offset): the extras rotate round
            if size:
                shards[(j + offset) % num_shards].append((at, at + int(size)))
                at += int(size)
        offset += n % num_shards
    return shards


def _dirichlet_pieces(train: list[RowRange], num_shards: int, alpha: float, seed: int) -> list[list[RowRange]]:
    rng = np.random.default_rng(seed)
    shards: list[list[RowRange]] = [[] for _ in range(num_shards)]
    for start, stop in train:
        n = stop - start
        cuts = (np.cumsum(rng.dirichlet(np.full(num_shards, alpha)))[:-1] * n).astype(np.int64)
        edges = [start, *(start + int(c) for c in cuts), stop]
        for i in range(num_shards):
            if edges[i + 1] > edges[i]:
                shards[i].append((edges[i], edges[i + 1]))
    for i in range(num_shards):  # top up an empty shard from the tail of the largest one
        if not shards[i]:
            donor = max(range(num_shards), key=lambda k: sum(b - a for a, b in shards[k]))
            a, b = max(shards[donor], key=lambda r: r[1] - r[0])
            if b - a < 2:
                raise ValueError(f"cannot give {num_shards} shards a row each")
            shards[donor][shards[donor].index((a, b))] = (a, b - 1)
            shards[i].append((b - 1, b))
    return shards


def _plan_arrays(manifest: DatasetManifest, num_shards: int, test_fraction: float, partition: str,
                 alpha: float, seed: int) -> SplitPlan:
    layout = manifest.arrays
    assert layout is not None
    classes = layout.target == "classes"
    if (problem := partition_problem(manifest, partition)) is not None:
        raise ValueError(problem)
    ranges = class_ranges(layout.class_rows)
    test: list[RowRange] = []
    train: list[RowRange] = []
    for start, stop in ranges:
        cut = stop - _test_rows(stop - start, test_fraction)
        if cut > start:
            train.append((start, cut))
        if stop > cut:
            test.append((cut, stop))
    total = sum(b - a for a, b in train)
    if not test or total < num_shards:
        raise ValueError(f"cannot make {num_shards} shards and a test split from {layout.rows} rows")
    pieces = (_iid_pieces(train, num_shards) if partition == "iid"
              else _dirichlet_pieces(train, num_shards, alpha, seed))
    x = manifest.file(layout.features)
    y = None if layout.labels is None else manifest.file(layout.labels)
    label_bytes = layout.label_bytes

    def slices(rows: list[RowRange]) -> DataSlices:
        rows = sorted(rows)
        xs = [FileSlice(path=x.path, cid=x.cid, offset=a * layout.row_bytes, length=(b - a) * layout.row_bytes)
              for a, b in rows]
        ys = [] if y is None else [FileSlice(path=y.path, cid=y.cid, offset=a * label_bytes,
                                             length=(b - a) * label_bytes) for a, b in rows]
        return DataSlices(slices=tuple(xs + ys), samples=sum(b - a for a, b in rows))

    def counts(rows: list[RowRange]) -> tuple[int, ...]:
        if not classes:
            return ()
        out = [0] * layout.num_classes
        for a, b in rows:
            out[_class_of(ranges, a)] += b - a
        return tuple(out)

    return SplitPlan(test=slices(test), shards=[slices(p) for p in pieces],
                     label_counts=[counts(p) for p in pieces], test_label_counts=counts(test))


def _class_of(ranges: list[RowRange], row: int) -> int:
    return next(c for c, (a, b) in enumerate(ranges) if a <= row < b)


def array_rows(slices: DataSlices, *, labelled: bool = True) -> tuple[list[FileSlice], list[FileSlice]]:
    """A shard of an array dataset as (feature slices, label slices), matched by position; a dataset without a
    target (``labelled`` False) has feature slices only."""
    if not labelled:
        if len({s.path for s in slices.slices}) > 1:
            raise ValueError("an array shard without a target holds one feature file's slices")
        return list(slices.slices), []
    half = len(slices.slices) // 2
    xs, ys = list(slices.slices[:half]), list(slices.slices[half:])
    if len(xs) != len(ys) or len({s.path for s in xs}) > 1 or len({s.path for s in ys}) > 1:
        raise ValueError("an array shard pairs one feature slice with one label slice")
    return xs, ys


# --- tokens -------------------------------------------------------------------------------

def _plan_tokens(manifest: DatasetManifest, num_shards: int, test_fraction: float, seed: int) -> SplitPlan:
    layout = manifest.tokens
    assert layout is not None
    item = layout.itemsize
    files = [f for f in manifest.files if f.path != layout.tokenizer_file and f.size > 0]
    total = sum(f.size for f in files) // item
    target = test_fraction * total
    held: set[int] = set()
    held_tokens = 0
    for i in np.random.default_rng(seed).permutation(len(files)) if len(files) >= 2 else []:
        n = files[int(i)].size // item
        if held_tokens >= target:
            break
        if held_tokens + n <= 2 * target:  # whole files, but not one that would take most of the data
            held.add(int(i))
            held_tokens += n
    if held:
        test = DataSlices(slices=tuple(FileSlice(path=files[i].path, cid=files[i].cid, offset=0, length=files[i].size)
                                       for i in sorted(held)), samples=held_tokens)
        streams = [(f, 0, f.size) for i, f in enumerate(files) if i not in held]
    else:  # no file is small enough: the last file's tail is the test split
        f = files[-1]
        tokens = f.size // item
        cut = (tokens - min(tokens - 1, max(1, int(round(target))))) * item if tokens > 1 else f.size
        if cut >= f.size:
            raise ValueError("the corpus is too small for a test split")
        test = DataSlices(slices=(FileSlice(path=f.path, cid=f.cid, offset=cut, length=f.size - cut),),
                          samples=(f.size - cut) // item)
        streams = [(g, 0, g.size) for g in files[:-1]] + ([(f, 0, cut)] if cut else [])
    train_tokens = sum(stop - start for _, start, stop in streams) // item
    if train_tokens < num_shards:
        raise ValueError(f"cannot make {num_shards} shards from {train_tokens} training tokens")
    sizes = np.full(num_shards, train_tokens // num_shards, dtype=np.int64)
    sizes[: train_tokens % num_shards] += 1
    shards = [_cut(streams, int(sum(sizes[:i])) * item, int(sizes[i]) * item, item) for i in range(num_shards)]
    return SplitPlan(test=test, shards=shards, label_counts=[() for _ in shards], test_label_counts=())


def _cut(streams: list, begin: int, length: int, item: int) -> DataSlices:
    """Bytes [begin, begin + length) of the concatenated streams, as slices of their files."""
    out: list[FileSlice] = []
    at = 0
    for f, start, stop in streams:
        n = stop - start
        lo, hi = max(begin, at), min(begin + length, at + n)
        if lo < hi:
            out.append(FileSlice(path=f.path, cid=f.cid, offset=start + lo - at, length=hi - lo))
        at += n
    return DataSlices(slices=tuple(out), samples=length // item)


# --- images and files ---------------------------------------------------------------------

def _plan_files(manifest: DatasetManifest, num_shards: int, test_fraction: float, partition: str,
                alpha: float, seed: int) -> SplitPlan:
    files = [f for f in manifest.files if f.size > 0]
    labelled = manifest.kind == "images"
    labels = np.array([f.label or 0 for f in files], dtype=np.int64)
    rng = np.random.default_rng(seed)
    test_idx: list[int] = []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        test_idx += members[: _test_rows(len(members), test_fraction)].tolist()
    held = set(test_idx)
    train_idx = np.array([i for i in range(len(files)) if i not in held], dtype=np.int64)
    if not held or len(train_idx) < num_shards:
        raise ValueError(f"cannot make {num_shards} shards and a test split from {len(files)} files")
    if partition == "iid" or not labelled:
        parts = np.array_split(np.random.default_rng(seed + 1).permutation(len(train_idx)), num_shards)
    else:
        parts = dirichlet_partition(labels[train_idx], num_shards, alpha, seed)
    n_classes = len(manifest.classes)

    def slices(idx: list[int]) -> DataSlices:  # in the order given: a shard's files are shuffled
        return DataSlices(slices=tuple(FileSlice(path=files[i].path, cid=files[i].cid, offset=0,
                                                 length=files[i].size) for i in idx), samples=len(idx))

    def counts(idx: list[int]) -> tuple[int, ...]:
        return tuple(int(c) for c in np.bincount(labels[idx], minlength=n_classes)) if labelled else ()

    order = np.random.default_rng(seed + 2)  # within a shard, files in random order: any range is a random part
    shards = [[int(train_idx[j]) for j in order.permutation(np.asarray(part))] for part in parts]
    return SplitPlan(test=slices(sorted(held)), shards=[slices(s) for s in shards],
                     label_counts=[counts(s) for s in shards], test_label_counts=counts(sorted(held)))


# --- re-splitting (the elastic pool moves sample ranges of shards) ------------------------

def _sample_sizes(shard: ShardData) -> tuple[list[FileSlice], list[int], int]:
    """The slices that carry samples, how many samples each holds, and bytes per sample."""
    if shard.kind == "arrays":
        assert shard.arrays is not None
        xs, ys = array_rows(shard.data, labelled=shard.arrays.labels is not None)
        row = shard.arrays.row_bytes
        return xs, [x.length // row for x in xs], row
    if shard.kind == "tokens":
        assert shard.tokens is not None
        item = shard.tokens.itemsize
        return list(shard.data.slices), [s.length // item for s in shard.data.slices], item
    return list(shard.data.slices), [1] * len(shard.data.slices), 0


def sub_shard(shard: ShardData, start: int, end: int) -> ShardData:
    """Samples ``[start, end)`` of ``shard``, as slices of the same files.

    Tokens and files: the samples in the shard's order (an image shard's files are in a seeded random
    order). Arrays: an array shard is one row range per class, so a contiguous range of its rows would
    be a few classes; instead every class range gives its proportional part, rows
    ``[start * n // N, end * n // N)`` of a class with ``n`` of the shard's ``N`` rows. Adjacent ranges
    tile every class exactly, so ranges that partition ``[0, N)`` partition the shard's rows.
    """
    if not 0 <= start < end <= shard.data.samples:
        raise ValueError(f"samples [{start}, {end}) are not inside a shard of {shard.data.samples}")
    carriers, counts, item = _sample_sizes(shard)
    total = shard.data.samples
    picked: list[tuple[int, int, int]] = []  # (slice index, first sample in it, samples taken)
    if shard.kind == "arrays":
        for i, n in enumerate(counts):
            lo, hi = start * n // total, end * n // total
            if hi > lo:
                picked.append((i, lo, hi - lo))
    if not picked:  # in order (or an array range too short to give any class a row)
        at = 0
        for i, n in enumerate(counts):
            lo, hi = max(start, at), min(end, at + n)
            if lo < hi:
                picked.append((i, lo - at, hi - lo))
            at += n
    if shard.kind == "arrays":
        assert shard.arrays is not None
        _, ys = array_rows(shard.data, labelled=shard.arrays.labels is not None)
        row, lab = shard.arrays.row_bytes, shard.arrays.label_bytes
        new_x = [carriers[i].model_copy(update={"offset": carriers[i].offset + a * row, "length": k * row})
                 for i, a, k in picked]
        new_y = [ys[i].model_copy(update={"offset": ys[i].offset + a * lab, "length": k * lab})
                 for i, a, k in picked if ys]
        slices = tuple(new_x + new_y)
    elif item:
        slices = tuple(carriers[i].model_copy(update={"offset": carriers[i].offset + a * item, "length": k * item})
                       for i, a, k in picked)
    else:
        slices = tuple(carriers[i] for i, _, _ in picked)
    labels = tuple(shard.labels[i] for i, _, _ in picked) if shard.labels else ()
    taken = sum(k for _, _, k in picked)
    return shard.model_copy(update={"data": DataSlices(slices=slices, samples=taken), "labels": labels})


def merge_shards(parts: list[ShardData]) -> ShardData:
    """One shard holding ``parts`` in order (all of one dataset)."""
    first = parts[0]
    if first.kind == "arrays":
        assert first.arrays is not None
        pairs = [array_rows(p.data, labelled=first.arrays.labels is not None) for p in parts]
        slices = tuple(x for xs, _ in pairs for x in xs) + tuple(y for _, ys in pairs for y in ys)
    else:
        slices = tuple(s for p in parts for s in p.data.slices)
    return first.model_copy(update={"data": DataSlices(slices=slices, samples=sum(p.data.samples for p in parts)),
                                    "labels": tuple(label for p in parts for label in p.labels)})


def shard_label_counts(shard: ShardData) -> tuple[int, ...]:
    """Samples per class of a labelled shard; () for tokens and files."""
    if shard.kind == "images":
        return tuple(int(c) for c in np.bincount(np.array(shard.labels, dtype=np.int64),
                                                 minlength=len(shard.classes)))
    if shard.kind != "arrays" or shard.arrays is None or shard.arrays.target != "classes":
        return ()
    ranges = class_ranges(shard.arrays.class_rows)
    out = [0] * shard.arrays.num_classes
    for y in array_rows(shard.data)[1]:
        a, b = y.offset // 8, y.end // 8
        for c, (lo, hi) in enumerate(ranges):
            out[c] += max(0, min(b, hi) - max(a, lo))
    return tuple(out)


def spread_sample(shard: ShardData, samples: int, runs: int = 64) -> ShardData:
    """About ``samples`` samples of ``shard`` in ``runs`` evenly spaced runs (a shard's rows are grouped by
    class, so its first rows alone would be one class)."""
    n = shard.data.samples
    if samples >= n:
        return shard
    runs = max(1, min(runs, samples))
    per = max(1, samples // runs)
    starts = np.linspace(0, n - per, runs).astype(np.int64)
    pieces, last = [], -1
    for start in starts:
        lo = max(int(start), last)
        if lo + per <= n and lo < lo + per:
            pieces.append(sub_shard(shard, lo, lo + per))
            last = lo + per
    return merge_shards(pieces)
