"""A spot check's re-execution of one committed segment, and how far two states lie apart. Pure torch, no I/O.

The coordinator opens a segment's start state (a boundary file the worker sends, bound to the
commitment by its hash), builds the task's model, optimizer and scheduler as the worker's
:func:`~aitbc_agent_sdk.tasks.train_task` did, replays the job's seeded batch stream from its start (checking
each segment's batches against the commitment on the way) and trains the segment's steps with the
loop's own step function. On equal CPUs the end state must equal the committed one bit for bit.

The worker's side uses the same replay: :func:`recompute_boundaries` recomputes a boundary it did not keep
(:func:`~._trajectory.kept_boundaries`) by training on from the kept state before it, and checks the
result against its own commitment before it lets it out.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.records import JobConfig, ModelSpec, TrajectoryCommitment
from aitbc_agent_sdk.tasks._bound_task import BoundTask
from aitbc_agent_sdk.tasks._task import Batch
from aitbc_agent_sdk.tasks._task_loop import train_step
from aitbc_agent_sdk.proof._trajectory import (
    boundary_hashes, boundary_name, encode_boundary, encode_hashed_boundary, hash_batch, isolated_rng,
    kept_boundaries, load_boundary, opened_state_problem, recompute_plan, seed_step, segment_steps,
    state_hash,
)


@dataclass(frozen=True)
class Reexecution:
    """The state a re-executed segment ends in (a boundary file and its hashes), or why it could not run."""

    end: bytes = b""
    model_hash: str = ""
    state_hash: str = ""
    model: dict[str, torch.Tensor] = field(default_factory=dict)
    problem: str | None = None
    # True: the problem contradicts the commitment itself (its step count, its batches); False: the opened
    # state is not one the task could be in, so the segment could not be replayed at all.
    contradicts: bool = False


def _stream(bound: BoundTask, data: Any, config: JobConfig, batch_size: int, generator: torch.Generator,
            device: torch.device) -> Iterator[Batch]:
    """The job's batches, epoch after epoch, drawn as train_task draws them."""
    for _ in range(config.epochs):
        yield from bound.task.batches(data, bound.params, batch_size, generator, device)


def reexecute_segment(task: BoundTask, spec: ModelSpec, data: Any, config: JobConfig, seed: int,
                      commitment: TrajectoryCommitment, segment: int, start: bytes, *,
                      device: torch.device = torch.device("cpu")) -> Reexecution:
    """Train ``segment`` of the committed job again from its opened start state ``start``.

    A ``problem`` says what in the worker's answer is wrong (the start state, the job's shape, the
    batch order); the caller compares the returned end state with the committed one."""
    return reexecute_segments(task, spec, data, config, seed, commitment, {segment: start}, device=device)[segment]


def reexecute_segments(task: BoundTask, spec: ModelSpec, data: Any, config: JobConfig, seed: int,
                       commitment: TrajectoryCommitment, starts: Mapping[int, bytes], *,
                       device: torch.device = torch.device("cpu"),
                       after_step: AfterStep | None = None) -> dict[int, Reexecution]:
    """:func:`reexecute_segment` for several segments in one pass over the job's batch stream (the batches
    before the last one are drawn and hashed once, not once per segment). Every opened start state is
    checked against the task's freshly built model, optimizer and scheduler before anything is replayed
    (:func:`~._trajectory.opened_state_problem`). A problem found on the way (the stream, the batch order)
    ends the pass: it and every segment not reached carry it."""
    for segment in starts:
        if not 0 <= segment < commitment.segments:
            raise ValueError(f"segment {segment} outside the commitment's {commitment.segments}")
    done = _opened_problems(commitment, starts)
    batch_size, total = _steps(task, data, config)
    k = segment_steps(total, config.segments)
    if (commitment.steps, commitment.segment_steps) != (total, k):
        problem = (f"commits {commitment.steps} steps in segments of {commitment.segment_steps}; the job has "
                   f"{total} in segments of {k}")
        return {s: done.get(s, Reexecution(problem=problem, contradicts=True)) for s in starts}
    with isolated_rng(device):
        job = _fresh(task, spec, len(data), config, total, device)
        for segment in sorted(set(starts) - set(done)):
            if (unfit := opened_state_problem(starts[segment], *job)) is not None:
                done[segment] = Reexecution(problem=f"opened start state cannot be replayed: {unfit}")
        wanted = sorted(s for s in starts if s not in done)
        if not wanted:
            return done
        batches = _stream(task, data, config, batch_size, torch.Generator().manual_seed(seed), device)

        def ended(run: int, _: int) -> None:
            done[run] = _ended(*job)
        runs = {s: (starts[s], s + 1) for s in wanted}
        problem, unloaded = _replay(task, job, seed, commitment, runs, batches, total, ended, device, after_step)
        done.update({s: Reexecution(problem=f"opened start state does not fit the task: {why}")
                     for s, why in unloaded.items()})
    if problem is not None:  # segments finished before it keep their end states
        return {s: done.get(s, Reexecution(problem=problem, contradicts=True)) for s in starts}
    return {s: done.get(s, Reexecution(problem=STOPPED)) for s in starts}


