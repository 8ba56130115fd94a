"""The per-host cluster agent: one daemon per host that answers inventory and runs torchrun.

``aitbc cluster serve`` runs it. Over the signed MQTT channel it

* answers inventory requests (:class:`~.transport.InventoryResponder`);
* takes control requests (:mod:`.launch` protocol) from the cluster's allow-listed
  coordinators only: reserve a rendezvous port, preflight, launch, stop, mount;
* runs torchrun in the sandbox (:mod:`.sandbox`, network shared so the ranks reach each
  other) or, with ``sandbox=False``, in a pid namespace of its own; either way it owns every
  process of the job: when torchrun exits, is stopped, or the coordinator falls silent, the
  whole tree goes (a pid namespace dies with its first process), so no worker is left
  orphaned and no surviving torchrun waits out its 300 s exit barrier for it;
* streams the job back: batched log lines, each rank's ``AITBC_METRIC`` line, torchrun's
  rendezvous results, a heartbeat, and the exit status (also written to
  ``<work_root>/jobs/<job>.json``), plus a retained per-host status for ``aitbc cluster monitor``.

Its own decisions (launch accepted, torchrun exited, coordinator lost, stopped) go to a
hash-chained audit log, ``<work_root>/agent-audit.jsonl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..audit import AuditLog
from ..errors import MessagingError
from ..messaging.channel import SignedChannel
from ..messaging.envelope import Verified
from ..provider.process import scrubbed_env
from .errors import ClusterError
from .launch import (
    ControlReply, ControlRequest, CoordinatorBeat, HostStatus, JobEvent, Launch, Preflight, PreflightReport,
    RendezvousParser, ReservePort, Stop, TorchrunSpec, beat_topic, control_reply_topic, control_topic, events_topic,
    parse_metric_line, status_topic, torchrun_argv, torchrun_env,
)
from .mounts import MountCommand, MountHandle, MountSettings, perform_mount
from .spec import ClusterSpec
from .transport import InventoryResponder

log = logging.getLogger(__name__)

_SIOCGIFADDR = 0x8915
_LOG_BATCH_S = 0.25
_LOG_BATCH_LINES = 64
_STOP_GRACE_S = 3.0


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    work_root: Path = Field(description="local directory for jobs without a checkpoint dir, status and audit")
    sandbox: bool = Field(default=True, description="False: run torchrun plainly (still in its own pid namespace)")
    network_address: str | None = Field(default=None, description="this host's address for the rendezvous")
    python: str = Field(default=sys.executable, description="the interpreter that runs torchrun")
    beat_interval_s: float = Field(default=2.0, gt=0)
    mounts: MountSettings = MountSettings()


# --- host facts -------------------------------------------------------------------------------

def route_source(dest: str) -> str:
    """The local address the kernel uses to reach ``dest`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((dest, 9))
        return str(probe.getsockname()[0])


def interface_of(address: str) -> str | None:
    """The interface that holds IPv4 ``address``, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def check_readable(path: str) -> str:
    """'ok' when ``path`` (a file, or a directory and a file in it) can be read, else the error."""
    p = Path(path)
    try:
        if p.is_dir():
            for entry in sorted(p.rglob("*"))[:64]:
                if entry.is_file():
                    with entry.open("rb") as fh:
                        fh.read(4096)
                    return "ok"
            os.listdir(p)
            return "ok"
        with p.open("rb") as fh:
            fh.read(4096)
        return "ok"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def check_writable(directory: Path) -> str | None:
    """None when a file can be created, written and removed in ``directory`` (made if missing)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".aitbc-probe-{os.getpid()}-{time.time_ns()}"
        probe.write_bytes(b"x")
        probe.unlink()
        return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def run_preflight(command: Preflight, host: str, *, connect_timeout: float = 3.0) -> PreflightReport:
    problems: list[str] = []
    local_addr = ifname = None
    try:
        local_addr = route_source(command.master_addr)
        ifname = interface_of(local_addr)
    except OSError as exc:
        problems.append(f"no route to the master {command.master_addr}: {exc}")
    reachable, connect_ms = False, None
    started = time.perf_counter()
    try:
        with socket.create_connection((command.master_addr, command.port), timeout=connect_timeout):
            pass
        reachable, connect_ms = True, (time.perf_counter() - started) * 1000
    except OSError as exc:
        problems.append(f"cannot open TCP to the master's rendezvous port {command.master_addr}:{command.port}: {exc}")
    script = check_readable(command.script)
    if script != "ok":
        problems.append(f"script {command.script} unreadable: {script}")
    datasets = {path: check_readable(path) for path in command.datasets}
    problems += [f"dataset {p} unreadable: {why}" for p, why in datasets.items() if why != "ok"]
    writable = None
    if command.checkpoint_dir:
        why = check_writable(Path(command.checkpoint_dir))
        writable = why is None
        if why:
            problems.append(f"checkpoint directory {command.checkpoint_dir} not writable: {why}")
    return PreflightReport(host=host, local_addr=local_addr, ifname=ifname, master_reachable=reachable,
                           connect_ms=connect_ms, script_readable=script == "ok", datasets=datasets,
                           checkpoint_writable=writable, problems=tuple(problems))


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


# --- one running job --------------------------------------------------------------------------

class _Job:
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


class ClusterAgent:
    """``async with ClusterAgent(channel, spec, config=...)``: this host's agent, until the block ends."""

    def __init__(self, channel: SignedChannel, spec: ClusterSpec, *, config: AgentConfig,
                 broker_host: str | None = None) -> None:
        host = spec.host(channel.address)
        if host is None:
            raise ClusterError(f"{channel.address} is not a host of cluster {spec.name!r}")
        self.channel = channel
        self.spec = spec
        self.host = host
        self.config = config
        self._broker_host = broker_host
        self._coordinators = {a.lower() for a in spec.coordinators}
        self._responder = InventoryResponder.for_spec(channel, spec)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._control: asyncio.Task[None] | None = None
        self._reserved: dict[str, tuple[socket.socket, asyncio.Task[None]]] = {}
        self._job: _Job | None = None
        self._mounts: list[MountHandle] = []
        self.audit = AuditLog(config.work_root / "agent-audit.jsonl")
        self._address: str | None = None
        self._gpus = False

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def network_address(self) -> str:
        if self._address is None:
            self._address = (self.config.network_address or self.host.network_address
                             or (route_source(self._broker_host) if self._broker_host else "127.0.0.1"))
        return self._address

    async def __aenter__(self) -> ClusterAgent:
        from .inventory import read_gpus

        self.config.work_root.mkdir(parents=True, exist_ok=True)
        gpus, _ = await asyncio.to_thread(read_gpus)
        self._gpus = bool(gpus)
        await self._responder.__aenter__()
        ready = asyncio.Event()
        self._control = asyncio.create_task(self._serve(ready), name=f"cluster-agent-{self.name}")
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({self._control, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._control.done():
            await self._responder.__aexit__(None, None, None)
            self._control.result()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._job is not None:
            await self._kill(self._job, "agent shutting down")
        for sock, task in self._reserved.values():
            task.cancel()
            sock.close()
        self._reserved.clear()
        for handle in reversed(self._mounts):
            with contextlib.suppress(Exception):
                await handle.unmount()
        if self._control is not None:
            self._control.cancel()
        for task in (*self._tasks, *(t for t in [self._control] if t is not None)):
            task.cancel()
        await asyncio.gather(*self._tasks, *(t for t in [self._control] if t is not None), return_exceptions=True)
        await self._responder.__aexit__(exc_type, exc, tb)

    async def serve_forever(self) -> None:
        assert self._control is not None, "use 'async with ClusterAgent(...)' first"
        await self._control

    # -- control requests ------------------------------------------------------------------

    async def _serve(self, ready: asyncio.Event) -> None:
        async with self.channel.subscribe(control_topic(self.spec.name, self.channel.address), ControlRequest) as reqs:
            ready.set()
            async for verified in reqs:
                task = asyncio.create_task(self._answer(verified))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _answer(self, verified: Verified[ControlRequest]) -> None:
        request = verified.message
        if request.cluster != self.spec.name:
            return
        if not self._coordinators:
            reply = ControlReply(ok=False, error=f"cluster {self.spec.name} lists no coordinators: this host runs "
                                                 f"nothing (recreate it with --coordinator ADDRESS)")
        elif verified.sender.lower() not in self._coordinators:
            log.warning("control request from %s, who is not a coordinator of %s, refused", verified.sender,
                        self.spec.name)
            await self.audit.append("request-refused", sender=verified.sender, kind=request.command.kind)
            reply = ControlReply(ok=False, error=f"{verified.sender} is not a coordinator of {self.spec.name}")
        else:
            try:
                reply = await self._dispatch(request.command)
            except Exception as exc:  # noqa: BLE001 - the coordinator must hear why, not time out
                log.exception("%s request failed", request.command.kind)
                reply = ControlReply(ok=False, error=f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(MessagingError):
            await self.channel.publish(control_reply_topic(self.spec.name, verified.sender, request.nonce), reply)

    async def _dispatch(self, command: Any) -> ControlReply:
        if isinstance(command, ReservePort):
            return await self._reserve(command)
        if isinstance(command, Preflight):
            report = await asyncio.to_thread(run_preflight, command, self.name)
            return ControlReply(ok=True, data=report.model_dump(mode="json"))
        if isinstance(command, Launch):
            return await self._launch(command)
        if isinstance(command, Stop):
            return await self._stop(command)
        if isinstance(command, MountCommand):
            handle, report = await perform_mount(command, host=self.name, settings=self.config.mounts)
            if handle is not None:
                self._mounts.append(handle)
            return ControlReply(ok=report.ok, error=None if report.ok else "; ".join(report.problems),
                                data=report.model_dump(mode="json"))
        return ControlReply(ok=False, error=f"unknown command {command!r}")

    async def _reserve(self, command: ReservePort) -> ControlReply:
        old = self._reserved.pop(command.job_id, None)
        if old is not None:
            old[1].cancel()
            old[0].close()
        address = self.network_address
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, command.port))
            sock.listen(64)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            return ControlReply(ok=False, error=f"cannot bind {address}:{command.port}: {exc}")
        port = sock.getsockname()[1]
        self._reserved[command.job_id] = (sock, asyncio.create_task(self._accept_probes(sock)))
        return ControlReply(ok=True, data={"address": address, "port": port})

    @staticmethod
    async def _accept_probes(sock: socket.socket) -> None:
        """Accept preflight connections; the prober closes first, so no TIME_WAIT holds the port here."""
        loop = asyncio.get_running_loop()

        async def drain(conn: socket.socket) -> None:
            with conn, contextlib.suppress(OSError, TimeoutError):
                conn.setblocking(False)
                async with asyncio.timeout(10):
                    while await loop.sock_recv(conn, 1024):
                        pass

        pending: set[asyncio.Task[None]] = set()
        try:
            while True:
                conn, _ = await loop.sock_accept(sock)
                task = asyncio.create_task(drain(conn))
                pending.add(task)
                task.add_done_callback(pending.discard)
        finally:
            for task in pending:
                task.cancel()

    def _release(self, job_id: str) -> None:
        held = self._reserved.pop(job_id, None)
        if held is not None:
            held[1].cancel()
            held[0].close()

    # -- running torchrun ------------------------------------------------------------------

    async def _launch(self, command: Launch) -> ControlReply:
        spec = command.spec
        if self._job is not None and not self._job.done.is_set():
            return ControlReply(ok=False, error=f"{self.name} is busy with job {self._job.spec.job_id}")
        local_addr = self.network_address if command.is_master else route_source(spec.master_addr)
        ifname = interface_of(local_addr)
        argv = torchrun_argv(spec, is_master=command.is_master, local_addr=local_addr, python=self.config.python)
        env = torchrun_env(spec, ifname=ifname, gpus=self._gpus)
        work_dir = Path(spec.checkpoint_dir) if spec.checkpoint_dir else self.config.work_root / "jobs" / spec.job_id
        work_dir.mkdir(parents=True, exist_ok=True)
        self._release(spec.job_id)  # the master's store binds the reserved port next
        sandboxed = spec.sandbox and self.config.sandbox
        if sandboxed:
            proc, shown = await self._start_sandboxed(spec, argv, env, work_dir)
        else:
            proc, shown = await self._start_plain(argv, env, work_dir)
        job = _Job(spec, proc, work_dir, shown)
        self._job = job
        await self.audit.append("launch-accepted", job=spec.job_id, is_master=command.is_master, sandbox=sandboxed,
                                local_addr=local_addr, ifname=ifname, pid=proc.pid)
        await self._publish(job, JobEvent(job_id=spec.job_id, host=self.name, seq=job.next_seq(), kind="state",
                                          state="started", reason=" ".join(argv)))
        job.tasks = [asyncio.create_task(self._pump(job)), asyncio.create_task(self._heartbeat(job)),
                     asyncio.create_task(self._watch_coordinator(job)), asyncio.create_task(self._reap(job))]
        return ControlReply(ok=True, data={"command": argv, "sandbox": sandboxed, "local_addr": local_addr,
                                           "ifname": ifname, "pid": proc.pid})

    async def _start_sandboxed(self, spec: TorchrunSpec, argv: list[str], env: dict[str, str],
                               work_dir: Path) -> tuple[asyncio.subprocess.Process, list[str]]:
        from .sandbox import SandboxLimits, SandboxSpec, start_sandboxed

        read_only = [Path(spec.script).parent, *(Path(p) for p in spec.datasets if Path(p).exists())]
        # The rendezvous and gloo/NCCL use ports picked at run time on every host, and bwrap cannot
        # filter by address: the network is shared (README, "What a sandboxed rank can still reach").
        # The private root still hides the host's path-based UNIX sockets.
        sandbox = SandboxSpec(command=tuple(argv), work_dir=work_dir, env=env, threads=1, allow_network=True,
                              read_only_paths=tuple(dict.fromkeys(read_only)), gpus=self._gpus,
                              limits=SandboxLimits(open_files=65536))
        proc, _ = await start_sandboxed(sandbox, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        return proc, argv

    async def _start_plain(self, argv: list[str], env: dict[str, str],
                           work_dir: Path) -> tuple[asyncio.subprocess.Process, list[str]]:
        prefix = list(pid_namespace_prefix())
        if not prefix:
            log.warning("no pid namespace available: a killed torchrun may leave workers behind")
        full_env = {**scrubbed_env(work_dir, 1), **env}
        proc = await asyncio.create_subprocess_exec(
            *prefix, *argv, cwd=work_dir, env=full_env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        return proc, [*prefix, *argv]

    async def _publish(self, job: _Job, event: JobEvent) -> None:
        with contextlib.suppress(MessagingError):
            await self.channel.publish(events_topic(self.spec.name, job.spec.job_id, self.channel.address), event)

    async def _publish_status(self, job: _Job | None, state: str, gpus: tuple[dict[str, Any], ...] = ()) -> None:
        status = HostStatus(host=self.name, job_id=job.spec.job_id if job else None, state=state,
                            ranks=dict(job.ranks) if job else {}, gpus=gpus)
        with contextlib.suppress(MessagingError):
            await self.channel.publish(status_topic(self.spec.name, self.channel.address), status, retain=True)

    async def _pump(self, job: _Job) -> None:
        """Forward torchrun's and the ranks' output: log lines batched, metrics and rendezvous at once."""
        assert job.proc.stdout is not None
        parser = RendezvousParser()
        batch: list[str] = []
        flush_at = time.monotonic() + _LOG_BATCH_S

        async def flush() -> None:
            nonlocal batch, flush_at
            if batch:
                lines, batch = tuple(batch), []
                await self._publish(job, JobEvent(job_id=job.spec.job_id, host=self.name, seq=job.next_seq(),
                                                  kind="log", lines=lines))
            flush_at = time.monotonic() + _LOG_BATCH_S

        log_file = (self.config.work_root / "jobs" / f"{job.spec.job_id}.log")
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("a", encoding="utf-8") as local_log:
            while True:
                try:
                    raw = await asyncio.wait_for(job.proc.stdout.readline(), max(0.01, flush_at - time.monotonic()))
                except TimeoutError:
                    await flush()
                    continue
                if not raw:
                    break
                line = raw.decode(errors="replace").rstrip("\n")
                local_log.write(line + "\n")
                local_log.flush()
                metric = parse_metric_line(line)
                if metric is not None:
                    if "rank" in metric:
                        job.ranks[str(metric["rank"])] = metric
                    await self._publish(job, JobEvent(job_id=job.spec.job_id, host=self.name, seq=job.next_seq(),
                                                      kind="metric", metric=metric))
                    continue
                info = parser.feed(line)
                if info is not None:
                    await flush()
                    await self._publish(job, JobEvent(job_id=job.spec.job_id, host=self.name, seq=job.next_seq(),
                                                      kind="rendezvous", rendezvous=info))
                batch.append(line)
                if len(batch) >= _LOG_BATCH_LINES or time.monotonic() >= flush_at:
                    await flush()
            await flush()

    async def _heartbeat(self, job: _Job) -> None:
        from .inventory import read_gpus

        while not job.done.is_set():
            gpus: tuple[dict[str, Any], ...] = ()
            if self._gpus:
                found, _ = await asyncio.to_thread(read_gpus)
                gpus = tuple(g.model_dump(mode="json") for g in found)
            await self._publish(job, JobEvent(job_id=job.spec.job_id, host=self.name, seq=job.next_seq(),
                                              kind="state", state="heartbeat", gpus=gpus))
            await self._publish_status(job, "running", gpus)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.done.wait(), self.config.beat_interval_s)

    async def _watch_coordinator(self, job: _Job) -> None:
        """Stop the job when its coordinator has been silent for ``coordinator_timeout_s``."""
        async with self.channel.subscribe(beat_topic(self.spec.name, job.spec.job_id), CoordinatorBeat) as beats:
            async def listen() -> None:
                async for beat in beats:
                    if beat.sender.lower() in self._coordinators:
                        job.last_beat = time.monotonic()

            listener = asyncio.create_task(listen())
            try:
                while not job.done.is_set():
                    silent = time.monotonic() - job.last_beat
                    if silent > job.spec.coordinator_timeout_s:
                        await self.audit.append("coordinator-lost", job=job.spec.job_id, silent_s=round(silent, 1))
                        await self._kill(job, f"coordinator silent for {silent:.0f}s")
                        return
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(job.done.wait(), 1.0)
            finally:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError, MessagingError):
                    await listener

    async def _reap(self, job: _Job) -> None:
        returncode = await job.proc.wait()
        # torchrun is gone: whatever it left (in its pid namespace or process group) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.proc.pid, signal.SIGKILL)
        pump = job.tasks[0]
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(pump), 5.0)
        reason = job.stop_reason or (f"killed by signal {-returncode}" if returncode < 0 else
                                     f"exited with {returncode}")
        status = {"job": job.spec.job_id, "host": self.name, "returncode": returncode, "reason": reason,
                  "started": job.started, "ended": time.time()}
        path = self.config.work_root / "jobs" / f"{job.spec.job_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=1))
        os.replace(tmp, path)
        await self.audit.append("torchrun-exited", job=job.spec.job_id, returncode=returncode, reason=reason)
        await self._publish(job, JobEvent(job_id=job.spec.job_id, host=self.name, seq=job.next_seq(), kind="state",
                                          state="exited", returncode=returncode, reason=reason))
        job.done.set()
        await self._publish_status(job, "exited" if returncode == 0 else "failed")
        for task in job.tasks[1:3]:
            task.cancel()

    async def _kill(self, job: _Job, reason: str) -> None:
        if job.done.is_set():
            return
        job.stop_reason = reason
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(job.done.wait(), _STOP_GRACE_S)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(job.done.wait(), 10.0)

    async def _stop(self, command: Stop) -> ControlReply:
        self._release(command.job_id)
        job = self._job
        if job is None or job.spec.job_id != command.job_id or job.done.is_set():
            return ControlReply(ok=True, data={"running": False})
        await self.audit.append("stop-requested", job=command.job_id, reason=command.reason)
        await self._kill(job, f"stopped: {command.reason}" if command.reason else "stopped")
        return ControlReply(ok=True, data={"running": False, "returncode": job.proc.returncode})
