"""Datasets through the coordinator's store: imported once as directories, shards read back by slices."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aitbc_agent_sdk.coordinator.data._datasets import DatasetStore
from aitbc_agent_sdk.coordinator.data._sharding import publish_shards
from aitbc_agent_sdk.errors import ConfigError, DatasetError
from aitbc_agent_sdk.records import TrainingRecord, TrainingSpec
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.data._corpus import decode_bytes
from aitbc_agent_sdk.data._shard_files import TokenData


def record(cid: str, **spec) -> TrainingRecord:
    return TrainingRecord(training_id="training_ds", spec=TrainingSpec(model_type="mlp", target_workers=2, **spec),
                          coordinator="0x" + "1" * 40, dataset_cid=cid)


def blocks_on_disk(store_root: Path) -> int:
    return sum(p.stat().st_size for p in (store_root / "blocks").rglob("*") if p.is_file())


async def test_arrays_are_stored_once_and_shards_are_slices_of_them(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path / "store")
    data = DatasetStore(store, tmp_path / "data")
    cid, manifest = await data.import_dataset("digits")
    stored = blocks_on_disk(tmp_path / "store")
    published = await publish_shards(data, record(cid), manifest, 3)
    # Shards are records of slices: the store grew by kilobytes, not by another copy of the data.
    assert blocks_on_disk(tmp_path / "store") - stored < 64 << 10
    assert manifest.total_bytes <= stored < 1.1 * manifest.total_bytes
    shards = [await data.load(s.cid) for s in published.shards]
    test = await data.load(published.manifest.test_cid)
    digits = load_dataset("digits")
    rows = sorted(map(tuple, np.concatenate([s.features.numpy() for s in [*shards, test]]).tolist()))
    assert rows == sorted(map(tuple, digits.features.numpy().tolist()))  # every row once, in a shard or the test
    assert [len(s) for s in shards] == [s.samples for s in published.shards]
    assert all(tuple(np.bincount(s.labels.numpy(), minlength=10)) == p.label_counts
               for s, p in zip(shards, published.shards))
    assert not any((tmp_path / "data" / "staging").iterdir())
    again, _ = await data.import_dataset("digits")
    assert again == cid  # the same data, the same CID


async def test_an_image_folder_is_stored_as_it_is_and_decoded_by_the_loader(tmp_path: Path) -> None:
    folder = tmp_path / "pets"
    rng = np.random.default_rng(0)
    for cls, tint in (("cat", 40), ("dog", 200)):
        (folder / cls).mkdir(parents=True)
        for i in range(6):
            pixels = np.clip(rng.normal(tint, 10, size=(20 + i, 24, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / cls / f"{i} photo.png")
    store = LocalContentStore(tmp_path / "store")
    data = DatasetStore(store, tmp_path / "data")
    cid, manifest = await data.import_dataset(folder)
    assert manifest.kind == "images" and manifest.classes == ("cat", "dog")
    assert manifest.root == await store.add_directory(folder, only_hash=True)  # the folder's own CID
    published = await publish_shards(data, record(cid, test_fraction=0.34), manifest, 2)
    shard = await data.load(published.shards[0].cid)
    assert shard.features.shape[1:] == (3, 32, 32) and shard.num_classes == 2
    for image, label in zip(shard.features, shard.labels):  # dark cats, bright dogs: labels follow the folders
        assert (float(image.mean()) > 0.5) == bool(label)


async def test_a_corpus_is_tokenized_and_shards_read_as_token_streams(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"{i}.txt").write_text(f"document {i}. " * 500)
    data = DatasetStore(LocalContentStore(tmp_path / "store"), tmp_path / "data")
    cid, manifest = await data.import_dataset(corpus)
    assert manifest.kind == "tokens" and manifest.tokens.vocab_size == 257
    published = await publish_shards(data, record(cid), manifest, 2)
    streams = [await data.load(s.cid) for s in published.shards]
    assert all(isinstance(s, TokenData) for s in streams)
    text = "".join(decode_bytes(np.concatenate(s.parts)) for s in streams)
    assert "document 0. document 0." in text and len(text) == sum(s.samples for s in published.shards)


async def test_bad_input_leaves_nothing_behind_and_too_large_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.ones((4, 2)), y=np.zeros(4))
    data = DatasetStore(LocalContentStore(tmp_path / "store"), tmp_path / "data")
    with pytest.raises(DatasetError, match="at least 2 classes"):
        await data.import_dataset(bad)
    staging = tmp_path / "data" / "staging"
    assert not staging.exists() or not any(staging.iterdir())
    with pytest.raises(ConfigError, match="more than"):
        await data.import_dataset("digits", declared_size=1000)  # staged, measured, refused, removed
    assert not any(staging.iterdir())


class FailingOnceStore(LocalContentStore):
    """Fault injection (a mock, labelled): the store fails one import midway, as a daemon that dies would."""

    failed = False

    async def add_directory(self, path, **kwargs):
        if not self.failed:
            self.failed = True
            raise OSError("the store went away")
        return await super().add_directory(path, **kwargs)


async def test_an_interrupted_import_is_not_reused_for_another_target_or_column(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = ["a,b,grade,score"] + [f"{x:.3f},{y:.3f},{g},{g + 0.5 * y:.3f}"
                                  for x, y, g in zip(rng.normal(size=60), rng.normal(size=60), rng.integers(0, 3, 60))]
    csv = tmp_path / "grades.csv"
    csv.write_text("\n".join(rows) + "\n")
    data = DatasetStore(FailingOnceStore(tmp_path / "store"), tmp_path / "data")
    with pytest.raises(OSError):  # interrupted after preparing: its staging stays for a rerun to resume
        await data.import_dataset(csv, label_column="grade", target="classes")
    _, other_column = await data.import_dataset(csv, label_column="score")  # detected, not the staged classes
    assert other_column.arrays.target == "values" and other_column.arrays.feature_shape == (3,)
    _, as_values = await data.import_dataset(csv, label_column="grade", target="values")
    assert (as_values.arrays.target, as_values.arrays.num_classes) == ("values", 0)
    _, as_classes = await data.import_dataset(csv, label_column="grade", target="classes")
    assert (as_classes.arrays.target, as_classes.arrays.num_classes) == ("classes", 3)
