"""Memory-balanced batches: the planning rule, the OOM shrink, and the weighted all-reduce that makes
uneven per-rank batches train exactly like one process on the concatenated batch (gloo, real ranks)."""

from __future__ import annotations

import multiprocessing
import socket

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aitbc_agent_sdk.cluster import (
    BatchPlanError, ClusterError, ClusterInventory, ClusterSpec, HostInventory, HostSpec, RankBudget,
    budgets_from_inventory, plan_batches, shrink_after_oom, weighted_allreduce_gradients,
)
from aitbc_agent_sdk.cluster._balance import water_fill
from aitbc_agent_sdk.cluster._inventory import GpuInventory

MB = 2**20


def budget(cap: int, speed: float | None = None) -> RankBudget:
    """A rank whose memory holds exactly ``cap`` samples of 1 MiB."""
    return RankBudget.from_config(cap * MB, memory_per_sample_bytes=MB, samples_per_s=speed)


# --- plan_batches ---------------------------------------------------------------------------------


def test_batches_follow_measured_throughput():
    assert list(plan_batches(60, [budget(100, 1), budget(100, 2), budget(100, 3)])) == [10, 20, 30]


def test_before_measuring_batches_follow_memory():
    assert list(plan_batches(20, [budget(10), budget(30)])) == [5, 15]


def test_a_rank_at_its_memory_cap_is_pinned_and_the_rest_shared_out():
    plan = plan_batches(24, [budget(4, 10), budget(100, 1), budget(100, 1)])
    assert list(plan) == [4, 10, 10] and plan.caps == (4, 100, 100)


def test_rounding_is_by_largest_remainder_with_ties_to_the_lower_rank():
    assert list(plan_batches(10, [budget(10, 1), budget(10, 1), budget(10, 1)])) == [4, 3, 3]
    assert list(plan_batches(10, [budget(10, 1), budget(10, 2)])) == [3, 7]  # 3.33 / 6.67


def test_fixed_memory_is_paid_before_samples():
    rank = RankBudget(free_memory_bytes=10 * MB, fixed_bytes=4 * MB, memory_per_sample_bytes=MB)
    assert rank.capacity == 6 and rank.source == "config"
    assert RankBudget(free_memory_bytes=MB, fixed_bytes=4 * MB, memory_per_sample_bytes=MB).capacity == 0


def test_a_batch_that_does_not_fit_is_refused():
    with pytest.raises(BatchPlanError, match="holds 7 samples"):
        plan_batches(8, [budget(3, 1), budget(4, 1)])
    with pytest.raises(BatchPlanError):
        plan_batches(0, [budget(3)])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.floats(0.1, 1000)), min_size=1, max_size=12), st.data())
def test_any_plan_sums_to_the_batch_stays_in_caps_and_is_near_its_share(ranks, data):
    budgets = [budget(cap, speed) for cap, speed in ranks]
    room = sum(cap for cap, _ in ranks)
    if room == 0:
        return
    total = data.draw(st.integers(1, room))
    plan = plan_batches(total, budgets)
    assert sum(plan) == total
    assert all(0 <= size <= cap for size, (cap, _) in zip(plan, ranks, strict=True))
    shares = water_fill(total, [s for _, s in ranks], [c for c, _ in ranks])
    assert all(abs(size - share) < 1 + 1e-6 for size, share in zip(plan, shares, strict=True))


# --- shrink_after_oom ---------------------------------------------------------------------------


def test_an_oom_halves_that_rank_and_moves_the_rest_within_caps():
    plan = plan_batches(24, [budget(4, 10), budget(100, 1), budget(30, 1)])
    assert list(plan) == [4, 10, 10]
    shrunk = shrink_after_oom(plan, 1)
    assert list(shrunk) == [4, 5, 15] and shrunk.caps == (4, 5, 30)  # rank 0 is full: rank 2 takes the 5
    assert list(shrink_after_oom(shrunk, 1)) == [4, 2, 18]


def test_an_oom_the_others_cannot_absorb_is_an_error():
    plan = plan_batches(20, [budget(10, 1), budget(10, 1)])
    with pytest.raises(BatchPlanError):
        shrink_after_oom(plan, 0)


