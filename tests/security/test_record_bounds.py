"""Attack: records with no size bounds. A stranger's ModelSpec could ask for any hidden width or input
shape, and a CSV label of 1e9 made a 1,000,000,001-class head (about 512 GB); the provider's
contract table, job queue and progress history grew with every message. Now every record is
bounded, a model's size is estimated before it is built, and every cache has a maximum.
"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from aitbc_agent_sdk import limits
from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.records import ContractReply, JobCancel, ModelSpec, Progress, ShardManifest, new_id
from aitbc_agent_sdk.provider import _node as provider_agent
from aitbc_agent_sdk.provider._book import BookLimits, contract_key
from aitbc_agent_sdk.tasks._networks import build_model
from aitbc_agent_sdk.data._datasets import load_dataset

from tests.security.provider_rig import WAIT_S, provider_rig, servers  # noqa: F401 (servers: a fixture)


@pytest.mark.parametrize("fields, words", [
    ({"num_classes": 1_000_000_001}, "num_classes"),
    ({"hidden": 10**9}, "hidden"),
    ({"input_shape": (1,) * 64}, "input_shape"),
    ({"input_shape": (10**9,)}, "input_shape"),
    ({"input_shape": ()}, "input_shape"),
    ({"name": "cnn", "input_shape": (1024, 1024), "hidden": 8}, "activations"),  # 16.8 M parameters, 27 M floats
    ({"name": "transformer", "input_shape": (5000,)}, "tokens"),
])
def test_an_oversized_model_spec_is_rejected_with_a_clear_error(fields, words):
    with pytest.raises(ValidationError, match=words):
        ModelSpec.model_validate({"name": "mlp", "input_shape": (64,), "num_classes": 10} | fields)


def test_the_size_estimate_matches_the_models_the_registry_builds():
    for spec in (ModelSpec(name="mlp", input_shape=(64,), num_classes=10, hidden=128),
                 ModelSpec(name="cnn", input_shape=(8, 8), num_classes=10, hidden=64),
                 ModelSpec(name="cnn", input_shape=(1, 28, 28), num_classes=7, hidden=32),
                 ModelSpec(name="transformer", input_shape=(64,), num_classes=10, hidden=128),
                 ModelSpec(name="transformer", input_shape=(30,), num_classes=3, hidden=32)):
        built = sum(p.numel() for p in build_model(spec).parameters())
        assert limits.model_size(spec.name, spec.input_shape, spec.num_classes, spec.hidden).parameters == built


@pytest.mark.parametrize("record, fields", [
    (JobCancel, {"job_id": "job_1", "training_id": "training_1", "reason": "x" * 100_000}),
    (ContractReply, {"contract_id": "contract_1", "accepted": False, "reason": "x" * 100_000}),
    (Progress, {"job_id": "job_1", "training_id": "training_1", "worker_id": "0x" + "11" * 20, "round": 1,
                "status": "failed", "epoch": 0, "epochs": 1, "progress": 0.0, "error": "x" * 100_000}),
    (Progress, {"job_id": "job_1", "training_id": "training_1", "worker_id": "0x" + "11" * 20, "round": 1,
                "status": "running", "epoch": 0, "epochs": 1, "progress": 0.0, "loss": float("nan")}),
])
def test_unbounded_text_and_non_finite_numbers_from_strangers_are_rejected(record, fields):
    with pytest.raises(ValidationError):
        record.model_validate(fields)


def test_a_manifest_with_more_label_counts_than_classes_allowed_is_rejected():
    cid = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    shard = {"shard_id": "s", "index": 0, "cid": cid, "samples": 1, "label_counts": [1] * (limits.MAX_CLASSES + 1)}
    with pytest.raises(ValidationError):
        ShardManifest.model_validate({"dataset_cid": cid, "test_cid": cid, "partition": "iid", "seed": 0,
                                      "num_classes": 2, "feature_shape": [4], "shards": [shard]})


def test_a_csv_label_of_a_billion_is_a_dataset_error_not_a_billion_class_head(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("a,b,label\n0.1,0.2,0\n0.3,0.4,1\n0.5,0.6,1000000000\n")
    with pytest.raises(DatasetError, match="label 1000000000 .*at most"):
        load_dataset(path, label_column="label")
    arrays = tmp_path / "data.npz"
    np.savez(arrays, x=np.zeros((3, 2), dtype=np.float32), y=np.array([0, 1, 10**9]))
    with pytest.raises(DatasetError, match="at most"):
        load_dataset(arrays)


async def test_the_provider_contract_table_and_progress_history_stay_bounded(servers, monkeypatch):
    # Small maxima so the test floods past them in seconds; the mechanism is the same at any size.
    monkeypatch.setattr(provider_agent, "MAX_JOB_HISTORY", 2)
    async with provider_rig(servers, contract_limits=BookLimits(unfunded=8)) as rig:
        ids = [new_id("contract") for _ in range(19)]
        for contract_id in ids:
            await rig.send(topics.negotiate(rig.provider.address), rig.proposal(contract_id))
        await rig.feeds["replies"].first(lambda v: v.message.contract_id == ids[-1], timeout=WAIT_S)
        ids.append(await rig.hire())  # the twentieth, opened on chain so its jobs run
        assert len(rig.provider._contracts) <= 8
        # the newest contracts are the ones kept
        assert rig.provider._contracts.get(contract_key(rig.attacker.address, ids[-1])) is not None
        jobs = [await rig.job(ids[-1]) for _ in range(3)]
        for job in jobs:
            await rig.send(topics.jobs(rig.provider.address), job)
        await rig.feeds["results"].first(lambda v: v.message.job_id == jobs[-1].job_id)
        assert len(rig.provider.jobs) <= 2 and rig.provider.progress(jobs[-1].job_id) is not None


async def test_the_provider_refuses_jobs_beyond_its_queue(servers):
    async with provider_rig(servers) as rig:
        contract = await rig.hire()
        limit = provider_agent.MAX_JOBS_PER_CONTRACT
        # Long jobs, so the first ones are still queued or running when the rest arrive.
        jobs = [await rig.job(contract, epochs=1000) for _ in range(limit + 3)]
        for job in jobs:
            await rig.send(topics.jobs(rig.provider.address), job)
        refused = [await rig.feeds["progress"].first(
            lambda v, j=j: v.message.job_id == j.job_id and v.message.status == "failed") for j in jobs[limit:]]
        assert all("queue" in v.message.error for v in refused)
        assert len(rig.provider.active_job_ids) == limit
        assert rig.provider.dropped["jobs: queue full"] == 3


async def test_a_job_whose_model_is_too_large_fails_before_the_provider_builds_it(servers):
    async with provider_rig(servers) as rig:
        contract = await rig.hire()
        # 4096 x 8192 weights: 33.6 M parameters, more than a job without a declared footprint may build
        huge = ModelSpec.model_construct(name="mlp", input_shape=(4096,), num_classes=10, hidden=8192)
        bad = await rig.job(contract, model=huge)
        await rig.send(topics.jobs(rig.provider.address), bad)
        valid = await rig.job(contract)
        await rig.send(topics.jobs(rig.provider.address), valid)
        await rig.feeds["results"].first(lambda v: v.message.job_id == valid.job_id)
        assert not any(v.message.job_id == bad.job_id for v in rig.feeds["progress"].items)
        assert rig.provider.channel.verifier.dropped["invalid"] >= 1
