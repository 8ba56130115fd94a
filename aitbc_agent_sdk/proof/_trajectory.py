"""A worker's committed trajectory: hashes of its training state every ``k`` steps and of the batches it used.

While a job trains, :class:`TrajectoryRecorder` hashes the state at every segment boundary (model,
optimizer, scheduler) and each segment's batches as they are consumed; its
:meth:`~TrajectoryRecorder.commitment` goes into the checkpoint the worker signs. Only the states of
:func:`kept_boundaries` (boundary 0 and evenly spaced ones: three at most, so a job's disk is at
most three times its weights and optimizer) are written as safetensors files. The coordinator later
asks for a few boundary files and re-executes the segments between them (:mod:`._trajectory_replay`);
the worker recomputes one it did not keep from the kept one before it (:func:`recompute_plan`).
Each step starts with the global RNG seeded from the job's seed and the step's index, so dropout
replays from any step's state alone: a boundary's, or a mid-segment one a dispute narrows to.

Boundary files arrive from strangers: decoding bounds the header, never unpickles, and a file
whose tensors or JSON are not a state the task's own model, optimizer and scheduler could be in
(shapes, fields, and values within bounds: :mod:`._opened_state`) is refused before it is loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from torch import nn

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.records import COMMITMENT_KEY, MAX_COMMITMENT_BYTES, MAX_SEGMENTS, TrajectoryCommitment
from aitbc_agent_sdk.wire._checkpoint import decode_metadata, decode_state, encode_state
from aitbc_agent_sdk.proof._opened_state import (
    model_problem, optimizer_state_problem, param_groups_problem, scheduler_problem,
)
from aitbc_agent_sdk.wire._task_state import split_optimizer_state

Scheduler = torch.optim.lr_scheduler.LRScheduler
Batch = tuple[torch.Tensor, torch.Tensor]
BOUNDARY_KIND = "trajectory_boundary"
MODEL_PREFIX, OPTIM_PREFIX = "model/", "optim/"
MAX_HEADER_BYTES = 16 << 20  # a boundary's or checkpoint's safetensors header: thousands of tensors fit
_HEADER_LEN = struct.Struct("<Q")


KEPT_STATES = 3  # boundary states a job keeps on disk; the rest are recomputed when a spot check asks


def boundary_name(index: int) -> str:
    return f"{index:06d}.safetensors"


def kept_boundaries(n_boundaries: int, keep: int = KEPT_STATES) -> tuple[int, ...]:
    """The boundaries (of ``n_boundaries``) whose states a worker keeps on disk: 0, and ``keep - 1`` more
    spaced evenly over the segments, so recomputing any other takes about ``segments / keep`` segments.
    All of them when there are no more than ``keep``. Both sides know the rule: nothing to announce."""
    if not 1 <= keep < n_boundaries:
        return tuple(range(n_boundaries))
    segments = n_boundaries - 1
    return tuple(sorted({(2 * i * segments + keep) // (2 * keep) for i in range(keep)}))


def recompute_plan(n_boundaries: int, wanted: Iterable[int]) -> dict[int, int]:
    """Kept boundary -> the furthest wanted boundary to recompute from it (the kept one before each
    wanted one that is not kept); kept wanted boundaries need nothing."""
    kept = kept_boundaries(n_boundaries)
    plan: dict[int, int] = {}
    for boundary in wanted:
        if not 0 <= boundary < n_boundaries:
            raise ValueError(f"boundary {boundary} outside the trajectory's {n_boundaries}")
        if boundary not in kept:
            start = max(k for k in kept if k < boundary)
            plan[start] = max(plan.get(start, boundary), boundary)
    return plan


def recompute_segments(n_boundaries: int, wanted: Iterable[int]) -> int:
    """Segments a worker trains again to open ``wanted`` (:func:`recompute_plan`)."""
    return sum(stop - start for start, stop in recompute_plan(n_boundaries, wanted).items())


def segment_steps(total_steps: int, segments: int) -> int:
    """Steps per segment: ``segments`` of them, fewer when the job has fewer steps."""
    return math.ceil(total_steps / min(segments, total_steps))


def step_seed(seed: int, step: int) -> int:
    """The global RNG's seed at the start of ``step`` of the job seeded ``seed``."""
    digest = hashlib.sha256(f"aitbc-trajectory-step:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seed_step(seed: int, step: int, device: torch.device) -> None:
    """Seed the global RNG that dropout on ``device`` draws from for ``step``: the CPU's, and the GPU's on
    one (not torch.manual_seed, which costs a stack trace per lazy backend each call)."""
    value = step_seed(seed, step)
    torch.default_generator.manual_seed(value)
    if device.type == "cuda":
        torch.cuda.manual_seed(value)


@contextlib.contextmanager
def isolated_rng(device: torch.device) -> Iterator[None]:
    """The global RNG (the CPU's, and ``device``'s when it is a GPU) as it was before, afterwards."""
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        yield


def _update_tensor(hasher: Any, tensor: torch.Tensor) -> None:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    hasher.update(flat.view(torch.uint8).numpy().data if flat.numel() else b"")


def tensor_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the tensors in sorted key order: key, dtype, shape, then the bytes. Independent of
    how (or whether) they are laid out in a file."""
    hasher = hashlib.sha256()
    for key in sorted(tensors):
        tensor = tensors[key]
        hasher.update(json.dumps([key, str(tensor.dtype), list(tensor.shape)]).encode() + b"\n")
        _update_tensor(hasher, tensor)
    return hasher.hexdigest()


def hash_batch(hasher: Any, batch: Batch) -> None:
    """Add one consumed batch (inputs, then targets) to its segment's hash."""
    for tensor in batch:
        hasher.update(json.dumps([str(tensor.dtype), list(tensor.shape)]).encode() + b"\n")
        _update_tensor(hasher, tensor)


# --- boundary state files


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _boundary_parts(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Scheduler | None
                    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, str]]:
    """The model's tensors, the optimizer's tensors (``index.name``, as task_state names them) and the
    rest as canonical JSON metadata: what a boundary file holds and its hashes cover."""
    model_tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    state = optimizer.state_dict()
    tensors, scalars = split_optimizer_state(state)
    optim = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    metadata = {"kind": BOUNDARY_KIND, "param_groups": _canonical(state["param_groups"]),
                "scalars": _canonical(scalars),
                "scheduler": _canonical(scheduler.state_dict() if scheduler is not None else None)}
    return model_tensors, optim, metadata