Job = tuple[torch.nn.Module, torch.optim.Optimizer, Any]
STOPPED = "stopped before the segment's end"  # an ``after_step`` hook ended the run


@dataclass(frozen=True)
class Traced:
    """A segment re-executed for a dispute: the state it ended in (after ``stop`` steps, or all of them) and
    the state hashes after each of the steps asked for, in order."""

    end: Reexecution
    trace: tuple[str, ...] = ()


def trace_segment(task: BoundTask, spec: ModelSpec, data: Any, config: JobConfig, seed: int,
                  commitment: TrajectoryCommitment, segment: int, start: bytes, *, points: Sequence[int] = (),
                  stop: int | None = None, device: torch.device = torch.device("cpu")) -> Traced:
    """:func:`reexecute_segment`, hashing the state after each of ``points`` steps into the segment (strictly
    increasing, from 1), and ending after ``stop`` of its steps when given (no later than the last point)."""
    first, last = commitment.segment_steps_of(segment)
    stop = last - first if stop is None else stop
    if not 1 <= stop <= last - first or any(not 1 <= p <= stop for p in points) or list(points) != sorted(set(points)):
        raise ValueError(f"points {list(points)[:8]} and stop {stop} do not lie in segment {segment}'s "
                         f"{last - first} steps")
    wanted = set(points)
    trace: list[str] = []
    stopped: list[Reexecution] = []

    def after(_: int, steps: int, job: Job) -> bool:
        if steps in wanted:
            trace.append(state_hash(*job))
        if steps == stop and stop < last - first:
            stopped.append(_ended(*job))
            return True
        return False
    again = reexecute_segments(task, spec, data, config, seed, commitment, {segment: start}, device=device,
                               after_step=after)[segment]
    if stopped and again.problem == STOPPED:
        again = stopped[0]
    return Traced(again, tuple(trace) if again.problem is None else ())


def replay_step(task: BoundTask, spec: ModelSpec, data: Any, config: JobConfig, seed: int,
                commitment: TrajectoryCommitment, step: int, state: bytes, *,
                device: torch.device = torch.device("cpu")) -> Reexecution:
    """Train one step, ``step`` of the job (counted from its first), from ``state``, the state after the
    steps before it: what a dispute's referee computes once the parties' traces narrow it to that step.
    The batch is the job's own (drawn from its seeded stream); the state must be one the task can be in."""
    batch_size, total = _steps(task, data, config)
    if (commitment.steps, commitment.segment_steps) != (total, segment_steps(total, config.segments)):
        return Reexecution(problem="the commitment is not of this job's steps", contradicts=True)
    if not 0 <= step < total:
        raise ValueError(f"step {step} outside the job's {total}")
    with isolated_rng(device):
        model, optimizer, scheduler = job = _fresh(task, spec, len(data), config, total, device)
        if (unfit := opened_state_problem(state, *job)) is not None:
            return Reexecution(problem=f"the state before step {step} cannot be replayed: {unfit}")
        try:
            load_boundary(state, model, optimizer, scheduler)
        except TrainingError as exc:
            return Reexecution(problem=f"the state before step {step} does not fit the task: {exc}")
        batches = _stream(task, data, config, batch_size, torch.Generator().manual_seed(seed), device)
        model.train()
        for drawn in range(step + 1):
            seed_step(seed, drawn, device)
            batch = next(batches, None)
            if batch is None:
                return Reexecution(problem=f"the job's batches end at step {drawn}", contradicts=True)
        train_step(task.task, model, batch, task.params, optimizer, scheduler, device,
                   task.task.grad_clip_norm(task.params))
        return _ended(*job)


