"""The per-host cluster agent: one daemon per host that answers inventory and runs torchrun.

``aitbc cluster serve`` runs it. Over the signed MQTT channel it

* answers inventory requests (:class:`~._transport.InventoryResponder`);
* takes control requests (:mod:`._protocol`) from the cluster's allow-listed
  coordinators only: reserve a rendezvous port, preflight, launch, stop, mount;
* runs torchrun in the sandbox (:mod:`._sandbox`, network shared so the ranks reach each
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
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..audit import AuditLog
from ..errors import MessagingError
from ..messaging._channel import SignedChannel
from ..messaging._envelope import Verified
from ._errors import ClusterConfigError
from ._host_job import HostJob, start_plain, start_sandboxed
from .mounts import MountCommand, MountHandle, MountSettings, perform_mount
from ._plan import torchrun_argv, torchrun_env
from ._preflight import interface_of, route_source, run_preflight
from ._protocol import (
    ControlReply, ControlRequest, CoordinatorBeat, HostStatus, JobEvent, Launch, Preflight, RendezvousParser,
    ReservePort, Stop, beat_topic, control_reply_topic, control_topic, events_topic, parse_metric_line, status_topic,
)
from ._rendezvous_port import PortReservations
from ._spec import ClusterSpec
from ._transport import InventoryResponder

log = logging.getLogger(__name__)

_LOG_BATCH_S = 0.25
_LOG_BATCH_LINES = 64
_STOP_GRACE_S = 3.0


class HostAgentConfig(BaseModel):
    """How this host's agent runs its jobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    work_root: Path = Field(description="local directory for jobs without a checkpoint dir, status and audit")
    sandbox: bool = Field(default=True, description="False: run torchrun plainly (still in its own pid namespace)")
    network_address: str | None = Field(default=None, description="this host's address for the rendezvous")
    python: str = Field(default=sys.executable, description="the interpreter that runs torchrun")
    beat_interval_s: float = Field(default=2.0, gt=0)
    mounts: MountSettings = MountSettings()


class ClusterAgent:
    """``async with ClusterAgent(channel, spec, config=...)``: this host's agent, until the block ends."""

    def __init__(self, channel: SignedChannel, spec: ClusterSpec, *, config: HostAgentConfig,
                 broker_host: str | None = None) -> None:
        host = spec.host(channel.address)
        if host is None:
            raise ClusterConfigError(f"{channel.address} is not a host of cluster {spec.name!r}")
        self.channel = channel
        self.spec = spec
        self.host = host
        self.config = config
        self._broker_host = broker_host
        self._coordinators = {a.lower() for a in spec.coordinators}
        self._responder = InventoryResponder.for_spec(channel, spec)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._control: asyncio.Task[None] | None = None
        self._ports = PortReservations()
        self._job: HostJob | None = None
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
        from ._inventory import read_gpus

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
        self._ports.release_all()
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
        address = self.network_address
        try:
            port = self._ports.reserve(command.job_id, address, command.port)
        except OSError as exc:
            return ControlReply(ok=False, error=f"cannot bind {address}:{command.port}: {exc}")
        return ControlReply(ok=True, data={"address": address, "port": port})

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
        self._ports.release(spec.job_id)  # the master's store binds the reserved port next
        sandboxed = spec.sandbox and self.config.sandbox
        if sandboxed:
            proc, shown = await start_sandboxed(spec, argv, env, work_dir, gpus=self._gpus)
        else:
            proc, shown = await start_plain(argv, env, work_dir)
        job = HostJob(spec, proc, work_dir, shown)
        self._job = job
        await self.audit.append("launch-accepted", job=spec.job_id, is_master=command.is_master, sandbox=sandboxed,
                                local_addr=local_addr, ifname=ifname, pid=proc.pid)
        await self._publish(job, JobEvent(job_id=spec.job_id, host=self.name, seq=job.next_seq(), kind="state",
                                          state="started", reason=" ".join(argv)))
        job.tasks = [asyncio.create_task(self._pump(job)), asyncio.create_task(self._heartbeat(job)),
                     asyncio.create_task(self._watch_coordinator(job)), asyncio.create_task(self._reap(job))]
        return ControlReply(ok=True, data={"command": argv, "sandbox": sandboxed, "local_addr": local_addr,
                                           "ifname": ifname, "pid": proc.pid})

    async def _publish(self, job: HostJob, event: JobEvent) -> None:
        with contextlib.suppress(MessagingError):
            await self.channel.publish(events_topic(self.spec.name, job.spec.job_id, self.channel.address), event)

    async def _publish_status(self, job: HostJob | None, state: str, gpus: tuple[dict[str, Any], ...] = ()) -> None:
        status = HostStatus(host=self.name, job_id=job.spec.job_id if job else None, state=state,
                            ranks=dict(job.ranks) if job else {}, gpus=gpus)
        with contextlib.suppress(MessagingError):
            await self.channel.publish(status_topic(self.spec.name, self.channel.address), status, retain=True)

    async def _pump(self, job: HostJob) -> None:
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

    async def _heartbeat(self, job: HostJob) -> None:
        from ._inventory import read_gpus

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

    async def _watch_coordinator(self, job: HostJob) -> None:
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

    async def _reap(self, job: HostJob) -> None:
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

    async def _kill(self, job: HostJob, reason: str) -> None:
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
        self._ports.release(command.job_id)
        job = self._job
        if job is None or job.spec.job_id != command.job_id or job.done.is_set():
            return ControlReply(ok=True, data={"running": False})
        await self.audit.append("stop-requested", job=command.job_id, reason=command.reason)
        await self._kill(job, f"stopped: {command.reason}" if command.reason else "stopped")
        return ControlReply(ok=True, data={"running": False, "returncode": job.proc.returncode})
