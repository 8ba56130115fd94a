"""A launched job, watched: events in, recovery decisions out (:mod:`._recovery`), every decision in the
hash-chained audit log.

One :class:`JobWatch` per job. Its inputs are public: the signed channel, the hosts' control
(:class:`HostControl`, which :class:`~._launcher.TrainingCoordinator` implements), the coordinator's
settings (:class:`WatchSettings`) and the prepared job (:class:`PreparedJob`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

from ..errors import MessagingError
from ._errors import ClusterError
from ._job import HostOutcome, TrainRequest, TrainResult
from ._plan import HostSlot, LaunchPlan
from ._protocol import (
    ControlReply, CoordinatorBeat, JobEvent, Launch, Preflight, PreflightReport, RendezvousInfo, Stop, TorchrunSpec,
    beat_topic, events_filter,
)
from ._recovery import choose_spare, enough_hosts, verify_step_log

if TYPE_CHECKING:
    from ..audit import AuditLog
    from ..messaging._channel import SignedChannel

EventSink = Callable[[JobEvent], None]
NoticeSink = Callable[[str], None]


class HostControl(Protocol):
    """Requests to the hosts' agents: the coordinator's side of the control protocol."""

    async def request(self, host: HostSlot, command: BaseModel, *,
                      timeout: float | None = None) -> ControlReply: ...

    async def preflight(self, slots: Sequence[HostSlot], command: Preflight) -> dict[str, PreflightReport]: ...

    async def stop_host(self, slot: HostSlot, job_id: str, reason: str) -> ControlReply: ...


@dataclass(frozen=True)
class WatchSettings:
    """What the coordinator lends every job it watches."""

    cluster: str
    audit: AuditLog
    events_log: Path | None
    on_event: EventSink
    on_notice: NoticeSink
    host_timeout_s: float
    beat_interval_s: float
    finish_grace_s: float


@dataclass(frozen=True)
class PreparedJob:
    """A planned and preflighted job, about to launch."""

    plan: LaunchPlan
    spec: TorchrunSpec
    preflight: Preflight
    reports: dict[str, PreflightReport]
    request: TrainRequest
    started: float  # monotonic: when the coordinator took the request


class _HostRun:
    def __init__(self, slot: HostSlot, now: float) -> None:
        self.slot = slot
        self.state = "launching"  # launching -> running -> done | failed | stopped
        self.returncode: int | None = None
        self.reason: str | None = None
        self.last_seen = now
        self.rendezvous: list[RendezvousInfo] = []
        self.rendezvous_at = 0.0  # when the latest one arrived (monotonic)
        self.stop_sent = False

    @property
    def active(self) -> bool:
        return self.state in ("launching", "running")


class JobWatch:
    """The launched job: events in, recovery decisions out. One per :meth:`TrainingCoordinator.run`."""

    def __init__(self, channel: SignedChannel, hosts: HostControl, settings: WatchSettings,
                 job: PreparedJob) -> None:
        self.channel = channel
        self.hosts = hosts
        self.settings = settings
        self.plan = job.plan
        self.spec = job.spec
        self.preflight_cmd = job.preflight
        self.reports = dict(job.reports)
        self.request = job.request
        self.started = job.started
        now = time.monotonic()
        self.runs: dict[str, _HostRun] = {s.name: _HostRun(s, now) for s in self.plan.hosts}
        self.by_address = {s.address.lower(): s.name for s in (*self.plan.hosts, *self.plan.spares)}
        self.spares_used: list[str] = []
        self.unhealthy: set[str] = set()
        self.failures: list[dict[str, Any]] = []
        self.formed: set[tuple[tuple[str, int], ...]] = set()
        self.world_confirmed: int | None = None
        self.first_success: float | None = None
        self.failed_reason: str | None = None
        self.metrics: list[dict[str, Any]] = []
        self.takeovers: set[asyncio.Task[None]] = set()
        self.recovery_pending = False
        self.membership_changed = 0.0  # a world counts only if every host reported it after this

    @property
    def audit(self) -> AuditLog:
        return self.settings.audit

    async def run(self) -> TrainResult:
        job = self.spec.job_id
        channel = self.channel
        events_file = self.settings.events_log.open("a") if self.settings.events_log else None
        try:
            async with channel.subscribe(events_filter(self.settings.cluster, job), JobEvent) as events:
                beats = asyncio.create_task(self._beat(), name=f"beat-{job}")
                try:
                    await self._launch_all()
                    await self._watch(events, events_file)
                finally:
                    await self._stop_active("coordinator finished" if self.failed_reason is None
                                            else f"job failed: {self.failed_reason}")
                    for task in self.takeovers:
                        task.cancel()
                    beats.cancel()
                    await asyncio.gather(beats, *self.takeovers, return_exceptions=True)
        finally:
            if events_file is not None:
                events_file.close()
        return await self._result()

    async def _beat(self) -> None:
        topic = beat_topic(self.settings.cluster, self.spec.job_id)
        while True:
            with contextlib.suppress(MessagingError):
                await self.channel.publish(topic, CoordinatorBeat(job_id=self.spec.job_id))
            await asyncio.sleep(self.settings.beat_interval_s)

    async def _launch(self, slot: HostSlot) -> ControlReply:
        reply = await self.hosts.request(slot, Launch(spec=self.spec, is_master=slot.role == "master"))
        await self.audit.append("launched" if reply.ok else "launch-failed", job=self.spec.job_id, host=slot.name,
                                role=slot.role, error=reply.error, command=reply.data.get("command"),
                                sandbox=reply.data.get("sandbox"))
        return reply

    async def _launch_all(self) -> None:
        master, *others = self.plan.hosts
        first = await self._launch(master)  # it releases the reserved port and starts the c10d store
        if not first.ok:
            self.failed_reason = f"launch on the master {master.name} failed: {first.error}"
            raise ClusterError(self.failed_reason)
        self.runs[master.name].state = "running"
        self.settings.on_notice(f"launched on {master.name} (master): {' '.join(first.data.get('command', []))}")
        replies = await asyncio.gather(*(self._launch(s) for s in others))
        for slot, reply in zip(others, replies, strict=True):
            run = self.runs[slot.name]
            if reply.ok:
                run.state = "running"
                self.settings.on_notice(f"launched on {slot.name}")
            else:
                await self._host_failed(run, None, f"launch failed: {reply.error}")

    async def _watch(self, events: Any, sink: Any) -> None:
        deadline = None if self.request.timeout_s is None else self.started + self.request.timeout_s
        launched_at = time.monotonic()
        iterator = events.__aiter__()
        pending: asyncio.Task[Any] | None = None
        try:
            while True:
                now = time.monotonic()
                if not any(r.active for r in self.runs.values()) and not self.takeovers:
                    return
                if deadline is not None and now > deadline:
                    await self._fail(f"job ran past its {self.request.timeout_s:.0f}s limit")
                    return
                if self.world_confirmed is None and now - launched_at > self.request.rendezvous_timeout_s:
                    await self._fail(f"no rendezvous with the expected world size within "
                                     f"{self.request.rendezvous_timeout_s:.0f}s")
                    return
                if self.first_success is not None and now - self.first_success > self.settings.finish_grace_s:
                    await self._stop_active("the job finished on the other hosts")
                    return
                await self._check_silence(now)
                if pending is None:
                    pending = asyncio.ensure_future(iterator.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=1.0)
                if not done:
                    continue
                verified, pending = pending.result(), None
                name = self.by_address.get(verified.sender.lower())
                if name is None:
                    continue  # signed, but not by a host of this job
                event: JobEvent = verified.message
                if event.host != name:
                    event = event.model_copy(update={"host": name})  # the spec names the host, not the host
                if sink is not None:
                    sink.write(event.model_dump_json() + "\n")
                    sink.flush()
                self.settings.on_event(event)
                await self._handle(name, event)
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending

    async def _handle(self, name: str, event: JobEvent) -> None:
        run = self.runs.get(name)
        if run is None:
            return
        run.last_seen = time.monotonic()
        if event.kind == "metric" and event.metric is not None:
            self.metrics.append({**event.metric, "_host": name})
        elif event.kind == "rendezvous" and event.rendezvous is not None:
            run.rendezvous.append(event.rendezvous)
            run.rendezvous_at = time.monotonic()
            await self._check_formed()
        elif event.kind == "state" and event.state == "exited":
            await self._exited(run, event.returncode, event.reason)

    async def _check_formed(self) -> None:
        """Audit each world that all running hosts agree on: the first is the launch, later ones recoveries."""
        running = [r for r in self.runs.values() if r.state == "running"]
        latest = [r.rendezvous[-1] for r in running if r.rendezvous and r.rendezvous_at > self.membership_changed]
        if len(latest) != len(running) or not running:
            return
        sizes = {i.world_size for i in latest}
        if len(sizes) != 1:
            return
        world = sizes.pop()
        if world != len(running) * self.plan.nproc_per_node:
            return
        key = tuple(sorted((r.slot.name, r.rendezvous[-1].restart_count) for r in running))
        if key in self.formed:
            return
        self.formed.add(key)
        ranks = {r.slot.name: r.rendezvous[-1].group_rank for r in running}
        first = self.world_confirmed is None
        self.world_confirmed = world
        self.recovery_pending = False
        await self.audit.append("rendezvous-formed" if first else "rendezvous-reformed", job=self.spec.job_id,
                                world_size=world, expected=self.plan.world_size, node_ranks=ranks,
                                restart_counts={r.slot.name: r.rendezvous[-1].restart_count for r in running})
        self.settings.on_notice(f"rendezvous {'formed' if first else 're-formed'}: world size {world}, node ranks "
                          + ", ".join(f"{n}={k}" for n, k in sorted(ranks.items(), key=lambda x: x[1])))

    async def _exited(self, run: _HostRun, returncode: int | None, reason: str | None) -> None:
        if not run.active:
            return
        run.returncode, run.reason = returncode, reason
        if returncode == 0:
            run.state = "done"
            if self.first_success is None:
                self.first_success = time.monotonic()
                await self.audit.append("host-finished", job=self.spec.job_id, host=run.slot.name)
            return
        if run.stop_sent:
            run.state = "stopped"
            return
        await self._host_failed(run, returncode, reason or f"torchrun exited with {returncode}")

    async def _check_silence(self, now: float) -> None:
        for run in list(self.runs.values()):
            if run.active and now - run.last_seen > self.settings.host_timeout_s:
                run.reason = f"no event for {now - run.last_seen:.0f}s"
                await self.audit.append("host-silent", job=self.spec.job_id, host=run.slot.name,
                                        silent_s=round(now - run.last_seen, 1))
                with contextlib.suppress(Exception):  # a silent agent rarely answers: do not wait long
                    await self.hosts.request(run.slot, Stop(job_id=self.spec.job_id, reason="silent: replaced"),
                                         timeout=3.0)
                await self._host_failed(run, None, run.reason)

    async def _host_failed(self, run: _HostRun, returncode: int | None, reason: str) -> None:
        run.state, run.returncode, run.reason = "failed", returncode, reason
        self.membership_changed = time.monotonic()
        self.unhealthy.add(run.slot.name)
        failure = {"host": run.slot.name, "returncode": returncode, "reason": reason,
                   "after_s": round(time.monotonic() - self.started, 1)}
        self.failures.append(failure)
        await self.audit.append("host-failed", job=self.spec.job_id, **failure)
        self.settings.on_notice(f"detected: {run.slot.name} failed ({reason})")
        if self.first_success is not None:
            return
        if run.slot.role == "master":
            await self._fail(f"the master {run.slot.name} (c10d store host) failed: the rendezvous cannot survive it")
            return
        used = set(self.runs) | set(self.spares_used)
        spare = choose_spare(self.plan.spares, used=used, unhealthy=self.unhealthy)
        alive = sum(1 for r in self.runs.values() if r.active)
        if spare is not None:
            self.recovery_pending = True
            task = asyncio.create_task(self._takeover(run.slot, spare), name=f"takeover-{spare.name}")
            self.takeovers.add(task)
            task.add_done_callback(self.takeovers.discard)
        elif enough_hosts(alive, self.plan.min_nodes):
            self.recovery_pending = True
            await self.audit.append("recovery-continue", job=self.spec.job_id, failed=run.slot.name,
                                    remaining=alive, min_nodes=self.plan.min_nodes,
                                    action="re-rendezvous of the remaining hosts (no spare available)")
            self.settings.on_notice(f"recovery: no spare; {alive} hosts re-rendezvous without {run.slot.name}")
        else:
            await self._fail(f"{alive} hosts left, fewer than --min-hosts {self.plan.min_nodes}, and no spare")

    async def _takeover(self, failed: HostSlot, spare: HostSlot) -> None:
        self.spares_used.append(spare.name)
        slot = spare.model_copy(update={"role": "worker", "slot": failed.slot})
        reports = await self.hosts.preflight([slot], self.preflight_cmd.model_copy())
        self.reports.update(reports)
        self.runs[spare.name] = run = _HostRun(slot, time.monotonic())
        self.membership_changed = time.monotonic()
        reply = await self._launch(slot)
        if not reply.ok:
            await self._host_failed(run, None, f"launch failed: {reply.error}")
            return
        run.state = "running"
        await self.audit.append("spare-assigned", job=self.spec.job_id, failed=failed.name, spare=spare.name,
                                slot=failed.slot)
        self.settings.on_notice(f"recovery: spare {spare.name} takes {failed.name}'s slot")

    async def _fail(self, reason: str) -> None:
        if self.failed_reason is None:
            self.failed_reason = reason
            await self.audit.append("job-failed", job=self.spec.job_id, reason=reason)
            self.settings.on_notice(f"job failed: {reason}")
        self.recovery_pending = False
        await self._stop_active(reason)

    async def _stop_active(self, reason: str) -> None:
        active = [r for r in self.runs.values() if r.active]
        if not active:
            return
        for r in active:
            r.stop_sent = True
        replies = await asyncio.gather(*(self.hosts.stop_host(r.slot, self.spec.job_id, reason) for r in active))
        for r, reply in zip(active, replies, strict=True):
            r.state = "stopped"
            r.reason = reason if reply.ok else f"{reason}; stop failed: {reply.error}"
        await self.audit.append("hosts-stopped", job=self.spec.job_id, hosts=[r.slot.name for r in active],
                                reason=reason)

    async def _result(self) -> TrainResult:
        done = [r for r in self.runs.values() if r.state == "done"]
        ok = self.failed_reason is None and bool(done)
        continuity = None
        rank0 = [m for m in self.metrics if m.get("rank") == 0 and m.get("event") in ("step", "checkpoint", "resume")]
        if any(m.get("event") == "step" and "attempt" in m for m in rank0):
            report = verify_step_log(rank0)
            continuity = report.model_dump(mode="json")
            await self.audit.append("checkpoint-continuity", job=self.spec.job_id, ok=report.ok,
                                    attempts=len(report.attempts), effective_steps=report.effective_steps,
                                    problems=list(report.problems))
        error = self.failed_reason
        if error is None and not done:
            error = "no host finished the job"
        await self.audit.append("job-finished" if ok else "job-ended", job=self.spec.job_id, ok=ok, error=error,
                                hosts={n: {"state": r.state, "returncode": r.returncode}
                                       for n, r in self.runs.items()},
                                spares_used=self.spares_used, world_size=self.world_confirmed)
        hosts = {n: HostOutcome(name=n, role=r.slot.role, state=r.state, returncode=r.returncode, reason=r.reason,
                                group_rank=r.rendezvous[-1].group_rank if r.rendezvous else None,
                                rendezvous=r.rendezvous) for n, r in self.runs.items()}
        return TrainResult(
            job_id=self.spec.job_id, cluster=self.settings.cluster, ok=ok, error=error, master=self.plan.master.name,
            master_addr=self.spec.master_addr, port=self.spec.port, world_size_expected=self.plan.world_size,
            world_size_confirmed=self.world_confirmed, plan=self.plan, preflight=self.reports, hosts=hosts,
            failures=self.failures, spares_used=self.spares_used, continuity=continuity,
            audit_log=str(self.audit.path),
            events_log=str(self.settings.events_log) if self.settings.events_log else None,
            duration_s=round(time.monotonic() - self.started, 2))
