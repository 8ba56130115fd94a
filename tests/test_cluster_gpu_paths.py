"""The trusted cluster's GPU paths, checked on a CPU: bf16 weight digests and where collectives run.

On a real GPU two things failed: ``weights_digest`` called ``.numpy()`` on bf16 tensors (numpy
has no bfloat16), and ``BalancedStep`` all-reduced CPU tensors (its OOM flags and loss sum) on an
NCCL group, which takes CUDA tensors only. scripts/gpu_check.sh runs the NCCL path on a card.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
import torch.distributed as dist

from aitbc_agent_sdk.cluster import ddp


def _model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to(dtype)


def test_a_bf16_model_has_a_digest_that_tells_weights_apart_bit_for_bit():
    model, twin = _model(torch.bfloat16), _model(torch.bfloat16)
    assert ddp.weights_digest(model) == ddp.weights_digest(twin)
    with torch.no_grad():  # the smallest change bf16 can hold: one step of the last mantissa bit
        bits = twin[0].weight.view(torch.int16)
        bits[0, 0] += 1
    assert ddp.weights_digest(model) != ddp.weights_digest(twin)
    # bf16 -> fp32 is exact, so the same values in fp32 give another digest (other bytes), never an error
    assert ddp.weights_digest(model.float()) != ddp.weights_digest(twin.float())


def test_numpy_dtypes_keep_the_digest_they_had():
    model = _model(torch.float32)
    before = hashlib.sha256()  # the formula before bf16 support: the numpy bytes of each tensor
    for key, tensor in model.state_dict().items():
        before.update(key.encode())
        before.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    assert ddp.weights_digest(model) == before.hexdigest()
    assert ddp.tensor_bytes(torch.tensor([1.5], dtype=torch.float16)) == torch.tensor([1.5]).half().numpy().tobytes()


@pytest.mark.parametrize(("backend", "device", "expected"), [
    ("nccl", "cuda:1", "cuda:1"),  # NCCL reduces CUDA tensors only: this rank's GPU
    ("nccl", "cpu", "cpu"),
    ("gloo", "cuda:0", "cpu"),  # gloo's CPU collectives, even for a rank that trains on a GPU
    ("gloo", "cpu", "cpu"),
])
def test_collectives_run_on_the_rank_gpu_for_nccl_and_on_the_cpu_otherwise(backend, device, expected):
    assert ddp.collective_device(backend, device) == expected


def test_dist_info_puts_an_nccl_rank_on_its_local_gpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("DIST_BACKEND", raising=False)
    nccl = ddp.dist_info("nccl")
    assert (nccl.backend, nccl.device) == ("nccl", "cuda:1")
    assert ddp.collective_device(nccl.backend, nccl.device) == "cuda:1"
    gloo = ddp.dist_info("gloo")
    assert (gloo.backend, gloo.device) == ("gloo", "cpu")
    monkeypatch.setenv("DIST_BACKEND", "nccl")
    assert ddp.dist_info().device == "cuda:1"


def test_a_balanced_step_on_a_gloo_group_trains_and_its_bf16_copy_digests(tmp_path, monkeypatch):
    """One rank over gloo: the step's collectives (on the device ``collective_device`` picks) run,
    the weights move, and a bf16 copy of the trained model has a digest."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(ddp, "emit", lambda *a, **k: None)  # no metric lines on pytest's stdout
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        info = ddp.dist_info("gloo")
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        before = ddp.weights_digest(model)
        budget = ddp.local_budget(info, memory_per_sample_bytes=1, config_memory_bytes=1 << 20)
        step = ddp.BalancedStep.from_budgets(model, optimizer, 8, budget, info)
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        result = step.run(1, lambda off, n: (x[off:off + n], y[off:off + n]), torch.nn.functional.mse_loss)
    finally:
        dist.destroy_process_group()
    assert result.global_batch == 8 and result.sizes == (8,) and result.loss > 0
    assert ddp.weights_digest(model) != before
    assert len(ddp.weights_digest(model.to(torch.bfloat16))) == 64
