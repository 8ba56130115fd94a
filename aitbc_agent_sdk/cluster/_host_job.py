"""One torchrun job on a host: its record, and starting its process in the sandbox or in a pid
namespace of its own, so that the whole process tree goes when torchrun does."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from ..host._sandbox_plan import scrubbed_env
from ._protocol import TorchrunSpec

log = logging.getLogger(__name__)


class HostJob:
    """The job this host runs: its process, output counters and the tasks that serve it."""

    def __init__(self, spec: TorchrunSpec, proc: asyncio.subprocess.Process, work_dir: Path,
                 command: list[str]) -> None:
        self.spec = spec
        self.proc = proc
        self.work_dir = work_dir
        self.command = command
        self.started = time.time()
        self.seq = 0
        self.last_beat = time.monotonic()
        self.stop_reason: str | None = None
        self.ranks: dict[str, dict[str, Any]] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        self.done = asyncio.Event()

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the agent dies, so a killed agent takes its job along."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@functools.cache
def pid_namespace_prefix() -> tuple[str, ...]:
    """``unshare`` arguments that give a command its own pid namespace, dying with it; () if impossible."""
    unshare = shutil.which("unshare")
    if not unshare:
        return ()
    for extra in ((), ("--user", "--map-root-user")):
        argv = (unshare, "--pid", "--fork", "--kill-child", *extra)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if subprocess.run([*argv, "/bin/true"], capture_output=True, timeout=10).returncode == 0:
                return argv
    return ()



async def start_sandboxed(spec: TorchrunSpec, argv: list[str], env: dict[str, str], work_dir: Path, *,
                          gpus: bool) -> tuple[asyncio.subprocess.Process, list[str]]:
    from ..host._sandbox import SandboxLimits, SandboxSpec
    from ..host._sandbox import start_sandboxed as start

    read_only = [Path(spec.script).parent, *(Path(p) for p in spec.datasets if Path(p).exists())]
    # The rendezvous and gloo/NCCL use ports picked at run time on every host, and bwrap cannot
    # filter by address: the network is shared (README, "What a sandboxed rank can still reach").
    # The private root still hides the host's path-based UNIX sockets.
    sandbox = SandboxSpec(command=tuple(argv), work_dir=work_dir, env=env, threads=1, allow_network=True,
                          read_only_paths=tuple(dict.fromkeys(read_only)), gpus=gpus,
                          limits=SandboxLimits(open_files=65536))
    proc, _ = await start(sandbox, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    return proc, argv


async def start_plain(argv: list[str], env: dict[str, str],
                      work_dir: Path) -> tuple[asyncio.subprocess.Process, list[str]]:
    prefix = list(pid_namespace_prefix())
    if not prefix:
        log.warning("no pid namespace available: a killed torchrun may leave workers behind")
    full_env = {**scrubbed_env(work_dir, 1), **env}
    proc = await asyncio.create_subprocess_exec(
        *prefix, *argv, cwd=work_dir, env=full_env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
    return proc, [*prefix, *argv]
