"""Training tasks on the wire: which task a job runs, the package its code travels in, what a provider runs.

A task package comes from the content store under a CID a stranger chose, so it is bounded
field by field: file names are relative ``.py`` paths that cannot leave the directory they are
written to, and sizes and counts are capped before anything is written.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from ._base import Cid, Record

MAX_TASK_FILES = 64
MAX_TASK_BYTES = 4 << 20  # source text of one task package: far above any training task's code
MAX_TASK_PARAMS = 64
MAX_REQUIREMENTS = 32
TASK_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
_FILE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*){0,7}\.py$")
_ENTRY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*){0,7}\.py:[A-Za-z_][A-Za-z0-9_]{0,127}$")
_PACKAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_SPECIFIER = re.compile(r"^[A-Za-z0-9<>=!~.,* +-]{0,100}$")


def _file_name(value: str) -> str:
    if not _FILE.fullmatch(value):
        raise ValueError(f"{value!r} is not a task file name: a relative path of identifiers ending in .py")
    return value


TaskFile = Annotated[str, AfterValidator(_file_name)]
ParamValue = str | int | float | bool | None | tuple[str | int | float | bool, ...]
TaskPolicyName = Literal["builtin", "allow-list", "any"]


class TaskRef(Record):
    """The task a training (and each of its jobs) runs: a built-in by name, or user code by CID."""

    name: str = Field(pattern=TASK_NAME_PATTERN, description="a built-in's name, or the package's own")
    cid: Cid | None = Field(default=None, description="the task package in the store; None: a built-in")
    params: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], ParamValue] = Field(
        default_factory=dict, max_length=MAX_TASK_PARAMS,
        description="the task's hyper-parameters, validated against its Params on both sides")

    @property
    def builtin(self) -> bool:
        return self.cid is None


class TaskManifest(Record):
    name: str = Field(pattern=TASK_NAME_PATTERN)
    entry: str = Field(description="FILE.py:ClassName, the TrainingTask subclass to run")
    requires: dict[Annotated[str, Field(pattern=_PACKAGE.pattern)], Annotated[str, Field(pattern=_SPECIFIER.pattern)]] = (
        Field(default_factory=dict, max_length=MAX_REQUIREMENTS,
              description="Python package -> PEP 440 specifier the provider's environment must satisfy"))

    @model_validator(mode="after")
    def _entry_form(self) -> TaskManifest:
        if not _ENTRY.fullmatch(self.entry):
            raise ValueError(f"entry {self.entry!r} is not FILE.py:ClassName")
        return self

    @property
    def entry_file(self) -> str:
        return self.entry.split(":", 1)[0]

    @property
    def entry_class(self) -> str:
        return self.entry.split(":", 1)[1]


class TaskPackage(Record):
    """A task's code as one document in the store: its manifest and its Python files' text."""

    format: Literal["aitbc-task/1"] = "aitbc-task/1"
    manifest: TaskManifest
    files: dict[TaskFile, str] = Field(min_length=1, max_length=MAX_TASK_FILES)

    @model_validator(mode="after")
    def _complete_and_bounded(self) -> TaskPackage:
        if self.manifest.entry_file not in self.files:
            raise ValueError(f"the entry file {self.manifest.entry_file!r} is not in the package")
        size = sum(len(text.encode()) for text in self.files.values())
        if size > MAX_TASK_BYTES:
            raise ValueError(f"the task's files hold {size} bytes, above {MAX_TASK_BYTES}")
        return self


class TaskPolicy(Record):
    """What a provider will run: built-ins only, built-ins and an allow-list of task CIDs, or any task."""

    accepts: TaskPolicyName = "builtin"
    allowed: tuple[Cid, ...] = Field(default=(), max_length=256, description="with accepts='allow-list'")

    def permits(self, task: TaskRef | None) -> bool:
        if task is None or task.builtin or self.accepts == "any":
            return True
        return self.accepts == "allow-list" and task.cid in self.allowed

    def refusal(self, task: TaskRef | None) -> str | None:
        """Why this policy refuses ``task``, or None."""
        if self.permits(task):
            return None
        assert task is not None
        return (f"this provider runs {'built-in tasks only' if self.accepts == 'builtin' else 'allow-listed tasks only'}"
                f"; task {task.name!r} ({task.cid}) is not among them")
