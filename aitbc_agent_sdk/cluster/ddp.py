"""Helpers for a training script run by ``aitbc cluster train`` (or plain ``torchrun``).

A plain DDP script needs none of this. A script that wants the SDK's checkpointing,
memory-balanced batches and metrics uses, top to bottom::

    info = ddp.setup()                                  # env (RANK, WORLD_SIZE, ...), gloo or NCCL
    ckpt = ddp.Checkpointer(info=info)                  # $CHECKPOINT_DIR, every $CHECKPOINT_EVERY steps
    start = ckpt.load(model, optimizer)                 # the last checkpoint's step, 0 if none
    for step in range(start + 1, steps + 1):
        ... one optimizer step on the batch of ``global_batch_indices(step, ...)`` ...
        ddp.emit("step", step=step, loss=loss, attempt=ckpt.attempt, samples_per_s=...)
        ckpt.maybe_save(step, model, optimizer)
    ddp.teardown()

Exactness after a crash comes from three things: the checkpoint holds the model, the
optimizer state and the step, written atomically (a temporary file, fsync, ``os.replace``);
the batch of step *k* is a function of *k* only (:func:`global_batch_indices`), whatever the
world size; and the gradient is the mean over that global batch (:class:`BalancedStep` uses
:func:`~._balance.weighted_allreduce_gradients`). A restart then repeats steps
``checkpoint+1 ...`` exactly as they would have run.

Metric lines are ``AITBC_METRIC {json}`` on stdout; the host agent streams them to the
coordinator and ``aitbc cluster monitor``. Memory figures say where they come from:
``memory_source`` is ``cuda`` (allocator) or ``rss`` (the process, CPU-only); a rank budget's
``budget_source`` is ``nvml`` or ``config`` (CPU-only hosts: from configuration, not measured).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._balance import BatchPlan, RankBudget, plan_batches, shrink_after_oom, weighted_allreduce_gradients

if TYPE_CHECKING:
    import torch

METRIC_PREFIX = "AITBC_METRIC "
LATEST = "latest.json"


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    restart_count: int
    backend: str
    device: str

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def dist_info(backend: str | None = None) -> DistInfo:
    """This process's place in the job, from torchrun's environment (a single process without it)."""
    import torch

    local_rank = _env_int("LOCAL_RANK", 0)
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() > local_rank
    backend = backend or os.environ.get("DIST_BACKEND") or ("nccl" if use_cuda else "gloo")
    return DistInfo(rank=_env_int("RANK", 0), world_size=_env_int("WORLD_SIZE", 1), local_rank=local_rank,
                    local_world_size=_env_int("LOCAL_WORLD_SIZE", 1), group_rank=_env_int("GROUP_RANK", 0),
                    restart_count=_env_int("TORCHELASTIC_RESTART_COUNT", 0), backend=backend,
                    device=f"cuda:{local_rank}" if backend == "nccl" else "cpu")


def setup(backend: str | None = None, *, timeout_s: float = 120.0) -> DistInfo:
    """``init_process_group`` from torchrun's environment (gloo on CPU, NCCL on GPU)."""
    import torch
    import torch.distributed as dist

    info = dist_info(backend)
    if info.device.startswith("cuda"):
        torch.cuda.set_device(info.local_rank)
    if "MASTER_ADDR" in os.environ and not dist.is_initialized():
        dist.init_process_group(info.backend, timeout=timedelta(seconds=timeout_s))
    return info


def teardown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def emit(event: str = "step", **fields: Any) -> None:
    """Print one metric line for the agent to stream (``rank`` and ``time`` added)."""
    record = {"event": event, "rank": _env_int("RANK", 0), "time": time.time(), **fields}
    sys.stdout.write(METRIC_PREFIX + json.dumps(record, default=float) + "\n")
    sys.stdout.flush()


def memory_used(device: str = "cpu") -> tuple[int, str]:
    """(bytes, source): the CUDA allocator's figure on a GPU, this process's RSS on CPU."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.memory_allocated(device)), "cuda"
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE"), "rss"
    except (OSError, ValueError, IndexError):
        return 0, "unknown"


def gpu_utilization(device: str) -> float | None:
    """NVML utilization of this rank's GPU, None on CPU or without NVML."""
    if not device.startswith("cuda"):
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            index = int(device.split(":")[1])
            return float(pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(index)).gpu)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - a missing figure, not a failed step
        return None


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of the parameters and buffers, in state-dict order: equal digests, equal weights."""
    h = hashlib.sha256()
    for key, tensor in unwrap(model).state_dict().items():
        h.update(key.encode())
        h.update(tensor_bytes(tensor))
    return h.hexdigest()


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's raw bytes on the CPU. numpy has no bfloat16 (or float8): such a tensor is read as
    integers of its width, bit for bit, so a bf16 model gets a digest too and every other dtype keeps its own."""
    import torch

    flat = tensor.detach().cpu().contiguous()
    if flat.dtype.is_floating_point and flat.dtype not in (torch.float16, torch.float32, torch.float64):
        flat = flat.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()])
    return flat.numpy().tobytes()


