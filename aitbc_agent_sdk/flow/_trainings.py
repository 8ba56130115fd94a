"""Trainings under a home: list them, read their logs, stop one (``sky status/logs/cancel``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..errors import AitbcError, ConfigError
from ..records import TrainingPhase
from ..profile import training_dir
from ..coordinator.round._stopping import STOPPED_REASON
from ._steps import coordinator_log, db_path, devnet_agent, load_training

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from ..coordinator import Coordinator

LogSource = Literal["auto", "coordinator", "audit"]


@dataclass(frozen=True)
class TrainingSummary:
    training_id: str
    phase: str
    round: int
    rounds: int
    workers: int  # under a worker contract now
    target_workers: int
    model_type: str
    driven: bool  # a coordinator process holds the training's lock
    created_at: float


def is_driven_now(home: Path, training_id: str) -> bool:
    """Like ``lock.is_driven``, without creating the lock file of a training that never had one."""
    from ..coordinator._lock import is_driven

    return (training_dir(home, training_id) / "coordinator.lock").exists() and is_driven(home, training_id)


async def list_trainings(home: Path) -> list[TrainingSummary]:
    """Every training of this home, newest first; an empty home stays empty (no database made)."""
    from ..coordinator._training_db import TrainingDatabase

    if not db_path(home).exists():
        return []
    out = []
    async with TrainingDatabase(db_path(home)) as db:
        for r in await db.trainings():
            workers = len(await db.contracts(r.training_id, "worker"))
            out.append(TrainingSummary(r.training_id, r.phase.value, r.round, r.spec.rounds, workers,
                                       r.spec.target_workers, r.spec.model_type,
                                       is_driven_now(home, r.training_id), r.created_at))
    return sorted(out, key=lambda s: s.created_at, reverse=True)


# -- logs ------------------------------------------------------------------------------------
def log_file(home: Path, training_id: str, source: LogSource = "auto") -> tuple[Path, Literal["coordinator", "audit"]]:
    """The coordinator daemon's log when it has one (``auto``), else the hash-chained audit log."""
    coordinator = coordinator_log(home, training_id)
    if source == "coordinator" or (source == "auto" and coordinator.exists()):
        return coordinator, "coordinator"
    return training_dir(home, training_id) / "audit.jsonl", "audit"


def audit_text(raw: str) -> str:
    """One audit line, readable: time, event, fields."""
    try:
        entry = json.loads(raw)
        fields = " ".join(f"{k}={v}" for k, v in entry["fields"].items())
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry["ts"]))
        return f"{stamp} #{entry['seq']} {entry['event']} {fields}".rstrip()
    except (ValueError, KeyError, TypeError):
        return raw  # a damaged line is shown as it is; `audit` says what is wrong with it


