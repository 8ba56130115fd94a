"""How the provider's training process is confined: one bubblewrap plan, shared with the cluster agent.

The training process parses shards and weights that strangers sent, so it runs in
:mod:`aitbc_agent_sdk.cluster.sandbox`'s bwrap sandbox and nothing weaker: no network, a
private root without ``$HOME``, the AITBC home (keystore, devnet password) or host sockets,
as ``nobody`` when the provider is root, with rlimits on memory, processes, file size and
CPU time and a wall-clock limit per job enforced from outside. Without a working bwrap the
provider refuses to start rather than train unconfined; ``--no-sandbox`` is the explicit
way out (``ProviderConfig.sandbox = None``).

Layout under the provider's work directory (``sandbox/p<n>/``, one per process, removed with it):

* ``in/``: read-only inside; the provider hard-links the current job's inputs here.
* ``out/``: the only writable directory, and HOME, TMPDIR and cwd of the process; the
  checkpoint comes back from here, opened without following links.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..errors import TrainingError

SANDBOX_DIR = "sandbox"
GiB = 1 << 30
# Jobs of one training a sandboxed process may serve before it is replaced; its CPU rlimit
# covers that many jobs at the wall-clock limit.
MAX_JOBS_PER_PROCESS = 16


class TrainingSandbox(BaseModel):
    """Limits of the sandboxed training process. ``None`` fields take the defaults below."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_bytes: int | None = Field(default=None, ge=256 << 20, description=(
        "RLIMIT_AS on CPU-only hosts, RLIMIT_DATA with GPUs (CUDA reserves far more address space than it "
        "uses); default: the host's physical memory"))
    processes: int = Field(default=256, ge=8, description="RLIMIT_NPROC: threads count too")
    file_size_bytes: int = Field(default=4 * GiB, ge=1 << 20, description="RLIMIT_FSIZE: largest file written")
    job_timeout_s: float = Field(default=3600.0, gt=0, description="wall clock per job, enforced by the parent")
    open_files: int = Field(default=1024, ge=64)
    hidden_paths: tuple[Path, ...] = Field(default=(), description="hidden besides $HOME and AITBC_HOME: the "
                                           "daemon's --home, where it is elsewhere")


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def sandbox_spec(policy: TrainingSandbox, box: Path, command: tuple[str, ...], *, threads: int) -> object:
    """The SandboxSpec of one training process; creates fresh ``box/in/`` and ``box/out/``."""
    from ..cluster.sandbox import SandboxLimits, SandboxSpec, gpu_devices

    shutil.rmtree(box, ignore_errors=True)  # nothing a previous process left behind survives
    (box / "in").mkdir(parents=True)
    (box / "out").mkdir()
    gpus = bool(gpu_devices())
    memory = policy.memory_bytes or physical_memory()
    # CPU seconds: the wall limit times the threads it may use for every job it may serve, plus
    # the time to import torch. The per-job wall limit, enforced from outside, is the tight one.
    cpu = int(policy.job_timeout_s * max(threads, 1)) * MAX_JOBS_PER_PROCESS + 120
    limits = SandboxLimits(cpu_seconds=cpu, open_files=policy.open_files, processes=policy.processes,
                           file_size_bytes=policy.file_size_bytes,
                           address_space_bytes=None if gpus else memory, data_bytes=memory if gpus else None)
    return SandboxSpec(command=command, work_dir=box / "out", read_only_paths=(box / "in",), threads=threads,
                       allow_network=False, gpus=gpus, limits=limits, drop_root=True,
                       hidden_paths=policy.hidden_paths)


def require_bwrap() -> None:
    """Raise unless bubblewrap can start a sandbox here (the unshare fallback is not enough for strangers)."""
    from ..cluster.errors import SandboxError
    from ..cluster.sandbox import available_backends

    if "bwrap" not in available_backends():
        raise SandboxError("bubblewrap (bwrap) does not work here, and the training process parses data from "
                           "strangers: install bubblewrap, or start the provider with --no-sandbox to run jobs "
                           "unconfined")


def stage_inputs(job_dir: Path, in_dir: Path, names: tuple[str, ...]) -> None:
    """Put the job's inputs in the read-only ``in/`` (hard links: no copy of a large shard)."""
    try:
        for old in in_dir.iterdir():
            old.unlink()
        os.chmod(in_dir, 0o755)
        for name in names:
            src, dst = job_dir / name, in_dir / name
            try:
                os.link(src, dst, follow_symlinks=False)
            except OSError:  # another filesystem: copy
                shutil.copyfile(src, dst, follow_symlinks=False)
            os.chmod(dst, 0o644)  # readable by nobody, writable by no one inside
    except OSError as exc:
        raise TrainingError(f"cannot stage the job's inputs: {exc}") from exc


def clear_output(out_dir: Path, name: str) -> None:
    """Remove a previous job's output (without following a link), so no stale checkpoint is taken."""
    try:
        (out_dir / name).unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise TrainingError(f"cannot clear the previous job's output: {exc}") from exc


def take_output(out_file: Path, dest: Path, *, max_bytes: int) -> None:
    """Copy what the sandbox wrote to ``dest``, refusing links and special files.

    The process inside could leave a symlink to the keystore under the checkpoint's name;
    following it would upload the key to IPFS. ``O_NOFOLLOW`` and a regular-file check stop that.
    """
    try:
        fd = os.open(out_file, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise TrainingError(f"the training process left no usable checkpoint: {exc}") from exc
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(src.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            raise TrainingError("the training process left something other than a checkpoint file")
        with open(dest, "wb") as out:
            shutil.copyfileobj(src, out)


def worker_command(entry: tuple[str, ...]) -> tuple[str, ...]:
    return (sys.executable, *entry)
