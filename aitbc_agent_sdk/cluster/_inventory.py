"""Host and cluster hardware inventory: pure records, plus one local reader (/proc and NVML).

A host with no NVML library, no driver, or no GPU is reported as ``cpu_only`` together with
the reason (``gpu_probe``), never with made-up GPUs. A host that did not answer is kept in
the cluster inventory with ``reachable=False``, so a missing host is visible, not dropped.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from ..host._hardware import cpu_model, nvml_text  # the same /proc and NVML string readers as the provider
from ..records import Address


class GpuInventory(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0, description="NVML index; CUDA numbers devices the same way under CUDA_DEVICE_ORDER=PCI_BUS_ID")
    model: str
    uuid: str | None = None
    memory_total_bytes: int = Field(ge=0)
    memory_free_bytes: int = Field(ge=0)
    driver_version: str | None = None
    cuda_version: str | None = Field(default=None, description="highest CUDA version the driver supports")
    utilization_percent: float | None = Field(default=None, ge=0, le=100, description="None where NVML has none (MIG)")


class HostInventory(BaseModel):
    """What one host has right now. ``cpu_only`` is derived: reachable and no GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    address: Address | None = None
    reachable: bool = True
    error: str | None = Field(default=None, description="why the host is unreachable")
    cpu_model: str | None = None
    cpu_cores: int = Field(default=0, ge=0)
    ram_total_bytes: int = Field(default=0, ge=0)
    ram_available_bytes: int = Field(default=0, ge=0)
    gpus: tuple[GpuInventory, ...] = ()
    gpu_probe: str = Field(default="", description="'nvml', or why there are no GPUs: 'nvml-missing', 'nvml-error: ...', 'no-gpu'")
    cpu_only: bool = False
    collected_at: float = Field(default_factory=time.time)

    @model_validator(mode="before")
    @classmethod
    def _derive_cpu_only(cls, data: Any) -> Any:
        # Derived, never trusted from the wire: a host cannot claim GPUs away or into existence.
        if isinstance(data, dict):
            data = {**data, "cpu_only": bool(data.get("reachable", True)) and not data.get("gpus")}
        return data

    @classmethod
    def unreachable(cls, name: str, address: str | None, error: str) -> HostInventory:
        return cls(name=name, address=address, reachable=False, error=error, gpu_probe="unknown")


class ClusterInventory(BaseModel):
    """Every host of a cluster (reachable or not) and the totals the scheduler needs."""

    # Summary fields are computed; they appear in JSON and are ignored when read back.
    model_config = ConfigDict(extra="ignore", frozen=True)

    cluster: str
    hosts: tuple[HostInventory, ...]
    collected_at: float = Field(default_factory=time.time)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reachable_hosts(self) -> list[str]:
        return [h.name for h in self.hosts if h.reachable]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def unreachable_hosts(self) -> list[str]:
        return [h.name for h in self.hosts if not h.reachable]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cpu_only_hosts(self) -> list[str]:
        return [h.name for h in self.hosts if h.cpu_only]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gpu_count(self) -> int:
        return sum(len(h.gpus) for h in self.hosts if h.reachable)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gpu_memory_total_bytes(self) -> int:
        return sum(g.memory_total_bytes for h in self.hosts if h.reachable for g in h.gpus)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gpu_memory_free_bytes(self) -> int:
        return sum(g.memory_free_bytes for h in self.hosts if h.reachable for g in h.gpus)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gpu_models(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for host in self.hosts:
            for gpu in host.gpus if host.reachable else ():
                counts[gpu.model] = counts.get(gpu.model, 0) + 1
        return counts

    def host(self, name: str) -> HostInventory:
        return next(h for h in self.hosts if h.name == name)


# --- reading the local host -------------------------------------------------------------------

def _meminfo() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes; MemAvailable is what the kernel can give without swapping."""
    fields: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = fields.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total, fields.get("MemAvailable", 0)


def _import_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def read_gpus(nvml: ModuleType | None = None) -> tuple[tuple[GpuInventory, ...], str]:
    """Every GPU NVML sees, and the probe outcome. ``nvml`` defaults to ``pynvml`` (nvidia-ml-py)."""
    nvml = nvml or _import_nvml()
    if nvml is None:
        return (), "nvml-missing"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:  # no driver, or no libnvidia-ml.so: a CPU-only host
        return (), f"nvml-error: {exc}"
    try:
        driver = nvml_text(nvml.nvmlSystemGetDriverVersion())
        raw = nvml.nvmlSystemGetCudaDriverVersion_v2()  # e.g. 12040 -> "12.4"
        cuda = f"{raw // 1000}.{(raw % 1000) // 10}"
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(GpuInventory(
                index=index, model=nvml_text(nvml.nvmlDeviceGetName(handle)), uuid=_optional(nvml, "nvmlDeviceGetUUID", handle),
                memory_total_bytes=int(memory.total), memory_free_bytes=int(memory.free),
                driver_version=driver, cuda_version=cuda, utilization_percent=_utilization(nvml, handle)))
    except nvml.NVMLError as exc:
        return (), f"nvml-error: {exc}"
    finally:
        nvml.nvmlShutdown()
    return tuple(gpus), "nvml" if gpus else "no-gpu"


def _utilization(nvml: ModuleType, handle: Any) -> float | None:
    try:
        return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:
        return None  # not supported on some parts (MIG slices)


def _optional(nvml: ModuleType, name: str, handle: Any) -> str | None:
    try:
        return nvml_text(getattr(nvml, name)(handle))
    except (AttributeError, nvml.NVMLError):
        return None


def read_local_inventory(name: str, address: str | None = None, *, nvml: ModuleType | None = None) -> HostInventory:
    """This host's inventory (blocking: NVML calls; run it with ``asyncio.to_thread`` in async code)."""
    gpus, probe = read_gpus(nvml)
    total, available = _meminfo()
    return HostInventory(name=name, address=address, cpu_model=cpu_model(), cpu_cores=os.cpu_count() or 1,
                         ram_total_bytes=total, ram_available_bytes=available, gpus=gpus, gpu_probe=probe)
