"""--encrypt end to end on the embedded stack: IPFS holds ciphertext only, hired workers still train on it."""

from __future__ import annotations

import numpy as np
import pytest

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingPhase, TrainingSpec
from aitbc_agent_sdk.chain._escrow import training_key
from aitbc_agent_sdk.chain._keywrap import data_key_info, unwrap_key
from aitbc_agent_sdk.errors import DecryptionError
from aitbc_agent_sdk.records import ShardManifest
from aitbc_agent_sdk.records._datasets import ShardData
from aitbc_agent_sdk.data._datasets import load_dataset


async def test_a_sealed_dataset_trains_and_the_store_holds_only_ciphertext(aitbc_home):
    config = AgentConfig(home=aitbc_home, providers=2)
    async with Agent(config) as agent:
        spec = TrainingSpec(model_type="mlp", target_workers=2, rounds=2, encrypt=True,
                            job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=2))
        report = await agent.run_distributed_training(spec)
        assert report.status == TrainingPhase.COMPLETE
        assert report.final_accuracy >= 0.85  # the providers trained on the real rows

        store, data = agent.stack.store, agent.coordinator.data
        manifest = ShardManifest.model_validate_json(await store.cat(report.manifest_cid))
        dataset = await data.manifest(manifest.dataset_cid)
        assert dataset.sealed is not None
        plain = load_dataset("digits").features.numpy().astype("<f4")
        first_row = plain[0].tobytes()
        for f in dataset.files:  # what any IPFS peer, or anyone who learns a CID, can read
            stored = await store.cat(f.cid, max_bytes=None)
            assert stored.startswith(b"AITBCS") and len(stored) > f.size
            assert first_row not in stored and plain[:4].tobytes()[:64] not in stored
        shard = ShardData.model_validate_json(await store.cat(manifest.shards[0].cid))
        assert shard.sealed is not None and shard.dataset == dataset.root

        jobs = await agent.coordinator.db.jobs(report.training_id)
        assert jobs and all(j.data_key for j in jobs)
        accounts = {p.address: p.account for p in agent.stack.providers}
        job = jobs[0]
        key = unwrap_key(bytes.fromhex(job.data_key), bytes(accounts[job.worker_id].key),
                         info=data_key_info(agent.coordinator.escrow.key(job.training_id), job.worker_id))
        assert key == data.keys.key(dataset.root)
        other = next(a for w, a in accounts.items() if w != job.worker_id)
        with pytest.raises(DecryptionError):  # another provider (hired or not) cannot open this worker's copy
            unwrap_key(bytes.fromhex(job.data_key), bytes(other.key),
                       info=data_key_info(agent.coordinator.escrow.key(job.training_id), job.worker_id))
        with pytest.raises(DecryptionError):  # nor can the worker use it for another training
            unwrap_key(bytes.fromhex(job.data_key), bytes(accounts[job.worker_id].key),
                       info=data_key_info(training_key(agent.coordinator.address, "training_other"), job.worker_id))
        stranger = "0x" + "11" * 20  # another coordinator opening a training of the same id string
        with pytest.raises(DecryptionError):  # so the key copied into his job opens nothing there
            unwrap_key(bytes.fromhex(job.data_key), bytes(accounts[job.worker_id].key),
                       info=data_key_info(training_key(stranger, job.training_id), job.worker_id))
        test = await data.load(manifest.test_cid)  # the coordinator reads its test split back in plaintext
        assert np.isin(test.features.numpy()[:3], plain).all()
