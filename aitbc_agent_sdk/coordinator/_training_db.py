"""SQLite persistence for trainings, shards, contracts, jobs, results, rounds, round times and payments.

Records are stored as validated JSON next to the columns we query by; every write
goes through one connection, serialised and run off the event loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from ..errors import NotFoundError
from ..records import (
    ChainIntent, CheckpointRef, EscrowSummary, JobAssignment, Payment, Progress, RoundMetrics, Shard,
    TrainingPhase, TrainingRecord, WorkerContract,
)

R = TypeVar("R", bound=BaseModel)
CheckpointStatus = Literal["received", "accepted", "rejected"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS trainings (
  training_id TEXT PRIMARY KEY, phase TEXT NOT NULL, data TEXT NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS shards (
  training_id TEXT NOT NULL, shard_id TEXT NOT NULL, idx INTEGER NOT NULL, data TEXT NOT NULL,
  PRIMARY KEY (training_id, shard_id));
CREATE TABLE IF NOT EXISTS contracts (
  contract_id TEXT PRIMARY KEY, training_id TEXT NOT NULL, worker_id TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  job_id TEXT PRIMARY KEY, training_id TEXT NOT NULL, worker_id TEXT NOT NULL, round INTEGER NOT NULL,
  data TEXT NOT NULL, progress TEXT);
CREATE TABLE IF NOT EXISTS checkpoints (
  job_id TEXT PRIMARY KEY, training_id TEXT NOT NULL, worker_id TEXT NOT NULL, round INTEGER NOT NULL,
  status TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
  training_id TEXT NOT NULL, round INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (training_id, round));
CREATE TABLE IF NOT EXISTS payments (
  training_id TEXT NOT NULL, worker_id TEXT NOT NULL, tx_hash TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS strikes (
  training_id TEXT NOT NULL, worker_id TEXT NOT NULL, job_id TEXT NOT NULL, reason TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS escrows (
  training_id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS intents (
  intent_id TEXT PRIMARY KEY, training_id TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
  data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS round_times (
  worker_id TEXT NOT NULL, training_id TEXT NOT NULL, seconds REAL NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_by_training ON jobs (training_id, round);
CREATE INDEX IF NOT EXISTS checkpoints_by_training ON checkpoints (training_id, round);
"""


class _FirstWrite(Exception):
    """A transaction on the empty stand-in database wrote: it is rolled back and run on the file."""


