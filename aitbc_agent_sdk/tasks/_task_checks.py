"""Mistakes in a user's task, found before anything is funded, each named with its file and line.

A misspelt hook (``def los``) or class attribute (``metrics = ...``) would leave the default in
place and train silently, so a public name close to one of :class:`TrainingTask`'s is an error. An
exception raised while the task's code runs is reported at the innermost line of the task's own
files (the user's path on the coordinator, the package's file name on a provider).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aitbc_agent_sdk import limits
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.tasks._task import TrainingTask

# difflib's ratio: 'los'/'loss' 0.86, 'evalute'/'evaluate' 0.93, 'metrics'/'metric' 0.92; helpers such as
# 'batch' (0.83 to 'batches'), 'losses' (0.80), 'optimizer' (0.64) or 'build' (0.62) stay below it.
CLOSE_TO_HOOK = 0.85
SDK_PACKAGE = TrainingTask.__module__.split(".")[0]
REPORT_LABEL_MAX = 64  # TrainingReport's metric and loss_name
MAX_MESSAGE = limits.TEXT_MAX_LENGTH // 2  # of an exception's text in a reason; the rest is for its place


@dataclass(frozen=True)
class TaskOrigin:
    """Where a task's files were imported from (``root``) and the path the user knows them by
    (``shown``: the ``--task`` file or directory; None: the package's own file names)."""

    root: Path
    shown: Path | None = None

    def user_path(self, filename: str) -> str | None:
        """``filename`` (a frame's or a class's source file) as the user names it; None outside the task."""
        try:
            relative = Path(filename).resolve().relative_to(self.root.resolve())
        except (ValueError, OSError):
            return None
        if self.shown is None:
            return relative.as_posix()
        if self.shown.suffix == ".py":  # a one-file task: its neighbours are not part of it
            return str(self.shown) if relative.as_posix() == self.shown.name else None
        return str(self.shown / relative)


def _is_method(value: object) -> bool:
    return inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod, property))


def task_hooks(methods: bool | None = None) -> frozenset[str]:
    """The public names of TrainingTask, read from the class itself: its methods (``methods=True``), its
    class attributes (False, nested classes such as ``Params`` included), or both (None)."""
    return frozenset(name for name in dir(TrainingTask) if not name.startswith("_")
                     and (methods is None or _is_method(inspect.getattr_static(TrainingTask, name)) == methods))


def close_hook(name: str, hooks: frozenset[str]) -> str | None:
    """The hook ``name`` is a likely misspelling of (case aside), or None: an exact hook or a helper
    (a leading '_', or a hook's name with a suffix: ``loss_fn``, ``metric_name``)."""
    if name.startswith("_") or name in hooks or any(name.startswith(hook + "_") for hook in hooks):
        return None
    by_lower = {hook.lower(): hook for hook in hooks}
    match = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=CLOSE_TO_HOOK)
    return by_lower[match[0]] if match else None


def misspelt_hooks(cls: type) -> list[tuple[type, str, str]]:
    """(the class defining it, name, hook) for each public name of the user's classes close to a hook."""
    # A method is compared with the methods and an attribute with the attributes: a helper 'metric_fn()' is
    # no misspelt 'metric = ...'.
    hooks = {True: task_hooks(methods=True), False: task_hooks(methods=False)}
    everything = task_hooks()
    found = []
    for owner in cls.__mro__:
        if owner is object or owner.__module__.split(".")[0] == SDK_PACKAGE:
            continue  # the SDK's own classes (a built-in the user subclasses) are not the user's mistakes
        for name, value in vars(owner).items():
            if name in everything:
                continue
            hook = close_hook(name, hooks[_is_method(value)])
            if hook is not None:
                found.append((owner, name, hook))
    return found


def check_task_class(cls: type, origin: TaskOrigin | None = None) -> None:
    """ConfigError naming each misspelt hook or attribute of ``cls`` with its file and line."""
    problems = []
    for label in ("metric", "loss_name"):  # they label the report, which is written after payment
        value = getattr(cls, label, None)
        if not isinstance(value, str) or not 0 < len(value) <= REPORT_LABEL_MAX:
            problems.append(f"{source_place(_defining(cls, label), label, origin)}: {label} of {cls.__name__} "
                            f"must be a name of 1 to {REPORT_LABEL_MAX} characters, got {value!r:.80}")
    for owner, name, hook in misspelt_hooks(cls):
        what = "method" if callable(vars(owner)[name]) else "class attribute"
        problems.append(f"{source_place(owner, name, origin)}: {what} {name!r} of {owner.__name__} is not a "
                        f"TrainingTask hook; did you mean {hook!r}? (a helper's name starts with '_')")
    if problems:
        raise ConfigError("\n".join(problems))


