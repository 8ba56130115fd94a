"""The coordinator's new model (outer step, momentum kept in the store, the model's encoded change) and
a provider rebuilding that model from the last round's and the change, on a real local content store."""

from __future__ import annotations

import pytest
import torch

from aitbc_agent_sdk.coordinator.data._inputs import job_task, new_job
from aitbc_agent_sdk.coordinator.round._round_model import outer_step
from aitbc_agent_sdk.coordinator.data._tasks import spec_for_dataset
from aitbc_agent_sdk.records import (
    JobConfig, ModelSpec, Shard, TaskRef, TrainingRecord, TrainingSpec, WeightsDelta, WorkerContract,
)
from aitbc_agent_sdk.provider._cache import ContentCache
from aitbc_agent_sdk.provider._weights_delta import rebuilt_weights
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.aggregate._aggregation import FedAvg
from aitbc_agent_sdk.wire._checkpoint import decode_state, encode_state
from aitbc_agent_sdk.aggregate._outer import NesterovOuter
from aitbc_agent_sdk.wire._update_codec import encode_update

COORDINATOR = "0x" + "11" * 20
WORKER = "0x" + "22" * 20


def model(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(300, 7, generator=g), "b": torch.randn(7, generator=g),
            "steps": torch.tensor([seed], dtype=torch.int64)}


def aggregate_of(states) -> FedAvg:
    strategy = FedAvg()
    for state in states:
        strategy.accumulate(state, 1.0)
    return strategy


def record(spec: TrainingSpec, **fields) -> TrainingRecord:
    return TrainingRecord(training_id="training_1", spec=spec, coordinator=COORDINATOR, **fields)


async def test_diloco_momentum_survives_a_coordinator_restart_through_the_store(tmp_path):
    store = LocalContentStore(tmp_path / "store")
    spec = TrainingSpec(model_type="mlp", target_workers=2, outer="diloco")
    start = model(0)
    # An uninterrupted outer optimizer, for comparison: two rounds of two workers.
    oracle, rounds = NesterovOuter(0.7, 0.9), [[model(1), model(2)], [model(3), model(4)]]
    expected = oracle.step(start, aggregate_of(rounds[0]).result())
    expected = oracle.step(expected, aggregate_of(rounds[1]).result())
    # The coordinator: a fresh outer optimizer each round (as after a restart), its state from the record.
    first = await outer_step(store, record(spec), start, aggregate_of(rounds[0]))
    assert first.outer_state_cid is not None and first.delta_cid is not None  # diloco uploads float32 changes
    after_first = decode_state(await store.cat(first.model_cid))
    resumed = record(spec, **first.record_update("Qm" + "a" * 44))
    second = await outer_step(store, resumed, after_first, aggregate_of(rounds[1]))
    final = decode_state(await store.cat(second.model_cid))
    for key in ("w", "b"):
        assert torch.allclose(final[key], expected[key], atol=1e-5), key
    # Without the stored momentum the second step differs: the test can see a lost state.
    forgot = await outer_step(store, record(spec), after_first, aggregate_of(rounds[1]))
    assert not torch.allclose(decode_state(await store.cat(forgot.model_cid))["w"], expected["w"], atol=1e-3)


async def test_fedavg_of_weights_keeps_no_state_and_sends_no_change(tmp_path):
    store = LocalContentStore(tmp_path / "store")
    new = await outer_step(store, record(TrainingSpec(model_type="mlp", target_workers=2)), model(0),
                           aggregate_of([model(1), model(2)]))
    assert new.outer_state_cid is None and new.delta_cid is None and new.residual_cid is None
    got = decode_state(await store.cat(new.model_cid))
    assert torch.equal(got["w"], (model(1)["w"] + model(2)["w"]) / 2)


async def prepared(tmp_path, encoding: str):
    """A training after one int8 round: the old model held by a provider's cache, the new one and its change."""
    store = LocalContentStore(tmp_path / "store")
    spec = TrainingSpec(model_type="mlp", target_workers=1, outer="diloco", update_encoding=encoding)
    base = model(0)
    base_cid = await store.add(encode_state(base))
    new = await outer_step(store, record(spec, model_cid=base_cid), base, aggregate_of([model(5)]))
    fields = {**new.record_update(base_cid), "round": 1}
    job = new_job(record(spec, **fields), WorkerContract(
        contract_id="contract_1", training_id="training_1", worker_id=WORKER, coordinator=COORDINATOR,
        price_wei=1, rounds=2, accepted_at=0.0, shard_index=0),
        Shard(shard_id="shard_1", index=0, cid=base_cid, samples=10, label_counts=(5, 5)),
        ModelSpec(name="mlp", input_shape=(4,), num_classes=2), JobConfig(),
        shard_bytes=1, weights_bytes=await store.size(new.model_cid), delta_bytes=await store.size(new.delta_cid))
    cache = await ContentCache(tmp_path / "cache", 1 << 30).open()
    return store, cache, job, base_cid


@pytest.mark.parametrize("encoding", ["float32", "int8"])
async def test_a_provider_holding_last_rounds_model_rebuilds_the_new_one_exactly(tmp_path, encoding):
    store, cache, job, base_cid = await prepared(tmp_path, encoding)
    assert job.weights_delta is not None and job.weights_delta.encoding == encoding
    assert job.weights_delta.delta_bytes < job.weights_bytes * (0.3 if encoding == "int8" else 1.1)
    assert await rebuilt_weights(cache, store, job) is None  # it does not hold the base: fetch the model
    (await cache.acquire(store, base_cid, size=1 << 20)).release()
    rebuilt = await rebuilt_weights(cache, store, job)
    assert rebuilt is not None and rebuilt.blob == await store.cat(job.weights_cid)  # byte for byte
    await cache.close()


async def test_a_change_that_does_not_hash_to_the_jobs_model_is_not_used(tmp_path):
    store, cache, job, base_cid = await prepared(tmp_path, "int8")
    (await cache.acquire(store, base_cid, size=1 << 20)).release()
    other, _ = encode_update(model(9), model(0), "int8")  # a well-formed change to some other model
    assert job.weights_delta is not None
    forged = job.model_copy(update={"weights_delta": WeightsDelta(
        base_cid=base_cid, delta_cid=await store.add(other), delta_bytes=len(other), encoding="int8")})
    assert await rebuilt_weights(cache, store, forged) is None
    garbage = job.model_copy(update={"weights_delta": job.weights_delta.model_copy(
        update={"delta_cid": await store.add(b"not a safetensors file"), "delta_bytes": 22})})
    assert await rebuilt_weights(cache, store, garbage) is None
    await cache.close()


def test_transformer_on_a_corpus_is_the_gpt_and_jobs_name_non_classifier_builtins():
    spec = TrainingSpec(model_type="transformer", target_workers=2)
    assert spec_for_dataset(spec, "tokens").task == TaskRef(name="gpt")
    assert spec_for_dataset(spec, "arrays") is spec  # a sequence classifier on labelled arrays, as before
    user = spec.model_copy(update={"task": TaskRef(name="mine", cid="Qm" + "b" * 44)})
    assert spec_for_dataset(user, "tokens") is user
    assert job_task(TrainingSpec(model_type="mlp", target_workers=1)) is None  # named by its model spec
    assert job_task(TrainingSpec(model_type="gpt", target_workers=1)) == TaskRef(name="gpt")
    assert TrainingSpec(model_type="mlp", target_workers=1, outer="diloco").upload_encoding == "float32"
    assert TrainingSpec(model_type="mlp", target_workers=1).upload_encoding == "weights"
