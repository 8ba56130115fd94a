"""Honest hardware detection: /proc for CPU and RAM, NVML for GPUs (none when there is no driver)."""

from __future__ import annotations

import os

from ..host._hardware import cpu_model, nvml_text
from ..records import GpuInfo, Hardware


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def detect_gpus() -> tuple[GpuInfo, ...]:
    """Read every GPU through NVML. No NVML library or driver means no GPUs, not an error."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return ()
    try:
        driver = nvml_text(pynvml.nvmlSystemGetDriverVersion())
        cuda_raw = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        cuda = f"{cuda_raw // 1000}.{(cuda_raw % 1000) // 10}"
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                util: float | None = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except pynvml.NVMLError:
                util = None  # not supported on some parts (MIG slices)
            gpus.append(GpuInfo(
                name=nvml_text(pynvml.nvmlDeviceGetName(handle)), memory_total_bytes=int(memory.total),
                memory_free_bytes=int(memory.free), driver_version=driver, cuda_version=cuda,
                utilization_percent=util,
            ))
        return tuple(gpus)
    finally:
        pynvml.nvmlShutdown()


def detect_hardware() -> Hardware:
    return Hardware(cpu_model=cpu_model(), cpu_cores=os.cpu_count() or 1, ram_bytes=_ram_bytes(),
                    gpus=detect_gpus())
