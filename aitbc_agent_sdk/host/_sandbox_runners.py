"""The programs that can start a sandbox, best first, each behind one small adapter.

* **bwrap** (bubblewrap) builds a private root (:func:`._sandbox_plan.bwrap_argv`).
* **unshare** + **setpriv** (util-linux) remount the host read-only in a private mount
  namespace (:func:`._sandbox_plan.unshare_argv`): the fallback where bwrap is missing or cannot start.

:data:`SANDBOX_RUNNERS` lists them in order of preference; :func:`available_backends` keeps
the ones that really start here, and :func:`choose_runner` picks one.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from ._errors import SandboxError
from ._sandbox_plan import (
    GPU_DEVICE_PATTERN, Backend, SandboxSpec, bwrap_argv, cover_paths, devices_for_gpu, mount_plan, unshare_argv,
)

# The SDK's source root (editable installs): this file is aitbc_agent_sdk/host/_sandbox_runners.py.
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def python_paths() -> tuple[Path, ...]:
    """This interpreter's prefixes (venv and base install) and the SDK's source root (editable installs)."""
    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent, _SOURCE_ROOT]
    resolved = [p.resolve() for p in paths if p.exists()]
    # Drop paths inside another one: a single bind already shows them.
    return tuple(p for p in dict.fromkeys(resolved) if not any(q != p and p.is_relative_to(q) for q in resolved))


def gpu_devices() -> tuple[Path, ...]:
    dev = Path("/dev")
    return tuple(sorted(p for p in dev.iterdir() if GPU_DEVICE_PATTERN.match(p.name))) if dev.is_dir() else ()


class SandboxRunner(Protocol):
    """One way of starting a sandbox: how to test that it works here, and the argv of a spec."""

    name: Backend
    filesystem: str  # what the process sees: "private-root" or "host-read-only"
    can_drop_root: bool  # honours ``SandboxSpec.drop_root``
    notes: tuple[str, ...]  # limits of this runner, reported with every sandbox it starts

    def probe_argv(self) -> list[str] | None:
        """A command that starts a minimal sandbox (exit 0 when it works); None when the tools are missing."""
        ...

    def argv(self, spec: SandboxSpec, hidden: tuple[Path, ...]) -> list[str]:
        """The full argv that runs ``spec.command`` (``spec`` resolved) with ``hidden`` unreadable."""
        ...


class BwrapRunner:
    name: Backend = "bwrap"
    filesystem = "private-root"
    can_drop_root = True
    notes: tuple[str, ...] = ()

    def probe_argv(self) -> list[str] | None:
        bwrap = shutil.which("bwrap")
        return [bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--cap-drop", "ALL",
                "--proc", "/proc", "--", "/bin/true"] if bwrap else None

    def argv(self, spec: SandboxSpec, hidden: tuple[Path, ...]) -> list[str]:
        plan = mount_plan(spec, hidden=hidden, python_paths=python_paths() if spec.bind_python else (),
                          gpu_devices=devices_for_gpu(gpu_devices(), spec.gpu_index) if spec.gpus else ())
        return bwrap_argv(spec, plan, bwrap=shutil.which("bwrap") or "bwrap", as_root=os.geteuid() == 0,
                          setpriv=shutil.which("setpriv") or "/usr/bin/setpriv")


class UnshareRunner:
    name: Backend = "unshare"
    filesystem = "host-read-only"
    can_drop_root = False
    notes = ("no private root: the host filesystem is visible read-only, apart from the hidden paths",)

    def probe_argv(self) -> list[str] | None:
        unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
        if not (unshare and setpriv):
            return None
        root_flag = [] if os.geteuid() == 0 else ["--map-root-user"]
        return [unshare, "--mount", "--pid", "--fork", "--mount-proc", "--net", *root_flag, "--",
                setpriv, "--no-new-privs", "--bounding-set=-all", "--", "/bin/true"]

    def argv(self, spec: SandboxSpec, hidden: tuple[Path, ...]) -> list[str]:
        keep = (*(python_paths() if spec.bind_python else ()), spec.work_dir, *spec.read_only_paths)
        if spec.work_dir in hidden:
            raise SandboxError(f"the working directory {spec.work_dir} is also a path to hide")
        return unshare_argv(spec, covers=cover_paths(hidden, keep), map_root=os.geteuid() != 0,
                            unshare=shutil.which("unshare") or "unshare")


# Best first: the order available_backends() keeps and choose_runner() picks from.
SANDBOX_RUNNERS: dict[Backend, SandboxRunner] = {"bwrap": BwrapRunner(), "unshare": UnshareRunner()}


def _probe_ok(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def available_backends() -> tuple[Backend, ...]:
    """The backends that can really start a sandbox here (each tried once per process)."""
    return tuple(name for name, runner in SANDBOX_RUNNERS.items()
                 if (argv := runner.probe_argv()) is not None and _probe_ok(argv))


def choose_runner(backend: Backend | None) -> SandboxRunner:
    """The runner asked for, or the best one that works here; SandboxError when it does not."""
    found = available_backends()
    if backend is None:
        if not found:
            raise SandboxError("no sandbox backend works here: install bubblewrap (apt-get install bubblewrap) "
                               "or util-linux's unshare and setpriv")
        return SANDBOX_RUNNERS[found[0]]
    if backend not in found:
        raise SandboxError(f"sandbox backend {backend!r} is not usable here (usable: {', '.join(found) or 'none'})")
    return SANDBOX_RUNNERS[backend]
