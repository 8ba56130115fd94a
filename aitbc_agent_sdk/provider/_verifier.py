"""Verification work: re-execute one segment of another worker's committed trajectory, for that training's
coordinator, and say what state it ended in.

Only a coordinator this provider holds a contract with may ask, for the training of that contract, with a
job addressed to this provider (its own contract, the dataset's key wrapped for it). The start state is
fetched no further than the size the request declares, which the job's own bound caps; the training
process (sandboxed, serving only this training) replays the segment and compares nothing. The end state
is uploaded and its CID signed as a result would be: should the report prove a lie, that signature is the
slashing evidence. One verification runs at a time; more than a few waiting are dropped.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import TrainingError
from ..records import VerifyRequest
from ..proof._trajectory import boundary_hashes, boundary_name
from ..storage import ContentStore
from ._inputs import JobInputs
from ._owners import TrainingOwner
from ._process import TRAJECTORY_DIR, TrainingProcess

__all__ = ["MAX_WAITING_VERIFICATIONS", "Reexecuted", "reexecute_for", "remove_dir", "start_state_limit"]

MAX_WAITING_VERIFICATIONS = 4  # verifications queued behind the one running; more are dropped
BOUNDARY_SLACK = 1 << 20  # a boundary file's header and the optimizer's scalars
SHA256 = re.compile(r"[0-9a-f]{64}")


def start_state_limit(weights_bytes: int) -> int:
    """The most a boundary state of a model of ``weights_bytes`` may take: the model and up to three times it
    in optimizer moments, plus the header."""
    return 4 * weights_bytes + BOUNDARY_SLACK


@dataclass(frozen=True)
class Reexecuted:
    """The end state's file (under the verification's directory) and hashes, or why there is none."""

    end: Path | None = None
    state_hash: str | None = None
    model_hash: str | None = None
    problem: str | None = None
    trace: tuple[str, ...] = ()  # a dispute's: the state hashes after the request's points


async def reexecute_for(process: TrainingProcess, inputs: JobInputs, store: ContentStore, owner: TrainingOwner,
                        request: VerifyRequest, job_dir: Path) -> Reexecuted:
    """Fetch the job's inputs and the start state into ``job_dir``, and have ``process`` replay the segment.
    The caller removes ``job_dir`` (the end state is in it) and releases the inputs."""
    job, segment = request.job, request.segment
    if request.start_bytes > start_state_limit(job.weights_bytes):
        return Reexecuted(problem=f"the start state's declared {request.start_bytes} bytes exceed the job's bound")
    await inputs.fetch(owner, job, job_dir)
    start = await store.cat(request.start_cid, max_bytes=request.start_bytes)
    if len(start) != request.start_bytes:
        return Reexecuted(problem=f"the start state holds {len(start)} bytes, not the {request.start_bytes} declared")
    await asyncio.to_thread((job_dir / boundary_name(segment)).write_bytes, start)
    del start
    done = await process.reexecute(job_dir, job_id=job.job_id, model=job.model, config=job.config, seed=job.seed,
                                   commitment=request.commitment, segment=segment, owner=owner.hex, task=job.task,
                                   points=request.points, stop=request.stop)
    if done.get("problem") is not None:
        return Reexecuted(problem=str(done["problem"])[:256])
    end = job_dir / TRAJECTORY_DIR / boundary_name(segment + 1)
    if not end.is_file():
        raise TrainingError("the training process left no end state")
    # Hashed here, not taken from the process's word: it runs the customer's code, and this report is signed.
    model_hash, state_hash = await asyncio.to_thread(lambda: boundary_hashes(end.read_bytes()))
    trace = tuple(str(h) for h in done.get("trace") or ())
    if len(trace) != len(request.points) or not all(SHA256.fullmatch(h) for h in trace):
        return Reexecuted(problem=f"the training process traced {len(trace)} of {len(request.points)} steps")
    return Reexecuted(end=end, state_hash=state_hash, model_hash=model_hash, trace=trace)


def remove_dir(job_dir: Path) -> None:
    shutil.rmtree(job_dir, ignore_errors=True)
