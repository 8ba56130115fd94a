"""The boundary states of a provider's recent jobs, kept so it can open them when a spot check asks.

A job's training process writes one file per committed boundary (``trajectory/NNNNNN.safetensors``
in its job directory). They are moved here when the job ends and kept for the last few jobs; a
challenge from the job's coordinator uploads the ones around the segments it names.
"""

from __future__ import annotations

import asyncio
import shutil
from collections import OrderedDict
from pathlib import Path

from ..models import BoundaryState, JobAssignment, TrajectoryChallenge, id_path
from ..storage import ContentStore
from .jobs import DELIVERED_KEPT
from .process import TRAJECTORY_DIR


def boundary_file(directory: Path, boundary: int) -> Path:
    return directory / f"{boundary:06d}.safetensors"


class KeptTrajectories:
    def __init__(self, root: Path, store: ContentStore, kept: int = DELIVERED_KEPT) -> None:
        self.root = root
        self.store = store
        self.kept = kept
        self._jobs: OrderedDict[str, tuple[JobAssignment, Path]] = OrderedDict()

    async def keep(self, job: JobAssignment, job_dir: Path) -> None:
        """Move the job's boundary files out of its job directory (which goes) and forget the oldest."""
        source, target = job_dir / TRAJECTORY_DIR, id_path(self.root, job.job_id)
        await asyncio.to_thread(shutil.rmtree, target, True)
        if source.is_dir() and not source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(shutil.move, str(source), str(target))
        self._jobs[job.job_id] = (job, target)  # without a trajectory too: it answers "nothing to open"
        while len(self._jobs) > self.kept:
            _, (_, old) = self._jobs.popitem(last=False)
            await asyncio.to_thread(shutil.rmtree, old, True)

    def job(self, job_id: str) -> JobAssignment | None:
        found = self._jobs.get(job_id)
        return found[0] if found else None

    async def open(self, challenge: TrajectoryChallenge) -> tuple[BoundaryState, ...]:
        """Upload the boundaries around every segment asked for; those it does not have are left out."""
        _, directory = self._jobs[challenge.job_id]
        states = []
        for boundary in sorted({b for s in challenge.segments for b in (s, s + 1)}):
            path = boundary_file(directory, boundary)
            if path.is_file() and not path.is_symlink():
                states.append(BoundaryState(boundary=boundary, cid=await self.store.add(path)))
        return tuple(states)
