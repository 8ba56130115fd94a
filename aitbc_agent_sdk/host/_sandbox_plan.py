"""What a sandbox is made of, as data: the spec, its environment, the mount plan, and each backend's argv.

Nothing here starts or changes anything; it only looks at which paths exist. So the exact
command lines are testable on their own. :mod:`._sandbox` gathers the host facts (paths to
hide, the interpreter, GPU devices) and runs them.

Mount order is by depth of the destination, parents first: a tmpfs over ``/root`` comes
before the read-only bind of ``/root/.pyenv`` that puts the interpreter back, and a read-only
bind of a data directory comes before the tmpfs that hides an AITBC home inside it. At equal
depth a hide comes after a bind, so hiding always wins over exposing the same path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..audit import SECRET_MARKERS
from ._errors import SandboxError

Backend = Literal["bwrap", "unshare"]

# Top-level system directories; on merged-/usr systems most are symlinks into /usr.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Only what programs need from /etc: not shadow, ssh keys or anything else root keeps there.
ETC_ENTRIES = ("passwd", "group", "hosts", "nsswitch.conf", "resolv.conf", "host.conf", "gai.conf", "localtime",
               "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates", "alternatives", "mime.types")
_SECRET_WORDS = {"KEY", "TOKEN", "PASSPHRASE", "CREDENTIALS"}
GPU_DEVICE_PATTERN = re.compile(r"^nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-caps)$")


def devices_for_gpu(devices: tuple[Path, ...], index: int | None) -> tuple[Path, ...]:
    """``devices`` with the numbered GPU nodes cut to ``/dev/nvidia<index>`` (None: all of them)."""
    if index is None:
        return devices
    return tuple(d for d in devices if not d.name[len("nvidia"):].isdigit() or d.name == f"nvidia{index}")
# Only these variables reach a sandboxed (or training) process; wallet passwords, keys and
# AITBC_* settings never do.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONHASHSEED", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
             "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


def scrubbed_env(work_dir: Path, threads: int, source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed variables of ``source`` (default: this process), with HOME and TMPDIR in ``work_dir``."""
    source = os.environ if source is None else source
    env = {k: v for k, v in source.items() if k in ENV_ALLOW}
    env.update(HOME=str(work_dir), TMPDIR=str(work_dir), AITBC_WORKER_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    return env


class SandboxLimits(BaseModel):
    """rlimits set before the sandbox starts; ``None`` leaves a limit as inherited.

    ``processes`` (RLIMIT_NPROC) counts every process of the real user across the machine,
    and the sandboxed process is still real uid 0 when the caller is root, so it is off by
    default: as root, set it above the number of root processes already running.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_seconds: int | None = Field(default=None, ge=1)
    address_space_bytes: int | None = Field(default=None, ge=1 << 20)
    open_files: int | None = Field(default=1024, ge=16)
    processes: int | None = Field(default=None, ge=1)
    file_size_bytes: int | None = Field(default=None, ge=0)
    core_bytes: int | None = Field(default=0, ge=0, description="0: no core dumps of the training process")
    data_bytes: int | None = Field(default=None, ge=1 << 20, description="RLIMIT_DATA: heap and private mappings; "
                                   "a memory cap that, unlike RLIMIT_AS, leaves CUDA's address reservations alone")


class SandboxSpec(BaseModel):
    """One command to run isolated. Paths are resolved (symlinks followed) before mounting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: tuple[str, ...] = Field(min_length=1)
    work_dir: Path = Field(description="bound read-write at the same path; cwd, HOME and TMPDIR of the process")
    env: dict[str, str] = Field(default_factory=dict, description="added to the scrubbed environment")
    threads: int = Field(default=1, ge=1)
    allow_network: bool = Field(default=False, description="share the host's network (torch.distributed across hosts)")
    read_only_paths: tuple[Path, ...] = Field(default=(), description="extra read-only binds: datasets, code")
    hidden_paths: tuple[Path, ...] = Field(default=(), description="hidden besides $HOME and the AITBC home")
    bind_python: bool = Field(default=True, description="bind this interpreter, its venv and the SDK read-only")
    gpus: bool = Field(default=False, description="pass /dev/nvidia* (and /sys read-only) through")
    gpu_index: int | None = Field(default=None, ge=0, description=(
        "with gpus: of the numbered /dev/nvidiaN nodes only this one (a provider's slot sees its own GPU)"))
    limits: SandboxLimits = SandboxLimits()
    drop_root: bool = Field(default=False, description=(
        "bwrap only: when started as root, run the command as nobody (65534), so files only root may read stay "
        "unreadable and RLIMIT_NPROC is enforced (the kernel never enforces it for uid 0); work_dir is chowned"))

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            folded = re.sub(r"[^a-z0-9]", "", key.lower())
            words = set(re.split(r"[^A-Za-z0-9]+", key.upper()))
            if key.upper().startswith("AITBC_") or any(m in folded for m in SECRET_MARKERS) or words & _SECRET_WORDS:
                raise ValueError(f"{key} looks like a secret or an AITBC setting; neither enters the sandbox")
        return env


@dataclass(frozen=True)
class Mount:
    kind: Literal["ro", "rw", "dev", "hide", "symlink"]
    dest: Path
    src: str = ""


def _depth(path: Path) -> int:
    return len(path.parts)


def mount_plan(spec: SandboxSpec, *, hidden: tuple[Path, ...], python_paths: tuple[Path, ...],
               gpu_devices: tuple[Path, ...] = (), root: Path = Path("/")) -> list[Mount]:
    """Every mount of a bwrap sandbox, in the order they must be made (see the module docstring)."""
    work = spec.work_dir
    if work in hidden:
        raise SandboxError(f"the working directory {work} is also a path to hide")
    system: list[Mount] = []
    for name in SYSTEM_DIRS:
        path = root / name
        if path.is_symlink():
            system.append(Mount("symlink", Path("/") / name, str(path.readlink())))
        elif path.is_dir():
            system.append(Mount("ro", Path("/") / name, str(path)))
    system += [Mount("ro", Path("/etc") / e, str(root / "etc" / e)) for e in ETC_ENTRIES if (root / "etc" / e).exists()]
    binds = [Mount("ro", p, str(p)) for p in (*python_paths, *spec.read_only_paths)]
    binds.append(Mount("rw", work, str(work)))
    if spec.gpus:
        binds += [Mount("dev", d, str(d)) for d in gpu_devices]
        if (root / "sys").is_dir():
            binds.append(Mount("ro", Path("/sys"), str(root / "sys")))
    hides = [Mount("hide", h) for h in hidden]
    ordered = sorted([*binds, *hides], key=lambda m: (_depth(m.dest), m.kind == "hide"))
    return [*system, *ordered]


NOBODY = 65534


def _parents_to_make(plan: list[Mount]) -> dict[Path, list[Path]]:
    """For each bind, the directories bwrap would create on the way to it with mode 0700.

    Those are the ones inside the sandbox's own root or inside a hiding tmpfs; a path under
    a host bind exists already. Made 0755 first, so a process that is not root can walk them.
    """
    made: set[Path] = set()
    need: dict[Path, list[Path]] = {}
    for m in plan:
        if m.kind in ("ro", "rw", "dev"):
            dirs = []
            for parent in reversed(m.dest.parents[:-1]):  # outermost first, "/" excluded
                enclosing = [o for o in plan if o is not m and parent.is_relative_to(o.dest) and o.dest != Path("/")]
                inner = max(enclosing, key=lambda o: _depth(o.dest), default=None)
                if parent in made or (inner is not None and (inner.dest == parent or inner.kind != "hide")):
                    continue
                made.add(parent)
                dirs.append(parent)
            need[m.dest] = dirs
        made.add(m.dest)
    return need


def bwrap_argv(spec: SandboxSpec, plan: list[Mount], *, bwrap: str = "bwrap", as_root: bool = False,
               setpriv: str = "/usr/bin/setpriv") -> list[str]:
    """bwrap's command line; ``as_root``: the caller is uid 0 (matters only with ``spec.drop_root``)."""
    drop = spec.drop_root and as_root
    # Only setuid/setgid survive, and only until setpriv (inside) becomes nobody: that clears them all.
    caps = ["--cap-drop", "ALL", *(["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if drop else [])]
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", *caps, "--proc", "/proc", "--dev", "/dev"]
    if not spec.allow_network:
        argv.append("--unshare-net")
    flag = {"ro": "--ro-bind", "rw": "--bind", "dev": "--dev-bind"}
    parents = _parents_to_make(plan)
    for m in plan:
        if m.kind == "symlink":
            argv += ["--symlink", m.src, str(m.dest)]
        elif m.kind == "hide":
            argv += ["--tmpfs", str(m.dest)]
        else:
            for d in parents.get(m.dest, ()):
                argv += ["--perms", "0755", "--dir", str(d)]
            argv += [flag[m.kind], m.src, str(m.dest)]
    # Read-only last, once everything is mounted: the sandbox root and every hiding tmpfs.
    argv += ["--remount-ro", "/"]
    for m in plan:
        if m.kind == "hide":
            argv += ["--remount-ro", str(m.dest)]
    command = list(spec.command)
    if drop:
        command = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--bounding-set=-all",
                   "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs", "--", *command]
    return [*argv, "--chdir", str(spec.work_dir), "--", *command]


def cover_paths(hidden: tuple[Path, ...], keep: tuple[Path, ...]) -> tuple[Path, ...]:
    """What the unshare backend mounts over so ``hidden`` is unreadable but ``keep`` still shows.

    A hidden directory with nothing to keep inside is covered whole; otherwise each of its
    entries is, except the ones leading to a kept path (recursively). Symlinks are left: a
    mount would land on their target. Hiding wins where a kept path equals a hidden one.
    """
    covers: list[Path] = []

    def cover(path: Path) -> None:
        inside = [k for k in keep if k != path and k.is_relative_to(path)]
        if not inside:
            if path.exists() and not path.is_symlink():
                covers.append(path)
            return
        for child in sorted(path.iterdir()):
            if any(k == child or k.is_relative_to(child) for k in inside) and child not in hidden:
                if child not in keep:
                    cover(child)
            elif not child.is_symlink():
                covers.append(child)

    for path in hidden:
        if path.is_dir() or path.is_file():
            cover(path)
    return tuple(dict.fromkeys(covers))


# The unshare fallback cannot build a private root. Inside its own mount namespace it binds
# the work directory onto itself, remounts every other mount read-only, covers each hidden
# path (an empty read-only tmpfs on a directory, /dev/null on a file), then drops every
# capability before exec. Hiding a directory that holds the interpreter (a pyenv under
# $HOME) is done by covering its other entries instead: see ``sandbox.cover_paths``.
_UNSHARE_SCRIPT = r"""
work=$1; n=$2; shift 2
mount --bind "$work" "$work" || exit 125
for m in $(awk '{print $5}' /proc/self/mountinfo); do
  case "$m" in /proc|/proc/*|/dev|/dev/*|/sys|/sys/*|"$work") continue;; esac
  mount -o remount,bind,ro "$m" 2>/dev/null || echo "aitbc-sandbox: $m stays writable" >&2
done
while [ "$n" -gt 0 ]; do
  if [ -d "$1" ]; then mount -t tmpfs -o ro,size=4k,mode=000 aitbc-hidden "$1" || exit 125
  else mount --bind /dev/null "$1" || exit 125; fi
  shift; n=$((n-1))
done
cd "$work" || exit 125
exec setpriv --no-new-privs --bounding-set=-all --inh-caps=-all --ambient-caps=-all -- "$@"
"""


def unshare_argv(spec: SandboxSpec, *, covers: tuple[Path, ...], map_root: bool = False,
                 unshare: str = "unshare") -> list[str]:
    argv = [unshare, "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts", "--propagation", "private"]
    if map_root:  # not root: a user namespace gives the mount rights (and the caps setpriv then drops)
        argv.append("--map-root-user")
    if not spec.allow_network:
        argv.append("--net")
    return [*argv, "--", "/bin/sh", "-c", _UNSHARE_SCRIPT, "aitbc-sandbox", str(spec.work_dir),
            str(len(covers)), *map(str, covers), *spec.command]
