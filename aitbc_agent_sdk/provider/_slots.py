"""A provider's training slots: one training process each, on its own GPU where the host has GPUs.

Slot ``i`` trains on GPU ``i`` (its process sees that device only); slots beyond the GPUs, and
every slot of a CPU host, train on the CPU with an equal share of its cores. So what the offer
advertises (the host's GPUs and cores) is what its jobs run on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from ..records import Hardware
from ._process import TrainingProcess
from ._sandbox import TrainingSandbox


@dataclass(frozen=True)
class SlotPlan:
    gpu: int | None  # NVML index of the slot's GPU; None: CPU
    threads: int  # torch threads of its process


def plan_slots(slots: int, hardware: Hardware, threads: int | None = None) -> list[SlotPlan]:
    """Pure: which device and how many threads each of ``slots`` gets on ``hardware``."""
    per_slot = threads or max(1, hardware.cpu_cores // max(slots, 1))
    return [SlotPlan(gpu=i if i < len(hardware.gpus) else None, threads=per_slot) for i in range(slots)]


class TrainingSlots:
    """The processes and a queue of the free ones: a job holds one process for its whole run."""

    def __init__(self, work_dir: Path, plans: list[SlotPlan], sandbox: TrainingSandbox | None) -> None:
        # Slot 0 keeps the provider's work directory (its worker.log); the others get their own.
        self.processes = [TrainingProcess(work_dir if i == 0 else work_dir / "slots" / str(i), threads=p.threads,
                                          sandbox=sandbox, gpu=p.gpu) for i, p in enumerate(plans)]
        self._free: asyncio.Queue[TrainingProcess] = asyncio.Queue()
        for process in self.processes:
            self._free.put_nowait(process)

    async def start(self) -> None:
        await asyncio.gather(*(p.start() for p in self.processes))

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.processes), return_exceptions=True)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[TrainingProcess]:
        process = await self._free.get()
        try:
            yield process
        finally:
            self._free.put_nowait(process)
