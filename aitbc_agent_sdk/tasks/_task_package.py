"""Task code as a package: packed from the user's file or directory, unpacked and imported where it runs.

``pack_task`` reads ``FILE.py`` or a directory of ``.py`` files (with an optional
``aitbc-task.json`` naming the entry point and requirements) into a :class:`TaskPackage`, the
one document stored under the task's CID. ``load_task`` writes a package's files below a
directory of the caller's and imports the entry class; the provider does that only inside its
sandboxed training process. ``missing_requirements`` says what an environment lacks.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import re
import sys
from pathlib import Path
from types import ModuleType

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import ValidationError

from aitbc_agent_sdk.errors import ConfigError, TrainingError
from aitbc_agent_sdk.records import TaskManifest, TaskPackage
from aitbc_agent_sdk.tasks._task import TrainingTask
from aitbc_agent_sdk.tasks._task_checks import TaskOrigin, check_task_class, task_frame

MANIFEST_FILE = "aitbc-task.json"
MAX_SOURCE_FILES = 64


def pack_task(source: Path) -> TaskPackage:
    """The package of the task in ``source`` (a ``.py`` file or a directory); ConfigError when it is not one."""
    source = source.expanduser()
    if source.is_file() and source.suffix != ".py":
        raise ConfigError(f"{source}: not a .py file: a task is a .py file or a directory of them")
    if source.is_file():
        files = {source.name: _read(source)}
        root = source.parent
    elif source.is_dir():
        root = source
        paths = sorted(p for p in source.rglob("*.py") if "__pycache__" not in p.parts)
        if not paths:
            raise ConfigError(f"{source}: no .py files: a task directory holds the task's Python code")
        if len(paths) > MAX_SOURCE_FILES:
            raise ConfigError(f"{source}: {len(paths)} .py files, above {MAX_SOURCE_FILES}")
        files = {p.relative_to(source).as_posix(): _read(p) for p in paths}
    else:
        raise ConfigError(f"{source}: no such task file or directory")
    try:
        manifest = _manifest(root if source.is_dir() else None, files, TaskOrigin(root, shown=source))
    except TrainingError as exc:  # the user's code does not import: a usage error here, not a training failure
        raise ConfigError(f"{source}: {exc}") from exc
    try:
        return TaskPackage(manifest=manifest, files=files)
    except ValidationError as exc:
        raise ConfigError(f"{source}: not a task package: {exc.errors()[0]['msg']}") from exc


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the task's code: {exc}") from exc


def _manifest(directory: Path | None, files: dict[str, str], origin: TaskOrigin) -> TaskManifest:
    declared: dict[str, object] = {}
    if directory is not None and (directory / MANIFEST_FILE).is_file():
        try:
            declared = json.loads((directory / MANIFEST_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{directory / MANIFEST_FILE}: {exc}") from exc
        if not isinstance(declared, dict):
            raise ConfigError(f"{directory / MANIFEST_FILE}: expected a JSON object")
    root = origin.root
    entry = str(declared.get("entry") or _find_entry(files, root))
    task = _import_entry(root, entry)
    check_task_class(type(task), origin)  # a misspelt hook would train with the default: refuse it now
    requires = {**task.requires, **dict(declared.get("requires") or {})}  # type: ignore[call-overload]
    name = str(declared.get("name") or _task_name(task, entry))
    try:
        return TaskManifest(name=name, entry=entry, requires=requires)
    except ValidationError as exc:
        raise ConfigError(f"task manifest: {exc.errors()[0]['msg']}") from exc


def _find_entry(files: dict[str, str], root: Path) -> str:
    """``FILE.py:Class`` of the one TrainingTask subclass the files define."""
    found = []
    for name in files:
        module = _import_file(root, name)
        found += [f"{name}:{cls.__name__}" for cls in _tasks_defined_in(module)]
    if len(found) != 1:
        what = "no TrainingTask subclass" if not found else f"several TrainingTask subclasses ({', '.join(found)})"
        raise ConfigError(f"{root}: {what}; name the entry in {MANIFEST_FILE} as {{\"entry\": \"FILE.py:Class\"}}")
    return found[0]


def _tasks_defined_in(module: ModuleType) -> list[type[TrainingTask]]:
    return [obj for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, TrainingTask) and obj is not TrainingTask
            and obj.__module__ == module.__name__]


def _task_name(task: TrainingTask, entry: str) -> str:
    if task.name != TrainingTask.name:
        return task.name
    return re.sub(r"[^a-z0-9_-]", "-", Path(entry.split(":")[0]).stem.lower()).strip("-")[:64] or "task"


def _module_name(path: Path) -> str:
    return "aitbc_task_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]


def _import_file(root: Path, name: str) -> ModuleType:
    path = root / name
    module_name = _module_name(path)
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TrainingError(f"cannot import the task file {path}")
    module = importlib.util.module_from_spec(spec)
    # The task's own modules import each other by name (``import helper``): its root goes first on the path.
    if str(root) in sys.path:
        sys.path.remove(str(root))
    sys.path.insert(0, str(root))
    before = set(sys.modules)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        place = task_frame(exc, TaskOrigin(root))
        raise TrainingError(f"the task file {path.name} failed to import: {type(exc).__name__}: {exc}"
                            + (f" (at {place})" if place else "")) from exc
    finally:
        _forget_modules_under(root, set(sys.modules) - before - {module_name})
    return module


def _forget_modules_under(root: Path, names: set[str]) -> None:
    """Drop the task's helper modules from the import cache (its modules keep their references), so
    another task with a ``helper.py`` of its own imports that one, not this one."""
    inside = str(root.resolve()) + "/"
    for name in names:
        module = sys.modules.get(name)
        places = [getattr(module, "__file__", None), *(getattr(module, "__path__", None) or [])]
        if any(place and str(Path(place).resolve()).startswith(inside) for place in places):
            del sys.modules[name]


def _import_entry(root: Path, entry: str) -> TrainingTask:
    file_name, class_name = entry.split(":", 1)
    module = _import_file(root, file_name)
    cls = getattr(module, class_name, None)
    if not (inspect.isclass(cls) and issubclass(cls, TrainingTask)):
        raise TrainingError(f"the task's entry {entry} is not a TrainingTask subclass")
    try:
        return cls()
    except Exception as exc:
        raise TrainingError(f"the task {entry} cannot be created without arguments: {exc}") from exc


def load_task(package: TaskPackage, root: Path) -> TrainingTask:
    """Write ``package``'s files below ``root`` (a fresh directory per task CID) and import its entry."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in package.files.items():
        path = root / name  # names are validated identifiers: no '..', no absolute path, no link
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return _import_entry(root, package.manifest.entry)


def encode_package(package: TaskPackage) -> bytes:
    """The stored form: canonical JSON, so the same code always gets the same CID."""
    return json.dumps(package.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()


def decode_package(blob: bytes) -> TaskPackage:
    try:
        return TaskPackage.model_validate_json(blob)
    except ValidationError as exc:
        raise TrainingError(f"not a task package: {exc.errors()[0]['msg']}") from exc


def missing_requirements(requires: dict[str, str]) -> list[str]:
    """The requirements this Python environment does not satisfy, each with what it has instead."""
    missing = []
    for package, specifier in sorted(requires.items()):
        try:
            have = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{package}{specifier} (not installed)")
            continue
        try:
            if specifier and Version(have) not in SpecifierSet(specifier):
                missing.append(f"{package}{specifier} (have {have})")
        except (InvalidSpecifier, InvalidVersion):
            missing.append(f"{package}{specifier} (cannot compare with {have})")
    return missing