def _hashes(model_tensors: Mapping[str, torch.Tensor], optim: Mapping[str, torch.Tensor],
            metadata: Mapping[str, str]) -> tuple[str, str]:
    model_hash = tensor_digest(model_tensors)
    state = hashlib.sha256("\n".join((model_hash, tensor_digest(optim), _canonical(dict(metadata)))).encode())
    return model_hash, state.hexdigest()


def state_hash(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Scheduler | None) -> str:
    """The state hash :func:`encode_boundary`'s file would have, with no file made: a dispute's trace."""
    return _hashes(*_boundary_parts(model, optimizer, scheduler))[1]


def encode_boundary(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Scheduler | None) -> bytes:
    model_tensors, optim, metadata = _boundary_parts(model, optimizer, scheduler)
    return _encode_parts(model_tensors, optim, metadata)


def encode_hashed_boundary(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Scheduler | None
                           ) -> tuple[bytes, str]:
    """:func:`encode_boundary` and its state hash, hashed from the tensors (nothing decoded again)."""
    parts = _boundary_parts(model, optimizer, scheduler)
    return _encode_parts(*parts), _hashes(*parts)[1]


def _encode_parts(model_tensors: Mapping[str, torch.Tensor], optim: Mapping[str, torch.Tensor],
                  metadata: Mapping[str, str]) -> bytes:
    tensors = {**{MODEL_PREFIX + k: v for k, v in model_tensors.items()},
               **{OPTIM_PREFIX + k: v for k, v in optim.items()}}
    return encode_state(tensors, metadata)


def _bounded_metadata(blob: bytes, what: str) -> dict[str, str]:
    try:
        (size,) = _HEADER_LEN.unpack_from(blob, 0)
    except struct.error as exc:
        raise TrainingError(f"malformed {what} ({len(blob)} bytes)") from exc
    if size > MAX_HEADER_BYTES:
        raise TrainingError(f"{what}'s header is {size} bytes, above {MAX_HEADER_BYTES}")
    return decode_metadata(blob)


def _decode_parts(blob: bytes) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, str]]:
    metadata = _bounded_metadata(blob, "boundary state")
    if metadata.get("kind") != BOUNDARY_KIND or set(metadata) != {"kind", "param_groups", "scalars", "scheduler"}:
        raise TrainingError("not a trajectory boundary state")
    model_tensors, optim = {}, {}
    for key, tensor in decode_state(blob).items():
        if key.startswith(MODEL_PREFIX):
            model_tensors[key[len(MODEL_PREFIX):]] = tensor
        elif key.startswith(OPTIM_PREFIX):
            optim[key[len(OPTIM_PREFIX):]] = tensor
        else:
            raise TrainingError(f"boundary state holds a stray tensor {key[:64]!r}")
    return model_tensors, optim, metadata