def _complete_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """Whole lines written after byte ``offset`` (a line still being written waits)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
    except FileNotFoundError:
        return [], offset
    end = chunk.rfind(b"\n") + 1
    return chunk[:end].decode(errors="replace").splitlines(), offset + end


async def log_lines(home: Path, training_id: str, source: LogSource = "auto", *, follow: bool = False,
                    interval: float = 0.5, raw: bool = False) -> AsyncIterator[str]:
    """The training's log lines; with ``follow``, new ones as they come until it ends. An audit log's
    lines are made readable (``audit_text``) unless ``raw``."""
    from ..coordinator._phases import is_terminal

    await load_training(home, training_id)  # an unknown id fails here
    path, kind = log_file(home, training_id, source)
    if not follow and not path.exists():
        raise ConfigError(f"no {kind} log for {training_id} at {path}")
    offset, ended_at = 0, None
    while True:
        if ended_at is None and follow and is_terminal((await load_training(home, training_id)).phase):
            ended_at = time.monotonic()
        lines, offset = _complete_lines(path, offset)
        for line in lines:
            yield audit_text(line) if kind == "audit" and not raw else line
        if not follow:
            return
        # Ended: the daemon still writes its last lines until it lets go of the lock.
        if ended_at is not None and (not is_driven_now(home, training_id) or time.monotonic() - ended_at > 5):
            for line in _complete_lines(path, offset)[0]:
                yield audit_text(line) if kind == "audit" and not raw else line
            return
        await asyncio.sleep(interval)


# -- stop --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stopped:
    training_id: str
    daemon_pid: int | None  # the coordinator daemon ended, if one ran
    paid_wei: int
    refunded_wei: int
    refund_tx: str | None


def daemon_pid(home: Path, training_id: str) -> int | None:
    """The pid of this training's coordinator daemon, only if that process is still the daemon."""
    try:
        pid = int((training_dir(home, training_id) / "coordinator.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    # The pid may have been reused since: check it is the daemon, for this training.
    if b"aitbc_agent_sdk.flow._daemon" in cmdline and training_id.encode() in cmdline:
        return pid
    return None


async def end_daemon(home: Path, training_id: str, timeout: float = 30.0) -> int | None:
    """SIGTERM the training's coordinator daemon and wait until its lock is free."""
    pid = daemon_pid(home, training_id)
    if pid is None:
        if is_driven_now(home, training_id):
            raise ConfigError(f"training {training_id} is driven by a process that is not its coordinator "
                              "daemon (an in-process run or an agent with auto_resume); stop that process")
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while is_driven_now(home, training_id):
        if time.monotonic() > deadline:
            raise AitbcError(f"the coordinator daemon {pid} did not exit within {timeout:.0f}s of SIGTERM")
        await asyncio.sleep(0.1)
    return pid


async def stop_training(home: Path, training_id: str, account: LocalAccount) -> Stopped:
    """End a training for good, as ``sky cancel`` does: stop its coordinator daemon, tell the workers to
    drop their jobs, pay the rounds already accepted, refund the rest, and mark it failed (``stopped``)."""
    from ..coordinator._lock import training_lock
    from ..coordinator._phases import is_terminal
    from ..coordinator.round._run import wind_down  # torch and web3: only when a training is stopped

    record = await load_training(home, training_id)
    if is_terminal(record.phase):
        raise ConfigError(f"training {training_id} already ended ({record.phase.value}); nothing to stop")
    pid = await end_daemon(home, training_id)
    with training_lock(home, training_id):  # no daemon may start driving it meanwhile
        async with devnet_agent(home, account) as agent:
            paid, refunded, tx = await wind_down(agent.coordinator, training_id)
    return Stopped(training_id, pid, paid, refunded, tx)


# -- an interrupted in-process run (Ctrl-C, SIGTERM on `run`) ------------------------------------
@dataclass(frozen=True)
class Interrupted:
    """What settling an interrupted run did: the accepted rounds paid, the rest refunded, as ``stop`` does."""

    training_id: str | None  # None: interrupted before a training was written, so nothing was funded
    accepted_rounds: int = 0
    workers_paid: int = 0
    paid_wei: int = 0
    refunded_wei: int = 0  # back at once
    held_wei: int = 0  # the escrow keeps it for the workers' receipts until held_until, then it can be reclaimed
    held_until: int | None = None
    funded: bool = False


async def settle_interrupted(coordinator: Coordinator, known: set[str]) -> Interrupted:
    """Settle the training an interrupted run wrote (the one not in ``known``): pay its accepted rounds,
    refund the rest and mark it failed (``wind_down``). One that had already ended (it failed while being
    funded, and was refunded then) is only reported."""
    from ..coordinator._phases import is_terminal
    from ..coordinator.round._run import wind_down

    new = [r for r in await coordinator.db.trainings() if r.training_id not in known]
    if not new:
        return Interrupted(None)
    record = max(new, key=lambda r: r.created_at)
    tid = record.training_id
    if not is_terminal(record.phase):
        await wind_down(coordinator, tid)
    escrow = await coordinator.db.escrow(tid)
    if escrow is None:
        return Interrupted(tid)
    # A round counts once a worker's result in it was accepted (and so paid), aggregated or not.
    accepted = {c.round for c in await coordinator.db.checkpoints(tid, "accepted")}
    paid_to = {p.worker_id for p in await coordinator.db.payments(tid) if p.amount_wei > 0}
    return Interrupted(tid, accepted_rounds=max(accepted, default=0), workers_paid=len(paid_to),
                       paid_wei=escrow.paid_wei, refunded_wei=escrow.refunded_wei, held_wei=escrow.held_wei,
                       held_until=escrow.held_until, funded=True)