def test_a_rank_shrunk_to_nothing_gets_no_samples():
    plan = shrink_after_oom(plan_batches(5, [budget(1, 1), budget(10, 1)]), 0)
    assert list(plan) == [0, 5]


# --- budgets from the inventory -------------------------------------------------------------------


def test_budgets_come_from_nvml_on_gpu_hosts_and_from_config_on_cpu_hosts():
    """The GPU figures are fixed numbers (fault injection of NVML data), as in the inventory tests."""
    gpu = GpuInventory(index=0, model="H100", memory_total_bytes=80 * 2**30, memory_free_bytes=64 * MB)
    spec = ClusterSpec(name="lab", hosts=(HostSpec(name="cpu", address="0x" + "11" * 20, memory_budget_bytes=32 * MB),
                                          HostSpec(name="gpu", address="0x" + "22" * 20)))
    inventory = ClusterInventory(cluster="lab", hosts=(
        HostInventory(name="gpu", address="0x" + "22" * 20, gpus=(gpu,)),
        HostInventory(name="cpu", address="0x" + "11" * 20),
        HostInventory.unreachable("gone", None, "no reply")))
    budgets = budgets_from_inventory(inventory, memory_per_sample_bytes=MB, spec=spec)
    assert [(b.label, b.source, b.capacity) for b in budgets] == [("gpu:0", "nvml", 64), ("cpu:cpu", "config", 32)]
    with pytest.raises(ClusterError, match="no memory budget"):
        budgets_from_inventory(inventory, memory_per_sample_bytes=MB)


# --- weighted all-reduce against one process on the concatenated batch ---------------------------------

SIZES = [[2, 7], [5, 0], [1, 8]]  # per step and rank; rank 1 sits the second step out
LR = 0.1


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(sum(s), 5, generator=g), torch.randn(sum(s), 2, generator=g)) for s in SIZES]


def _rank_main(rank: int, world: int, port: int, queue: multiprocessing.Queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        for sizes, (x, y) in zip(SIZES, _data(), strict=True):
            start = sum(sizes[:rank])
            xs, ys = x[start:start + sizes[rank]], y[start:start + sizes[rank]]
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(xs), ys).backward()  # mean over this rank's samples
            assert weighted_allreduce_gradients(model, sizes[rank]) == sum(sizes)
            optimizer.step()
        if rank == 0:
            queue.put({k: v.numpy().copy() for k, v in model.state_dict().items()})  # no shared-memory handles
    finally:
        dist.destroy_process_group()


def _single_process(per_rank_mean: bool = False) -> dict[str, torch.Tensor]:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for sizes, (x, y) in zip(SIZES, _data(), strict=True):
        optimizer.zero_grad()
        if per_rank_mean:  # what a plain (unweighted) gradient average over the ranks would do
            chunks = [(xs, ys) for xs, ys, n in zip(x.split(sizes), y.split(sizes), sizes, strict=True) if n]
            for xs, ys in chunks:
                (torch.nn.functional.mse_loss(model(xs), ys) / len(chunks)).backward()
        else:
            torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return model.state_dict()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_uneven_batches_with_weighted_allreduce_equal_one_process_on_the_whole_batch():
    # A fork server imports torch and this module once, then forks each rank from that clean,
    # single-threaded process: much faster than spawn, without forking this (threaded) pytest.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", __name__])
    queue = ctx.Queue()
    world, port = len(SIZES[0]), _free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, world, port, queue)) for rank in range(world)]
    for p in procs:
        p.start()
    try:
        distributed = queue.get(timeout=60)
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    reference = _single_process()
    for name, value in reference.items():
        torch.testing.assert_close(torch.from_numpy(distributed[name]), value, rtol=1e-5, atol=1e-6)
    # The check can fail: averaging the ranks' mean gradients without weights lands elsewhere.
    unweighted = _single_process(per_rank_mean=True)
    assert not all(torch.allclose(unweighted[k], reference[k], rtol=1e-5, atol=1e-6) for k in reference)