def boundary_hashes(blob: bytes) -> tuple[str, str]:
    """(model_hash, state_hash) of a boundary file: ``model_hash`` is :func:`tensor_digest` of the model's
    tensors (so it equals that of ``model.state_dict()`` or of the checkpoint's weights), ``state_hash``
    covers it, the optimizer's tensors and the metadata."""
    return _hashes(*_decode_parts(blob))


OpenedParts = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], Any, Any, Any]


def _opened_parts(blob: bytes) -> OpenedParts:
    """A boundary file's model tensors, optimizer tensors, param groups, optimizer scalars and scheduler state."""
    model_tensors, optim, metadata = _decode_parts(blob)
    try:
        groups, scalars, saved = (json.loads(metadata[k]) for k in ("param_groups", "scalars", "scheduler"))
    except (ValueError, RecursionError) as exc:
        raise TrainingError(f"the boundary state's metadata is not JSON: {str(exc)[:128]}") from exc
    return model_tensors, optim, groups, scalars, saved


def _fit_problem(parts: OpenedParts, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Scheduler | None) -> str | None:
    model_tensors, optim, groups, scalars, saved = parts
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return (model_problem(model_tensors, model.state_dict())
            or param_groups_problem(groups, optimizer.state_dict()["param_groups"])
            or optimizer_state_problem(optim, scalars, params)
            or scheduler_problem(saved, scheduler.state_dict() if scheduler is not None else None))


def opened_state_problem(blob: bytes, model: nn.Module, optimizer: torch.optim.Optimizer,
                         scheduler: Scheduler | None) -> str | None:
    """Why the task's model, optimizer and scheduler (built by its own code) could not be in the boundary
    state ``blob`` (:mod:`._opened_state`); None when they could. Loads nothing."""
    try:
        return _fit_problem(_opened_parts(blob), model, optimizer, scheduler)
    except TrainingError as exc:
        return str(exc)


def load_boundary(blob: bytes, model: nn.Module, optimizer: torch.optim.Optimizer,
                  scheduler: Scheduler | None) -> None:
    """Restore a boundary file into a freshly built model, optimizer and scheduler of the job's task, once
    :func:`opened_state_problem` finds nothing wrong with it."""
    parts = _opened_parts(blob)
    if (problem := _fit_problem(parts, model, optimizer, scheduler)) is not None:
        raise TrainingError(f"the boundary state does not fit this task: {problem}")
    model_tensors, optim, groups, scalars, saved = parts
    state: dict[int, dict[str, Any]] = {}
    for index, values in scalars.items():
        state.setdefault(int(index), {}).update(values)
    for key, tensor in optim.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = tensor
    try:
        model.load_state_dict(dict(model_tensors), strict=True)
        optimizer.load_state_dict({"state": state, "param_groups": groups})
        if scheduler is not None:
            scheduler.load_state_dict(saved)
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise TrainingError(f"the boundary state does not fit this task: {exc}") from exc


# --- recording in the training loop


def _record_boundary(parts: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, str]],
                     path: Path | None) -> tuple[str, str]:
    """A boundary's (model_hash, state_hash), and its state file at ``path`` when it is kept."""
    if path is not None:
        path.write_bytes(_encode_parts(*parts))
    return _hashes(*parts)


