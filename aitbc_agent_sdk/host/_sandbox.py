"""Run a training command isolated from the host: its own filesystem view, no network, no capabilities.

Backends, best first (one adapter each, in :data:`._sandbox_runners.SANDBOX_RUNNERS`):

* **bwrap** (bubblewrap): a private root holding only /usr, a few /etc files, the Python
  environment (read-only), the work directory (read-write) and optional extra read-only
  paths; ``$HOME`` and the AITBC home are covered by empty read-only tmpfs; new pid, ipc,
  uts and (unless ``allow_network``) network namespaces; every capability dropped, so the
  process cannot ``umount`` what hides the keystore even when it runs as root.
* **unshare** + **setpriv** (util-linux), when bwrap is missing or cannot start: the host
  filesystem remounted read-only in a private mount namespace except the work directory, the
  same hidden paths, new pid/ipc/uts/net namespaces, then no capabilities and no new privileges.

Both scrub the environment (:func:`._sandbox_plan.scrubbed_env`) and set
rlimits before exec. :func:`verify_sandbox` checks from inside what is really in effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import resource
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..config import default_home
from ._errors import SandboxError
from ._sandbox_plan import NOBODY, Backend, SandboxLimits, SandboxSpec, scrubbed_env
from ._sandbox_runners import SANDBOX_RUNNERS, available_backends, choose_runner, gpu_devices, python_paths

__all__ = ["Backend", "SandboxLimits", "SandboxReport", "SandboxResult", "SandboxSpec", "available_backends",
           "build_command", "gpu_devices", "python_paths", "run_sandboxed", "start_sandboxed", "verify_sandbox"]

_RLIMITS = {"cpu_seconds": resource.RLIMIT_CPU, "address_space_bytes": resource.RLIMIT_AS,
            "open_files": resource.RLIMIT_NOFILE, "processes": resource.RLIMIT_NPROC,
            "file_size_bytes": resource.RLIMIT_FSIZE, "core_bytes": resource.RLIMIT_CORE,
            "data_bytes": resource.RLIMIT_DATA}


class SandboxReport(BaseModel):
    """Which isolation is in effect. ``verified`` is True only when observed from inside."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Backend
    verified: bool
    filesystem: str  # "private-root" (bwrap) or "host-read-only" (unshare)
    network_isolated: bool
    pid_isolated: bool
    capabilities_dropped: bool
    no_new_privs: bool
    hidden_paths: tuple[str, ...]
    writable_paths: tuple[str, ...]
    rlimits: dict[str, int]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SandboxResult:
    returncode: int
    stdout: bytes
    stderr: bytes
    report: SandboxReport


# --- host facts -------------------------------------------------------------------------------

def default_hidden_paths(spec: SandboxSpec) -> tuple[Path, ...]:
    """$HOME, the AITBC home (keystore, devnet password) and the spec's own, resolved."""
    paths = [Path.home(), default_home(), *spec.hidden_paths]
    return tuple(dict.fromkeys(p.expanduser().resolve() for p in paths))


def _resolved(spec: SandboxSpec) -> SandboxSpec:
    return spec.model_copy(update={"work_dir": spec.work_dir.resolve(),
                                   "read_only_paths": tuple(p.resolve() for p in spec.read_only_paths)})


def build_command(spec: SandboxSpec, backend: Backend) -> list[str]:
    """The full argv that runs ``spec.command`` in the sandbox (``spec.work_dir`` must exist)."""
    spec = _resolved(spec)
    return SANDBOX_RUNNERS[backend].argv(spec, default_hidden_paths(spec))


def sandbox_env(spec: SandboxSpec) -> dict[str, str]:
    return {**scrubbed_env(spec.work_dir.resolve(), spec.threads), **spec.env}


def _rlimit_values(limits: SandboxLimits) -> dict[str, int]:
    return {k: v for k, v in limits.model_dump().items() if v is not None}


def _lowered(values: dict[str, int]) -> list[tuple[int, int]]:
    """(resource, limit) pairs, never above the current hard limit (only root may raise that)."""
    pairs = []
    for name, value in values.items():
        hard = resource.getrlimit(_RLIMITS[name])[1]
        pairs.append((_RLIMITS[name], value if hard == resource.RLIM_INFINITY else min(value, hard)))
    return pairs


def _set_rlimits(pairs: list[tuple[int, int]]) -> None:
    # Runs in the child between fork and exec: computed beforehand, so this only makes syscalls.
    for which, value in pairs:
        resource.setrlimit(which, (value, value))


def describe(spec: SandboxSpec, backend: Backend) -> SandboxReport:
    """What the backend sets up for ``spec``, as designed (``verified=False``)."""
    runner = SANDBOX_RUNNERS[backend]
    notes = list(runner.notes)
    if os.geteuid() == 0 and not (spec.drop_root and runner.can_drop_root):
        notes.append("the process keeps real uid 0 without capabilities: files it can see are readable by owner bits")
    return SandboxReport(
        backend=backend, verified=False, filesystem=runner.filesystem,
        network_isolated=not spec.allow_network, pid_isolated=True, capabilities_dropped=True, no_new_privs=True,
        hidden_paths=tuple(str(p) for p in default_hidden_paths(spec)), writable_paths=(str(spec.work_dir.resolve()),),
        rlimits=_rlimit_values(spec.limits), notes=tuple(notes))


