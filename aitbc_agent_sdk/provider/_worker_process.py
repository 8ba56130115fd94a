"""The training process a provider runs jobs in (``python -m aitbc_agent_sdk.provider._worker_process``).

It speaks JSON lines: one request per line on stdin, events on stdout. It reads only
safetensors files and (for a user task) the task package from the job directory, so nothing
a stranger sent is unpickled; the customer's task code is imported here and nowhere else on
the provider. It holds no keys: its environment is scrubbed by the parent, and on a provider
it runs in the bwrap sandbox of :mod:`._sandbox`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..records import COMMITMENT_KEY, JobConfig, ModelSpec, TaskRef, TrajectoryCommitment
from ..data._datasets import LabeledData
from ..wire._checkpoint import decode_state, encode_state
from ..errors import AitbcError, TrainingError
from ..tasks._bound_task import BoundTask, bind_task, job_task_ref
from ..data._shard_files import load_shard
from ..tasks._task import TrainingTask
from ..tasks._task_loop import EpochStats, training_device
from ..tasks._task_checks import TaskOrigin, describe_task_error
from ..tasks._task_package import decode_package, load_task
from ..proof._trajectory import TrajectoryRecorder, boundary_name
from ..tasks._trajectory_replay import recompute_boundaries, trace_segment
from ..wire._update_codec import decode_residual, encode_residual, encode_update

from ._process import CHECKPOINT_FILE, RESIDUAL_FILE, SHARD_FILE, STATE_FILE, TASK_FILE, TRAJECTORY_DIR, WEIGHTS_FILE

LoadedTasks = dict[str, TrainingTask]  # task CID -> the imported task: a process serves one training


Emit = Callable[[dict[str, Any]], None]


def event_channel() -> Emit:
    """Events go out on a private copy of stdout; fd 1 then points at stderr (the worker log), so a
    task that prints cannot corrupt the event stream."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(event: dict[str, Any]) -> None:
        channel.write(json.dumps(event) + "\n")
        channel.flush()
    return emit


def run_job(request: dict[str, Any], loaded: LoadedTasks, emit: Emit) -> dict[str, Any]:
    """One request: ``train`` a job, ``recompute`` boundary states of one it trained before, or ``reexecute``
    a segment of another worker's job as its verifier."""
    job_dir = Path(request["job_dir"])
    out_dir = Path(request.get("out_dir") or job_dir)  # sandboxed: inputs are read-only, output goes here
    spec = ModelSpec.model_validate(request["model"])
    config = JobConfig.model_validate(request["config"])
    ref = job_task_ref(spec, TaskRef.model_validate(request["task"]) if request.get("task") else None)
    user_task = None
    if ref.cid is not None:  # the customer's code, imported here, inside the sandbox only
        if ref.cid not in loaded:
            package = decode_package((job_dir / TASK_FILE).read_bytes())
            loaded[ref.cid] = load_task(package, out_dir / "tasks" / ref.cid)
        user_task = loaded[ref.cid]
    task = bind_task(ref, user_task, TaskOrigin(out_dir / "tasks" / ref.cid) if ref.cid is not None else None)
    try:
        if request.get("op") == "recompute":
            return _recompute(request, task, job_dir, out_dir, config, spec)
        if request.get("op") == "reexecute":
            return _reexecute(request, task, job_dir, out_dir, config, spec)
        return _train_job(request, task, job_dir, out_dir, config, spec, emit)
    except AitbcError:
        raise
    except Exception as exc:  # in the customer's code, as a rule: its line goes back to the customer
        if task.origin is None:
            raise
        raise TrainingError(describe_task_error(exc, task.task, task.origin)) from exc


