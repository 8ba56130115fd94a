"""How a round went: what ``RoundRunner.run`` returns and the elastic pool plans the next round from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoundStats:
    model_cid: str  # the aggregated model
    seconds: float  # first dispatch to last verified result
    samples: int
    slowest_s: float  # the slowest winning worker's own training time: the round's compute
    worker_seconds: dict[str, float]  # each final holder's winning job time
    worker_samples: dict[str, int]

    @property
    def throughput(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0