def _steps(task: BoundTask, data: Any, config: JobConfig) -> tuple[int, int]:
    """The job's batch size and its steps on ``data``, as train_task counts them."""
    batch_size = min(config.batch_size, len(data))
    return batch_size, config.epochs * task.task.steps_per_epoch(data, task.params, batch_size)


def unfit_states(task: BoundTask, spec: ModelSpec, data: Any, config: JobConfig,
                 opened: Mapping[int, bytes]) -> dict[int, str]:
    """The opened boundary states (by index) that the job's own model, optimizer and scheduler could not be
    in, and why: what a spot check refuses before it replays anything."""
    device = torch.device("cpu")
    with isolated_rng(device):  # building the model draws its initial weights
        job = _fresh(task, spec, len(data), config, _steps(task, data, config)[1], device)
    return {i: problem for i, blob in sorted(opened.items())
            if (problem := opened_state_problem(blob, *job)) is not None}


def _fresh(task: BoundTask, spec: ModelSpec, samples: int, config: JobConfig, total: int,
           device: torch.device) -> Job:
    """The job's model, optimizer and scheduler as the task's own code builds them."""
    model = task.build(spec, samples=samples)
    model.to(device)
    optimizer, scheduler = task.task.configure_optimizer(model, task.params, config, total)
    return model, optimizer, scheduler


def _opened_problems(commitment: TrajectoryCommitment, starts: Mapping[int, bytes]) -> dict[int, Reexecution]:
    """Opened start states that are not what the commitment hashed."""
    found = {}
    for segment, start in starts.items():
        try:
            opened = boundary_hashes(start)[1]
        except TrainingError as exc:
            found[segment] = Reexecution(problem=f"opened start state is malformed: {exc}")
            continue
        if opened != commitment.state_hashes[segment]:
            found[segment] = Reexecution(problem="opened start state does not match the commitment")
    return found


Runs = Mapping[int, tuple[bytes, int]]  # start boundary -> (its state file, the boundary to train up to)
AfterStep = Callable[[int, int, 'Job'], bool]  # (run, steps into it, the job's state) -> stop the run


def _replay(task: BoundTask, job: Job, seed: int, commitment: TrajectoryCommitment, runs: Runs,
            batches: Iterator[Batch], total: int, reached: Callable[[int, int], None],
            device: torch.device, after_step: AfterStep | None = None) -> tuple[str | None, dict[int, str]]:
    """Draw the job's batches up to the last boundary a run trains to, hashing each segment's; train each
    run from its opened start, calling ``reached(run, boundary)`` at every boundary it reaches (the job's
    state is then that boundary's), and ``after_step(run, steps)`` after each of its steps (``steps`` into
    the run's first segment; True ends the run there). Returns what ended the pass early (stream or batch
    order), and the runs whose start did not load, with why."""
    model, optimizer, scheduler = job
    clip = task.task.grad_clip_norm(task.params)
    model.train()
    k = commitment.segment_steps
    last = max(stop for _, stop in runs.values()) - 1  # the last segment trained
    training: int | None = None  # the run being trained, if any
    unloaded: dict[int, str] = {}
    hasher = hashlib.sha256()
    for step in range(commitment.segment_steps_of(last)[1]):
        segment = step // k
        if step % k == 0 and segment in runs:
            training = None
            try:
                load_boundary(runs[segment][0], model, optimizer, scheduler)
            except TrainingError as exc:
                unloaded[segment] = str(exc)
            else:
                training = segment
        seed_step(seed, step, device)  # every step, before its batch is drawn, as the recorder does
        batch = next(batches, None)
        if batch is None:
            return f"the job's batches end at step {step}, before segment {last} does", unloaded
        hash_batch(hasher, batch)
        if training is not None:
            train_step(task.task, model, batch, task.params, optimizer, scheduler, device, clip)
            if after_step is not None and after_step(training, step + 1 - training * k, job):
                training = None  # the run stops here: the hook kept what it wanted
        if (step + 1) % k == 0 or step + 1 == total:
            if hasher.hexdigest() != commitment.batch_hashes[segment]:
                return f"batch order of segment {segment} differs from the commitment", unloaded
            hasher = hashlib.sha256()
            if training is not None:
                reached(training, segment + 1)
                if segment + 1 == runs[training][1]:
                    training = None
    return None, unloaded


