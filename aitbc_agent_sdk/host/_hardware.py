"""Readers of this machine's facts that the provider's and the cluster's hardware reports share."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def nvml_text(value: bytes | str) -> str:
    """An NVML string as str: depending on the pynvml version it comes as bytes or str."""
    return value.decode() if isinstance(value, bytes) else value
