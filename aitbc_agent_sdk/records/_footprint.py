"""What one worker's copy of a model costs, and whether a machine can hold it.

A training measures its model's footprint in the rehearsal before funding (parameters, the encoded
weights, the optimizer's state, activations per sample) and signs it into every proposal and job.
The size bound of a job is then this declaration, not a global constant: a provider refuses a
footprint that does not fit its GPU, host memory or disk, and every fetch it makes for the job is
bounded by the declared bytes. Pure arithmetic, so discovery, the provider and the dry run agree.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from .. import limits
from ._base import Record
from ._market import Hardware
from ._sizes import format_size

USABLE_GPU_FRACTION = 0.9  # the CUDA context, the caching allocator's slack and fragmentation take the rest
RUNTIME_BYTES = 600 << 20  # python, torch and the provider daemon, beside the model itself
HEADER_SLACK = 1 << 20  # a safetensors header of another metadata than the declared weights' own


class ModelFootprint(Record):
    """Sizes measured on the round-0 model in the rehearsal; a stranger's claim once it is on the wire."""

    parameters: int = Field(ge=1, le=limits.MAX_DECLARED_PARAMETERS)
    weights_bytes: int = Field(ge=1, le=limits.MAX_MODEL_BYTES, description="the encoded round-0 model, exactly")
    parameter_bytes: int = Field(ge=0, le=limits.MAX_MODEL_BYTES, description=(
        "trainable parameters in memory: their gradients take as much"))
    optimizer_bytes: int = Field(ge=0, le=4 * limits.MAX_MODEL_BYTES, description="the optimizer's state after a step")
    activation_bytes: int = Field(ge=0, le=limits.MAX_MODEL_BYTES, description=(
        "bytes kept for the backward pass per sample"))

    @property
    def max_weights_bytes(self) -> int:
        """The most any weights-sized file of this job may hold: a checkpoint with another header."""
        return self.weights_bytes + HEADER_SLACK


def device_bytes(footprint: ModelFootprint, batch_size: int) -> int:
    """Memory a job needs where it trains: weights, gradients, optimizer state, activations of a batch."""
    return (footprint.weights_bytes + footprint.parameter_bytes + footprint.optimizer_bytes
            + footprint.activation_bytes * batch_size)


def host_bytes(footprint: ModelFootprint, batch_size: int, *, on_gpu: bool) -> int:
    """Host memory beside it: one model to load and encode from (plus all of training on a CPU)."""
    training = 0 if on_gpu else device_bytes(footprint, batch_size)
    return training + footprint.weights_bytes + RUNTIME_BYTES


def disk_bytes(footprint: ModelFootprint, shard_bytes: int = 0) -> int:
    """Disk a job takes: its shard, the weights it starts from, its checkpoint, the one kept for
    re-sends, and a committed trajectory of at most three training states."""
    return shard_bytes + 3 * footprint.weights_bytes + 3 * (footprint.weights_bytes + footprint.optimizer_bytes)


def gpu_capacity(hardware: Hardware) -> int | None:
    """Usable bytes of one GPU (a job takes one: the smallest of them), or None on a CPU host."""
    if not hardware.gpus:
        return None
    return int(min(gpu.memory_total_bytes for gpu in hardware.gpus) * USABLE_GPU_FRACTION)


def fit_problem(footprint: ModelFootprint, batch_size: int, hardware: Hardware,
                disk_free_bytes: int | None = None) -> str | None:
    """Why a machine with ``hardware`` (and ``disk_free_bytes``, else the offer's own) cannot train a job of
    this footprint at ``batch_size``, or None when it can."""
    gpu = gpu_capacity(hardware)
    if gpu is not None and (need := device_bytes(footprint, batch_size)) > gpu:
        return (f"the model needs about {format_size(need)} of GPU memory at batch size {batch_size}; "
                f"this GPU has {format_size(gpu)} usable")
    need = host_bytes(footprint, batch_size, on_gpu=gpu is not None)
    if need > hardware.ram_bytes:
        return (f"the model needs about {format_size(need)} of host memory at batch size {batch_size}; "
                f"this host has {format_size(hardware.ram_bytes)}")
    disk = disk_free_bytes if disk_free_bytes is not None else hardware.disk_free_bytes
    if disk is not None and (need := disk_bytes(footprint)) > disk:
        return f"the job needs about {format_size(need)} of disk; {format_size(disk)} is free"
    return None


def largest_machine(hardware: Iterable[Hardware]) -> str:
    """The biggest memory on offer, for a message that says no provider fits."""
    machines = list(hardware)
    if not machines:
        return "no provider answered"
    gpus = [g for h in machines if (g := gpu_capacity(h)) is not None]
    best_gpu = f"; the largest GPU has {format_size(max(gpus))} usable" if gpus else ""
    return f"the largest host has {format_size(max(h.ram_bytes for h in machines))} of memory{best_gpu}"


def describe(footprint: ModelFootprint, batch_size: int) -> str:
    """``85.4M parameters, 342 MB of weights; about 1.9 GB to train at batch size 8``."""
    return (f"{footprint.parameters / 1e6:.1f}M parameters, {format_size(footprint.weights_bytes)} of weights; "
            f"about {format_size(device_bytes(footprint, batch_size))} to train at batch size {batch_size}")
