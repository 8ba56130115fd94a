"""Agent and AgentConfig: the async facade the seed scenario is written against.

    async with Agent(AgentConfig(name="distributed-training")) as agent:
        report = await agent.run_distributed_training(TrainingSpec(model_type="mlp", target_workers=4))
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path

from eth_account.signers.local import LocalAccount
from typing import Any

from .config import AgentConfig, default_home
from .coordinator import (
    Coordinator, EscrowAccount, RunRequest, TrainingDatabase, is_terminal, resume_training,
    run_training,
)
from .coordinator.round._liveness import ping
from .coordinator._lock import training_lock
from .coordinator.round._run import Prepared
from .coordinator.data._export import export_model
from .coordinator.data._generation import SampleRequest, sample_text
from .errors import AitbcError, ConfigError, NotEnoughWorkersError
from .records._datasets import TargetKind
from .market import ScoringStrategy, WeightedScore
from .messaging import SignedChannel
from .records import (
    AggregateResult, CheckpointRef, EscrowSummary, ExportResult, JobAssignment, JobConfig, Payment, Progress,
    RoundMetrics, SampleResult, Settlement, Shard, TaskRef, TrainingPhase, TrainingRecord, TrainingReport, TrainingSpec,
    TrainingStatus, Worker, WorkerContract,
)
from ._stack import Stack, build_stack
from .aggregate._aggregation import FedAvg

__all__ = ["Agent", "AgentConfig", "default_home"]


class Agent:
    """One coordinating agent. Nothing is global: several can run in one process."""

    def __init__(self, config: AgentConfig | None = None, *, account: LocalAccount | None = None,
                 scoring: ScoringStrategy | None = None, observer: Any = None) -> None:
        self.config = config or AgentConfig()
        self._account = account
        self.scoring = scoring or WeightedScore()
        self._observer = observer
        self._exits: AsyncExitStack | None = None
        self._stack: Stack | None = None
        self._coordinator: Coordinator | None = None
        self.resumed: dict[str, asyncio.Task[Any]] = {}  # training id -> its resumed driver

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> Agent:
        if self._exits is not None:
            raise AitbcError("agent already started")
        exits = AsyncExitStack()
        try:
            cfg = self.config
            stack = await build_stack(cfg, self._account, exits)
            db = await exits.enter_async_context(TrainingDatabase(cfg.home / "aitbc.db"))
            settings = cfg.coordinator
            if settings.audit_dir is None:  # an agent keeps its trainings' audit logs in its home
                settings = settings.model_copy(update={"audit_dir": cfg.home / "trainings"})
            if settings.task_dir is None:
                settings = settings.model_copy(update={"task_dir": cfg.home / "tasks"})
            if settings.data_dir is None:
                settings = settings.model_copy(update={"data_dir": cfg.home / "datasets"})
            if settings.min_stake_wei is None and cfg.network == "embedded":  # its providers are our processes
                settings = settings.model_copy(update={"min_stake_wei": 0})
            coordinator = Coordinator(
                channel=SignedChannel(stack.bus, stack.account), store=stack.store, db=db,
                escrow=EscrowAccount(stack.sender, stack.escrow), scoring=self.scoring, aggregation=FedAvg,
                settings=settings, observer=self._observer, registry=stack.registry)
            exits.push_async_callback(coordinator.close)
        except BaseException:
            await exits.aclose()
            raise
        self._exits, self._stack, self._coordinator = exits, stack, coordinator
        if cfg.auto_resume:
            await self.resume_unfinished()
        return self

    async def stop(self) -> None:
        for task in self.resumed.values():
            task.cancel()
        await asyncio.gather(*self.resumed.values(), return_exceptions=True)
        exits, self._exits = self._exits, None
        self._stack = self._coordinator = None
        if exits is not None:
            await exits.aclose()

    async def __aenter__(self) -> Agent:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def coordinator(self) -> Coordinator:
        if self._coordinator is None:
            raise AitbcError("agent not started: use 'async with Agent(...)' or 'await agent.start()'")
        return self._coordinator

    @property
    def stack(self) -> Stack:
        if self._stack is None:
            raise AitbcError("agent not started")
        return self._stack

    @property
    def address(self) -> str:
        return self.coordinator.address

    # -- the whole thing -------------------------------------------------------------------
    async def run_distributed_training(self, spec: TrainingSpec, *, dataset: str | Path = "digits",
                                       label_column: str | None = None, min_gpu: str | None = None,
                                       prepared: Prepared | None = None) -> TrainingReport:
        """``prepared``: what :func:`~.coordinator._run.prepare` returned for a cost preview, so the
        workers priced are the workers hired (and the market is not asked twice)."""
        return await run_training(self.coordinator, RunRequest(spec=spec, dataset=dataset,
                                                               label_column=label_column, min_gpu=min_gpu),
                                  prepared)

    async def resume_training(self, training_id: str) -> Settlement | None:
        """Carry on a funded training whose coordinator died (None if it had ended)."""
        lock = ExitStack()
        lock.enter_context(training_lock(self.config.home, training_id))
        return await self._resume_holding(training_id, lock)

    async def _resume_holding(self, training_id: str, lock: ExitStack) -> Settlement | None:
        with lock:
            outcome = await resume_training(self.coordinator, training_id)
        return outcome[0] if outcome else None

    async def resume_unfinished(self) -> list[str]:
        """Start resuming, in the background, every unfinished funded training of this coordinator
        that no other process drives; ``self.resumed`` holds the tasks."""
        for record in await self.coordinator.db.trainings():
            tid = record.training_id
            if (is_terminal(record.phase) or record.coordinator != self.address
                    or await self.coordinator.db.escrow(tid) is None
                    or not (await self.coordinator.escrow.state(tid)).exists):
                continue
            lock = ExitStack()
            try:  # taken here, before the task starts, so no second driver can slip in between
                lock.enter_context(training_lock(self.config.home, tid))
            except ConfigError:
                continue  # another process drives it
            self.resumed[tid] = asyncio.create_task(self._resume_holding(tid, lock))
        return list(self.resumed)

    # -- the seed scenario's steps -----------------------------------------------------------
    async def initialize_distributed_training(self, model_type: str, target_workers: int, *,
                                              dataset_size: int | None = None, rounds: int = 5,
                                              **spec: Any) -> TrainingRecord:
        return await self.coordinator.initialize(TrainingSpec(
            model_type=model_type, target_workers=target_workers, dataset_size=dataset_size, rounds=rounds, **spec))

    async def upload_to_ipfs(self, *, path: str | Path | None = None, data: bytes | None = None,
                             pin: bool = True) -> str:
        return await self.coordinator.upload(path=path, data=data, pin=pin)

    async def upload_training_data(self, training_id: str, path: str | Path, *, label_column: str | None = None,
                                   target: TargetKind | None = None, vocab_size: int | None = None) -> str:
        """``vocab_size``: learn a BPE of that many tokens on a text corpus (None: byte-level tokens)."""
        return await self.coordinator.attach_dataset(training_id, path, label_column=label_column, target=target,
                                                     vocab_size=vocab_size)

    async def create_data_shards(self, training_id: str, num_shards: int) -> list[Shard]:
        return await self.coordinator.create_shards(training_id, num_shards)

    async def discover_gpu_workers(self, *, min_gpu: str | None = None, required_workers: int | None = None,
                                   max_price_wei: int | None = None, include_busy: bool = False,
                                   task: TaskRef | None = None, min_stake_wei: int | None = None,
                                   fit: TrainingSpec | None = None) -> list[Worker]:
        """Providers that fit; with ``task``, only those that run it (user code: their offer says so); only
        those bonded with ``min_stake_wei`` (None: the network's minimum); with ``fit``, only those that can
        hold its model (its measured footprint)."""
        workers = await self.coordinator.discover(min_gpu=min_gpu, max_price_wei=max_price_wei,
                                                  include_busy=include_busy, task=task, min_stake_wei=min_stake_wei,
                                                  fit=fit)
        if required_workers is not None and len(workers) < required_workers:
            raise NotEnoughWorkersError(f"asked for {required_workers} workers, found {len(workers)}")
        return workers

    async def select_best_workers(self, workers: Sequence[Worker], count: int) -> list[Worker]:
        return self.coordinator.select(workers, count)

    async def negotiate_worker_contract(self, worker_id: str, training_id: str, price: int) -> WorkerContract:
        return await self.coordinator.negotiate(worker_id, training_id, price)

    async def fund_escrow(self, training_id: str) -> str:
        return await self.coordinator.money.fund_escrow(training_id)

    async def send_training_job(self, worker_id: str, training_id: str, shard_id: str,
                                config: JobConfig | Mapping[str, Any] | None = None) -> JobAssignment:
        job_config = config if isinstance(config, JobConfig) else JobConfig(**(config or {}))
        return await self.coordinator.send_job(worker_id, training_id, shard_id, job_config)

    async def get_worker_progress(self, job_id: str) -> Progress:
        return await self.coordinator.progress(job_id)

    async def collect_checkpoint(self, worker_id: str, job_id: str) -> CheckpointRef:
        return await self.coordinator.collect_checkpoint(worker_id, job_id)

    async def federated_average(self, checkpoints: Sequence[CheckpointRef],
                                weights: Sequence[float] | None = None) -> AggregateResult:
        return await self.coordinator.federated_average(checkpoints, weights)

    async def save_training_results(self, training_id: str, model_cid: str,
                                    metrics: Mapping[str, Any] | None = None) -> RoundMetrics:
        return await self.coordinator.save_results(training_id, model_cid, dict(metrics or {}))

    async def update_training_phase(self, training_id: str, phase: TrainingPhase | str) -> TrainingRecord:
        return await self.coordinator.update_phase(training_id, phase)

    async def get_training_status(self, training_id: str) -> TrainingStatus:
        return await self.coordinator.status(training_id)

    async def process_payment(self, worker_id: str, contract_id: str, amount: int) -> Payment:
        contract = await self.coordinator.db.contract(contract_id)
        if contract.worker_id != worker_id:
            raise ConfigError(f"contract {contract_id} belongs to {contract.worker_id}, not {worker_id}")
        payments = await self.coordinator.money.pay(contract.training_id, worker_id, amount_wei=amount)
        return payments[0]

    async def settle_training(self, training_id: str) -> Settlement:
        return await self.coordinator.money.settle(training_id)

    async def refund_remainder(self, training_id: str) -> int:
        refunded, _ = await self.coordinator.escrow.refund(training_id)
        return refunded

    async def escrow_summary(self, training_id: str) -> EscrowSummary:
        return await self.coordinator.escrow.summary(training_id)

    async def payments(self, training_id: str) -> list[Payment]:
        return await self.coordinator.db.payments(training_id)

    # -- the seed's fault-tolerant loop (Example 3) ------------------------------------------
    # The round loop itself detects, replaces and verifies (coordinator/rounds.py); these let a
    # program watch it the way the seed's loop does.
    async def get_all_workers(self, training_id: str) -> list[WorkerContract]:
        """Every contract of the training: its workers, spares and the workers they replaced."""
        return await self.coordinator.db.contracts(training_id)

    async def ping_worker(self, worker_id: str, timeout: float = 2.0) -> bool:
        return await ping(self.coordinator.channel, worker_id, timeout)

    async def get_worker_job(self, training_id: str, worker_id: str) -> JobAssignment | None:
        """The worker's job in the training's current round, if it has one."""
        record = await self.coordinator.db.training(training_id)
        jobs = [j for j in await self.coordinator.db.jobs(training_id, record.round + 1) if j.worker_id == worker_id]
        return jobs[-1] if jobs else None

    async def get_all_checkpoints(self, training_id: str) -> list[CheckpointRef]:
        return await self.coordinator.db.checkpoints(training_id, None)

    async def verify_checkpoint(self, checkpoint: CheckpointRef) -> bool:
        """Fetched intact by CID, signed by its worker, and shaped like the model with finite values."""
        return await self.coordinator.checkpoint_fits(checkpoint)

    # -- the trained model -------------------------------------------------------------------
    async def sample_text(self, training_id: str, prompt: str, *, tokens: int = 200, temperature: float = 0.8,
                          top_k: int | None = 40, seed: int = 0) -> SampleResult:
        """Text from the training's current language model after ``prompt`` (byte-level tokens, sampled on
        the CPU; ``temperature`` 0 is greedy). A classifier, or a training with no model yet: NotSampleableError."""
        c = self.coordinator
        return await sample_text(c.store, c.data, c.tasks, await c.db.training(training_id),
                                 SampleRequest(prompt, tokens, temperature, top_k, seed))

    async def export_model(self, training_id: str, out: str | Path, *, round: int | None = None,  # noqa: A002
                           format: str = "safetensors") -> ExportResult:  # noqa: A002
        """Write the training's global model after ``round`` (None: the last round done) into the new directory
        ``out``: ``safetensors`` (any task: weights with their provenance, and a model card) or ``hf`` (the
        built-in gpt as a ``transformers`` GPT-2 with its tokenizer). No model yet, no such round, ``hf`` for
        another task or an ``out`` that holds files: NotExportableError, and ``out`` is left as it was."""
        c = self.coordinator
        return await export_model(c.store, c.data, c.tasks, await c.db.training(training_id),
                                  await c.db.rounds(training_id), Path(out), round_=round, format_=format)
