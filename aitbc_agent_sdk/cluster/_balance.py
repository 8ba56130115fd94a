"""Memory-balanced per-rank batches, and the gradient all-reduce that keeps uneven batches exact.

The rule (pure, in :func:`plan_batches`):

* rank *i* holds at most ``cap_i = (free_memory_bytes - fixed_bytes) // memory_per_sample_bytes``
  samples (its memory cap);
* its weight ``w_i`` is its measured throughput ``samples_per_s`` when every rank has one
  (then all ranks finish a step together), else its memory cap (before the first measurement);
* the real-valued shares are ``b_i = min(cap_i, λ·w_i)`` with λ chosen so ``Σ b_i = global_batch``
  (water-filling: ranks that hit their cap are pinned there and the rest is shared out again
  in proportion to the weights);
* the shares become integers by largest remainder (floors first, then +1 to the largest
  fractional parts, ties to the lower rank), which never passes a cap.

So sizes always sum to the global batch and never exceed a cap; if the caps together hold
fewer samples than the global batch, :class:`BatchPlanError` says so instead of overflowing.

:func:`weighted_allreduce_gradients` makes a step on these uneven batches equal to one step on
the concatenated batch: each rank's mean-loss gradient is weighted by ``n_i / N`` and summed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ._errors import BatchPlanError, ClusterError

if TYPE_CHECKING:
    import torch

    from ._inventory import ClusterInventory, GpuInventory
    from ._spec import ClusterSpec


class RankBudget(BaseModel):
    """What one rank can hold and how fast it goes. ``source`` says where the memory figure came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    free_memory_bytes: int = Field(ge=0)
    memory_per_sample_bytes: int = Field(gt=0, description="activation/gradient memory one more sample costs")
    fixed_bytes: int = Field(default=0, ge=0, description="model, optimizer state and workspace, paid once")
    samples_per_s: float | None = Field(default=None, gt=0, description="measured throughput; None before measuring")
    source: Literal["nvml", "config"] = "config"
    label: str = ""

    @property
    def capacity(self) -> int:
        """The most samples this rank's memory holds in one step."""
        return max(0, self.free_memory_bytes - self.fixed_bytes) // self.memory_per_sample_bytes

    @classmethod
    def from_gpu(cls, gpu: GpuInventory, *, memory_per_sample_bytes: int, fixed_bytes: int = 0,
                 samples_per_s: float | None = None, label: str = "") -> RankBudget:
        return cls(free_memory_bytes=gpu.memory_free_bytes, memory_per_sample_bytes=memory_per_sample_bytes,
                   fixed_bytes=fixed_bytes, samples_per_s=samples_per_s, source="nvml",
                   label=label or f"gpu{gpu.index}")

    @classmethod
    def from_config(cls, memory_bytes: int, *, memory_per_sample_bytes: int, fixed_bytes: int = 0,
                    samples_per_s: float | None = None, label: str = "") -> RankBudget:
        """A CPU-only rank: nothing measures its usable memory, so the operator's budget is used."""
        return cls(free_memory_bytes=memory_bytes, memory_per_sample_bytes=memory_per_sample_bytes,
                   fixed_bytes=fixed_bytes, samples_per_s=samples_per_s, source="config", label=label)


@dataclass(frozen=True)
class BatchPlan:
    """Per-rank batch sizes (``sizes[i]`` for rank i). Iterates, indexes and sums like a list of ints."""

    global_batch: int
    sizes: tuple[int, ...]
    caps: tuple[int, ...]
    weights: tuple[float, ...]

    def __iter__(self) -> Any:
        return iter(self.sizes)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, rank: int) -> int:
        return self.sizes[rank]

    def as_list(self) -> list[int]:
        return list(self.sizes)


def water_fill(total: float, weights: Sequence[float], caps: Sequence[int]) -> list[float]:
    """Real shares ``min(cap_i, λ·w_i)`` summing to ``total`` (caller checks the caps can hold it)."""
    shares = [0.0] * len(weights)
    active = [i for i, (w, c) in enumerate(zip(weights, caps, strict=True)) if w > 0 and c > 0]
    remaining = float(total)
    while active and remaining > 0:
        lam = remaining / sum(weights[i] for i in active)
        pinned = [i for i in active if lam * weights[i] >= caps[i]]
        if not pinned:
            for i in active:
                shares[i] = lam * weights[i]
            break
        for i in pinned:
            shares[i] = float(caps[i])
            remaining -= caps[i]
        active = [i for i in active if i not in pinned]
    return shares


def largest_remainder(total: int, shares: Sequence[float], caps: Sequence[int]) -> list[int]:
    """Integers that sum to ``total``: floors, then +1 by largest fractional part, never past a cap."""
    sizes = [min(int(math.floor(s)), c) for s, c in zip(shares, caps, strict=True)]
    left = total - sum(sizes)
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - math.floor(shares[i])), i))
    while left > 0:  # one pass suffices in exact arithmetic; more only absorb float error
        progressed = False
        for i in order:
            if left and sizes[i] < caps[i]:
                sizes[i] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise BatchPlanError(f"cannot place {left} more samples within the caps {list(caps)}")
    return sizes


