"""A model's size is the job's own, not a global cap: measured in the rehearsal, signed into every
proposal and job, checked by each provider against its memory and disk, and refused before funding
(exit 2, with the estimate and the largest machine) when no provider can hold it."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from pydantic import ValidationError

from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.records import (
    ContractReply, GpuInfo, Hardware, JobAssignment, JobConfig, ModelFootprint, ModelSpec, TaskRef, fit_problem,
    largest_machine, new_id,
)
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.tasks._gpt_task import GptParams
from aitbc_agent_sdk.data._shard_files import TokenData

from tests.security.provider_rig import WAIT_S, provider_rig, servers  # noqa: F401 (servers: a fixture)

GB = 10**9
CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


def footprint(weights: int, *, optimizer: int | None = None, activations: int = 0) -> ModelFootprint:
    return ModelFootprint(parameters=weights // 4, weights_bytes=weights, parameter_bytes=weights,
                          optimizer_bytes=2 * weights if optimizer is None else optimizer,
                          activation_bytes=activations)


def digits_footprint(hidden: int, batch_size: int = 16) -> ModelFootprint:
    data = load_dataset("digits").subset(list(range(64)))
    return bind_task(TaskRef(name="mlp", params={"hidden": hidden})).rehearse(
        data, JobConfig(batch_size=batch_size, epochs=1), seed=0)


def test_the_rehearsal_measures_parameters_optimizer_and_activations():
    small, wide = digits_footprint(32), digits_footprint(256)
    assert small.parameters == 64 * 32 + 32 + 32 * 10 + 10  # the mlp's exact count
    assert small.parameter_bytes == 4 * small.parameters
    assert 2 * small.parameter_bytes <= small.optimizer_bytes <= 2 * small.parameter_bytes + 1024  # Adam: m, v, step
    assert small.weights_bytes > small.parameter_bytes  # the encoded file: tensors and a header
    # Activations are what autograd keeps per sample: they grow with the width, not with the batch.
    assert 0 < small.activation_bytes < wide.activation_bytes
    assert digits_footprint(32, batch_size=64).activation_bytes == pytest.approx(small.activation_bytes, rel=0.25)


def test_a_language_models_activations_grow_with_its_context():
    stream = torch.randint(0, 255, (1 << 14,), generator=torch.Generator().manual_seed(0)).to(torch.uint16)
    tokens = TokenData(parts=(stream.numpy(),), vocab_size=256, eot=255)

    def measured(context: int) -> ModelFootprint:
        params = GptParams(layers=1, heads=2, width=32, context=context).model_dump()
        return bind_task(TaskRef(name="gpt", params=params)).rehearse(tokens, JobConfig(batch_size=4), seed=0)
    short, long = measured(16), measured(64)
    assert short.parameters < long.parameters  # the position table
    assert long.activation_bytes > 3 * short.activation_bytes  # linear in tokens, and attention is quadratic


@pytest.mark.parametrize("hardware, disk, words", [
    (Hardware(cpu_model="c", cpu_cores=8, ram_bytes=64 * GB, gpus=(GpuInfo(name="RTX 3090", memory_total_bytes=24 * GB),)),
     None, None),
    (Hardware(cpu_model="c", cpu_cores=8, ram_bytes=64 * GB, gpus=(GpuInfo(name="GTX 1080", memory_total_bytes=8 * GB),)),
     None, "GPU memory"),
    (Hardware(cpu_model="c", cpu_cores=8, ram_bytes=4 * GB), None, "host memory"),
    (Hardware(cpu_model="c", cpu_cores=8, ram_bytes=64 * GB), 5 * GB, "disk"),
    (Hardware(cpu_model="c", cpu_cores=8, ram_bytes=64 * GB, disk_free_bytes=5 * GB), None, "disk"),
])
def test_a_machine_fits_a_model_by_its_memory_and_disk(hardware, disk, words):
    # 1 GB of weights, 1 GB of gradients, 2 GB of Adam, 60 MB of activations per sample at batch 64: ~7.8 GB
    model = footprint(GB, activations=60 * 10**6)
    problem = fit_problem(model, 64, hardware, disk)
    if words is None:
        assert problem is None
    else:
        assert problem is not None and words in problem
    assert fit_problem(model, 1, Hardware(cpu_model="c", cpu_cores=1, ram_bytes=64 * GB), 100 * GB) is None


def test_the_largest_machine_is_named_when_none_fits():
    text = largest_machine([Hardware(cpu_model="c", cpu_cores=1, ram_bytes=8 * GB),
                            Hardware(cpu_model="c", cpu_cores=1, ram_bytes=16 * GB,
                                     gpus=(GpuInfo(name="g", memory_total_bytes=10 * GB),))])
    assert "16 GB" in text and "9 GB" in text


def job(**fields) -> JobAssignment:
    base = dict(job_id="job_1", training_id="training_1", round=1, worker_id="0x" + "11" * 20,
                contract_id="contract_1", shard_cid=CID, shard_bytes=100, weights_cid=CID, weights_bytes=100,
                model=ModelSpec(name="task", input_shape=(256,), num_classes=256, hidden=1), config=JobConfig())
    return JobAssignment.model_validate(base | fields)


def test_a_jobs_weights_are_bounded_by_its_declared_footprint_not_a_constant():
    big = footprint(4 * 85_000_000)  # a GPT-2-small's float32 weights
    assert job(footprint=big, weights_bytes=big.weights_bytes).weights_bytes == big.weights_bytes
    with pytest.raises(ValidationError, match="above the job's bound"):
        job(footprint=big, weights_bytes=big.weights_bytes + (2 << 20))
    with pytest.raises(ValidationError, match="above the job's bound"):  # a job that declares nothing: the old bound
        job(weights_bytes=big.weights_bytes)
    # A registry model larger than the job declares is refused before anything is built.
    wide = ModelSpec(name="mlp", input_shape=(4096,), num_classes=10, hidden=8192)
    with pytest.raises(ValidationError, match="the job declares 25,000,000"):
        job(model=wide)
    with pytest.raises(ValidationError, match="declares"):
        job(model=wide, footprint=footprint(4 * 1_000_000))
    assert job(model=wide, footprint=footprint(4 * 40_000_000, optimizer=0)).model.hidden == 8192


async def test_a_provider_declines_a_model_it_cannot_hold_and_a_job_that_changes_it(servers):
    async with provider_rig(servers) as rig:  # the rig's provider has 1 GiB of memory
        huge = footprint(2 * GB)
        contract_id = new_id("contract")
        proposal = rig.proposal(contract_id).model_copy(update={"footprint": huge})
        reply = await rig.attacker.request(
            topics.negotiate(rig.provider.address), proposal,
            topics.negotiate_reply(rig.attacker.address, contract_id), ContractReply,
            timeout=WAIT_S, expected_sender=rig.provider.address)
        assert not reply.accepted and "host memory" in reply.reason
        # A contract agreed without a footprint cannot be given a job that declares a larger one.
        contract = await rig.hire()
        bigger = (await rig.job(contract)).model_copy(update={"footprint": footprint(100 << 20)})
        await rig.send(topics.jobs(rig.provider.address), bigger)
        refused = await rig.feeds["progress"].first(lambda v: v.message.job_id == bigger.job_id)
        assert refused.message.status == "failed" and "footprint" in refused.message.error


def test_a_dry_run_refuses_a_model_no_provider_can_hold_with_the_estimate(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 2000)
    # A tiny model, but attention over 512 tokens for 65,536 windows a batch: terabytes of activations.
    model = ["--task", "gpt", "--task-param", "layers=1", "--task-param", "heads=2", "--task-param", "width=16",
             "--task-param", "context=512", "--data-path", str(corpus), "--workers", "1", "--rounds", "1", "--dry-run"]

    def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*aitbc_cmd, "distributed-training", "run", *model, *args], env=cli_env,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    done = dry_run("--batch-size", "65536")
    assert done.returncode == 2, done.stderr
    assert "no provider can hold this model" in done.stderr and "the largest host has" in done.stderr
    assert "at batch size 65536" in done.stderr and not aitbc_home.exists()
    fits = dry_run("--batch-size", "4", "--json")
    assert fits.returncode == 0, fits.stderr
    assert json.loads(fits.stdout)["model"]["activation_bytes"] > 0


def test_a_vocabulary_is_not_a_class_count():
    # A language model's vocabulary sizes its own model (declared in its footprint), not a registry head.
    assert ModelSpec(name="task", input_shape=(1,), num_classes=50_257).num_classes == 50_257
    with pytest.raises(ValidationError, match="above 10000"):
        ModelSpec(name="mlp", input_shape=(64,), num_classes=50_257)
    with pytest.raises(ValidationError):
        ModelSpec(name="task", input_shape=(1,), num_classes=(1 << 20) + 1)