def _train_job(request: dict[str, Any], task: BoundTask, job_dir: Path, out_dir: Path, config: JobConfig,
               spec: ModelSpec, emit: Emit) -> dict[str, Any]:
    data = load_shard(job_dir)  # shard.json and its parts, checked against each other
    model = task.build(spec, samples=len(data), max_parameters=request.get("max_parameters"))
    reference = decode_state((job_dir / WEIGHTS_FILE).read_bytes())  # the round's start: what an update is from
    model.load_state_dict(reference, strict=True)

    device = training_device(str(request.get("device", "auto")))

    def on_epoch(stats: EpochStats) -> None:
        emit({"event": "epoch", "epoch": stats.epoch, "epochs": stats.epochs, "loss": stats.loss,
              "samples_per_s": stats.samples_per_s, **gpu_figures(device)})

    kept = (job_dir / STATE_FILE).read_bytes() if (job_dir / STATE_FILE).is_file() else None
    worker = str(request.get("worker") or "")  # an old caller names none: no commitment
    recorder = TrajectoryRecorder(out_dir / TRAJECTORY_DIR, config.segments) if worker else None
    result = task.train(model, data, config, seed=int(request["seed"]), device=device,
                        on_epoch=on_epoch, kept_state=kept, trajectory=recorder)
    if result.task_state is not None:
        (out_dir / STATE_FILE).write_bytes(result.task_state)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    commitment = None if recorder is None else recorder.commitment(str(request.get("job_id", "")), worker, device.type)
    residual = write_checkpoint(state, reference, job_dir, out_dir, request, commitment)
    kept_as = None if result.task_state is None else ("resumed" if result.resumed else "fresh")
    return {"event": "done", "samples": result.samples, "loss": result.loss, "seconds": result.seconds,
            "task_state": kept_as, "residual": residual,
            "trajectory": 0 if commitment is None else len(commitment.state_hashes)}


def _recompute(request: dict[str, Any], task: BoundTask, job_dir: Path, out_dir: Path, config: JobConfig,
               spec: ModelSpec) -> dict[str, Any]:
    """Recompute the boundaries asked for from the kept states in ``job_dir``, as many threads as the job
    trained with (a CPU's sums depend on them), each checked against the commitment before it is written."""
    commitment = TrajectoryCommitment.model_validate(request["commitment"])
    wanted = [int(b) for b in request["wanted"]]
    data = load_shard(job_dir)
    directory = out_dir / TRAJECTORY_DIR
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)

    def put(boundary: int, blob: bytes) -> None:  # one state in memory at a time
        (directory / boundary_name(boundary)).write_bytes(blob)
    before = torch.get_num_threads()
    torch.set_num_threads(commitment.threads)
    try:
        recompute_boundaries(task, spec, data, config, int(request["seed"]), commitment, job_dir, wanted, put,
                             device=training_device(str(request.get("device", "auto"))))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)  # no file of a recomputation that failed
        raise
    finally:
        torch.set_num_threads(before)
    return {"event": "done", "recomputed": sorted(int(p.stem) for p in directory.iterdir())}


def _reexecute(request: dict[str, Any], task: BoundTask, job_dir: Path, out_dir: Path, config: JobConfig,
               spec: ModelSpec) -> dict[str, Any]:
    """A verifier's work: train ``segment`` again from the start state staged in ``job_dir``, as many threads
    as the job trained with, and leave the end state in ``out_dir/TRAJECTORY_DIR``. Compares nothing: the
    coordinator does, with the hashes this returns. A ``problem`` says why the segment could not be replayed.
    In a dispute: ``trace`` holds the state hashes after the request's ``points``, and ``stop`` ends it early."""
    commitment = TrajectoryCommitment.model_validate(request["commitment"])
    segment = int(request["segment"])
    data = load_shard(job_dir)
    directory = out_dir / TRAJECTORY_DIR
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    start = (job_dir / boundary_name(segment)).read_bytes()
    before = torch.get_num_threads()
    torch.set_num_threads(commitment.threads)
    try:
        # The device the worker committed to: a CPU trajectory replays on this CPU even beside a GPU, bit for
        # bit as the coordinator's referee does (a GPU's sums would part from it at the first step).
        prefer = "cpu" if commitment.device == "cpu" else str(request.get("device", "auto"))
        traced = trace_segment(task, spec, data, config, int(request["seed"]), commitment, segment, start,
                               points=tuple(int(p) for p in request.get("points") or ()), stop=request.get("stop"),
                               device=training_device(prefer))
    finally:
        torch.set_num_threads(before)
    again = traced.end
    if again.problem is not None:
        return {"event": "done", "problem": again.problem[:256], "contradicts": again.contradicts}
    (directory / boundary_name(segment + 1)).write_bytes(again.end)
    return {"event": "done", "state_hash": again.state_hash, "model_hash": again.model_hash,
            "trace": list(traced.trace)}


