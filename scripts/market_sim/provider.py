"""The simulation's provider: the SDK's own ProviderAgent, with its training slot run in a thread.

Everything a provider says on the market is the real code: offers, consents, job intake and its checks
on chain, progress, signed results with their trajectory commitments, spot-check openings, receipts,
heartbeats. The one substitution: a job runs the training process's own code (``run_job``) in a thread
of the fleet's process, not in a sandboxed process of its own, because thousands of providers share
this machine's two cores. Jobs are small (an MLP on a shard of digits), so compute stays negligible.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

from aitbc_agent_sdk.errors import AitbcError
from aitbc_agent_sdk.messaging import Verified, topics
from aitbc_agent_sdk.provider._node import ProviderAgent
from aitbc_agent_sdk.records import JobAssignment, Offer, Ping
from aitbc_agent_sdk.provider._process import EpochCallback, TrainingProcess, _maybe_await, _Request
from aitbc_agent_sdk.provider._slots import TrainingSlots
from aitbc_agent_sdk.provider._worker_process import run_job

CRASH_CLOSE_S = 5.0  # what a crashed provider's bus gets to close before it is abandoned


class InThreadProcess(TrainingProcess):
    """A training slot whose jobs run ``run_job`` in a thread (labelled: the simulation's substitution)."""

    def __init__(self, work_dir: Path) -> None:
        super().__init__(work_dir, threads=1, sandbox=None)
        self._loaded: dict[str, Any] = {}

    async def _run(self, job_dir: Path, request: _Request, on_epoch: EpochCallback | None) -> dict[str, Any]:
        line = json.loads(request.line(job_dir, job_dir, "cpu"))
        events: list[dict[str, Any]] = []
        done = await asyncio.to_thread(run_job, line, self._loaded, events.append)
        for event in events:
            if on_epoch is not None and event.get("event") == "epoch":
                await _maybe_await(on_epoch(event))
        return done

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def kill(self) -> None:
        return None


class InThreadSlots(TrainingSlots):
    def __init__(self, work_dir: Path, slots: int) -> None:  # noqa: D107 - no processes to start
        self.processes = [InThreadProcess(work_dir / "slots" / str(i)) for i in range(slots)]
        self._free: asyncio.Queue[TrainingProcess] = asyncio.Queue()
        for process in self.processes:
            self._free.put_nowait(process)


class SimulatedProvider(ProviderAgent):
    """``marked_busy``: heartbeat as a provider at work does, without a job (the liveness phase).
    ``dispatch_s``: for each job, seconds from its coordinator signing it to this provider taking it up."""

    marked_busy = False
    hides_offer = False  # its offer never reaches the market's book (a hostile one that discovery drops)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dispatch_s: list[float] = []

    async def _take_job(self, verified: Verified[JobAssignment]) -> None:
        self.dispatch_s.append(time.time() - verified.sent_at)  # one clock: every process is on this machine
        await super()._take_job(verified)

    @property
    def at_work(self) -> bool:
        return super().at_work or self.marked_busy

    async def __aenter__(self) -> SimulatedProvider:
        await super().__aenter__()
        self.training = InThreadSlots(self.config.work_dir, self.slots)  # warm_start is off: nothing ran yet
        return self

    @property
    def mid_job(self) -> bool:
        return bool(self._active_jobs)

    async def crash(self) -> None:
        """Die as a killed daemon does (labelled fault injection): the TCP connection is cut under the bus,
        with no MQTT DISCONNECT, so the broker publishes the last will; every loop and job stops; nothing
        is said to anyone. The offer is not cleared by this provider: only the will clears it."""
        bus = self.channel._bus  # noqa: SLF001 - a crash bypasses the port
        bus._reconnect = False  # noqa: SLF001 - a dead daemon does not come back
        connection = bus._conn  # noqa: SLF001
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.client._client.socket().shutdown(socket.SHUT_RDWR)  # noqa: SLF001
        tasks = [*self._tasks, *self._job_tasks]
        for task in tasks:
            task.cancel()
        # Neither the loops' clean-up nor the bus's close is waited for past a few seconds: on a socket cut
        # under it, an unsubscribe, a job's last report or the DISCONNECT each waits the bus's whole timeout
        # (120 s here), and the fleet missed its stats. A dead daemon closes nothing; what is left fails alone.
        if tasks:
            await asyncio.wait(tasks, timeout=CRASH_CLOSE_S)
        with contextlib.suppress(AitbcError, TimeoutError):
            await asyncio.wait_for(bus.aclose(), CRASH_CLOSE_S)


# -- hostile providers in the mix (labelled: each misbehaves in one way a stranger could) ----------------------

FLOOD_MESSAGES = 400
FLOOD_RATE_HZ = 200


class MalformedOfferProvider(SimulatedProvider):
    """Its retained offer is garbage bytes: discovery must drop it and go on."""

    hides_offer = True

    async def __aenter__(self) -> MalformedOfferProvider:
        await super().__aenter__()
        await self._advertise_now()
        return self

    async def _advertise_now(self) -> None:
        bus = self.channel._bus  # noqa: SLF001 - junk is not signed
        await bus.publish(topics.offer(self.address), b"\x00not an envelope" * 8, retain=True)


class ForgedOfferProvider(SimulatedProvider):
    """Advertises, under its own signature, an offer in another provider's name at a price nobody beats."""

    victim = "0x" + "11" * 20
    hides_offer = True

    def offer(self) -> Offer:
        return super().offer().model_copy(update={"provider": self.victim, "price_wei": 1})


class FloodingProvider(SimulatedProvider):
    """Does its jobs, and meanwhile floods its training's result and progress topics with junk."""

    async def _take_job(self, verified: Verified[JobAssignment]) -> None:
        self._track(asyncio.create_task(self._flood(verified.message)))
        await super()._take_job(verified)

    async def _flood(self, job: JobAssignment) -> None:
        bus = self.channel._bus  # noqa: SLF001 - junk is not signed
        for i in range(FLOOD_MESSAGES):
            topic = topics.results(job.training_id) if i % 2 else topics.progress(job.training_id, job.job_id)
            with contextlib.suppress(AitbcError):
                await bus.publish(topic, b'{"junk": true}')
            await asyncio.sleep(1 / FLOOD_RATE_HZ)


class VanishingProvider(SimulatedProvider):
    """Consents to a contract, then never takes a job nor answers a ping: gone, as its coordinator sees it."""

    async def _take_job(self, verified: Verified[JobAssignment]) -> None:
        return None

    async def _answer_ping(self, verified: Verified[Ping]) -> None:
        return None


HOSTILE: dict[str, type[SimulatedProvider]] = {
    "malformed-offer": MalformedOfferProvider, "forged-offer": ForgedOfferProvider,
    "flood": FloodingProvider, "vanish-after-consent": VanishingProvider,
}