def collective_device(backend: str, device: str) -> str:
    """Where a collective's own tensors (OOM flags, loss sums) must live: NCCL reduces CUDA tensors
    only, so on an NCCL group they go to this rank's GPU; gloo and the rest take CPU tensors."""
    return device if backend == "nccl" and device.startswith("cuda") else "cpu"


def global_batch_indices(step: int, global_batch: int, dataset_size: int, *, seed: int = 0) -> list[int]:
    """The samples of step ``step`` (1-based): a function of the step only, never of the world size."""
    import torch

    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, dataset_size, (global_batch,), generator=generator).tolist()


class Checkpointer:
    """Checkpoints on shared storage, every ``every`` steps, written by rank 0 only.

    Layout: ``DIR/step-00000010.pt`` (model, optimizer, step, extra) and ``DIR/latest.json``
    naming the newest complete one. Both are written to a temporary file, fsync'd and renamed,
    so a crash leaves either the old or the new checkpoint, never half of one.
    """

    def __init__(self, directory: str | Path | None = None, every: int | None = None, *, info: DistInfo | None = None,
                 keep: int = 2) -> None:
        directory = directory or os.environ.get("CHECKPOINT_DIR")
        if not directory:
            raise ValueError("no checkpoint directory: pass one or set CHECKPOINT_DIR (aitbc cluster train "
                             "--checkpoint-dir sets it)")
        self.directory = Path(directory) / "checkpoints"
        self.every = every or _env_int("CHECKPOINT_EVERY", 10)
        self.info = info or dist_info()
        self.keep = keep
        self.attempt = uuid.uuid4().hex[:12]  # one per worker start: the step log's unit
        self.resumed_from = 0

    def latest(self) -> tuple[int, Path] | None:
        try:
            meta = json.loads((self.directory / LATEST).read_text())
        except (OSError, ValueError):
            return None
        path = self.directory / meta["file"]
        return (int(meta["step"]), path) if path.is_file() else None

    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
        """Restore the newest checkpoint into ``model``/``optimizer``; its step (0 when there is none)."""
        import torch

        found = self.latest()
        step = 0
        if found is not None:
            step, path = found
            state = torch.load(path, map_location="cpu", weights_only=True)
            unwrap(model).load_state_dict(state["model"])
            if optimizer is not None and "optimizer" in state:
                optimizer.load_state_dict(state["optimizer"])
        self.resumed_from = step
        emit("resume", attempt=self.attempt, resumed_from=step, world_size=self.info.world_size,
             restart_count=self.info.restart_count)
        return step

    def maybe_save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                   **extra: Any) -> bool:
        if step % self.every:
            return False
        self.save(step, model, optimizer, **extra)
        return True

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
             **extra: Any) -> None:
        import torch
        import torch.distributed as dist

        if self.info.is_master:
            self.directory.mkdir(parents=True, exist_ok=True)
            name = f"step-{step:08d}.pt"
            state = {"model": unwrap(model).state_dict(), "step": step, "extra": extra}
            if optimizer is not None:
                state["optimizer"] = optimizer.state_dict()
            _atomic_write(self.directory / name, lambda fh: torch.save(state, fh))
            _atomic_write(self.directory / LATEST,
                          lambda fh: fh.write(json.dumps({"step": step, "file": name}).encode()))
            self._prune()
            emit("checkpoint", step=step, attempt=self.attempt, file=name)
        if dist.is_initialized():
            dist.barrier()  # nobody runs ahead of a checkpoint that is not in place yet

    def _prune(self) -> None:
        files = sorted(self.directory.glob("step-*.pt"))
        for old in files[:-self.keep]:
            old.unlink(missing_ok=True)


