"""The seed's step-by-step flow, one function per step: create, upload, hire, distribute, resume.

Each step is its own process in the CLI (``aitbc distributed-training init`` ...) and a tool in
the assistant; both call these, so a training started from chat is the one the CLI starts.
"""

from __future__ import annotations

import asyncio
import csv
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import AitbcError, ConfigError, DatasetError, NotEnoughWorkersError, NotFoundError
from ..market._discovery import resolve_min_stake
from ..records import TrainingPhase, TrainingRecord, TrainingSpec, largest_machine
from ..records._footprint import describe
from ..records._datasets import TargetKind
from ..profile import training_dir
from ._costs import CostPreview, checks_where, preview

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from .._agent import Agent

Ready = Callable[[], Awaitable[bool]]


def db_path(home: Path) -> Path:
    return home / "aitbc.db"


def coordinator_log(home: Path, training_id: str) -> Path:
    return training_dir(home, training_id) / "coordinator.log"


async def load_training(home: Path, training_id: str) -> TrainingRecord:
    from ..coordinator._training_db import TrainingDatabase

    if not db_path(home).exists():  # opening would create an empty database
        raise NotFoundError(f"no training {training_id!r}: no trainings yet in {home}")
    async with TrainingDatabase(db_path(home)) as db:
        return await db.training(training_id)


async def wallet_of(home: Path, training_id: str) -> str:
    record = await load_training(home, training_id)
    if record.wallet is None:
        raise ConfigError(f"training {training_id} has no wallet recorded")
    return record.wallet


@asynccontextmanager
async def devnet_agent(home: Path, account: LocalAccount, name: str = "aitbc-cli") -> AsyncIterator[Agent]:
    """A devnet agent signing as ``account``, its JSON-RPC session closed on the way out."""
    from .._agent import Agent
    from ..config import AgentConfig

    async with Agent(AgentConfig(name=name, network="devnet", home=home), account=account) as agent:
        w3 = agent.stack.sender.w3
        try:
            yield agent
        finally:
            # The devnet stack leaves its session open; one process may run several agents.
            await w3.provider.disconnect()


async def create_training(agent: Agent, spec: TrainingSpec, wallet: str) -> TrainingRecord:
    """Step 1: the training's record; nothing is spent."""
    return await agent.coordinator.initialize(spec, wallet=wallet)


def dataset_source(data_path: str | Path) -> str | Path:
    """'digits' (the bundled set), an existing file or a directory; ConfigError otherwise."""
    if str(data_path) == "digits":
        return "digits"
    path = Path(data_path).expanduser()
    if not path.exists():
        raise ConfigError(f"dataset not found: {path} (give a .npz, .pt or .csv file, a directory of .txt files, "
                          "of CLASS/ image folders or of your task's files, or 'digits')")
    return path


def check_dataset(source: str | Path, label_column: str | None = None, target: TargetKind | None = None,
                  vocab_size: int | None = None) -> None:
    """What can be checked without reading the data, before anything connects: its kind, a CSV's label column,
    a vocabulary size (text corpora only). The rows themselves are checked as they stream into the store (a bad
    one stops the import, exit 2)."""
    from ..data._bpe import check_vocab_size
    from ..data._dataset_dirs import dataset_kind

    check_vocab_size(vocab_size)
    if source == "digits":
        if vocab_size is not None:
            raise DatasetError("--vocab-size applies to a text corpus (a directory of .txt files), not to digits")
        return
    path = Path(source)
    if (kind := dataset_kind(path)) != "tokens" and vocab_size is not None:
        raise DatasetError(f"{path}: --vocab-size applies to a text corpus (a directory of .txt files), not to "
                           f"{kind} data")
    if path.is_file() and path.suffix.lower() == ".csv":
        try:
            with path.open(newline="") as fh:
                header = [h.strip() for h in next(csv.reader(fh), [])]
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{source}: not UTF-8 text (byte {exc.start}); save the CSV as UTF-8") from exc
        except OSError as exc:
            raise DatasetError(f"{source}: cannot read it ({type(exc).__name__}: {exc})") from exc
        if label_column is None and target != "none":
            raise DatasetError(f"{path}: name the target column with --label-column, or pass --target none")
        if label_column is not None and label_column not in header:
            raise DatasetError(f"{path}: no label column {label_column!r}; columns are {header}")