class TrajectoryRecorder:
    """Records one job's trajectory while :func:`~aitbc_agent_sdk.tasks.train_task` runs it; ``directory=None``
    keeps only the hashes. The loop calls :meth:`start`, then per batch :meth:`consume` and
    :meth:`stepped` (after the optimizer's and the scheduler's step), then :meth:`finish`."""

    def __init__(self, directory: Path | None, segments: int) -> None:
        if not 1 <= segments <= MAX_SEGMENTS:
            raise ValueError(f"segments must be within 1..{MAX_SEGMENTS}, got {segments}")
        self.directory, self.segments = directory, segments
        self.total_steps = self.segment_steps = self.steps = 0
        self.seed, self.device, self.threads = 0, torch.device("cpu"), 1
        self.kept: tuple[int, ...] = ()  # the boundaries written to ``directory``
        self.model_hashes: list[str] = []
        self.state_hashes: list[str] = []
        self.batch_hashes: list[str] = []
        self._batches = hashlib.sha256()
        self._finished = False
        # Boundaries are hashed (and the kept ones written) on a thread while the next segment trains: sha256
        # releases the GIL, so a GPU's training, or a CPU's spare core, hides it. One snapshot in flight.
        self._hashing: ThreadPoolExecutor | None = None
        self._pending: Future[tuple[str, str]] | None = None

    def start(self, total_steps: int, seed: int, device: torch.device, model: nn.Module,
              optimizer: torch.optim.Optimizer, scheduler: Scheduler | None) -> None:
        """Boundary 0 (after a kept state is restored, before the first batch), and step 0's RNG."""
        if total_steps < 1:
            raise TrainingError("a committed trajectory needs at least one step")
        self.total_steps, self.seed, self.device = total_steps, seed, device
        self.threads = torch.get_num_threads()  # a CPU's sums depend on it: the re-execution uses as many
        self.segment_steps = segment_steps(total_steps, self.segments)
        self.kept = kept_boundaries(math.ceil(total_steps / self.segment_steps) + 1)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)  # no stale boundary of another job survives
            self.directory.mkdir(parents=True)
        self._hashing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trajectory")
        self._boundary(model, optimizer, scheduler)
        seed_step(seed, 0, device)

    def consume(self, batch: Batch) -> None:
        hash_batch(self._batches, batch)

    def stepped(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Scheduler | None) -> None:
        self.steps += 1
        if self.steps > self.total_steps:
            raise TrainingError(f"the task's batches() yielded more than the {self.total_steps} batches its "
                                f"steps_per_epoch() x epochs promise; a committed trajectory needs them to agree")
        if self.steps < self.total_steps:
            seed_step(self.seed, self.steps, self.device)
        if self.steps % self.segment_steps and self.steps != self.total_steps:
            return
        self.batch_hashes.append(self._batches.hexdigest())
        self._batches = hashlib.sha256()
        self._boundary(model, optimizer, scheduler)

    def finish(self) -> None:
        self.close()
        if self.steps != self.total_steps:
            raise TrainingError(f"the task's batches() yielded {self.steps} batches, its steps_per_epoch() x "
                                f"epochs promise {self.total_steps}; a committed trajectory needs them to agree")
        self._finished = True

    def close(self) -> None:
        """Wait for the boundary in flight and stop the hashing thread (also after a failed job)."""
        try:
            self._collect()
        finally:
            if self._hashing is not None:
                self._hashing.shutdown(wait=True)
                self._hashing = None

    def _boundary(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Scheduler | None) -> None:
        model_tensors, optim, metadata = _boundary_parts(model, optimizer, scheduler)
        if self.device.type == "cpu":  # the parts are the live tensors: the next step would change them
            model_tensors = {k: v.clone() for k, v in model_tensors.items()}
            optim = {k: v.clone() for k, v in optim.items()}
        self._collect()
        index = len(self.model_hashes) + (self._pending is not None)
        path = self.directory / boundary_name(index) if self.directory is not None and index in self.kept else None
        assert self._hashing is not None, "start() first"
        self._pending = self._hashing.submit(_record_boundary, (model_tensors, optim, metadata), path)

    def _collect(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            model_hash, state_hash = pending.result()
            self.model_hashes.append(model_hash)
            self.state_hashes.append(state_hash)

    def commitment(self, job_id: str, worker: str, device_type: str) -> TrajectoryCommitment:
        if not self._finished:
            raise TrainingError("the trajectory is not finished")
        return TrajectoryCommitment(job_id=job_id, worker=worker, steps=self.steps, segment_steps=self.segment_steps,
                                    device="cuda" if device_type == "cuda" else "cpu", threads=self.threads,
                                    model_hashes=tuple(self.model_hashes), state_hashes=tuple(self.state_hashes),
                                    batch_hashes=tuple(self.batch_hashes))


def read_commitment_file(path: Path) -> TrajectoryCommitment | None:
    """:func:`read_commitment` of a checkpoint file, reading its header only."""
    with open(path, "rb") as file:
        head = file.read(_HEADER_LEN.size)
        if len(head) == _HEADER_LEN.size and (size := _HEADER_LEN.unpack(head)[0]) <= MAX_HEADER_BYTES:
            head += file.read(size)
    return read_commitment(head)


def read_commitment(blob: bytes) -> TrajectoryCommitment | None:
    """The trajectory a checkpoint commits to; None when it has none, TrainingError when it is malformed."""
    value = _bounded_metadata(blob, "checkpoint").get(COMMITMENT_KEY)
    if value is None:
        return None
    if len(value.encode()) > MAX_COMMITMENT_BYTES:
        raise TrainingError(f"the checkpoint's trajectory commitment is above {MAX_COMMITMENT_BYTES} bytes")
    try:
        return TrajectoryCommitment.model_validate_json(value)
    except ValidationError as exc:
        raise TrainingError(f"malformed trajectory commitment: {exc.errors()[0]['msg']}") from exc
