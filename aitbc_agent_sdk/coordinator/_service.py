"""The coordinator's operations, one method per step of the seed scenario.

Each method does one step against the ports it was given (bus channel, content
store, SQLite, escrow); the round loop that strings them together lives in
``coordinator.run`` and in the scenario scripts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..chain._registry import RegistryClient
from ..errors import ConfigError, MessagingError, NotFoundError
from ..market import (
    OfferBook, ScoringStrategy, meets_min_gpu, rank_workers, reputation_unit,
)
from ..market._discovery import leave_out_held, resolve_min_stake, split_by_stake, stake_skip_text
from ..market._scoring import rate_worker
from ..messaging import SignedChannel, topics
from ..records import (
    UNCONFIRMED_CLASS, AggregateResult, CheckpointRef, ContractProposal, ContractReply, Hardware, JobAssignment,
    JobConfig, ModelSpec, Offer, Progress, RoundMetrics, Shard, ShardManifest, TaskRef, TrainingPhase, TrainingRecord, TrainingSpec,
    TrainingStatus, Worker, WorkerContract, fit_problem, new_id, reported_accuracy,
)
from ..storage import ContentStore
from ..tracking import experiment_log_problems
from ..aggregate._aggregation import AggregationStrategy, FedAvg
from ..data._datasets import LabeledData
from ..wire._checkpoint import decode_state
from ..records._datasets import DatasetManifest, TargetKind
from ..tasks._bound_task import rehearsal_size
from ..data._dataset_dirs import manifest_shape
from ..data._file_sharding import partition_problem
from .data._datasets import DatasetStore
from .checks._hardware import check_hardware
from .data._sealing import JobKeys
from .data._inputs import RoundInputs, load_round_inputs, new_job
from ._listener import Observer, TrainingListener
from ._logbook import AuditLogs, audit_path
from .money._money import EscrowSteps
from ._phases import check_transition
from .money._receipts import ReceiptIssuer
from .round._results import SeedResults
from .round._round_times import RoundTimes
from ._settings import CoordinatorSettings
from .money._settlement import EscrowAccount
from .data._sharding import publish_shards
from .data._tasks import TaskCache, spec_for_dataset
from .round._stats import RoundStats
from ._training_db import TrainingDatabase

__all__ = ["Coordinator", "CoordinatorSettings", "audit_path"]  # audit_path: where tests and tools read a log
log = logging.getLogger(__name__)


@dataclass
class Coordinator:
    channel: SignedChannel
    store: ContentStore
    db: TrainingDatabase
    escrow: EscrowAccount
    scoring: ScoringStrategy
    aggregation: Callable[[], AggregationStrategy] = FedAvg
    settings: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    observer: Observer | None = None
    registry: RegistryClient | None = None  # provider bonds and on-chain reputation, when deployed
    _listeners: dict[str, TrainingListener] = field(default_factory=dict)
    # provider -> why the latest discovery flagged its offer (the hardware challenge); hiring logs them
    hardware_flags: dict[str, str] = field(default_factory=dict)
    # provider -> its bond, for the offers the latest discovery skipped as bonded below the minimum
    stake_skipped: dict[str, int] = field(default_factory=dict)
    # The latest discovery's offers too small for the model it was asked to fit (their hardware).
    fit_skipped: list[Hardware] = field(default_factory=list)
    # provider -> slots of it that this coordinator's starting or running trainings hold (``run``'s path):
    # trainings started together would otherwise all hire the same best offers (docs/scale.md, item 6).
    held_slots: Counter[str] = field(default_factory=Counter)
    # Spot checks take turns holding their opened states (coordinator/spot_check.py).
    spot_check_turn: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    round_times: RoundTimes = field(init=False)  # seconds per delivered round, per training and provider
    logs: AuditLogs = field(init=False)  # one audit log per training, under settings.audit_dir
    data: DatasetStore = field(init=False)  # datasets by manifest, and the splits this coordinator reads
    tasks: TaskCache = field(init=False)  # the trainings' tasks, built-in or user code by CID
    money: EscrowSteps = field(init=False)  # budget, funding, paying, settling
    job_keys: JobKeys = field(init=False)  # sealed datasets: each job carries the key wrapped for its worker
    receipts: ReceiptIssuer = field(init=False)  # each accepted round's signed, redeemable payment receipts
    results: SeedResults = field(init=False)  # the seed's results one by one, outside the round loop
    offer_book: OfferBook = field(init=False)  # the market's offers, shared by this coordinator's discoveries

    def __post_init__(self) -> None:
        self.offer_book = OfferBook(self.channel)
        self.logs = AuditLogs(self.settings.audit_dir)
        self.round_times = RoundTimes(self.db)
        self.data = DatasetStore(self.store, self.settings.data_dir)
        self.tasks = TaskCache(self.store, self.settings.task_dir)
        self.job_keys = JobKeys(self.db, self.data, self.escrow)
        self.money = EscrowSteps(self.db, self.escrow, self.logs, gas_reserve_wei=self.settings.gas_reserve_wei,
                                 observer=self.observer)
        self.receipts = ReceiptIssuer(self.channel, self.db, self.escrow, self.logs)
        self.results = SeedResults(store=self.store, db=self.db, escrow=self.escrow, logs=self.logs,
                                   receipts=self.receipts, aggregation=self.aggregation)

    @property
    def address(self) -> str:
        return self.channel.address

    async def round_inputs(self, training_id: str) -> RoundInputs:
        return await load_round_inputs(self.db, self.store, self.data, self.tasks, training_id)

    async def close(self) -> None:
        await self.offer_book.aclose()
        for listener in self._listeners.values():
            await listener.stop()
        self._listeners.clear()

    # -- set-up ----------------------------------------------------------------------------
    async def initialize(self, spec: TrainingSpec, *, wallet: str | None = None) -> TrainingRecord:
        if missing := experiment_log_problems(spec.log_to):  # refused here, long before anything is funded
            raise ConfigError("; ".join(missing))
        record = TrainingRecord(training_id=new_id("training"), spec=spec, coordinator=self.address, wallet=wallet)
        await self.db.save_training(record)
        return record

    async def upload(self, *, path: str | Path | None = None, data: bytes | None = None, pin: bool = True) -> str:
        if (path is None) == (data is None):
            raise ConfigError("give exactly one of path= or data=")
        if path is not None:
            path = Path(path)
            if path.is_dir():  # the CID `ipfs add -r` gives
                return await self.data.add_directory(path, pin=pin)
            if not path.is_file():
                raise ConfigError(f"no such file or directory: {path}")
            return await self.store.add(path, pin=pin)
        assert data is not None
        return await self.store.add(data, pin=pin)

    async def attach_dataset(self, training_id: str, source: str | Path | LabeledData, *,
                             label_column: str | None = None, target: TargetKind | None = None,
                             progress: Callable[[int], None] | None = None, vocab_size: int | None = None) -> str:
        """Import a dataset (a file, a directory, a bundled name or arrays) once and link it to the training;
        ``vocab_size``: a text corpus's BPE vocabulary (None: byte-level tokens)."""
        record = await self.db.training(training_id)
        cid, manifest = await self.data.import_dataset(source, label_column=label_column, progress=progress,
                                                       target=target or record.spec.target,
                                                       declared_size=record.spec.dataset_size,
                                                       encrypt=record.spec.encrypt,
                                                       vocab_size=vocab_size or record.spec.vocab_size)
        spec = spec_for_dataset(record.spec, manifest.kind)
        (await self.tasks.bound(spec)).model_spec(manifest_shape(manifest))  # an unknown task fails now
        if (problem := partition_problem(manifest, spec.partition)) is not None:  # before anything is funded
            raise ConfigError(problem)
        spec = await self.measured(spec, manifest)
        await self.db.save_training(record.model_copy(update={"dataset_cid": cid, "spec": spec}))
        return cid

    async def measured(self, spec: TrainingSpec, manifest: DatasetManifest) -> TrainingSpec:
        """``spec`` with its model's footprint, from a rehearsal on a sample of the data when it has none yet:
        what every proposal and job then declares, and what discovery fits providers to."""
        if spec.footprint is not None:
            return spec
        task = await self.tasks.bound(spec)
        sample = await self.data.load_sample(manifest, spec, rehearsal_size(manifest.kind))
        footprint = await asyncio.to_thread(task.rehearse, sample, spec.job, spec.seed)
        return spec.model_copy(update={"footprint": footprint})

    async def attach_data(self, training_id: str, data: LabeledData) -> str:
        return await self.attach_dataset(training_id, data)

    async def use_dataset(self, training_id: str, dataset_cid: str) -> None:
        """Link a dataset already in the store (by its manifest's CID) to the training."""
        record = await self.db.training(training_id)
        manifest = await self.data.manifest(dataset_cid)
        spec = spec_for_dataset(record.spec, manifest.kind)
        (await self.tasks.bound(spec)).model_spec(manifest_shape(manifest))
        spec = await self.measured(spec, manifest)
        await self.db.save_training(record.model_copy(update={"dataset_cid": dataset_cid, "spec": spec}))

    async def manifest(self, training_id: str) -> ShardManifest:
        return await self._manifest_of(await self.db.training(training_id))

    async def _manifest_of(self, record: TrainingRecord) -> ShardManifest:
        if record.manifest_cid is None:
            raise NotFoundError(f"training {record.training_id} has no shards yet")
        return ShardManifest.model_validate_json(await self.store.cat(record.manifest_cid))

    async def create_shards(self, training_id: str, num_shards: int) -> list[Shard]:
        """Plan the shards and the test split as slices of the dataset's files; store the round-0 model."""
        record = await self.db.training(training_id)
        if record.manifest_cid is not None:
            return list((await self._manifest_of(record)).shards)
        if record.dataset_cid is None:
            raise ConfigError(f"training {training_id} has no dataset; upload one first")
        published = await publish_shards(self.data, record, await self.data.manifest(record.dataset_cid), num_shards)
        manifest_cid = await self.store.add(published.manifest.model_dump_json(indent=1).encode())
        task = await self.tasks.bound(record.spec)
        sample = await self.data.load(await self.data.add_shard(published.prepare_sample), published.prepare_sample)
        model_cid = await self.store.add(await asyncio.to_thread(task.initial_state, sample, record.spec.seed))
        await self.db.save_shards(training_id, published.shards)
        await self.db.save_training(record.model_copy(update={"manifest_cid": manifest_cid, "model_cid": model_cid}))
        return published.shards

    # -- market ----------------------------------------------------------------------------
    async def discover(self, *, min_gpu: str | None = None, max_price_wei: int | None = None,
                       include_busy: bool = False, task: TaskRef | None = None,
                       min_stake_wei: int | None = None, fit: TrainingSpec | None = None) -> list[Worker]:
        """Providers on the market that fit; with ``task``, only those whose offer says they run it; with
        ``fit``, only those that can hold its model (its measured footprint) at its batch size.
        Only providers bonded with ``min_stake(min_stake_wei)`` or more; ``stake_skipped`` names the others.
        Offers that claim a GPU take the timed hardware challenge (``coordinator.hardware``) first."""
        offers = await self.offer_book.offers(timeout=self.settings.discovery_timeout_s)
        self.fit_skipped = []
        unit = reputation_unit([o.price_wei for o in offers])
        fitting: list[Offer] = []
        for offer in offers:
            if (offer.free_slots < 1 and not include_busy) or not meets_min_gpu(offer.hardware.gpu_type, min_gpu):
                continue
            if not offer.tasks.permits(task):
                continue
            if max_price_wei is not None and offer.price_wei > max_price_wei:
                continue
            if fit is not None and fit.footprint is not None and \
                    fit_problem(fit.footprint, fit.job.batch_size, offer.hardware) is not None:
                self.fit_skipped.append(offer.hardware)
                continue
            fitting.append(offer)
        workers = await self._workers(fitting, unit)
        floor = self.min_stake(min_stake_wei)
        workers, self.stake_skipped = split_by_stake(workers, floor)
        if self.stake_skipped:  # before the hardware challenge: an unbonded stranger costs no GPU check
            log.warning("%s: %s", stake_skip_text(len(self.stake_skipped), floor), sorted(self.stake_skipped))
        workers = await check_hardware(self.channel, self.store, workers, self.settings)
        self.hardware_flags = {w.worker_id: w.hardware_reason or "flagged" for w in workers if w.flagged}
        return workers

    def min_stake(self, requested_wei: int | None = None) -> int:
        """The bond a hire needs: a training's own minimum, else this network's."""
        return resolve_min_stake(requested_wei, self.settings.min_stake_wei)

    def stake_skips(self, requested_wei: int | None = None) -> str | None:
        """What the latest discovery left out for its bond: '2 offers skipped: stake below 0.01 ETH', or None."""
        if not self.stake_skipped:
            return None
        return stake_skip_text(len(self.stake_skipped), self.min_stake(requested_wei))

    def stake_note(self, requested_wei: int | None = None) -> str:
        """The same for a 'not enough workers' error, naming the flag that lowers it; '' when none was skipped."""
        skips = self.stake_skips(requested_wei)
        return f"; {skips} (--min-stake)" if skips else ""

    async def _workers(self, offers: Sequence[Offer], unit_wei: int) -> list[Worker]:
        """Each offer rated: reputation from the value the registry says it was paid (``unit_wei`` a job's
        worth), its failures and slashes, plus results this coordinator rejected; and its bond. One registry
        call per ``PROVIDERS_PER_CALL`` offers and one database read, whatever the market's size."""
        providers = [o.provider for o in offers]
        histories = await self.db.worker_histories(providers)
        states = await self.registry.provider_states(providers) if self.registry is not None and offers else {}
        workers = []
        for offer in offers:
            _, rejected = histories[offer.provider]
            state = states.get(offer.provider)
            done, failed, slashes, stake, earned = ((state.completed, state.failed, state.slashes, state.stake,
                                                     state.earned) if state is not None else (0, 0, 0, 0, 0))
            workers.append(rate_worker(offer, completed=done, failed=failed + rejected, slashes=slashes,
                                       stake_wei=stake, earned_wei=earned, unit_wei=unit_wei))
        return workers

    def select(self, workers: Sequence[Worker], count: int) -> list[Worker]:
        """The best ``count``, leaving out providers whose every slot another of this coordinator's trainings
        holds, unless that leaves too few (then a job queues behind another rather than a training failing)."""
        if not workers:
            return []
        pool = leave_out_held(workers, self.held_slots, count)
        return rank_workers(pool, self.scoring.score(pool), count)

    def hold(self, workers: Sequence[Worker]) -> None:
        """Count a slot of each of ``workers`` as this coordinator's until :meth:`release`."""
        self.held_slots.update(w.worker_id for w in workers)

    def release(self, workers: Sequence[Worker]) -> None:
        self.held_slots.subtract(w.worker_id for w in workers)
        for worker in [w for w, n in self.held_slots.items() if n <= 0]:
            del self.held_slots[worker]

    async def negotiate(self, worker_id: str, training_id: str, price_wei: int, *, role: str = "worker",
                        shard_index: int | None = None, rounds: int | None = None,
                        device_class: str = UNCONFIRMED_CLASS) -> WorkerContract:
        """Agree a contract for ``rounds`` (default: the whole training) at ``price_wei`` per round;
        the provider checks on chain that its slot holds ``price_wei * rounds`` before it works."""
        record = await self.db.training(training_id)
        rounds = rounds or record.spec.rounds
        proposal = ContractProposal(contract_id=new_id("contract"), training_id=training_id,
                                    coordinator=self.address, price_wei=price_wei, rounds=rounds,
                                    task=record.spec.task, footprint=record.spec.footprint,
                                    batch_size=record.spec.job.batch_size)
        reply = await self.channel.request(
            topics.negotiate(worker_id), proposal, topics.negotiate_reply(self.address, proposal.contract_id),
            ContractReply, timeout=self.settings.reply_timeout_s, expected_sender=worker_id)
        if not reply.accepted:
            raise MessagingError(f"worker {worker_id} declined: {reply.reason}")
        if not await self.escrow.consent_ok(training_id, worker_id, reply.consent):
            # Without it the escrow refuses the slot; checked now, not when funding fails.
            raise MessagingError(f"worker {worker_id} accepted without a valid consent to its escrow slot")
        contract = WorkerContract(contract_id=proposal.contract_id, training_id=training_id, worker_id=worker_id,
                                  coordinator=self.address, price_wei=price_wei, rounds=rounds,
                                  accepted_at=time.time(), role=role, shard_index=shard_index,
                                  consent=reply.consent, device_class=device_class)
        await self.db.save_contract(contract)
        return contract

    # -- jobs ------------------------------------------------------------------------------
    async def listener(self, training_id: str) -> TrainingListener:
        if training_id not in self._listeners:
            listener = TrainingListener(self.channel, self.db, training_id, self.observer)
            await listener.start()
            self._listeners[training_id] = listener
        return self._listeners[training_id]

    async def send_job(self, worker_id: str, training_id: str, shard_id: str, config: JobConfig) -> JobAssignment:
        """One job, read from the database (the seed's step); the round loop builds its jobs from its inputs."""
        record = await self.db.training(training_id)
        shard = next((s for s in await self.db.shards(training_id) if s.shard_id == shard_id), None)
        if shard is None:
            raise NotFoundError(f"no shard {shard_id!r} in training {training_id}")
        contract = next((c for c in await self.db.contracts(training_id)
                         if c.worker_id == worker_id and c.role != "replaced"), None)
        if contract is None:
            raise NotFoundError(f"worker {worker_id} has no contract for training {training_id}")
        assert record.model_cid is not None  # create_shards stores the round-0 model
        # Exact sizes of content this coordinator stored itself: the provider fetches no more.
        job = new_job(record, contract, shard, await self._model_spec_of(record), config,
                      shard_bytes=await self.store.size(shard.cid),
                      weights_bytes=await self.store.size(record.model_cid))
        await self.publish_job(job)
        return job

    async def publish_job(self, job: JobAssignment) -> None:
        await self.listener(job.training_id)  # subscribed before the job goes out, so no result is missed
        job = await self.job_keys.attach(job)  # a sealed dataset's key, wrapped for this worker
        await self.db.save_job(job)
        await self.channel.publish(topics.jobs(job.worker_id), job)

    async def model_spec(self, training_id: str) -> ModelSpec:
        """The model's shape follows the data: built from the (cached) test split."""
        return await self._model_spec_of(await self.db.training(training_id))

    async def _model_spec_of(self, record: TrainingRecord) -> ModelSpec:
        manifest = await self._manifest_of(record)
        return (await self.tasks.bound(record.spec)).model_spec(await self.data.load(manifest.test_cid))

    async def progress(self, job_id: str) -> Progress:
        progress = await self.db.progress(job_id)
        if progress is not None:
            return progress
        job = await self.db.job(job_id)
        return Progress(job_id=job_id, training_id=job.training_id, worker_id=job.worker_id, round=job.round,
                        status="assigned", epoch=0, epochs=job.config.epochs, progress=0.0)

    async def save_results(self, training_id: str, model_cid: str, metrics: dict[str, object] | None = None,
                           *, stats: RoundStats | None = None, inputs: RoundInputs | None = None) -> RoundMetrics:
        """Evaluate the aggregated model on the held-out test split and close the round."""
        record = await self.db.training(training_id)  # fresh: the round moved its phase on
        test = inputs.test if inputs is not None else await self.data.load((await self._manifest_of(record)).test_cid)
        state = decode_state(await self.store.cat(model_cid))
        task = inputs.task if inputs is not None else await self.tasks.bound(record.spec)
        result = await asyncio.to_thread(task.evaluate, test, state)
        round_ = record.round + 1
        jobs = await self.db.jobs(training_id, round_)
        round_metrics = RoundMetrics(
            # A task without an accuracy (a regression) reports None; its own metric is in ``metrics``.
            round=round_, accuracy=min(max(result["accuracy"], 0.0), 1.0) if "accuracy" in result else None,
            loss=result["loss"],
            metrics=result, model_cid=model_cid,
            workers=len(stats.worker_samples) if stats else max(len({j.worker_id for j in jobs}), 1),
            throughput=stats.throughput if stats else None, round_seconds=stats.seconds if stats else None,
            bytes_sent=stats.bytes_sent if stats else None, bytes_received=stats.bytes_received if stats else None)
        # The model, the outer optimizer's state and the model's change move on together, with the round's metrics.
        update: dict[str, object] = {"round": round_, **(stats.record_update if stats else {}), "model_cid": model_cid}
        await self.db.finish_round(round_metrics, record.model_copy(update=update))
        if metrics:
            await self.store.add(json.dumps({"training_id": training_id, "round": round_, **metrics},
                                            sort_keys=True, default=str).encode())
        if self.observer is not None:
            self.observer(round_metrics)
        return round_metrics

    # -- the seed's results, one by one (coordinator.results) -----------------------------------
    async def collect_checkpoint(self, worker_id: str, job_id: str) -> CheckpointRef:
        return await self.results.collect(worker_id, job_id)

    async def checkpoint_fits(self, ref: CheckpointRef) -> bool:
        return await self.results.fits(ref)

    async def federated_average(self, checkpoints: Sequence[CheckpointRef],
                                weights: Sequence[float] | None = None) -> AggregateResult:
        return await self.results.average(checkpoints, weights)

    # -- phases and status -----------------------------------------------------------------
    async def update_phase(self, training_id: str, phase: TrainingPhase | str) -> TrainingRecord:
        record = await self.db.training(training_id)
        target = check_transition(record.phase, phase)
        updated = record.model_copy(update={"phase": target})
        await self.db.save_training(updated)
        if self.observer is not None:
            self.observer(target)
        return updated

    async def status(self, training_id: str) -> TrainingStatus:
        record = await self.db.training(training_id)
        rounds = await self.db.rounds(training_id)
        return TrainingStatus(training_id=training_id, phase=record.phase, round=record.round,
                              rounds=record.spec.rounds, workers=len(await self.db.contracts(training_id, "worker")),
                              accuracy=reported_accuracy(rounds[-1]) if rounds else None, model_cid=record.model_cid)
