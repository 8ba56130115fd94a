"""Which tasks a provider runs, fetching a task's code by CID, and the state a task keeps between rounds.

The policy is checked twice: when a contract is proposed (with the package fetched once, so a
task this environment cannot run is refused with the packages it lacks, not failed mid-round)
and again for every job, whose task must be the contract's. A ``keep_state`` task's state is kept
per training (its on-chain identity, so another coordinator's training of the same id string
never reaches it) and contract (a replacement worker has another contract: it starts fresh), and
dropped once the chain shows that training closed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import OrderedDict
from pathlib import Path

from ..errors import AitbcError
from ..records import MAX_TASK_BYTES, JobAssignment, TaskPackage, TaskPolicy, TaskRef, id_path
from ..storage import ContentStore, fetch_timeout_s
from ..tasks._task_package import decode_package, missing_requirements
from ._jobs import write_file
from ._owners import TrainingOwner
from ._process import KEPT_FILES, TASK_FILE

PACKAGES_KEPT = 16  # fetched task packages kept in memory, by CID


class ProviderTasks:
    def __init__(self, policy: TaskPolicy, store: ContentStore, states: Path) -> None:
        """``states``: where kept task states live, by training (its on-chain identity) and contract
        (emptied now: no contract survives a restart)."""
        self.policy = policy
        self._store = store
        self._packages: OrderedDict[str, bytes] = OrderedDict()
        self._states = states
        shutil.rmtree(states, ignore_errors=True)
        self._kept: set[TrainingOwner] = set()  # trainings with kept state

    async def refusal(self, task: TaskRef | None) -> str | None:
        """Why this provider will not run ``task`` (its policy, an unreadable package, missing packages)."""
        if (problem := self.policy.refusal(task)) is not None or task is None or task.cid is None:
            return problem
        try:
            package = decode_package(await self._fetch(task.cid))
        except AitbcError as exc:
            return f"task {task.name!r} ({task.cid}) cannot be read: {exc}"
        return requirement_refusal(task, package)

    async def prepare(self, owner: TrainingOwner, job: JobAssignment, job_dir: Path) -> None:
        """Put a user task's package, and the state its worker kept from the last round, into the job directory."""
        if job.task is not None and job.task.cid is not None:
            blob = await self._fetch(job.task.cid)
            await asyncio.to_thread(write_file, job_dir / TASK_FILE, blob)
        for name in KEPT_FILES:
            kept = self._state_path(owner, job, name)
            if kept.is_file():
                await asyncio.to_thread(shutil.copyfile, kept, job_dir / name)

    async def keep(self, owner: TrainingOwner, job: JobAssignment, job_dir: Path) -> None:
        """Keep the state the job left (a keep_state task's optimizer, an encoding's error feedback) for this
        worker's next round."""
        for name in KEPT_FILES:
            produced = job_dir / name
            if not produced.is_file() or produced.is_symlink():
                continue
            target = self._state_path(owner, job, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(os.replace, produced, target)
            self._kept.add(owner)

    def owners(self) -> set[TrainingOwner]:
        return set(self._kept)

    async def forget_training(self, owner: TrainingOwner) -> None:
        """Drop a training's kept state (the chain shows it closed)."""
        self._kept.discard(owner)
        await asyncio.to_thread(shutil.rmtree, self._states / owner.hex, True)

    def _state_path(self, owner: TrainingOwner, job: JobAssignment, name: str) -> Path:
        return id_path(id_path(self._states, owner.hex), job.contract_id) / name

    async def _fetch(self, cid: str) -> bytes:
        if cid not in self._packages:
            limit = 2 * MAX_TASK_BYTES  # JSON escapes: the files' text at most doubles
            self._packages[cid] = await self._store.cat(cid, max_bytes=limit, timeout_s=fetch_timeout_s(limit))
            while len(self._packages) > PACKAGES_KEPT:
                self._packages.popitem(last=False)
        self._packages.move_to_end(cid)
        return self._packages[cid]


def requirement_refusal(task: TaskRef, package: TaskPackage) -> str | None:
    missing = missing_requirements(dict(package.manifest.requires))
    if not missing:
        return None
    return f"task {task.name!r} needs {', '.join(missing)}, which this provider's environment lacks"
