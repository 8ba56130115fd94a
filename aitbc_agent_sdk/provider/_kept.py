"""What a provider keeps of each delivered job until its training closes on chain.

The checkpoint (so a result the coordinator could not fetch can be re-sent) and the boundary
states the training process kept (``trajectory/NNNNNN.safetensors``, three at most: a spot check
opens them, and has the others recomputed from them) move here from the job directory when the
job ends. They are keyed by the training's on-chain identity and the job id, so another
coordinator reusing an id replaces nothing, and they stay until the chain shows the training
closed, within a disk bound: past it the oldest job of the training holding the most bytes goes
first, so a flood of one party's jobs evicts its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import AitbcError
from ..records import BoundaryState, JobAssignment, TrajectoryChallenge, id_path
from ._jobs import TrainOutcome
from ._owners import TrainingOwner
from ._pins import TrainingPins
from ._process import CHECKPOINT_FILE, TRAJECTORY_DIR

__all__ = ["KEPT_BYTES", "KEPT_JOBS", "MAX_RECOMPUTES", "KeptJob", "KeptResults", "Recompute", "boundary_file"]

log = logging.getLogger(__name__)
KEPT_JOBS = 4096  # delivered jobs kept across all open trainings
KEPT_BYTES = 32 << 30  # their checkpoints and boundary states on disk
MAX_RECOMPUTES = 2  # openings of one job that recompute states (a spot check, and a closer one when held)


def boundary_file(directory: Path, boundary: int) -> Path:
    return directory / f"{boundary:06d}.safetensors"


@dataclass(frozen=True)
class KeptJob:
    owner: TrainingOwner
    job: JobAssignment
    outcome: TrainOutcome  # its checkpoint is the kept copy
    directory: Path
    size: int

    @property
    def trajectory(self) -> Path:
        return self.directory / TRAJECTORY_DIR


Recompute = Callable[[KeptJob, tuple[int, ...], Path], Awaitable[None]]
"""Recompute the boundaries a kept job did not keep into a directory, each checked against its
commitment (boundaries outside the trajectory are skipped)."""


class KeptResults:
    def __init__(self, root: Path, pins: TrainingPins, *, max_jobs: int = KEPT_JOBS,
                 max_bytes: int = KEPT_BYTES) -> None:
        self.root = root
        self.pins = pins  # openings are pinned for their training, unpinned when it closes
        self.max_jobs = max_jobs
        self.max_bytes = max_bytes
        shutil.rmtree(root, ignore_errors=True)  # nothing kept survives a restart: no contract does either
        self._jobs: OrderedDict[tuple[str, str], KeptJob] = OrderedDict()  # (owner hex, job id), oldest first
        self._recomputed: Counter[tuple[str, str]] = Counter()  # openings that recomputed states, per job

    @property
    def bytes(self) -> int:
        return sum(kept.size for kept in self._jobs.values())

    async def keep(self, owner: TrainingOwner, job: JobAssignment, job_dir: Path, outcome: TrainOutcome) -> KeptJob:
        """Move the job's checkpoint and boundary files out of ``job_dir`` (which goes), then trim to the bounds."""
        target = id_path(id_path(self.root, owner.hex), job.job_id)
        kept = await asyncio.to_thread(_move_in, job_dir, target, outcome.checkpoint)
        entry = KeptJob(owner, job, replace(outcome, checkpoint=target / CHECKPOINT_FILE), target, kept)
        key = (owner.hex, job.job_id)
        self._recomputed.pop(key, None)
        if (old := self._jobs.pop(key, None)) is not None and old.directory != target:
            await asyncio.to_thread(shutil.rmtree, old.directory, True)
        self._jobs[key] = entry
        await self._trim()
        return entry

    def get(self, owner: TrainingOwner, job_id: str) -> KeptJob | None:
        return self._jobs.get((owner.hex, job_id))

    async def open(self, kept: KeptJob, challenge: TrajectoryChallenge,
                   recompute: Recompute | None = None) -> tuple[BoundaryState, ...]:
        """Upload the boundaries of every segment asked for (starts, and ends if asked): the kept ones, and
        the others recomputed by ``recompute`` (into a scratch directory, gone once uploaded; at most
        MAX_RECOMPUTES times per job). Those it cannot open or upload are left out."""
        paths = {b: boundary_file(kept.trajectory, b) for b in challenge.boundaries()}
        missing = tuple(b for b, path in paths.items() if not _regular(path))
        key = (kept.owner.hex, kept.job.job_id)
        scratch = None
        try:
            if missing and recompute is not None and self._recomputed[key] < MAX_RECOMPUTES:
                self._recomputed[key] += 1
                self.root.mkdir(parents=True, exist_ok=True)
                scratch = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=".recompute-", dir=self.root))
                try:
                    await recompute(kept, missing, scratch)
                except Exception:  # the opening still goes out, without them: the check says what is missing
                    log.exception("boundaries %s of job %s could not be recomputed", list(missing), kept.job.job_id)
                paths.update({b: boundary_file(scratch, b) for b in missing})
            return tuple([state for b, path in paths.items() if _regular(path)
                          and (state := await self._uploaded(kept, b, path)) is not None])
        finally:
            if scratch is not None:
                await asyncio.to_thread(shutil.rmtree, scratch, True)

    async def _uploaded(self, kept: KeptJob, boundary: int, path: Path) -> BoundaryState | None:
        """One boundary in the store, or None: the opening still goes out without it, so its coordinator
        learns at once what is missing rather than wait out the opening's deadline."""
        try:
            return BoundaryState(boundary=boundary, cid=await self.pins.add(kept.owner, path))
        except AitbcError as exc:
            log.warning("boundary %d of job %s could not be uploaded: %s", boundary, kept.job.job_id, exc)
            return None

    def owners(self) -> set[TrainingOwner]:
        return {kept.owner for kept in self._jobs.values()}

    async def forget_training(self, owner: TrainingOwner) -> None:
        for key in [k for k in self._jobs if k[0] == owner.hex]:
            del self._jobs[key]
            self._recomputed.pop(key, None)
        await asyncio.to_thread(shutil.rmtree, self.root / owner.hex, True)

    async def _trim(self) -> None:
        while len(self._jobs) > 1 and (len(self._jobs) > self.max_jobs or self.bytes > self.max_bytes):
            held: dict[str, int] = {}
            for (owner_hex, _), kept in self._jobs.items():
                held[owner_hex] = held.get(owner_hex, 0) + kept.size
            heaviest = max(held, key=held.__getitem__)
            key = next(k for k in self._jobs if k[0] == heaviest)  # that training's oldest job
            gone = self._jobs.pop(key)
            self._recomputed.pop(key, None)
            await asyncio.to_thread(shutil.rmtree, gone.directory, True)


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _move_in(job_dir: Path, target: Path, checkpoint: Path) -> int:
    """Move the checkpoint and the trajectory directory into ``target``; their size on disk."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    if checkpoint.is_file() and not checkpoint.is_symlink():
        os.replace(checkpoint, target / CHECKPOINT_FILE)
    source = job_dir / TRAJECTORY_DIR
    if source.is_dir() and not source.is_symlink():
        shutil.move(str(source), str(target / TRAJECTORY_DIR))
    return sum(p.stat().st_size for p in target.rglob("*") if p.is_file() and not p.is_symlink())