def write_checkpoint(state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], job_dir: Path,
                     out_dir: Path, request: dict[str, Any], commitment: TrajectoryCommitment | None = None) -> bool:
    """The result as the job asked for it: the weights, or their change encoded, with the error the
    last round's lossy encoding left folded in, and the trajectory's commitment in its metadata (so the
    signed CID binds it). True when an error is kept for the next round."""
    encoding = str(request.get("update_encoding", "weights"))
    kept = job_dir / RESIDUAL_FILE
    residual = decode_residual(kept.read_bytes(), reference) if kept.is_file() else None
    metadata = {"job_id": str(request.get("job_id", ""))}
    if commitment is not None:
        metadata[COMMITMENT_KEY] = commitment.model_dump_json()
    blob, left = encode_update(state, reference, encoding, residual=residual,  # type: ignore[arg-type]
                               metadata=metadata)
    (out_dir / CHECKPOINT_FILE).write_bytes(blob)
    if left is None:
        return False
    (out_dir / RESIDUAL_FILE).write_bytes(encode_residual(left))
    return True


def gpu_figures(device: torch.device) -> dict[str, Any]:
    """Peak memory and utilisation of the process's GPU (none on a CPU)."""
    if device.type != "cuda":
        return {}
    figures: dict[str, Any] = {"gpu_memory_bytes": int(torch.cuda.max_memory_allocated(device))}
    try:
        figures["gpu_utilization_percent"] = float(torch.cuda.utilization(device))
    except Exception:  # NVML unreadable in this sandbox: memory alone
        pass
    return figures


def warm_up() -> None:
    """One tiny step before announcing ready, on the CPU and on the process's GPU when it has one:
    torch loads much of itself (and CUDA its context) on the first step, and a fresh sandboxed
    process serves every new training, so no job should wait for that."""
    spec = ModelSpec(name="mlp", input_shape=(4,), num_classes=2, hidden=4)
    data = LabeledData(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), 2)
    task = bind_task(TaskRef(name="mlp"))
    for device in {torch.device("cpu"), training_device()}:
        model = task.build(spec)
        task.train(model, data, JobConfig(epochs=1, batch_size=2), seed=0, device=device)
        decode_state(encode_state({k: v.detach() for k, v in model.state_dict().items()}))


def reproducible_gpu() -> None:
    """On a GPU, kernels that give the same bits run after run (before CUDA starts): a boundary state the
    provider did not keep is recomputed on the same GPU and must hash as committed. Ops torch has no
    deterministic kernel for only warn."""
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)


def main() -> None:
    torch.set_num_threads(int(os.environ.get("AITBC_WORKER_THREADS", "1")))
    reproducible_gpu()
    emit = event_channel()
    warm_up()
    emit({"event": "ready", "pid": os.getpid()})
    loaded: LoadedTasks = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            emit(run_job(json.loads(line), loaded, emit))
        except Exception as exc:  # report any failure to the parent instead of dying
            emit({"event": "error", "message": f"{type(exc).__name__}: {exc}",
                  "trace": traceback.format_exc(limit=5)})
    # stdin closed: the parent is done with us. Skip interpreter teardown (about a second
    # with torch loaded); every event was flushed as it was written.
    os._exit(0)


if __name__ == "__main__":
    main()