def check_metric(task: TrainingTask, metrics: Mapping[str, object], origin: TaskOrigin | None = None) -> None:
    """ConfigError when the task's ``metric`` (or 'loss') is not among the keys its ``evaluate`` returned."""
    missing = [key for key in (task.metric, "loss") if key not in metrics]
    if not missing:
        return
    cls = type(task)
    blamed = "metric" if task.metric in missing and _defining(cls, "metric") is not TrainingTask else "evaluate"
    owner = _defining(cls, blamed)
    hints = []
    for key in missing:
        keys = [str(k) for k in metrics]
        close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6) or [k for k in keys if key in k or k in key]
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ConfigError(f"{source_place(owner, blamed, origin)}: {cls.__name__}.evaluate() returned the keys "
                      f"{sorted(str(k) for k in metrics)}, without {' and '.join(hints)}; evaluate must return "
                      f"'loss' and the task's metric = {task.metric!r}")


def _defining(cls: type, name: str) -> type:
    return next((c for c in cls.__mro__ if name in vars(c)), cls)


def source_place(owner: type, name: str, origin: TaskOrigin | None = None) -> str:
    """'FILE:LINE' of ``name``'s definition in ``owner``'s body (the class statement's line where it is not there)."""
    filename = _class_file(owner)
    if filename is None:
        return f"class {owner.__name__}"
    shown = (origin.user_path(filename) if origin else None) or filename
    return f"{shown}:{_line_in_class(filename, owner.__name__, name)}"


def _class_file(owner: type) -> str | None:
    """The file that defines ``owner``: its module's, or one of its functions' (a task's helper module is
    dropped from the import cache once the task is loaded, so its classes' modules may be gone)."""
    try:
        return inspect.getsourcefile(owner)
    except (OSError, TypeError):
        pass
    codes = [vars(owner)[n].__code__ for n in vars(owner) if inspect.isfunction(vars(owner)[n])]
    return codes[0].co_filename if codes else None


def _line_in_class(filename: str, class_name: str, name: str) -> int:
    """The line of ``name``'s definition (def, class or assignment) in class ``class_name`` of the file, or of
    the class statement itself (0 when the file cannot be read)."""
    try:
        tree = ast.parse(Path(filename).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return 0
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == class_name]
    for cls in classes:
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return node.lineno
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node.lineno
    return classes[0].lineno if classes else 0


def task_frame(exc: BaseException, origin: TaskOrigin) -> str | None:
    """'FILE:LINE in FUNCTION' of the innermost traceback frame inside the task's files, or None."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        shown = origin.user_path(frame.filename)
        if shown is not None:
            return f"{shown}:{frame.lineno} in {frame.name}"
    return None


def hook_running(exc: BaseException) -> str | None:
    """The TrainingTask default (a hook the task did not override) innermost on the traceback, or None."""
    defaults = inspect.getsourcefile(TrainingTask)
    hooks = task_hooks()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == defaults and frame.name in hooks:
            return frame.name
    return None


def describe_task_error(exc: BaseException, task: TrainingTask, origin: TaskOrigin | None) -> str:
    """``TYPE: message`` of an error raised while the task ran, and where: its line in the task's
    files, else the TrainingTask default that was running (with the task class's own line)."""
    message = str(exc)
    if len(message) > MAX_MESSAGE:  # cut here, so that the place survives the reason's limit on the wire
        message = message[:MAX_MESSAGE] + "..."
    text = f"{type(exc).__name__}: {message}"
    place = task_frame(exc, origin) if origin is not None else None
    if place is not None:
        return f"{text} (at {place})"
    if type(task).__module__.split(".")[0] == SDK_PACKAGE:
        return text  # a built-in: the SDK's own files mean nothing to the user
    hook = hook_running(exc)
    where = source_place(type(task), "", origin)
    return f"{text} (in TrainingTask's default {hook}() of the task class at {where})" if hook else (
        f"{text} (task class at {where})")
