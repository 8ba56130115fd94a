"""Hostile task: fill the provider's disk, through the worker log it prints to and with files each below
the file-size limit."""

from __future__ import annotations

import os

from torch import nn

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask


class DiskParams(TaskParams):
    log_bytes: int = 0  # printed first, in 1 MiB writes without a newline: the provider logs what a task prints
    file_bytes: int = 1 << 20  # each file stays below RLIMIT_FSIZE
    total_bytes: int = 1 << 30  # the test's own cap: past it the fill counts as uncontained


class FillDisk(TrainingTask):
    name = "hostile-fill-disk"
    Params = DiskParams

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, DiskParams)
        noise = os.urandom(1 << 20).hex().encode()[: 1 << 20]  # printable, and no newline
        for _ in range(params.log_bytes >> 20):
            os.write(2, noise)
        chunk = os.urandom(params.file_bytes)  # incompressible, in case the filesystem compresses
        written = 0
        os.makedirs("fill", exist_ok=True)  # cwd: the job's one writable directory
        while written < params.total_bytes:
            with open(os.path.join("fill", f"f{written // params.file_bytes}"), "wb") as f:
                f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            written += params.file_bytes
        raise RuntimeError(f"filled {written} bytes unhindered")
