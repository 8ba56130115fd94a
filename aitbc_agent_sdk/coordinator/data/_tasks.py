"""The coordinator's tasks: user code packed into the store by CID, and loaded back to build and score models.

The coordinator runs its own customer's code (it packed it), so it imports the task in its
own process; providers import it only inside their sandbox.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from ...records import MAX_TASK_BYTES, TaskRef, TrainingSpec, id_path
from ...storage import ContentStore
from ...tasks._bound_task import BoundTask, bind_task, task_ref_of
from ...tasks._task import TrainingTask
from ...tasks._task_checks import TaskOrigin
from ...tasks._task_package import decode_package, encode_package, load_task, pack_task


LANGUAGE_MODEL = "gpt"  # what the seed's --model-type transformer trains on a text corpus


def spec_for_dataset(spec: TrainingSpec, kind: str) -> TrainingSpec:
    """The spec as the data decides it: ``transformer`` on a token corpus is a language model (the gpt
    task), not the sequence classifier it is on labelled arrays; any other spec is left as it is."""
    if spec.task is None and spec.model_type == "transformer" and kind == "tokens":
        return spec.model_copy(update={"task": TaskRef(name=LANGUAGE_MODEL)})
    return spec


class TaskCache:
    def __init__(self, store: ContentStore, root: Path | None) -> None:
        self._store = store
        self._root = root
        self._loaded: dict[str, TrainingTask] = {}
        self._sources: dict[str, Path] = {}  # task CID -> the user's file or directory: errors name it

    async def add(self, source: Path, params: dict | None = None) -> TaskRef:
        """Pack the task at ``source`` into the store; the returned reference goes into the spec."""
        package = await asyncio.to_thread(pack_task, source)
        cid = await self._store.add(encode_package(package))
        self._sources[cid] = source
        return TaskRef(name=package.manifest.name, cid=cid, params=params or {})

    async def bound(self, spec: TrainingSpec) -> BoundTask:
        """The spec's task with its parameters checked (a user task is fetched and imported once)."""
        ref = task_ref_of(spec)
        if ref.builtin:
            return bind_task(ref)
        assert ref.cid is not None
        root = id_path(self._dir(), ref.cid)
        if ref.cid not in self._loaded:
            blob = await self._store.cat(ref.cid, max_bytes=2 * MAX_TASK_BYTES)
            package = decode_package(blob)
            self._loaded[ref.cid] = await asyncio.to_thread(load_task, package, root)
        return bind_task(ref, self._loaded[ref.cid], TaskOrigin(root, shown=self._sources.get(ref.cid)))

    def _dir(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="aitbc-tasks-"))
        self._root.mkdir(parents=True, exist_ok=True)
        return self._root
