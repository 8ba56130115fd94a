"""How the provider's training process is confined: one bubblewrap plan, shared with the cluster agent.

The training process parses shards and weights that strangers sent, so it runs in
:mod:`aitbc_agent_sdk.host._sandbox`'s bwrap sandbox and nothing weaker: no network, a
private root without ``$HOME``, the AITBC home (keystore, devnet password) or host sockets,
as ``nobody`` when the provider is root, with rlimits on memory, processes, file size and
CPU time, and a wall-clock limit and a disk quota per job enforced from outside. Without a working bwrap the
provider refuses to start rather than train unconfined; ``--no-sandbox`` is the explicit
way out (``ProviderConfig.sandbox = None``).

Layout under the provider's work directory (``sandbox/p<n>/``, one per process, removed with it):

* ``in/``: read-only inside; the provider hard-links the current job's inputs here.
* ``out/``: the only writable directory, and HOME, TMPDIR and cwd of the process; the
  checkpoint comes back from here, opened without following links.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import sys
from collections.abc import Awaitable, Collection
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ..errors import TrainingError
from ..records import MAX_SEGMENTS

SANDBOX_DIR = "sandbox"
GiB = 1 << 30
# Jobs of one training a sandboxed process may serve before it is replaced; its CPU rlimit
# covers that many jobs at the wall-clock limit.
MAX_JOBS_PER_PROCESS = 16
T = TypeVar("T")
DISK_CHECK_S = 0.5  # how often a running job's disk use is measured
ENTRY_BYTES = 4096  # what one file or directory counts at least: no filling the disk with empty inodes


class TrainingSandbox(BaseModel):
    """Limits of the sandboxed training process. ``None`` fields take the defaults below."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_bytes: int | None = Field(default=None, ge=256 << 20, description=(
        "RLIMIT_AS on CPU-only hosts, RLIMIT_DATA with GPUs (CUDA reserves far more address space than it "
        "uses); default: the host's physical memory"))
    processes: int = Field(default=256, ge=8, description="RLIMIT_NPROC: threads count too")
    file_size_bytes: int = Field(default=4 * GiB, ge=1 << 20, description="RLIMIT_FSIZE: largest file written")
    disk_bytes: int = Field(default=16 * GiB, ge=1 << 20, description=(
        "what the process may keep in its writable directory, all files together (RLIMIT_FSIZE caps one); "
        f"checked every {DISK_CHECK_S}s, past it the job is killed"))
    disk_reserve_bytes: int = Field(default=GiB, ge=0, description=(
        "free space a job must leave on the work directory's filesystem (this also catches space held by "
        "files it deleted but keeps open)"))
    job_timeout_s: float = Field(default=3600.0, gt=0, description="wall clock per job, enforced by the parent")
    open_files: int = Field(default=1024, ge=64)
    hidden_paths: tuple[Path, ...] = Field(default=(), description="hidden besides $HOME and AITBC_HOME: the "
                                           "daemon's --home, where it is elsewhere")


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gpu_env(gpu: int | None) -> dict[str, str]:
    """The variables that show a training process its one GPU (NVML's order), or none at all."""
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "" if gpu is None else str(gpu)}


def sandbox_spec(policy: TrainingSandbox, box: Path, command: tuple[str, ...], *, threads: int,
                 gpu: int | None = None) -> object:
    """The SandboxSpec of one training process; creates fresh ``box/in/`` and ``box/out/``. ``gpu``:
    the one GPU whose device node is passed through (None: no GPU device at all)."""
    from ..host._sandbox import SandboxLimits, SandboxSpec, gpu_devices

    shutil.rmtree(box, ignore_errors=True)  # nothing a previous process left behind survives
    (box / "in").mkdir(parents=True)
    (box / "out").mkdir()
    gpus = gpu is not None and bool(gpu_devices())
    memory = policy.memory_bytes or physical_memory()
    # CPU seconds: the wall limit times the threads it may use for every job it may serve, plus
    # the time to import torch. The per-job wall limit, enforced from outside, is the tight one.
    cpu = int(policy.job_timeout_s * max(threads, 1)) * MAX_JOBS_PER_PROCESS + 120
    limits = SandboxLimits(cpu_seconds=cpu, open_files=policy.open_files, processes=policy.processes,
                           file_size_bytes=policy.file_size_bytes,
                           address_space_bytes=None if gpus else memory, data_bytes=memory if gpus else None)
    return SandboxSpec(command=command, work_dir=box / "out", read_only_paths=(box / "in",), threads=threads,
                       allow_network=False, gpus=gpus, gpu_index=gpu if gpus else None, env=gpu_env(gpu),
                       limits=limits, drop_root=True, hidden_paths=policy.hidden_paths)


