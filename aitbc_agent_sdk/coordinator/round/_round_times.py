"""Each provider's seconds per delivered round, per training: what its adaptive deadlines are cut from."""

from __future__ import annotations

from .._training_db import TrainingDatabase

ROUND_TIMES_KEPT = 256  # per provider, loaded on start: its adaptive deadline needs recent rounds only


class RoundTimes:
    """Kept in memory for the round loop and written through to the database, so a resumed coordinator
    keeps the history of the one before it."""

    def __init__(self, db: TrainingDatabase) -> None:
        self.db = db
        self._seconds: dict[str, dict[str, list[float]]] = {}  # training -> provider -> seconds per round

    async def load(self, training_id: str) -> None:
        self._seconds[training_id] = await self.db.round_times(training_id, ROUND_TIMES_KEPT)

    def of(self, training_id: str, worker_id: str) -> list[float]:
        return self._seconds.get(training_id, {}).get(worker_id, [])

    async def record(self, training_id: str, worker_id: str, seconds: float) -> None:
        self._seconds.setdefault(training_id, {}).setdefault(worker_id, []).append(seconds)
        await self.db.save_round_time(training_id, worker_id, seconds)