async def start_sandboxed(spec: SandboxSpec, *, backend: Backend | None = None, stdin: Any = None,
                          stdout: Any = asyncio.subprocess.PIPE,
                          stderr: Any = asyncio.subprocess.PIPE) -> tuple[asyncio.subprocess.Process, SandboxReport]:
    """Start ``spec.command`` in the sandbox; the caller owns (and must reap) the process.

    The process leads its own session, so ``os.killpg(proc.pid, SIGKILL)`` ends the whole sandbox.
    """
    runner = choose_runner(backend)
    spec.work_dir.mkdir(parents=True, exist_ok=True)
    if spec.drop_root and runner.can_drop_root and os.geteuid() == 0:
        os.chown(spec.work_dir, NOBODY, NOBODY)  # the one directory nobody may write
    argv = build_command(spec, runner.name)
    limits = _rlimit_values(spec.limits)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=spec.work_dir, env=sandbox_env(spec),
        start_new_session=True, preexec_fn=functools.partial(_set_rlimits, _lowered(limits)))
    return proc, describe(spec, runner.name)


async def run_sandboxed(spec: SandboxSpec, *, timeout: float, backend: Backend | None = None,
                        stdin: bytes | None = None) -> SandboxResult:
    """Run to completion and capture output; past ``timeout`` the sandbox is killed and SandboxError raised."""
    proc, report = await start_sandboxed(spec, backend=backend,
                                         stdin=asyncio.subprocess.PIPE if stdin is not None else None)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except (TimeoutError, asyncio.CancelledError) as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise SandboxError(f"sandboxed command ran past {timeout:.0f}s and was killed") from exc
    assert proc.returncode is not None
    return SandboxResult(returncode=proc.returncode, stdout=out, stderr=err, report=report)


# Runs inside the sandbox: reports what it can observe about its own confinement.
_PROBE = r"""
import json, os, sys
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
ifaces = [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]]
def writable(d):
    p = os.path.join(d, ".aitbc-sandbox-probe")
    try:
        open(p, "x").close()
    except OSError:
        return False
    os.unlink(p)
    return True
def visible(root, keep):
    # A readable, non-empty file anywhere under root, outside the kept subtrees (bounded walk).
    seen = 0
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if os.path.join(d, x) not in keep]
        for f in files:
            seen += 1
            try:
                with open(os.path.join(d, f), "rb") as fh:
                    if fh.read(1):
                        return True
            except OSError:
                pass
        if seen > 5000:
            return False
    return False
hidden, outside, keep = json.loads(sys.argv[1]), json.loads(sys.argv[2]), set(json.loads(sys.argv[3]))
print(json.dumps({"cap_eff": int(status["CapEff"], 16), "cap_prm": int(status["CapPrm"], 16),
                  "no_new_privs": status.get("NoNewPrivs", "0").strip() == "1", "ifaces": ifaces,
                  "pid": os.getpid(), "hidden_visible": [p for p in hidden if visible(p, keep)],
                  "outside_writable": [d for d in outside if writable(d)], "work_writable": writable(os.getcwd())}))
"""


async def verify_sandbox(spec: SandboxSpec, *, backend: Backend | None = None, timeout: float = 30) -> SandboxReport:
    """Run a probe under ``spec``'s isolation (its command is not run) and report what it observed."""
    spec = _resolved(spec)
    hidden = [str(p) for p in default_hidden_paths(spec)]
    outside = ["/", "/tmp", str(spec.work_dir.parent)]
    keep = [str(p) for p in (*python_paths(), spec.work_dir, *spec.read_only_paths)]
    probe = spec.model_copy(update={"command": (sys.executable, "-c", _PROBE, json.dumps(hidden),
                                                json.dumps(outside), json.dumps(keep)), "bind_python": True})
    result = await run_sandboxed(probe, timeout=timeout, backend=backend)
    if result.returncode != 0:
        raise SandboxError(f"sandbox probe failed ({result.returncode}): {result.stderr.decode(errors='replace')[-500:]}")
    seen = json.loads(result.stdout)
    notes = list(result.report.notes)
    notes += [f"{p} is visible" for p in seen["hidden_visible"]]
    notes += [f"{d} is writable" for d in seen["outside_writable"]]
    if not seen["work_writable"]:
        notes.append("the work directory is not writable")
    return result.report.model_copy(update={
        "verified": True, "network_isolated": seen["ifaces"] == ["lo"] or not seen["ifaces"],
        "pid_isolated": seen["pid"] <= 2, "capabilities_dropped": seen["cap_eff"] == 0 and seen["cap_prm"] == 0,
        "no_new_privs": seen["no_new_privs"],
        "hidden_paths": tuple(p for p in hidden if p not in seen["hidden_visible"]),
        "writable_paths": tuple([*seen["outside_writable"], *([str(spec.work_dir)] if seen["work_writable"] else [])]),
        "notes": tuple(notes)})