def _plan(global_batch: int, weights: Sequence[float], caps: Sequence[int]) -> BatchPlan:
    if global_batch < 1:
        raise BatchPlanError(f"global batch must be >= 1, got {global_batch}")
    if not caps:
        raise BatchPlanError("no ranks to plan for")
    room = sum(c for c, w in zip(caps, weights, strict=True) if w > 0)
    if room < global_batch:
        raise BatchPlanError(f"global batch {global_batch} does not fit: the ranks' memory holds {room} samples "
                             f"(caps {list(caps)}); use a smaller batch or gradient accumulation")
    sizes = largest_remainder(global_batch, water_fill(global_batch, weights, caps), caps)
    return BatchPlan(global_batch=global_batch, sizes=tuple(sizes), caps=tuple(caps), weights=tuple(weights))


def plan_batches(global_batch: int, ranks: Sequence[RankBudget]) -> BatchPlan:
    """Split ``global_batch`` over ``ranks`` by the rule in this module's docstring."""
    caps = [r.capacity for r in ranks]
    measured = all(r.samples_per_s is not None for r in ranks)
    weights = [float(r.samples_per_s) if measured else float(c)  # type: ignore[arg-type]
               for r, c in zip(ranks, caps, strict=True)]
    return _plan(global_batch, weights, caps)


def shrink_after_oom(plan: BatchPlan, rank: int, *, factor: float = 0.5) -> BatchPlan:
    """``rank`` ran out of memory at ``plan[rank]`` samples: cap it at ``floor(factor·size)`` and re-plan.

    The freed samples go to the other ranks in proportion to their weights and within their
    caps; a rank shrunk to 0 should sit the step out. Raises :class:`BatchPlanError` when the
    others cannot take them.
    """
    if not 0 <= rank < len(plan):
        raise BatchPlanError(f"no rank {rank} in a plan of {len(plan)} ranks")
    if not 0 <= factor < 1:
        raise BatchPlanError(f"shrink factor must be in [0, 1), got {factor}")
    caps = list(plan.caps)
    caps[rank] = min(caps[rank], math.floor(plan.sizes[rank] * factor))
    return _plan(plan.global_batch, plan.weights, caps)


def budgets_from_inventory(inventory: ClusterInventory, *, memory_per_sample_bytes: int, fixed_bytes: int = 0,
                           spec: ClusterSpec | None = None, cpu_memory_bytes: int | None = None) -> list[RankBudget]:
    """One budget per GPU of every reachable host (``source="nvml"``), one per CPU-only host (``"config"``).

    A CPU-only host's budget is its ``memory_budget_bytes`` in ``spec``, else ``cpu_memory_bytes``.
    """
    budgets: list[RankBudget] = []
    for host in inventory.hosts:
        if not host.reachable:
            continue
        for gpu in host.gpus:
            budgets.append(RankBudget.from_gpu(gpu, memory_per_sample_bytes=memory_per_sample_bytes,
                                               fixed_bytes=fixed_bytes, label=f"{host.name}:{gpu.index}"))
        if host.cpu_only:
            listed = spec.host(host.address) if spec is not None and host.address else None
            memory = listed.memory_budget_bytes if listed and listed.memory_budget_bytes is not None else cpu_memory_bytes
            if memory is None:
                raise ClusterError(f"CPU-only host {host.name} has no memory budget: set memory_budget_bytes "
                                   f"in the cluster spec or pass cpu_memory_bytes")
            budgets.append(RankBudget.from_config(memory, memory_per_sample_bytes=memory_per_sample_bytes,
                                                  fixed_bytes=fixed_bytes, label=f"{host.name}:cpu"))
    return budgets


def weighted_allreduce_gradients(model: torch.nn.Module, local_batch_size: int, group: Any = None) -> int:
    """Replace each gradient by ``Σ_r (n_r / N)·g_r`` over the ranks; return the global batch ``N = Σ_r n_r``.

    Call it after ``loss.backward()`` with ``loss`` the *mean* over this rank's ``n_r`` samples
    and before ``optimizer.step()``. Two collectives: the counts (int64), then one flat
    gradient buffer per device and dtype. A parameter without a gradient on this rank takes
    part with zeros, so every rank sends the same layout; a rank with ``n_r = 0`` sends zeros.
    """
    import torch
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return 0
    count = torch.tensor([local_batch_size], dtype=torch.int64, device=params[0].device)
    dist.all_reduce(count, op=dist.ReduceOp.SUM, group=group)
    total = int(count.item())
    if total <= 0:
        raise BatchPlanError("every rank reported an empty batch")
    buckets: dict[tuple[Any, Any], list[torch.nn.Parameter]] = {}
    for p in params:
        buckets.setdefault((p.device, p.dtype), []).append(p)
    for members in buckets.values():
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in members])
        if local_batch_size:
            flat.mul_(local_batch_size / total)
        else:
            flat.zero_()  # an empty batch's mean loss is NaN; its weight is 0 either way
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for p in members:
            grad = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            if p.grad is None:
                p.grad = grad.clone()
            else:
                p.grad.copy_(grad)
    return total
