"""Watching a cluster's running jobs: each host's retained status and its ranks' metric events,
only those signed by the cluster's hosts (``aitbc cluster monitor``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._protocol import HostStatus, JobEvent, events_filter, status_filter

if TYPE_CHECKING:
    from ..messaging._channel import SignedChannel
    from ..messaging._envelope import Verified
    from ._spec import ClusterSpec

MetricRow = dict[str, Any]  # a rank's metric line plus "host" and "job" (and "state" from a status)
RowSink = Callable[[MetricRow], None]


class ClusterMonitor:
    """The latest row per (host, rank) and per (host, GPU); ``on_metric`` hears each metric event.

    ``async with channel`` is the caller's; the monitor only subscribes. Rows keyed
    ``(host, "gpuN")`` carry a ``gpu`` dict (NVML) instead of a rank's metric.
    """

    def __init__(self, channel: SignedChannel, spec: ClusterSpec, *, job: str | None = None,
                 on_metric: RowSink | None = None) -> None:
        self._channel = channel
        self._spec = spec
        self._job = job
        self._on_metric = on_metric
        self._hosts = {h.address.lower(): h.name for h in spec.hosts}
        self.latest: dict[tuple[str, str], MetricRow] = {}

    def rows(self) -> list[MetricRow]:
        """Every latest row, by host then rank."""
        return sorted(self.latest.values(), key=lambda r: (r["host"], str(r.get("rank"))))

    async def watch(self, seconds: float | None, *, on_ready: Callable[[], None] | None = None) -> None:
        """Listen for ``seconds`` (None: until cancelled); ``on_ready`` once both subscriptions are in place."""
        async with self._channel.subscribe(status_filter(self._spec.name), HostStatus) as statuses, \
                self._channel.subscribe(events_filter(self._spec.name, self._job or "+"), JobEvent) as events:
            if on_ready is not None:
                on_ready()
            tasks = [asyncio.create_task(self._read_status(statuses)), asyncio.create_task(self._read_events(events))]
            try:
                await asyncio.sleep(1e9 if seconds is None else seconds)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _read_status(self, statuses: Any) -> None:
        async for s in statuses:
            self.take_status(s)

    async def _read_events(self, events: Any) -> None:
        async for e in events:
            self.take_event(e)

    def take_status(self, s: Verified[HostStatus]) -> None:
        name = self._hosts.get(s.sender.lower())
        if name is None or (self._job and s.message.job_id != self._job):
            return  # not signed by a host of this cluster, or another job
        for rank, metric in s.message.ranks.items():
            self.latest[(name, rank)] = {**metric, "host": name, "job": s.message.job_id, "state": s.message.state}
        for g in s.message.gpus:
            self.latest[(name, f"gpu{g.get('index')}")] = {"host": name, "job": s.message.job_id, "gpu": g,
                                                           "state": s.message.state}

    def take_event(self, e: Verified[JobEvent]) -> None:
        name = self._hosts.get(e.sender.lower())
        if name is None or e.message.kind != "metric" or e.message.metric is None:
            return
        row = {**e.message.metric, "host": name, "job": e.message.job_id}
        self.latest[(name, str(row.get("rank")))] = row
        if self._on_metric is not None:
            self._on_metric(row)
