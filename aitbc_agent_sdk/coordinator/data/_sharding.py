"""How a training's dataset becomes shards: slices of its files, planned on the manifest and stored as records.

Nothing is re-encoded: each shard and the test split is a small :class:`ShardData` record
in the store. The task's ``prepare`` (e.g. input normalisation) sees a bounded sample of the
training split, taken evenly from every shard, however large the dataset is.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError
from ...records import Shard, ShardManifest, TrainingRecord
from ...records._datasets import DatasetManifest, ShardData
from ...data._dataset_dirs import manifest_shape
from ...data._file_sharding import merge_shards, plan_split, shard_data, spread_sample
from ._datasets import DatasetStore

PREPARE_BYTES = 256 << 20  # of the training split, read on the coordinator for the task's prepare()


@dataclass(frozen=True)
class PublishedShards:
    shards: list[Shard]
    manifest: ShardManifest
    prepare_sample: ShardData


async def publish_shards(data: DatasetStore, record: TrainingRecord, dataset: DatasetManifest,
                         num_shards: int) -> PublishedShards:
    spec = record.spec
    assert record.dataset_cid is not None
    try:
        plan = plan_split(dataset, num_shards=num_shards, test_fraction=spec.test_fraction, partition=spec.partition,
                          alpha=spec.dirichlet_alpha, seed=spec.seed)
    except ValueError as exc:
        raise ConfigError(f"training {record.training_id}: {exc}") from exc
    shards: list[Shard] = []
    datas = [shard_data(dataset, s) for s in plan.shards]
    for i, (one, counts) in enumerate(zip(datas, plan.label_counts, strict=True)):
        cid = await data.add_shard(one)
        shards.append(Shard(shard_id=f"{record.training_id}-shard-{i}", index=i, cid=cid, samples=one.data.samples,
                            label_counts=counts))
    test = shard_data(dataset, plan.test)
    test_cid = await data.add_shard(test)
    shape = manifest_shape(dataset)
    manifest = ShardManifest(dataset_cid=record.dataset_cid, test_cid=test_cid, partition=spec.partition,
                             seed=spec.seed, num_classes=shape.num_classes, feature_shape=shape.feature_shape,
                             shards=tuple(shards))
    return PublishedShards(shards, manifest, prepare_sample(datas))


def prepare_sample(shards: list[ShardData], budget: int = PREPARE_BYTES) -> ShardData:
    """Samples spread over every shard, together at most about ``budget`` bytes (all of a small split)."""
    total = sum(s.data.bytes for s in shards)
    if total <= budget:
        return merge_shards(shards)
    return merge_shards([spread_sample(s, max(1, int(s.data.samples * budget / total))) for s in shards])