async def upload_data(agent: Agent, training_id: str, source: str | Path, label_column: str | None = None,
                      target: TargetKind | None = None, vocab_size: int | None = None) -> str:
    """Step 2: validate the dataset and store it by CID (``target``: its kind; None: the training's, or detected;
    ``vocab_size``: a text corpus's BPE vocabulary, None: byte-level tokens)."""
    return await agent.upload_training_data(training_id, source, label_column=label_column, target=target,
                                            vocab_size=vocab_size)


async def dataset_target(agent: Agent, dataset_cid: str) -> TargetKind | None:
    """The target kind a stored dataset was recorded with (None: not labelled arrays, e.g. a text corpus)."""
    manifest = await agent.coordinator.data.manifest(dataset_cid)
    return manifest.arrays.target if manifest.arrays is not None else None


def target_line(kind: TargetKind | None, chosen: bool) -> str | None:
    """What a user reads about the target before paying: detection can guess wrong, so it says how to override."""
    if kind is None:
        return None
    if chosen:
        return f"target: {kind} (--target)"
    others = " or ".join(k for k in ("classes", "values", "none") if k != kind)
    return f"target: {kind}, detected from the data (--target {others} to override)"


@dataclass(frozen=True)
class HiredWorker:
    worker_id: str
    role: str
    gpu: str
    price_wei: int
    reputation: float
    score: float
    contract_id: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


async def hire_workers(agent: Agent, training_id: str, required: int | None = None, *, min_gpu: str | None = None,
                       max_price_wei: int | None = None) -> list[HiredWorker]:
    """Step 3: discover offers, score them, sign contracts with the best (plus the training's spares)."""
    from ..coordinator.round._reassign import hire

    record = await agent.coordinator.db.training(training_id)
    wanted = required or record.spec.target_workers
    workers = await agent.discover_gpu_workers(min_gpu=min_gpu, max_price_wei=max_price_wei, task=record.spec.task,
                                               min_stake_wei=record.spec.min_stake_wei, fit=record.spec)
    if not workers and record.spec.footprint is not None and (offered := agent.coordinator.fit_skipped):
        raise ConfigError(f"no provider can hold this model: {describe(record.spec.footprint, record.spec.job.batch_size)}"
                          f"; {largest_machine(offered)} (a smaller --batch-size or model needs less)")
    if len(workers) < wanted:
        cap = f" at or under {max_price_wei} wei" if max_price_wei is not None else ""
        raise NotEnoughWorkersError(f"asked for {wanted} workers ({min_gpu or 'any hardware'}{cap}); "
                                    f"{len(workers)} suitable offers on the market"
                                    f"{agent.coordinator.stake_note(record.spec.min_stake_wei)}")
    scores = dict(zip([w.worker_id for w in workers], agent.scoring.score(workers), strict=True))
    ranked = await agent.select_best_workers(workers, wanted + record.spec.spare_workers)
    by_id = {w.worker_id: w for w in ranked}
    audit = agent.coordinator.logs.of(training_id)
    contracts = await hire(agent.coordinator, audit, training_id, ranked[:wanted], ranked[wanted:])
    return [HiredWorker(c.worker_id, c.role, by_id[c.worker_id].gpu_type, c.price_wei,
                        by_id[c.worker_id].reputation, float(scores[c.worker_id]), c.contract_id)
            for c in contracts]


async def distribution_cost(home: Path, training_id: str) -> CostPreview:
    """What ``distribute`` will deposit, from the contracts signed (no chain, no writes)."""
    from ..coordinator._training_db import TrainingDatabase

    record = await load_training(home, training_id)
    _check_distributable(record)
    async with TrainingDatabase(db_path(home)) as db:
        workers = await db.contracts(training_id, "worker")
        spares = await db.contracts(training_id, "spare")
    if not workers:
        raise ConfigError(f"no workers under contract for {training_id}; run discover-workers first")
    return preview([c.price_wei for c in workers], [c.price_wei for c in spares], record.spec.rounds,
                   min_stake_wei=min_stake_of(record.spec), spot_checks=record.spec.faults.spot_checks,
                   segments=record.spec.job.segments,
                   verify_on=checks_where(record.spec.faults, record.spec.footprint),
                   canary_rate=record.spec.faults.canary_rate)