def require_bwrap() -> None:
    """Raise unless bubblewrap can start a sandbox here (the unshare fallback is not enough for strangers)."""
    from ..host._errors import SandboxError
    from ..host._sandbox import available_backends

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
        fd = os.open(out_file, _READ_NO_LINKS)
    except OSError as exc:
        raise TrainingError(f"the training process left no usable checkpoint: {exc}") from exc
    _copy_regular(fd, dest, max_bytes)


_READ_NO_LINKS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0)


def _copy_regular(fd: int, dest: Path, max_bytes: int) -> int:
    """Copy the open ``fd`` (closed here) to ``dest`` when it is a regular file of at most ``max_bytes``."""
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(src.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            raise TrainingError("the training process left something other than a checkpoint file")
        with open(dest, "wb") as out:
            shutil.copyfileobj(src, out)
        return info.st_size


def clear_output_dir(out_dir: Path, name: str) -> None:
    """Remove a previous job's output directory (a link or file of that name too, never followed)."""
    path = out_dir / name
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise TrainingError(f"cannot clear the previous job's output: {exc}") from exc


def take_trajectory(out_dir: Path, dest: Path, *, boundaries: Collection[int], max_bytes: int,
                    max_total_bytes: int) -> None:
    """Move the state files of a committed trajectory's ``boundaries`` (``000000.safetensors``, ...) from the
    sandbox's directory ``out_dir`` to a fresh ``dest``: regular files only, neither the directory nor a
    file followed through a link, nothing else in it, each within ``max_bytes`` and all within
    ``max_total_bytes``.

    Each file is copied (the process inside may still hold it open) and its source removed at once, so the
    disk holds one trajectory and one file more, not two trajectories: a GPT-2 job's are gigabytes."""
    clear_output_dir(dest.parent, dest.name)
    try:
        dir_fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise TrainingError(f"the training process left no usable trajectory: {exc}") from exc
    try:
        names = sorted(os.listdir(dir_fd))
        expected = sorted(f"{i:06d}.safetensors" for i in set(boundaries) if 0 <= i <= MAX_SEGMENTS)
        if not expected or names != expected:
            raise TrainingError(f"the training process left {len(names)} trajectory entries, not its "
                                f"{len(expected)} boundary files")
        dest.mkdir()
        total = 0
        for name in names:
            fd = os.open(name, _READ_NO_LINKS, dir_fd=dir_fd)
            total += _copy_regular(fd, dest / name, min(max_bytes, max_total_bytes - total))
            os.unlink(name, dir_fd=dir_fd)
    except OSError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise TrainingError(f"cannot take the trajectory out of the sandbox: {exc}") from exc
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    finally:
        os.close(dir_fd)


def disk_usage(root: Path, limit: int) -> int:
    """Bytes allocated below ``root`` (at least ENTRY_BYTES per entry), links not followed; counting
    stops once past ``limit``, and a tree the provider cannot read counts as past it."""
    total, pending = 0, [root]
    while pending and total <= limit:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed meanwhile
                    total += max(info.st_blocks * 512, ENTRY_BYTES)
                    if stat.S_ISDIR(info.st_mode):
                        pending.append(Path(entry.path))
        except FileNotFoundError:
            continue
        except OSError:  # unreadable, or nested past PATH_MAX: nothing an honest job does
            return limit + 1
    return total


def disk_problem(policy: TrainingSandbox, out_dir: Path) -> str | None:
    """Why the job writing to ``out_dir`` must stop now (too much kept there, too little left free), or None."""
    if disk_usage(out_dir, policy.disk_bytes) > policy.disk_bytes:
        return f"wrote more than {policy.disk_bytes} bytes to its job directory"
    if shutil.disk_usage(out_dir).free < policy.disk_reserve_bytes:
        return f"left less than {policy.disk_reserve_bytes} bytes free on the provider's disk"
    return None


async def within_disk_limits(job: Awaitable[T], policy: TrainingSandbox, out_dir: Path, job_id: str) -> T:
    """``job``'s result; TrainingError (``job`` cancelled, the caller kills the process) as soon as a
    check every DISK_CHECK_S finds a :func:`disk_problem`. RLIMIT_FSIZE caps one file, not many."""
    work = asyncio.ensure_future(job)
    try:
        while True:
            finished, _ = await asyncio.wait({work}, timeout=DISK_CHECK_S)
            # Checked once more when it is done: what jobs of one training leave adds up.
            if (problem := await asyncio.to_thread(disk_problem, policy, out_dir)) is not None:
                raise TrainingError(f"job {job_id} {problem} and was killed")
            if finished:
                return work.result()
    finally:
        if not work.done():
            work.cancel()
            await asyncio.wait({work})


def worker_command(entry: tuple[str, ...]) -> tuple[str, ...]:
    return (sys.executable, *entry)
