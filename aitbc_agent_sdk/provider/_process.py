"""Async handle on the provider's training process: a separate OS process with a scrubbed environment.

With a :class:`~._sandbox.TrainingSandbox` the process runs in bubblewrap (see :mod:`._sandbox`).
Sandboxed or not, a process serves one training only, named by its on-chain identity (the
escrow's key, which binds the coordinator: an id string is anybody's to reuse). A job of another
training always gets a fresh process, checked twice (when the job is taken and again just before
its line is written to the process), so a job that got code execution, and any thread it left
behind, can reach nothing but later jobs of the same customer, whose data it came from. A failed or killed job ends its process too, and so does
the ``MAX_JOBS_PER_PROCESS``-th job (the CPU rlimit is sized for that many); its successor starts
at once, so only a provider switching customers waits for torch to import. (A spare started
beside every job was dearer: on a small host its import slowed the rounds it ran beside.)

A process takes three requests, under the same owner rule: train a job, recompute boundary states a
delivered job did not keep (a spot check's opening), and re-execute a segment of another worker's job
of the same training (a verifier's work).

Long because: one handle owns the process's whole life (launch, log, ready, replace, kill, stop) and
all of its requests, each sandboxed or not; split, that life would leak into two modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from ..errors import AitbcError, TrainingError
from ..host._sandbox_plan import scrubbed_env
from ..records import MAX_SEGMENTS, JobConfig, ModelSpec, TaskRef, TrajectoryCommitment
from ..data._shard_files import SHARD_INFO
from ..proof._trajectory import boundary_name, kept_boundaries, recompute_plan
from ._sandbox import (
    MAX_JOBS_PER_PROCESS, SANDBOX_DIR, TrainingSandbox, clear_output, clear_output_dir, gpu_env, require_bwrap,
    sandbox_spec, stage_inputs, take_output, take_trajectory, within_disk_limits, worker_command,
)

# The files a job directory holds: inputs written by the provider, output by the training process.
SHARD_FILE = SHARD_INFO  # the shard's ShardData record; its slices are part-NNNNNN beside it
WEIGHTS_FILE = "weights.safetensors"
CHECKPOINT_FILE = "checkpoint.safetensors"
TASK_FILE = "task.json"  # a user task's package, fetched by the provider from its CID
STATE_FILE = "task_state.safetensors"  # a keep_state task's optimizer state: in from the last round, out for the next
RESIDUAL_FILE = "residual.safetensors"  # a lossy update encoding's error feedback: kept like the task state
KEPT_FILES = (STATE_FILE, RESIDUAL_FILE)  # what a worker carries from one round of a training to its next
TRAJECTORY_DIR = "trajectory"  # the trajectory's kept (or recomputed) boundary states, 000000.safetensors, ...


WORKER_LOG = "worker.log"  # what training processes print, in the provider's work directory
MAX_LOG_BYTES = 16 << 20  # of one process's output; past it the rest is read and dropped
LOG_CHUNK = 1 << 16

EpochCallback = Callable[[dict[str, Any]], Any]
WORKER_ENTRY = ("-m", "aitbc_agent_sdk.provider._worker_process")


@dataclass(frozen=True)
class _JobRequest:
    job_id: str
    model: ModelSpec
    config: JobConfig
    seed: int
    task: TaskRef | None
    update_encoding: str = "weights"
    worker: str = ""  # the provider's address, which the trajectory commitment names; "": none is committed
    owner: str | None = None  # the training's on-chain identity; None: a process of its own
    max_parameters: int | None = None  # what the job declares: a task that builds more fails before training

    def input_files(self, job_dir: Path) -> tuple[str, ...]:
        user_code = self.task is not None and self.task.cid is not None
        kept = tuple(name for name in KEPT_FILES if (job_dir / name).is_file())
        parts = tuple(sorted(p.name for p in job_dir.glob("part-*")))
        return (SHARD_FILE, *parts, WEIGHTS_FILE, *((TASK_FILE,) if user_code else ()), *kept)

    def line(self, job_dir: Path, out_dir: Path, device: str) -> str:
        return json.dumps({
            "op": "train", "job_dir": str(job_dir), "out_dir": str(out_dir), "job_id": self.job_id, "seed": self.seed,
            "device": device, "model": self.model.model_dump(mode="json"),
            "config": self.config.model_dump(mode="json"), "update_encoding": self.update_encoding,
            "worker": self.worker, "task": self.task.model_dump(mode="json") if self.task is not None else None,
            "max_parameters": self.max_parameters})


@dataclass(frozen=True)
class _ReplayRequest:
    """Train segments of a delivered job's committed trajectory again from states staged beside its shard
    (``NNNNNN.safetensors``). ``recompute``: the boundaries ``wanted`` (none of them kept), each checked
    against the commitment, from the kept ones. ``reexecute``: a verifier's work on another worker's job,
    segment ``wanted[0]`` from its start state, compared with nothing."""

    op: Literal["recompute", "reexecute"]
    job_id: str
    model: ModelSpec
    config: JobConfig
    seed: int
    task: TaskRef | None
    commitment: TrajectoryCommitment
    wanted: tuple[int, ...]
    owner: str | None = None
    points: tuple[int, ...] = ()  # reexecute, in a dispute: the steps to hash the state after
    stop: int | None = None  # reexecute, in a dispute: the steps to train before it ends

    @property
    def starts(self) -> tuple[int, ...]:
        if self.op == "reexecute":
            return self.wanted
        return tuple(sorted(recompute_plan(len(self.commitment.state_hashes), self.wanted)))

    @property
    def produced(self) -> tuple[int, ...]:
        """The boundary files it leaves in the trajectory directory."""
        return tuple(b + 1 for b in self.wanted) if self.op == "reexecute" else self.wanted

    def input_files(self, job_dir: Path) -> tuple[str, ...]:
        user_code = self.task is not None and self.task.cid is not None
        parts = tuple(sorted(p.name for p in job_dir.glob("part-*")))
        return (SHARD_FILE, *parts, *((TASK_FILE,) if user_code else ()), *map(boundary_name, self.starts))

    def line(self, job_dir: Path, out_dir: Path, device: str) -> str:
        return json.dumps({
            "op": self.op, "job_dir": str(job_dir), "out_dir": str(out_dir), "job_id": self.job_id,
            "seed": self.seed, "device": device, "model": self.model.model_dump(mode="json"),
            "config": self.config.model_dump(mode="json"), "wanted": list(self.wanted),
            "segment": self.wanted[0], "commitment": self.commitment.model_dump(mode="json"),
            "points": list(self.points), "stop": self.stop,
            "task": self.task.model_dump(mode="json") if self.task is not None else None})


_Request = _JobRequest | _ReplayRequest


@dataclass(frozen=True)
class _Launched:
    proc: asyncio.subprocess.Process
    stderr_task: asyncio.Task[None]
    box: Path | None  # sandboxed: the process's own in/ and out/


class TrainingProcess:
    """One long-lived worker process per provider, so torch is imported once, not per job."""

    def __init__(self, work_dir: Path, *, threads: int = 1, sandbox: TrainingSandbox | None = None,
                 entry: tuple[str, ...] = WORKER_ENTRY, gpu: int | None = None) -> None:
        """``sandbox=None`` runs unconfined (``--no-sandbox``). ``entry`` follows the interpreter in argv:
        the worker module; tests swap in a probe that plays a job with code execution. ``gpu``: the
        one GPU (NVML index) this process sees and trains on; None: CPU only, no GPU visible."""
        self._work_dir = work_dir
        self._threads = threads
        self.gpu = gpu
        self._device = "cpu" if gpu is None else "auto"
        self._sandbox = sandbox
        self._entry = entry
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._stderr_task: asyncio.Task[None] | None = None
        self._ready = False
        self._box: Path | None = None
        self._owner: str | None = None  # the training (on-chain identity) the current process has served
        self._jobs_served = 0
        self._seq = itertools.count()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def sandboxed(self) -> bool:
        return self._sandbox is not None

    async def start(self) -> None:
        """Start the process; with a sandbox, raises SandboxError where bubblewrap does not work."""
        self._adopt(await self._launch())

    def _adopt(self, launched: _Launched) -> None:
        self._proc, self._stderr_task, self._box = launched.proc, launched.stderr_task, launched.box
        self._ready = False  # the new process announces itself once torch is imported
        self._owner, self._jobs_served = None, 0

    async def _launch(self) -> _Launched:
        self._work_dir.mkdir(parents=True, exist_ok=True)
        box = None
        if self._sandbox is not None:
            from ..host._sandbox import start_sandboxed

            await asyncio.to_thread(require_bwrap)
            box = self._work_dir / SANDBOX_DIR / f"p{next(self._seq)}"
            spec = await asyncio.to_thread(sandbox_spec, self._sandbox, box, worker_command(self._entry),
                                           threads=self._threads, gpu=self.gpu)
            proc, _ = await start_sandboxed(spec, backend="bwrap", stdin=asyncio.subprocess.PIPE)
        else:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, *self._entry,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                cwd=self._work_dir, env={**scrubbed_env(self._work_dir, self._threads), **gpu_env(self.gpu)},
                start_new_session=True,
            )
        return _Launched(proc, asyncio.create_task(self._drain_stderr(proc)), box)

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        """Copy the process's output (a task's prints too) to the worker log, at most MAX_LOG_BYTES of
        it, and read the rest to its end: a process blocked on a full pipe would never exit."""
        assert proc.stderr is not None
        log, kept = await asyncio.to_thread(_open_log, self._work_dir / WORKER_LOG), 0
        try:
            while chunk := await proc.stderr.read(LOG_CHUNK):  # chunks: a line may have no end
                if log is not None and kept < MAX_LOG_BYTES:
                    kept_now = chunk[: MAX_LOG_BYTES - kept]
                    if kept + len(chunk) >= MAX_LOG_BYTES:
                        kept_now += b"\n[output past this point not logged]\n"
                    with contextlib.suppress(OSError):  # a full disk must not stop the draining
                        log.write(kept_now)
                        log.flush()
                    kept += len(chunk)
        finally:
            if log is not None:
                log.close()

    async def _next_event(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        try:
            line = await self._proc.stdout.readline()
        except ValueError as exc:  # a line past the stream's limit
            raise TrainingError("the training process sent an oversized line") from exc
        if not line:
            code = await self._proc.wait()
            self._proc = None
            raise TrainingError(f"training process exited with code {code} (see {self._work_dir / WORKER_LOG})")
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise TrainingError("the training process sent something other than JSON") from exc
        if not isinstance(event, dict):
            raise TrainingError("the training process sent something other than an event")
        return event

    async def train(self, job_dir: Path, *, job_id: str, model: ModelSpec, config: JobConfig, seed: int,
                    on_epoch: EpochCallback | None = None, owner: str | None = None,
                    task: TaskRef | None = None, update_encoding: str = "weights", worker: str = "",
                    max_parameters: int | None = None) -> dict[str, Any]:
        """Run one job. ``owner`` (the training's on-chain identity) lets the process serve that
        training's next job too; ``None`` gives every job a fresh process. A user ``task``'s package is
        ``job_dir/TASK_FILE``. With a ``worker`` address the job commits its trajectory (in the
        checkpoint's metadata) and leaves its kept boundary states (``kept_boundaries``) in
        ``job_dir/TRAJECTORY_DIR`` (:meth:`recompute` makes the others)."""
        request = _JobRequest(job_id, model, config, seed, task, update_encoding, worker, owner, max_parameters)
        return await self._run(job_dir, request, on_epoch)

    async def recompute(self, job_dir: Path, *, job_id: str, model: ModelSpec, config: JobConfig, seed: int,
                        commitment: TrajectoryCommitment, wanted: tuple[int, ...], owner: str | None = None,
                        task: TaskRef | None = None) -> None:
        """Recompute the states of the ``wanted`` boundaries of a delivered job (none of them kept) into
        ``job_dir/TRAJECTORY_DIR``, from the kept ones in ``job_dir`` (``NNNNNN.safetensors``, beside the job's
        shard and task package) by training those segments again, as the job did. The process checks each
        against ``commitment``; a mismatch is a TrainingError and no file."""
        if not wanted or set(wanted) & set(kept_boundaries(len(commitment.state_hashes))):
            raise ValueError(f"boundaries {list(wanted)}: none or some kept")
        request = _ReplayRequest("recompute", job_id, model, config, seed, task, commitment, tuple(sorted(wanted)), owner)
        await self._run(job_dir, request, None)

    async def reexecute(self, job_dir: Path, *, job_id: str, model: ModelSpec, config: JobConfig, seed: int,
                        commitment: TrajectoryCommitment, segment: int, owner: str | None = None,
                        task: TaskRef | None = None, points: tuple[int, ...] = (),
                        stop: int | None = None) -> dict[str, Any]:
        """As a verifier: train ``segment`` of another worker's job again from its start state
        (``job_dir/NNNNNN.safetensors``, beside the job's shard and task package). The end state lands in
        ``job_dir/TRAJECTORY_DIR``; returns its ``state_hash`` and ``model_hash``, or a ``problem``; in a
        dispute, the ``trace`` of state hashes after ``points`` steps, the end being after ``stop``."""
        request = _ReplayRequest("reexecute", job_id, model, config, seed, task, commitment, (segment,), owner,
                                 points, stop)
        return await self._run(job_dir, request, None)

    async def _run(self, job_dir: Path, request: _Request, on_epoch: EpochCallback | None) -> dict[str, Any]:
        owner = request.owner
        async with self._lock:
            try:
                if self._proc is not None and self._jobs_served and (owner is None or owner != self._owner):
                    await self._replace()  # it served another training: this one's data never meets it
                if self._sandbox is None:
                    done = await self._train_locked(job_dir, request, on_epoch=on_epoch)
                    await self._served(owner)
                    return done
                return await self._train_sandboxed(job_dir, request, on_epoch=on_epoch, owner=owner)
            except asyncio.CancelledError:
                # The process is still computing this job and would later answer with its
                # events; kill it so the computation really stops and the next job starts clean.
                await self.kill()
                raise

    async def ready(self) -> None:
        """Wait until the process has imported torch and can take a job (starting it if none runs)."""
        async with self._lock:
            await self._await_ready()

    async def _await_ready(self) -> None:
        if self._proc is None:
            await self.start()
        if not self._ready:
            first = await self._next_event()
            if first.get("event") != "ready":
                raise TrainingError(f"unexpected event from training process: {first}")
            self._ready = True

    async def _train_sandboxed(self, job_dir: Path, request: _Request, *, on_epoch: EpochCallback | None,
                               owner: str | None) -> dict[str, Any]:
        assert self._sandbox is not None
        try:
            async with asyncio.timeout(self._sandbox.job_timeout_s):
                await self._await_ready()
                assert self._box is not None
                box = self._box
                for name in (CHECKPOINT_FILE, *KEPT_FILES):
                    await asyncio.to_thread(clear_output, box / "out", name)
                await asyncio.to_thread(clear_output_dir, box / "out", TRAJECTORY_DIR)
                await asyncio.to_thread(stage_inputs, job_dir, box / "in", request.input_files(job_dir))
                done = await within_disk_limits(
                    self._train_locked(box / "in", request, on_epoch=on_epoch, out_dir=box / "out"),
                    self._sandbox, box / "out", request.job_id)
            if isinstance(request, _ReplayRequest):
                if done.get("problem") is None:  # a re-execution that could not replay leaves nothing
                    await asyncio.to_thread(take_trajectory, box / "out" / TRAJECTORY_DIR, job_dir / TRAJECTORY_DIR,
                                            boundaries=request.produced, max_bytes=self._sandbox.file_size_bytes,
                                            max_total_bytes=self._sandbox.disk_bytes)
            else:
                await asyncio.to_thread(self._take_job_output, box / "out", job_dir, done)
        except TimeoutError as exc:
            await self._replace()
            raise TrainingError(f"job {request.job_id} ran past {self._sandbox.job_timeout_s:.0f}s and was killed") from exc
        except asyncio.CancelledError:
            raise  # train() kills the process; the next job starts one
        except BaseException:
            await self._replace()
            raise
        await self._served(owner)
        return done

    def _take_job_output(self, out_dir: Path, job_dir: Path, done: dict[str, Any]) -> None:
        """Blocking: a trained job's checkpoint, kept state and residual, and its kept boundary states, each
        removed from the sandbox once taken (a GPT-2 job's are a gigabyte each; the next job clears them too)."""
        assert self._sandbox is not None
        take_output(out_dir / CHECKPOINT_FILE, job_dir / CHECKPOINT_FILE, max_bytes=self._sandbox.file_size_bytes)
        clear_output(out_dir, CHECKPOINT_FILE)
        for name, produced in ((STATE_FILE, done.get("task_state")), (RESIDUAL_FILE, done.get("residual"))):
            if produced:
                take_output(out_dir / name, job_dir / name, max_bytes=self._sandbox.file_size_bytes)
                clear_output(out_dir, name)
        if boundaries := done.get("trajectory"):  # the process's word: its count names the kept files
            count = boundaries if isinstance(boundaries, int) and 0 < boundaries <= MAX_SEGMENTS + 1 else 0
            take_trajectory(out_dir / TRAJECTORY_DIR, job_dir / TRAJECTORY_DIR, boundaries=kept_boundaries(count),
                            max_bytes=self._sandbox.file_size_bytes, max_total_bytes=self._sandbox.disk_bytes)

    async def _served(self, owner: str | None) -> None:
        """After a job that succeeded: a process without an owner, or at its job limit, is not reused."""
        if owner is None or self._jobs_served >= MAX_JOBS_PER_PROCESS:
            await self._replace()

    async def _replace(self) -> None:
        """Kill this process (it may hold whatever a hostile job planted) and start its successor."""
        await self.kill()
        with contextlib.suppress(AitbcError, OSError):
            await self.start()

    async def _train_locked(self, job_dir: Path, request: _Request, *, on_epoch: EpochCallback | None,
                            out_dir: Path | None = None) -> dict[str, Any]:
        await self._await_ready()
        assert self._proc is not None and self._proc.stdin is not None
        if self._jobs_served and (request.owner is None or request.owner != self._owner):
            # The second check, where the job is handed over: whatever path led here, a process that
            # served another training never sees this one's inputs.
            await self.kill()
            raise TrainingError(f"job {request.job_id}: the training process served another training; it was killed")
        self._owner, self._jobs_served = request.owner, self._jobs_served + 1  # before it runs: a failed job counts
        line = request.line(job_dir, out_dir or job_dir, self._device)
        self._proc.stdin.write((line + "\n").encode())
        await self._proc.stdin.drain()
        while True:
            event = await self._next_event()
            kind = event.get("event")
            if kind == "epoch":
                if on_epoch is not None:
                    await _maybe_await(on_epoch(event))
            elif kind == "done":
                return event
            elif kind == "error":
                raise TrainingError(event.get("message", "training failed"))

    async def kill(self) -> None:
        """SIGKILL the training process (and anything it started) and reap it.

        The next ``train`` starts a fresh process; killing when none runs is a no-op.
        """
        proc, self._proc = self._proc, None
        box, self._box = self._box, None
        self._ready = False
        self._owner, self._jobs_served = None, 0
        if proc is None:
            return
        if proc.returncode is None:
            # start_new_session made the process a group leader: kill the whole group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        if self._stderr_task is not None:
            await asyncio.gather(self._stderr_task, return_exceptions=True)
            self._stderr_task = None
        if box is not None:
            await asyncio.to_thread(shutil.rmtree, box, True)

    async def stop(self) -> None:
        """Close stdin (the worker exits), kill what does not exit in 5 s. A process that has not
        announced itself ready (still importing torch) reads no stdin yet: it is killed at once."""
        if self._proc is None or self._stderr_task is None:
            return
        current = _Launched(self._proc, self._stderr_task, self._box)
        graceful = self._ready
        self._proc, self._box, self._stderr_task, self._ready = None, None, None, False
        await _close(current, graceful=graceful)


async def _close(worker: _Launched, *, graceful: bool) -> None:
    proc = worker.proc
    if proc.returncode is None:
        assert proc.stdin is not None
        proc.stdin.close()
        exited = False
        if graceful:  # a process still importing torch reads no stdin: nothing to wait for
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)
                exited = True
        if not exited:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    await asyncio.gather(worker.stderr_task, return_exceptions=True)
    if worker.box is not None:
        await asyncio.to_thread(shutil.rmtree, worker.box, True)


def _open_log(path: Path) -> BinaryIO | None:
    """The worker log to append to, the previous one kept as ``.1`` once past MAX_LOG_BYTES; None when
    it cannot be opened (the output is then only drained)."""
    try:
        if path.is_file() and path.stat().st_size > MAX_LOG_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
        return open(path, "ab")
    except OSError:
        return None


async def _maybe_await(value: Any) -> None:
    if asyncio.iscoroutine(value):
        await value