def min_stake_of(spec: TrainingSpec) -> int:
    """The bond a step-by-step (devnet) training hires at: its own minimum, else the default; the devnet is
    never the embedded network."""
    return resolve_min_stake(spec.min_stake_wei, None)


def _check_distributable(record: TrainingRecord) -> None:
    if record.phase != TrainingPhase.INITIALIZING:
        raise ConfigError(f"training {record.training_id} is already {record.phase.value}")
    if record.dataset_cid is None:
        raise ConfigError(f"no dataset for {record.training_id}; run upload-data first")


@dataclass(frozen=True)
class Started:
    """A detached coordinator daemon now drives the training."""

    training_id: str
    pid: int
    log: Path
    escrow_tx: str | None = None
    workers: int = 0
    round: int = 0
    phase: str = ""


async def distribute(home: Path, training_id: str, account: LocalAccount, password: str) -> Started:
    """Step 4: fund the escrow, shard the data, and start the detached coordinator daemon."""
    async with devnet_agent(home, account) as agent:
        record = await agent.coordinator.db.training(training_id)
        _check_distributable(record)
        contracts = await agent.coordinator.db.contracts(training_id, "worker")
        if not contracts:
            raise ConfigError(f"no workers under contract for {training_id}; run discover-workers first")
        await agent.coordinator.money.check_budget(training_id)  # before anything is written
        await agent.create_data_shards(training_id, len(contracts))
        tx = await agent.fund_escrow(training_id)
    assert record.wallet is not None
    pid = await start_coordinator(home, record.wallet, password, training_id)
    return Started(training_id, pid, coordinator_log(home, training_id), escrow_tx=tx, workers=len(contracts))


def resume_blocker(home: Path, record: TrainingRecord) -> str | None:
    """Why ``resume`` has nothing to do for this training, or None when it can go on."""
    from ..coordinator._lock import is_driven
    from ..coordinator._phases import is_terminal

    if is_terminal(record.phase):
        return f"training {record.training_id} already ended ({record.phase.value}); nothing to resume"
    if is_driven(home, record.training_id):
        return f"training {record.training_id} already has a running coordinator"
    return None


async def resume(home: Path, training_id: str, password: str) -> Started:
    """Carry on a funded training whose coordinator died, in a new detached daemon."""
    record = await load_training(home, training_id)
    if (reason := resume_blocker(home, record)) is not None:
        raise ConfigError(reason)
    wallet = await wallet_of(home, training_id)
    pid = await start_coordinator(home, wallet, password, training_id, resume=True)
    return Started(training_id, pid, coordinator_log(home, training_id), round=record.round,
                   phase=record.phase.value)


async def start_coordinator(home: Path, wallet: str, password: str, training_id: str, *, resume: bool = False,
                            timeout: float = 60.0) -> int:
    """Spawn the daemon and return its pid once it has taken the training over (or fail with its log)."""
    from ._daemon import spawn_coordinator
    from ..coordinator._lock import is_driven

    proc = spawn_coordinator(home, wallet, password, training_id, resume=resume)
    if resume:
        async def ready() -> bool:
            return is_driven(home, training_id)
        what = "take the training over"
    else:
        async def ready() -> bool:
            return (await load_training(home, training_id)).phase != TrainingPhase.INITIALIZING
        what = "start the training"
    await wait_for_daemon(ready, home, training_id, proc.pid, what, timeout)
    return proc.pid


async def wait_for_daemon(ready: Ready, home: Path, training_id: str, pid: int, what: str,
                          timeout: float = 60.0) -> None:
    """Return once ``ready()``; fail with the daemon's last log lines if it exited first."""
    from ..devnet._service import pid_alive, tail

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await ready():
            return
        if not pid_alive(pid):
            raise AitbcError(f"the coordinator daemon exited; last log lines:\n"
                             f"{tail(coordinator_log(home, training_id))}")
        await asyncio.sleep(0.2)
    raise AitbcError(f"the coordinator daemon did not {what} within {timeout:.0f}s")