def _atomic_write(path: Path, write: Callable[[Any], Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- memory-balanced steps --------------------------------------------------------------------

def local_budget(info: DistInfo, *, memory_per_sample_bytes: int, fixed_bytes: int = 0,
                 config_memory_bytes: int | None = None, samples_per_s: float | None = None) -> RankBudget:
    """This rank's budget: free GPU memory from CUDA (``nvml`` source) or, on CPU, the configured
    budget (``config``: ``config_memory_bytes`` or ``$MEMORY_BUDGET_BYTES``), never a guess."""
    if info.device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(info.device)
        return RankBudget(free_memory_bytes=int(free), memory_per_sample_bytes=memory_per_sample_bytes,
                          fixed_bytes=fixed_bytes, samples_per_s=samples_per_s, source="nvml", label=info.device)
    memory = config_memory_bytes if config_memory_bytes is not None else _env_int("MEMORY_BUDGET_BYTES", -1)
    if memory < 0:
        raise ValueError("a CPU rank needs a configured memory budget (MEMORY_BUDGET_BYTES or config_memory_bytes)")
    return RankBudget.from_config(memory, memory_per_sample_bytes=memory_per_sample_bytes, fixed_bytes=fixed_bytes,
                                  samples_per_s=samples_per_s, label=f"rank{info.rank}:cpu")


def gather_budgets(budget: RankBudget) -> list[RankBudget]:
    """Every rank's budget, in rank order (one all_gather_object)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return [budget]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, budget.model_dump())
    return [RankBudget.model_validate(b) for b in gathered]


OomInjector = Callable[[int, int, int], bool]  # (step, rank, batch size) -> raise a simulated OOM?


@dataclass
class StepResult:
    loss: float
    global_batch: int
    sizes: tuple[int, ...]
    oom_ranks: tuple[int, ...]
    retries: int


class BalancedStep:
    """One optimizer step on a global batch split by memory (:func:`~._balance.plan_batches`).

    Each rank runs forward/backward on its slice (offset = the sizes of the ranks before it).
    If any rank runs out of memory (``torch.OutOfMemoryError``) every rank learns it from one
    all_reduce, shrinks that rank's share (:func:`~._balance.shrink_after_oom`, the others take
    the rest) and redoes the step from zeroed gradients: the job goes on, no optimizer step is
    lost or doubled, and the result is the same as on the unsplit batch. ``model`` must be the
    plain module, not a DDP wrapper: gradients are combined by
    :func:`~._balance.weighted_allreduce_gradients`.

    ``inject_oom`` raises a *simulated* OutOfMemoryError (for tests on CPU-only machines, where
    no real allocator can run out); every OOM is reported in a metric line with ``simulated``.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, plan: BatchPlan, info: DistInfo, *,
                 shrink_factor: float = 0.5, max_retries: int = 4, inject_oom: OomInjector | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.plan = plan
        self.info = info
        self.shrink_factor = shrink_factor
        self.max_retries = max_retries
        self.inject_oom = inject_oom

    @classmethod
    def from_budgets(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer, global_batch: int,
                     budget: RankBudget, info: DistInfo, **kwargs: Any) -> BalancedStep:
        return cls(model, optimizer, plan_batches(global_batch, gather_budgets(budget)), info, **kwargs)

    def offset(self) -> int:
        return sum(self.plan.sizes[: self.info.rank])

    def run(self, step: int, batch: Callable[[int, int], tuple[Any, Any]],
            loss_fn: Callable[[Any, Any], torch.Tensor]) -> StepResult:
        """``batch(offset, size)`` gives this rank's inputs and targets; ``loss_fn`` the mean loss."""
        import torch
        import torch.distributed as dist

        oom_seen: list[int] = []
        reduce_device = collective_device(self.info.backend, self.info.device)
        for attempt in range(self.max_retries + 1):
            size = self.plan.sizes[self.info.rank]
            self.optimizer.zero_grad(set_to_none=False)
            local_loss = 0.0
            oom = 0
            try:
                if self.inject_oom is not None and self.inject_oom(step, self.info.rank, size):
                    raise torch.OutOfMemoryError(f"simulated out-of-memory at step {step} on rank {self.info.rank} "
                                                 f"with {size} samples (fault injection)")
                if size:
                    inputs, targets = batch(self.offset(), size)
                    loss = loss_fn(self.model(inputs), targets)
                    loss.backward()
                    local_loss = float(loss.detach()) * size
            except torch.OutOfMemoryError:
                oom = 1
                self.optimizer.zero_grad(set_to_none=False)
                if self.info.device.startswith("cuda"):
                    torch.cuda.empty_cache()
            flags = torch.zeros(self.info.world_size, dtype=torch.int64, device=reduce_device)
            flags[self.info.rank] = oom
            if dist.is_initialized():
                dist.all_reduce(flags)
            failed = [r for r, f in enumerate(flags.tolist()) if f]
            if failed:
                before = self.plan.sizes
                for r in failed:
                    self.plan = shrink_after_oom(self.plan, r, factor=self.shrink_factor)
                oom_seen += failed
                emit("oom", step=step, ranks=failed, before=list(before), after=list(self.plan.sizes),
                     retry=attempt + 1, simulated=self.inject_oom is not None)
                continue
            total = weighted_allreduce_gradients(self.model, size)
            self.optimizer.step()
            summed = torch.tensor([local_loss], dtype=torch.float64, device=reduce_device)
            if dist.is_initialized():
                dist.all_reduce(summed)
            return StepResult(loss=float(summed.item()) / total, global_batch=total, sizes=self.plan.sizes,
                              oom_ranks=tuple(oom_seen), retries=attempt)
        raise RuntimeError(f"step {step}: still out of memory after {self.max_retries} re-plans")
