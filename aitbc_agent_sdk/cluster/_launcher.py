"""``torchrun`` on a trusted cluster: the coordinator that runs one job.

The engine is ``torch.distributed`` started by ``torchrun`` with the c10d rendezvous (gloo on
CPU, NCCL on GPU); nothing here is a collective or a rendezvous of its own. The
:class:`TrainingCoordinator` takes a :class:`~._job.TrainRequest` through inventory, the plan
(:mod:`._plan`), a port reserved on the master, preflight on every host (TCP to the master's port,
script and dataset readable, checkpoint directory writable) and launch; :class:`~._job_watch.JobWatch`
then confirms that the rendezvous formed with the expected world size, streams the events and
handles crashes (:mod:`._recovery`), every decision in the hash-chained audit log. The messages
are those of :mod:`._protocol`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from ..errors import MessagingError
from ._errors import ClusterError, PreflightError
from ._job import TrainRequest, TrainResult
from ._job_watch import EventSink, JobWatch, NoticeSink, PreparedJob, WatchSettings
from ._plan import HostSlot, plan_launch
from ._protocol import (
    ControlReply, ControlRequest, Preflight, PreflightReport, ReservePort, Stop, TorchrunSpec, control_reply_topic,
    control_topic, new_job_id,
)
from ._spec import ClusterSpec, HostSpec

if TYPE_CHECKING:
    from ..audit import AuditLog
    from ..messaging._channel import SignedChannel
    from .mounts import ClusterMountReport, MountCommand


class TrainingCoordinator:
    """Plans, checks, launches and watches one job over the signed channel.

    ``on_event`` receives every event a host sends (log lines, metrics, rendezvous, state) and
    ``on_notice`` one-line summaries of what the coordinator does; both default to nothing.
    Every event is also appended to ``events_log`` (JSON lines) when given.
    """

    def __init__(self, channel: SignedChannel, spec: ClusterSpec, *, audit: AuditLog,
                 events_log: Path | None = None, on_event: EventSink | None = None,
                 on_notice: NoticeSink | None = None, request_timeout_s: float = 15.0,
                 inventory_timeout_s: float = 5.0, host_timeout_s: float = 20.0, beat_interval_s: float = 2.0,
                 finish_grace_s: float = 30.0) -> None:
        self._channel = channel
        self._spec = spec
        self._audit = audit
        self._events_log = events_log
        self._on_event = on_event or (lambda event: None)
        self._on_notice = on_notice or (lambda text: None)
        self._request_timeout = request_timeout_s
        self._inventory_timeout = inventory_timeout_s
        self._host_timeout = host_timeout_s
        self._beat_interval = beat_interval_s
        self._finish_grace = finish_grace_s

    # -- requests to one host --------------------------------------------------------------

    async def request(self, host: HostSpec | HostSlot, command: BaseModel, *,
                      timeout: float | None = None) -> ControlReply:
        nonce = uuid.uuid4().hex
        try:
            return await self._channel.request(
                control_topic(self._spec.name, host.address),
                ControlRequest(cluster=self._spec.name, nonce=nonce, command=command),  # type: ignore[arg-type]
                control_reply_topic(self._spec.name, self._channel.address, nonce), ControlReply,
                timeout=timeout or self._request_timeout, expected_sender=host.address)
        except MessagingError as exc:
            return ControlReply(ok=False, error=f"{host.name}: {exc}")

    # -- the job ---------------------------------------------------------------------------

    async def run(self, request: TrainRequest) -> TrainResult:
        from ._transport import collect_inventory  # the signed channel's imports, only when a job runs

        started = time.monotonic()
        job_id = request.job_id or new_job_id(self._spec.name)
        inventory = await collect_inventory(self._channel, self._spec, timeout=self._inventory_timeout)
        plan = plan_launch(inventory, self._spec, hosts=request.hosts, job_id=job_id, min_hosts=request.min_hosts,
                           nproc_per_node=request.nproc_per_node, max_restarts=request.max_restarts)
        await self._audit.append("job-planned", job=job_id, master=plan.master.name,
                                 hosts=[h.name for h in plan.hosts], spares=[h.name for h in plan.spares],
                                 nproc_per_node=plan.nproc_per_node, nnodes=f"{plan.min_nodes}:{plan.max_nodes}",
                                 max_restarts=plan.max_restarts, backend=plan.backend,
                                 unreachable=inventory.unreachable_hosts)
        self._on_notice(f"job {job_id}: master {plan.master.name}, hosts {', '.join(h.name for h in plan.hosts)}"
                        + (f", spares {', '.join(h.name for h in plan.spares)}" if plan.spares else ""))

        reserved = await self.request(plan.master, ReservePort(job_id=job_id))
        if not reserved.ok:
            await self._audit.append("job-failed", job=job_id, reason=f"port reservation: {reserved.error}")
            raise ClusterError(f"the master {plan.master.name} could not reserve a port: {reserved.error}")
        master_addr, port = str(reserved.data["address"]), int(reserved.data["port"])
        self._on_notice(f"rendezvous endpoint {master_addr}:{port} on {plan.master.name}")

        script = str(request.script.resolve())
        datasets = tuple(str(p.resolve()) for p in request.datasets)
        ckpt = str(request.checkpoint_dir.resolve()) if request.checkpoint_dir else None
        preflight_cmd = Preflight(job_id=job_id, master_addr=master_addr, port=port, script=script,
                                  datasets=datasets, checkpoint_dir=ckpt)
        try:
            reports = await self.preflight(plan.hosts, preflight_cmd)
        except BaseException:
            await self.request(plan.master, Stop(job_id=job_id, reason="preflight failed"))
            raise
        spec = TorchrunSpec(job_id=job_id, script=script, script_args=request.script_args,
                            nproc_per_node=plan.nproc_per_node, min_nodes=plan.min_nodes, max_nodes=plan.max_nodes,
                            max_restarts=plan.max_restarts, master_addr=master_addr, port=port, backend=plan.backend,
                            last_call_timeout_s=request.last_call_timeout_s, join_timeout_s=request.join_timeout_s,
                            checkpoint_dir=ckpt, checkpoint_every=request.checkpoint_every, datasets=datasets,
                            sandbox=request.sandbox, coordinator_timeout_s=max(10.0, 5 * self._beat_interval))
        job = PreparedJob(plan=plan, spec=spec, preflight=preflight_cmd, reports=reports, request=request,
                          started=started)
        return await JobWatch(self._channel, self, self._watch_settings(), job).run()

    def _watch_settings(self) -> WatchSettings:
        return WatchSettings(cluster=self._spec.name, audit=self._audit, events_log=self._events_log,
                             on_event=self._on_event, on_notice=self._on_notice, host_timeout_s=self._host_timeout,
                             beat_interval_s=self._beat_interval, finish_grace_s=self._finish_grace)

    async def preflight(self, slots: Sequence[HostSlot], command: Preflight) -> dict[str, PreflightReport]:
        """Ask ``slots`` to check ``command``; their reports, or :class:`ClusterError` naming every problem."""
        replies = await asyncio.gather(*(self.request(s, command) for s in slots))
        reports: dict[str, PreflightReport] = {}
        problems: list[str] = []
        for slot, reply in zip(slots, replies, strict=True):
            if not reply.ok:
                problems.append(f"{slot.name}: {reply.error}")
                continue
            report = PreflightReport.model_validate(reply.data)
            reports[slot.name] = report
            problems += [f"{slot.name}: {p}" for p in report.problems]
        await self._audit.append("preflight", job=command.job_id, ok=not problems, problems=problems,
                                 hosts={n: {"local_addr": r.local_addr, "ifname": r.ifname,
                                            "connect_ms": r.connect_ms} for n, r in reports.items()})
        if problems:
            raise PreflightError("preflight failed:\n  " + "\n  ".join(problems))
        for name, r in reports.items():
            self._on_notice(f"preflight {name}: {r.local_addr} ({r.ifname}) reaches the master in "
                            f"{r.connect_ms:.1f} ms; script and {len(r.datasets)} dataset path(s) readable")
        return reports

    async def stop_host(self, slot: HostSlot, job_id: str, reason: str) -> ControlReply:
        return await self.request(slot, Stop(job_id=job_id, reason=reason))

    async def mount(self, members: Sequence[HostSpec], command: MountCommand, *,
                    timeout: float) -> ClusterMountReport:
        """Mount on ``members`` and compare what each sees (``aitbc cluster mount``); audited."""
        from .mounts import MountReport, summarize_mounts

        replies = await asyncio.gather(*(self.request(h, command, timeout=timeout) for h in members))
        reports = {h.name: MountReport.model_validate(r.data) for h, r in zip(members, replies) if r.data.get("host")}
        errors = {h.name: r.error or "no report" for h, r in zip(members, replies) if not r.data.get("host")}
        summary = summarize_mounts(command, reports, errors)
        await self._audit.append("mount", source=summary.source, target=summary.target, mountpoint=summary.mountpoint,
                                 ok=summary.ok, digest=summary.comparison.digest,
                                 agreeing=list(summary.comparison.agreeing), errors=summary.errors)
        return summary
