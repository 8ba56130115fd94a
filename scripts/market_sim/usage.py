"""CPU and memory of a process, from /proc (Linux): what the simulation reports for itself and the broker."""

from __future__ import annotations

import os
import time

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15 of stat(5))


class ProcessClock:
    """``start()``, then ``percent()``: the share of one core ``pid`` used in between."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._cpu = 0.0
        self._wall = 0.0

    def start(self) -> None:
        self._cpu, self._wall = cpu_seconds(self.pid), time.monotonic()

    def percent(self) -> float:
        wall = time.monotonic() - self._wall
        return 100.0 * (cpu_seconds(self.pid) - self._cpu) / wall if wall > 0 else 0.0

    def rss_mib(self) -> float:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0
