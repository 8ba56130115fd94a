"""Shards as slices of a dataset's files: disjoint, covering, deterministic, and never a copy."""

from __future__ import annotations

import numpy as np
import pytest

from aitbc_agent_sdk.records._datasets import ArrayLayout, DatasetFile, DatasetManifest, ImageLayout, TokenLayout
from aitbc_agent_sdk.data._file_sharding import (
    array_rows, class_ranges, merge_shards, plan_split, shard_data, shard_label_counts, sub_shard)

CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


def arrays_manifest(class_rows: tuple[int, ...], width: int = 3) -> DatasetManifest:
    layout = ArrayLayout(feature_shape=(width,), num_classes=len(class_rows), class_rows=class_rows)
    rows = sum(class_rows)
    return DatasetManifest(kind="arrays", root=CID, arrays=layout, files=(
        DatasetFile(path="x.f32", cid=CID, size=rows * width * 4), DatasetFile(path="y.i64", cid=CID, size=rows * 8)))


def rows_of(slices) -> list[int]:
    xs, ys = array_rows(slices)
    out: list[int] = []
    for x, y in zip(xs, ys):
        assert x.offset // 12 == y.offset // 8 and x.length // 12 == y.length // 8  # the pairs cut the same rows
        out += range(y.offset // 8, y.end // 8)
    return out


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_array_shards_partition_the_train_rows_and_follow_the_classes(partition: str) -> None:
    manifest = arrays_manifest((50, 7, 130, 2))
    plan = plan_split(manifest, num_shards=5, test_fraction=0.2, partition=partition, alpha=0.3, seed=3)
    test = rows_of(plan.test)
    shards = [rows_of(s) for s in plan.shards]
    every = sorted(test + [r for s in shards for r in s])
    assert every == list(range(189))  # disjoint and covering
    ranges = class_ranges(manifest.arrays.class_rows)
    for rows, counts in zip(shards, plan.label_counts):
        assert len(rows) >= 1
        assert counts == tuple(sum(a <= r < b for r in rows) for a, b in ranges)
    assert plan.test_label_counts == (10, 1, 26, 1)  # each class's tail, one row at least
    again = plan_split(manifest, num_shards=5, test_fraction=0.2, partition=partition, alpha=0.3, seed=3)
    assert again == plan
    if partition == "iid":
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 1
    else:
        other = plan_split(manifest, num_shards=5, test_fraction=0.2, partition=partition, alpha=0.3, seed=4)
        assert other.label_counts != plan.label_counts


def test_dirichlet_gives_every_shard_a_row_even_when_skewed() -> None:
    plan = plan_split(arrays_manifest((6, 6)), num_shards=8, test_fraction=0.2, partition="dirichlet",
                      alpha=0.01, seed=0)
    assert all(s.samples >= 1 for s in plan.shards)
    with pytest.raises(ValueError, match="cannot make"):
        plan_split(arrays_manifest((3, 3)), num_shards=8, test_fraction=0.2, partition="iid", alpha=1, seed=0)


def tokens_manifest(sizes: list[int]) -> DatasetManifest:
    files = tuple(DatasetFile(path=f"tokens/{i:06d}.bin", cid=CID, size=2 * n) for i, n in enumerate(sizes))
    return DatasetManifest(kind="tokens", root=CID, files=files, tokens=TokenLayout(vocab_size=257, eot=256))


def test_token_shards_hold_out_whole_files_and_cut_the_rest_evenly() -> None:
    manifest = tokens_manifest([100, 40, 77, 300, 13])
    plan = plan_split(manifest, num_shards=3, test_fraction=0.1, partition="iid", alpha=1.0, seed=1)
    assert all(s.offset == 0 and s.length == manifest.file(s.path).size for s in plan.test.slices)
    held = {s.path for s in plan.test.slices}
    assert 1 <= len(held) < 5
    covered: dict[str, list[tuple[int, int]]] = {}
    for shard in plan.shards:
        assert all(s.path not in held and s.offset % 2 == 0 and s.length % 2 == 0 for s in shard.slices)
        for s in shard.slices:
            covered.setdefault(s.path, []).append((s.offset, s.end))
    for path, spans in covered.items():  # each remaining file exactly tiled, in order
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == manifest.file(path).size
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    sizes = [s.samples for s in plan.shards]
    assert sum(sizes) + plan.test.samples == 530 and max(sizes) - min(sizes) <= 1


def test_one_token_file_gives_its_tail_to_the_test_split() -> None:
    plan = plan_split(tokens_manifest([1000]), num_shards=4, test_fraction=0.1, partition="iid", alpha=1, seed=0)
    (test,) = plan.test.slices
    assert (test.offset, test.length) == (1800, 200)
    assert [s.samples for s in plan.shards] == [225] * 4


def test_image_files_split_by_label() -> None:
    files = tuple(DatasetFile(path=f"c{i % 3}/{i}.png", cid=CID, size=10 + i, label=i % 3) for i in range(60))
    manifest = DatasetManifest(kind="images", root=CID, files=files, classes=("a", "b", "c"), images=ImageLayout())
    plan = plan_split(manifest, num_shards=4, test_fraction=0.25, partition="dirichlet", alpha=0.1, seed=2)
    paths = [s.path for s in plan.test.slices] + [s.path for sh in plan.shards for s in sh.slices]
    assert sorted(paths) == sorted(f.path for f in files)
    assert plan.test_label_counts == (5, 5, 5)
    for shard, counts in zip(plan.shards, plan.label_counts):
        assert counts == tuple(sum(manifest.file(s.path).label == c for s in shard.slices) for c in range(3))
    assert np.std([c for counts in plan.label_counts for c in counts]) > 1  # skewed, as Dirichlet(0.1) is
    shard = shard_data(manifest, plan.shards[0])
    assert shard.labels == tuple(manifest.file(s.path).label for s in plan.shards[0].slices)
    assert shard.classes == ("a", "b", "c") and shard.images == ImageLayout()


def test_hostile_manifests_are_refused() -> None:
    with pytest.raises(ValueError, match="not a dataset path"):
        DatasetFile(path="../etc/passwd", cid=CID, size=1)
    with pytest.raises(ValueError, match="not a dataset path"):
        DatasetFile(path="a/.hidden", cid=CID, size=1)
    with pytest.raises(ValueError, match="do not match"):
        DatasetManifest(kind="arrays", root=CID, files=(DatasetFile(path="x.f32", cid=CID, size=5),
                                                        DatasetFile(path="y.i64", cid=CID, size=8)),
                        arrays=ArrayLayout(feature_shape=(1,), num_classes=2, class_rows=(1, 0)))
    with pytest.raises(ValueError, match="whole number of tokens"):
        DatasetManifest(kind="tokens", root=CID, files=(DatasetFile(path="t.bin", cid=CID, size=3),),
                        tokens=TokenLayout(vocab_size=257, eot=256))


@pytest.mark.parametrize("kind", ["arrays", "tokens", "images"])
def test_a_sub_range_of_shards_merges_back_to_the_same_samples(kind: str) -> None:
    if kind == "arrays":
        manifest = arrays_manifest((40, 25, 31))
    elif kind == "tokens":
        manifest = tokens_manifest([100, 40, 77, 300])
    else:
        files = tuple(DatasetFile(path=f"c{i % 2}/{i}.png", cid=CID, size=5, label=i % 2) for i in range(40))
        manifest = DatasetManifest(kind="images", root=CID, files=files, classes=("a", "b"), images=ImageLayout())
    plan = plan_split(manifest, num_shards=2, test_fraction=0.2, partition="iid", alpha=1, seed=0)
    shard = shard_data(manifest, plan.shards[0])
    n = shard.data.samples
    pieces = [sub_shard(shard, 0, 3), sub_shard(shard, 3, n // 2), sub_shard(shard, n // 2, n)]
    merged = merge_shards(pieces)
    assert merged.data.samples == n
    assert shard_label_counts(merged) == shard_label_counts(shard)
    if kind != "tokens":
        assert shard_label_counts(shard) == plan.label_counts[0]
    # The same bytes: compare the covered (path, byte) sets.
    def covered(s):
        return sorted((x.path, b) for x in s.data.slices for b in range(x.offset, x.end))
    assert covered(merged) == covered(shard)
    assert sum(p.data.samples for p in pieces) == n
    with pytest.raises(ValueError, match="not inside"):
        sub_shard(shard, 0, n + 1)


def test_an_array_sub_range_takes_every_class_in_proportion() -> None:
    manifest = arrays_manifest((40, 40, 40, 40))
    plan = plan_split(manifest, num_shards=2, test_fraction=0.2, partition="iid", alpha=1, seed=0)
    shard = shard_data(manifest, plan.shards[0])
    full = shard_label_counts(shard)
    head = sub_shard(shard, 0, shard.data.samples // 4)  # a range of an IID shard is IID too, not one class
    assert all(abs(c - f / 4) <= 1 for c, f in zip(shard_label_counts(head), full))