class TrainingDatabase:
    """A coordinator's trainings in SQLite (records, contracts, jobs, checkpoints, payments); the content
    itself lives in the ContentStore. The database file is created by the first write, not by opening:
    a command that only reads (or fails before writing) leaves no file behind. Until then reads see an
    empty schema."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._on_disk = False
        self._lock = asyncio.Lock()

    async def open(self) -> TrainingDatabase:
        self._conn = await asyncio.to_thread(self._connect_disk if self._path.exists() else self._connect_empty)
        return self

    def _connect_disk(self) -> sqlite3.Connection:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(SCHEMA)
        self._on_disk = True
        return conn

    def _connect_empty(self) -> sqlite3.Connection:
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        conn.executescript(SCHEMA)
        self._on_disk = False
        return conn

    def _to_disk(self) -> sqlite3.Connection:
        assert self._conn is not None
        self._conn.close()
        self._conn = self._connect_disk()
        return self._conn

    async def close(self) -> None:
        if self._conn is not None:
            await asyncio.to_thread(self._conn.close)
            self._conn = None

    async def __aenter__(self) -> TrainingDatabase:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        if self._conn is None:
            raise RuntimeError("TrainingDatabase is not open")

        def attempt(conn: sqlite3.Connection) -> Any:
            with conn:  # BEGIN/COMMIT, ROLLBACK on error: nothing half-written
                conn.execute("BEGIN")
                before = conn.total_changes
                result = fn(conn)
                if not self._on_disk and conn.total_changes != before:
                    raise _FirstWrite
                return result

        def in_transaction() -> Any:
            if not self._on_disk and self._path.exists():  # another process created it meanwhile
                self._to_disk()
            assert self._conn is not None
            try:
                return attempt(self._conn)
            except _FirstWrite:
                return attempt(self._to_disk())

        async with self._lock:
            return await asyncio.to_thread(in_transaction)

    async def _rows(self, sql: str, args: Iterable[Any], model: type[R]) -> list[R]:
        rows = await self._run(lambda c: c.execute(sql, tuple(args)).fetchall())
        return [model.model_validate_json(r[0]) for r in rows]

    # trainings -------------------------------------------------------------
    async def save_training(self, record: TrainingRecord) -> None:
        await self._run(lambda c: _upsert_training(c, record))

    async def training(self, training_id: str) -> TrainingRecord:
        found = await self._rows("SELECT data FROM trainings WHERE training_id=?", [training_id], TrainingRecord)
        if not found:
            raise NotFoundError(f"no training {training_id!r}")
        return found[0]

    async def trainings(self, phase: TrainingPhase | None = None) -> list[TrainingRecord]:
        if phase is None:
            return await self._rows("SELECT data FROM trainings ORDER BY updated_at", [], TrainingRecord)
        return await self._rows("SELECT data FROM trainings WHERE phase=? ORDER BY updated_at",
                                [phase.value], TrainingRecord)

    # shards ----------------------------------------------------------------
    async def save_shards(self, training_id: str, shards: Iterable[Shard]) -> None:
        rows = [(training_id, s.shard_id, s.index, s.model_dump_json()) for s in shards]
        await self._run(lambda c: c.executemany("INSERT OR REPLACE INTO shards VALUES (?,?,?,?)", rows))

    async def shards(self, training_id: str) -> list[Shard]:
        return await self._rows("SELECT data FROM shards WHERE training_id=? ORDER BY idx", [training_id], Shard)

    # contracts -------------------------------------------------------------
    async def save_contract(self, contract: WorkerContract) -> None:
        await self._run(lambda c: c.execute(
            "INSERT OR REPLACE INTO contracts VALUES (?,?,?,?)",
            (contract.contract_id, contract.training_id, contract.worker_id, contract.model_dump_json())))

    async def contract(self, contract_id: str) -> WorkerContract:
        found = await self._rows("SELECT data FROM contracts WHERE contract_id=?", [contract_id], WorkerContract)
        if not found:
            raise NotFoundError(f"no contract {contract_id!r}")
        return found[0]

    async def contracts(self, training_id: str, role: str | None = None) -> list[WorkerContract]:
        """Contracts in the order they were made; ``role`` picks workers, spares or replaced ones."""
        found = await self._rows("SELECT data FROM contracts WHERE training_id=? ORDER BY rowid",
                                 [training_id], WorkerContract)
        return [c for c in found if role is None or c.role == role]

    # jobs and progress -----------------------------------------------------
    async def save_job(self, job: JobAssignment) -> None:
        await self._run(lambda c: c.execute(
            "INSERT OR REPLACE INTO jobs (job_id, training_id, worker_id, round, data) VALUES (?,?,?,?,?)",
            (job.job_id, job.training_id, job.worker_id, job.round, job.model_dump_json())))

    async def job(self, job_id: str) -> JobAssignment:
        found = await self._rows("SELECT data FROM jobs WHERE job_id=?", [job_id], JobAssignment)
        if not found:
            raise NotFoundError(f"no job {job_id!r}")
        return found[0]

    async def jobs(self, training_id: str, round_: int | None = None) -> list[JobAssignment]:
        if round_ is None:
            return await self._rows("SELECT data FROM jobs WHERE training_id=? ORDER BY round, rowid",
                                    [training_id], JobAssignment)
        return await self._rows("SELECT data FROM jobs WHERE training_id=? AND round=? ORDER BY rowid",
                                [training_id, round_], JobAssignment)

    async def save_progress(self, progress: Progress) -> None:
        await self._run(lambda c: c.execute(
            "UPDATE jobs SET progress=? WHERE job_id=?", (progress.model_dump_json(), progress.job_id)))

    async def progress(self, job_id: str) -> Progress | None:
        rows = await self._run(lambda c: c.execute("SELECT progress FROM jobs WHERE job_id=?", (job_id,)).fetchall())
        if not rows:
            raise NotFoundError(f"no job {job_id!r}")
        return Progress.model_validate_json(rows[0][0]) if rows[0][0] else None

    # checkpoints -----------------------------------------------------------
    async def save_checkpoint(self, ref: CheckpointRef, status: CheckpointStatus) -> None:
        await self._run(lambda c: c.execute(
            "INSERT OR REPLACE INTO checkpoints VALUES (?,?,?,?,?,?)",
            (ref.job_id, ref.training_id, ref.worker_id, ref.round, status, ref.model_dump_json())))

    async def checkpoint(self, job_id: str) -> tuple[CheckpointRef, CheckpointStatus] | None:
        rows = await self._run(lambda c: c.execute(
            "SELECT data, status FROM checkpoints WHERE job_id=?", (job_id,)).fetchall())
        return (CheckpointRef.model_validate_json(rows[0][0]), rows[0][1]) if rows else None

    async def checkpoints(self, training_id: str,
                          status: CheckpointStatus | None = "accepted") -> list[CheckpointRef]:
        """Checkpoints with ``status`` (None: all of them) by round and arrival."""
        if status is None:
            return await self._rows("SELECT data FROM checkpoints WHERE training_id=? ORDER BY round, rowid",
                                    [training_id], CheckpointRef)
        return await self._rows(
            "SELECT data FROM checkpoints WHERE training_id=? AND status=? ORDER BY round, rowid",
            [training_id, status], CheckpointRef)

    # rounds, escrow, payments ----------------------------------------------
    async def save_round(self, training_id: str, metrics: RoundMetrics) -> None:
        await self._run(lambda c: c.execute(
            "INSERT OR REPLACE INTO rounds VALUES (?,?,?)", (training_id, metrics.round, metrics.model_dump_json())))

    async def finish_round(self, metrics: RoundMetrics, record: TrainingRecord) -> None:
        """A round's metrics and the training's record moved on past it, in one transaction: a coordinator
        killed between the two would otherwise resume the round its metrics say is done."""
        def both(c: sqlite3.Connection) -> None:
            c.execute("INSERT OR REPLACE INTO rounds VALUES (?,?,?)",
                      (record.training_id, metrics.round, metrics.model_dump_json()))
            _upsert_training(c, record)
        await self._run(both)

    async def rounds(self, training_id: str) -> list[RoundMetrics]:
        return await self._rows("SELECT data FROM rounds WHERE training_id=? ORDER BY round",
                                [training_id], RoundMetrics)

    async def save_round_time(self, training_id: str, worker_id: str, seconds: float) -> None:
        """How long a provider's winning job of a round took: its history for the adaptive deadline."""
        await self._run(lambda c: c.execute("INSERT INTO round_times VALUES (?,?,?,?)",
                                            (worker_id, training_id, seconds, time.time())))

    async def round_times(self, training_id: str, last: int | None = None) -> dict[str, list[float]]:
        """Each provider's round times in one training, oldest first; ``last``: only its latest that many.

        Per training, because a round's length depends on the training's model and shard size: a
        provider's fast rounds on a small model say nothing about its deadline on a large one.
        """
        def read(c: sqlite3.Connection) -> dict[str, list[float]]:
            times: dict[str, list[float]] = {}
            for worker, seconds in c.execute("SELECT worker_id, seconds FROM round_times WHERE training_id=? "
                                             "ORDER BY rowid", (training_id,)):
                times.setdefault(worker, []).append(seconds)
            return {w: t[-last:] if last else t for w, t in times.items()}
        return await self._run(read)

    async def save_escrow(self, training_id: str, summary: EscrowSummary) -> None:
        await self._run(lambda c: c.execute(
            "INSERT OR REPLACE INTO escrows VALUES (?,?)", (training_id, summary.model_dump_json())))

    async def escrow(self, training_id: str) -> EscrowSummary | None:
        found = await self._rows("SELECT data FROM escrows WHERE training_id=?", [training_id], EscrowSummary)
        return found[0] if found else None

    async def save_payment(self, payment: Payment) -> None:
        await self._run(lambda c: c.execute(
            "INSERT INTO payments VALUES (?,?,?,?)",
            (payment.training_id, payment.worker_id, payment.tx_hash, payment.model_dump_json())))

    async def payments(self, training_id: str) -> list[Payment]:
        return await self._rows("SELECT data FROM payments WHERE training_id=? ORDER BY rowid",
                                [training_id], Payment)

    # chain intents ---------------------------------------------------------
    async def save_intent(self, intent: ChainIntent) -> None:
        await self._run(lambda c: _put_intent(c, intent))

    async def intents(self, training_id: str, status: str | None = "pending") -> list[ChainIntent]:
        """Intents by age; ``status`` None: all of them."""
        found = await self._rows("SELECT data FROM intents WHERE training_id=? ORDER BY rowid",
                                 [training_id], ChainIntent)
        return [i for i in found if status is None or i.status == status]

    async def finish_replacement(self, intent: ChainIntent, old: WorkerContract, new: WorkerContract) -> None:
        """Both contracts and the intent's end in one transaction: a crash leaves all or none."""
        def write(c: sqlite3.Connection) -> None:
            for contract in (old, new):
                c.execute("INSERT OR REPLACE INTO contracts VALUES (?,?,?,?)",
                          (contract.contract_id, contract.training_id, contract.worker_id, contract.model_dump_json()))
            _put_intent(c, intent.model_copy(update={"status": "done"}))
        await self._run(write)

    async def save_strike(self, training_id: str, worker_id: str, job_id: str, reason: str) -> None:
        """A mark against a worker that is not a rejection, e.g. a checkpoint it had to re-send."""
        await self._run(lambda c: c.execute("INSERT INTO strikes VALUES (?,?,?,?,?)",
                                            (training_id, worker_id, job_id, reason, time.time())))

    async def struck_verifiers(self, training_id: str) -> set[str]:
        """Workers of ``training_id`` shown wrong as verifiers (strikes saved with a ``verifier:`` reason)."""
        rows = await self._run(lambda c: c.execute(
            "SELECT DISTINCT worker_id FROM strikes WHERE training_id=? AND reason LIKE 'verifier:%'",
            (training_id,)).fetchall())
        return {str(row[0]) for row in rows}

    async def strikes(self, worker_id: str) -> int:
        rows = await self._run(lambda c: c.execute(
            "SELECT COUNT(*) FROM strikes WHERE worker_id=?", (worker_id,)).fetchone())
        return int(rows[0])

    async def worker_histories(self, worker_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """``worker_history`` of many workers in three queries: discovery rates a whole market at once."""
        def count(c: sqlite3.Connection) -> dict[str, tuple[int, int]]:
            wanted = set(worker_ids)
            ok: Counter[str] = Counter()
            bad: Counter[str] = Counter()
            rows = c.execute("SELECT worker_id, status, COUNT(*) FROM checkpoints WHERE status IN (?, ?) "
                             "GROUP BY worker_id, status", ("accepted", "rejected"))
            for worker, status, n in rows:
                (ok if status == "accepted" else bad)[worker] += int(n)
            for worker, n in c.execute("SELECT worker_id, COUNT(*) FROM strikes GROUP BY worker_id"):
                bad[worker] += int(n)
            return {w: (ok[w], bad[w]) for w in wanted}
        return await self._run(count)

    async def worker_history(self, worker_id: str) -> tuple[int, int]:
        """(accepted, rejected-or-struck) checkpoints across all trainings, for reputation."""
        def count(c: sqlite3.Connection) -> tuple[int, int]:
            sql = "SELECT COUNT(*) FROM checkpoints WHERE worker_id=? AND status=?"
            ok = c.execute(sql, (worker_id, "accepted")).fetchone()
            bad = c.execute(sql, (worker_id, "rejected")).fetchone()
            struck = c.execute("SELECT COUNT(*) FROM strikes WHERE worker_id=?", (worker_id,)).fetchone()
            return int(ok[0]), int(bad[0]) + int(struck[0])
        return await self._run(count)


def _put_intent(c: sqlite3.Connection, intent: ChainIntent) -> None:
    c.execute("INSERT OR REPLACE INTO intents VALUES (?,?,?,?,?)",
              (intent.intent_id, intent.training_id, intent.kind, intent.status, intent.model_dump_json()))


def _upsert_training(c: sqlite3.Connection, record: TrainingRecord) -> None:
    c.execute("INSERT INTO trainings VALUES (?,?,?,?) ON CONFLICT(training_id) DO UPDATE SET "
              "phase=excluded.phase, data=excluded.data, updated_at=excluded.updated_at",
              (record.training_id, record.phase.value, record.model_dump_json(), time.time()))
