"""How a round went: what ``RoundRunner.run`` returns and the elastic pool plans the next round from."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RoundStats:
    model_cid: str  # the aggregated model
    seconds: float  # first dispatch to last verified result
    samples: int
    slowest_s: float  # the slowest winning worker's own training time: the round's compute
    worker_seconds: dict[str, float]  # each final holder's winning job time
    worker_samples: dict[str, int]
    record_update: dict[str, str | None] = field(default_factory=dict)  # record fields moving with the model
    bytes_sent: int = 0  # model bytes sent to the round's jobs
    bytes_received: int = 0  # result bytes fetched from workers

    @property
    def throughput(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0
