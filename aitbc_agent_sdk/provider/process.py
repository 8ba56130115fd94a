"""Async handle on the provider's training process: a separate OS process with a scrubbed environment."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import TrainingError
from ..models import JobConfig, ModelSpec

# The files a job directory holds: inputs written by the provider, output by the training process.
SHARD_FILE = "shard.safetensors"
WEIGHTS_FILE = "weights.safetensors"
CHECKPOINT_FILE = "checkpoint.safetensors"

# Only these variables reach the training process; wallet passwords, keys and
# AITBC_* settings never do.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONHASHSEED", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
             "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


def scrubbed_env(work_dir: Path, threads: int, source: Mapping[str, str] | None = None) -> dict[str, str]:
    source = os.environ if source is None else source
    env = {k: v for k, v in source.items() if k in ENV_ALLOW}
    env.update(HOME=str(work_dir), TMPDIR=str(work_dir), AITBC_WORKER_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    return env


EpochCallback = Callable[[dict[str, Any]], Any]


class TrainingProcess:
    """One long-lived worker process per provider, so torch is imported once, not per job."""

    def __init__(self, work_dir: Path, *, threads: int = 1) -> None:
        self._work_dir = work_dir
        self._threads = threads
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._stderr_task: asyncio.Task[None] | None = None
        self._ready = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> None:
        self._work_dir.mkdir(parents=True, exist_ok=True)
        self._ready = False  # the new process announces itself once torch is imported
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aitbc_agent_sdk.provider.worker_process",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=self._work_dir, env=scrubbed_env(self._work_dir, self._threads),
            start_new_session=True,
        )
        self._stderr_task = asyncio.create_task(self._drain_stderr(self._proc))

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        with open(self._work_dir / "worker.log", "ab") as log:
            async for line in proc.stderr:
                log.write(line)
                log.flush()

    async def _next_event(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        line = await self._proc.stdout.readline()
        if not line:
            code = await self._proc.wait()
            self._proc = None
            raise TrainingError(f"training process exited with code {code} (see {self._work_dir / 'worker.log'})")
        return json.loads(line)

    async def train(self, job_dir: Path, *, job_id: str, model: ModelSpec, config: JobConfig, seed: int,
                    on_epoch: EpochCallback | None = None) -> dict[str, Any]:
        async with self._lock:
            try:
                return await self._train_locked(job_dir, job_id=job_id, model=model, config=config, seed=seed,
                                                on_epoch=on_epoch)
            except asyncio.CancelledError:
                # The process is still computing this job and would later answer with its
                # events; kill it so the computation really stops and the next job starts clean.
                await self.kill()
                raise

    async def _train_locked(self, job_dir: Path, *, job_id: str, model: ModelSpec, config: JobConfig, seed: int,
                            on_epoch: EpochCallback | None) -> dict[str, Any]:
        if self._proc is None:
            await self.start()
        assert self._proc is not None and self._proc.stdin is not None
        if not self._ready:
            first = await self._next_event()
            if first.get("event") != "ready":
                raise TrainingError(f"unexpected event from training process: {first}")
            self._ready = True
        request = {"op": "train", "job_dir": str(job_dir), "job_id": job_id, "seed": seed,
                   "model": model.model_dump(mode="json"), "config": config.model_dump(mode="json")}
        self._proc.stdin.write((json.dumps(request) + "\n").encode())
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
        self._ready = False
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

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._stderr_task is not None:
            await asyncio.gather(self._stderr_task, return_exceptions=True)


async def _maybe_await(value: Any) -> None:
    if asyncio.iscoroutine(value):
        await value
