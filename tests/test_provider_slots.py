"""A provider's slots: one training process each, slot i on GPU i alone, the cores shared (pure and unstarted)."""

import asyncio
from pathlib import Path

from aitbc_agent_sdk.host._sandbox_plan import devices_for_gpu
from aitbc_agent_sdk.records import GpuInfo, Hardware
from aitbc_agent_sdk.provider._sandbox import TrainingSandbox, gpu_env, sandbox_spec
from aitbc_agent_sdk.provider._slots import SlotPlan, TrainingSlots, plan_slots

GPU = GpuInfo(name="NVIDIA H100", memory_total_bytes=80 << 30)


def host(cores: int, gpus: int) -> Hardware:
    return Hardware(cpu_model="x", cpu_cores=cores, ram_bytes=1 << 34, gpus=(GPU,) * gpus)


def test_each_gpu_gets_a_slot_and_the_cores_are_shared() -> None:
    assert plan_slots(4, host(32, 4)) == [SlotPlan(gpu=i, threads=8) for i in range(4)]
    assert plan_slots(3, host(8, 2)) == [SlotPlan(0, 2), SlotPlan(1, 2), SlotPlan(None, 2)]  # the third on CPU
    assert plan_slots(1, host(16, 0)) == [SlotPlan(None, 16)]  # a CPU provider uses its cores, not 1
    assert plan_slots(2, host(16, 0), threads=3) == [SlotPlan(None, 3)] * 2


def test_a_slot_sees_only_its_own_gpu() -> None:
    devices = tuple(Path("/dev") / n for n in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"))
    assert [d.name for d in devices_for_gpu(devices, 1)] == ["nvidia1", "nvidiactl", "nvidia-uvm"]
    assert devices_for_gpu(devices, None) == devices
    assert gpu_env(1)["CUDA_VISIBLE_DEVICES"] == "1" and gpu_env(None)["CUDA_VISIBLE_DEVICES"] == ""


def test_a_cpu_slot_gets_no_gpu_device_in_its_sandbox(tmp_path: Path) -> None:
    spec = sandbox_spec(TrainingSandbox(), tmp_path / "box", ("python",), threads=2, gpu=None)
    assert not spec.gpus and spec.gpu_index is None and spec.env["CUDA_VISIBLE_DEVICES"] == ""


async def test_two_jobs_hold_two_processes_at_once(tmp_path: Path) -> None:
    slots = TrainingSlots(tmp_path, [SlotPlan(None, 1), SlotPlan(None, 1)], sandbox=None)
    entered: list[object] = []
    both_in = asyncio.Event()

    async def job() -> None:
        async with slots.slot() as process:
            entered.append(process)
            if len(entered) == 2:
                both_in.set()
            await asyncio.wait_for(both_in.wait(), 10)  # neither waits for the other to finish

    await asyncio.gather(job(), job())
    assert len({id(p) for p in entered}) == 2

    third_waits = asyncio.Event()

    async def hold_all() -> None:
        async with slots.slot(), slots.slot():
            third = asyncio.create_task(asyncio.wait_for(slots.slot().__aenter__(), 0.2))
            third_waits.set()
            try:
                await third
            except TimeoutError:
                return
            raise AssertionError("a third job got a process while both slots were busy")

    await hold_all()
    assert third_waits.is_set()
