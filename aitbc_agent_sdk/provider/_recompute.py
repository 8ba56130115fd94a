"""A spot check's boundary states that a job did not keep, recomputed in the provider's training process.

A job keeps only :func:`~aitbc_agent_sdk.proof._trajectory.kept_boundaries` of its trajectory. To
open another, the provider puts the job's inputs in a directory again (through the cache: as a rule
nothing to download), links the kept states the recomputation starts from beside them, and has a
training process (sandboxed as for training, and serving only this training) train those segments
again. Every state that comes back must hash as the job's own commitment says before it is opened.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from ..errors import TrainingError
from ..records import TrajectoryCommitment
from ..proof._trajectory import (
    boundary_hashes, boundary_name, kept_boundaries, read_commitment_file, recompute_plan,
)
from ._inputs import JobInputs
from ._kept import KeptJob
from ._process import TRAJECTORY_DIR, TrainingProcess

__all__ = ["recompute_kept_job"]


async def recompute_kept_job(process: TrainingProcess, inputs: JobInputs, kept: KeptJob,
                             boundaries: Iterable[int], into: Path) -> None:
    """The states of ``boundaries`` (those of the trajectory the job did not keep) into ``into``, recomputed
    by ``process`` from the kept ones; a TrainingError when one does not hash as committed."""
    commitment = await asyncio.to_thread(read_commitment_file, kept.outcome.checkpoint)
    if commitment is None:
        raise TrainingError(f"the checkpoint of job {kept.job.job_id} commits to no trajectory")
    n_boundaries = len(commitment.state_hashes)
    held = set(kept_boundaries(n_boundaries))
    wanted = tuple(sorted({b for b in boundaries if 0 <= b < n_boundaries} - held))
    if not wanted:
        return
    job, owner = kept.job, kept.owner
    job_dir = into / "job"
    try:
        await inputs.fetch(owner, job, job_dir)
        await asyncio.to_thread(_link_starts, kept.trajectory, job_dir, recompute_plan(n_boundaries, wanted))
        await process.recompute(job_dir, job_id=job.job_id, model=job.model, config=job.config, seed=job.seed,
                                commitment=commitment, wanted=wanted, owner=owner.hex, task=job.task)
        await asyncio.to_thread(_take_checked, job_dir / TRAJECTORY_DIR, into, commitment, wanted)
    finally:
        await asyncio.to_thread(shutil.rmtree, job_dir, True)
        inputs.release(owner, job)


def _link_starts(trajectory: Path, job_dir: Path, starts: Iterable[int]) -> None:
    """Blocking: the kept states the recomputation starts from, beside the job's inputs."""
    for start in starts:
        source, target = trajectory / boundary_name(start), job_dir / boundary_name(start)
        try:
            os.link(source, target, follow_symlinks=False)
        except OSError:  # another file system
            shutil.copyfile(source, target, follow_symlinks=False)


def _take_checked(recomputed: Path, into: Path, commitment: TrajectoryCommitment, wanted: Iterable[int]) -> None:
    """Blocking: each recomputed state into ``into`` once it hashes as committed (the process checked it
    too, but it runs the customer's code)."""
    for boundary in wanted:
        path = recomputed / boundary_name(boundary)
        if boundary_hashes(path.read_bytes())[1] != commitment.state_hashes[boundary]:
            raise TrainingError(f"recomputed boundary {boundary} does not hash as committed: not opened")
        os.replace(path, into / boundary_name(boundary))