def open_boundaries(task: BoundTask, spec: ModelSpec, data: Any, config: JobConfig, seed: int,
                    commitment: TrajectoryCommitment, directory: Path, wanted: Iterable[int], *,
                    device: torch.device = torch.device("cpu")) -> dict[int, bytes]:
    """The state files of the ``wanted`` boundaries: read from ``directory`` when kept there, else
    recomputed (:func:`recompute_boundaries`). All in memory: for small jobs, tests and benchmarks."""
    asked = sorted(set(wanted))
    kept = kept_boundaries(len(commitment.state_hashes))
    opened = {b: (directory / boundary_name(b)).read_bytes() for b in asked if b in kept}
    recompute_boundaries(task, spec, data, config, seed, commitment, directory, [b for b in asked if b not in kept],
                         opened.__setitem__, device=device)
    return opened


def recompute_boundaries(task: BoundTask, spec: ModelSpec, data: Any, config: JobConfig, seed: int,
                         commitment: TrajectoryCommitment, directory: Path, wanted: Iterable[int],
                         put: Callable[[int, bytes], None], *, device: torch.device = torch.device("cpu")) -> None:
    """The worker's side of a spot check: recompute the ``wanted`` boundaries it did not keep from the kept
    state before each (in ``directory``), in one pass, handing each state file to ``put`` as it is reached,
    once it hashes as ``commitment`` says. One that does not is a TrainingError (the worker's own bug, and
    no file to hand out). Bit for bit on the device and thread count that trained the job."""
    asked = set(wanted)
    plan = recompute_plan(len(commitment.state_hashes), asked)
    if not plan:
        return
    starts = {k: (directory / boundary_name(k)).read_bytes() for k in plan}
    for k, blob in starts.items():
        if boundary_hashes(blob)[1] != commitment.state_hashes[k]:
            raise TrainingError(f"kept boundary {k} does not match the commitment")
    batch_size, total = _steps(task, data, config)
    if (commitment.steps, commitment.segment_steps) != (total, segment_steps(total, config.segments)):
        raise TrainingError("the commitment is not of this job's steps")
    with isolated_rng(device):
        job = _fresh(task, spec, len(data), config, total, device)
        batches = _stream(task, data, config, batch_size, torch.Generator().manual_seed(seed), device)

        def reached(_: int, boundary: int) -> None:
            if boundary in asked:
                blob, state_hash = encode_hashed_boundary(*job)
                if state_hash != commitment.state_hashes[boundary]:
                    raise TrainingError(f"recomputed boundary {boundary} does not hash as committed")
                put(boundary, blob)
        problem, unloaded = _replay(task, job, seed, commitment, {k: (starts[k], stop) for k, stop in plan.items()},
                                    batches, total, reached, device)
    if problem is not None or unloaded:
        raise TrainingError(f"cannot recompute the trajectory: {problem or next(iter(unloaded.values()))}")


def _ended(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> Reexecution:
    blob = encode_boundary(model, optimizer, scheduler)
    model_hash, state_hash = boundary_hashes(blob)
    tensors = {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}
    return Reexecution(end=blob, model_hash=model_hash, state_hash=state_hash, model=tensors)


def relative_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
                      start: Mapping[str, torch.Tensor]) -> float:
    """``||a - b|| / ||b - start||`` over ``b``'s floating tensors, in float64: how far a re-executed end
    state ``a`` lies from the committed ``b``, relative to the segment's own change. inf when non-finite."""
    keys = sorted(k for k, v in b.items() if v.is_floating_point())
    differ = [k for k in keys if k not in a or k not in start or not a[k].shape == b[k].shape == start[k].shape]
    if differ:
        raise ValueError(f"states differ in their tensors: {differ[:5]}")
    apart = moved = 0.0
    for key in keys:
        target = b[key].detach().to("cpu", torch.float64)
        apart += float((a[key].detach().to("cpu", torch.float64) - target).square().sum())
        moved += float((target - start[key].detach().to("cpu", torch.float64)).square().sum())
    distance = math.sqrt(apart) / max(math.sqrt(moved), 1e-12)
    return distance if math.isfinite(distance) else math.inf
