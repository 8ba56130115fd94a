"""``--task NAME|FILE.py|DIR``: a built-in by name, or the user's own code packed into the store by CID."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..errors import ConfigError
from ..records import TaskRef, TrainingSpec
from ..tasks._builtin_tasks import BUILTIN_TASKS
from ..tasks._task_package import pack_task

if TYPE_CHECKING:
    from .._agent import Agent


@dataclass(frozen=True)
class TaskChoice:
    """What the user asked for: ``--task`` (None: ``--model-type``'s built-in) and its parameters."""

    source: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


def check_task_source(task: str | None) -> None:
    """A clear usage error now (before anything starts) for a task that is neither a built-in nor a path,
    or whose code does not import or misspells a hook (packing it imports and checks it)."""
    if task is None or task in BUILTIN_TASKS:
        return
    pack_task(_task_path(task))


def _task_path(task: str) -> Path:
    path = Path(task).expanduser()
    if not (path.is_dir() or (path.is_file() and path.suffix == ".py")):
        raise ConfigError(f"--task {task!r} is neither a built-in task ({', '.join(BUILTIN_TASKS)}) nor a .py file "
                          f"or directory of the task's code")
    return path


def parse_task_params(pairs: list[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a value that reads as JSON (2, 0.5, true, "x") is that, otherwise a string."""
    params: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--task-param {pair!r} is not KEY=VALUE")
        try:
            params[key] = json.loads(raw)
        except ValueError:
            params[key] = raw
    return params


async def attach_task(agent: Agent, spec: TrainingSpec, task: str | None, params: dict[str, Any]) -> TrainingSpec:
    """``spec`` naming ``task`` (a user task is packed into the agent's store); its parameters are checked."""
    if task is None and not params:
        return spec
    name = task or spec.model_type
    try:
        if name in BUILTIN_TASKS:
            ref = TaskRef(name=name, params=params)
        else:
            ref = await agent.coordinator.tasks.add(_task_path(name), params)  # packing checks the code
    except ValidationError as exc:
        raise ConfigError(f"task {name!r}: {exc.errors()[0]['msg']}") from exc
    updated = spec.model_copy(update={"model_type": ref.name, "task": ref})
    await agent.coordinator.tasks.bound(updated)  # bad parameters: a usage error before anything is paid
    return updated
