"""A whole federated training from one call: validate, hire, fund, run the rounds, pay.

Everything that can be wrong with the request is checked before anything is
written, so a bad start leaves no training in the database and no money on chain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ...errors import AitbcError, ConfigError, NotEnoughWorkersError, TrainingError
from ...records import (
    ModelFootprint, RoundReport, Settlement, TrainingPhase, TrainingRecord, TrainingReport, TrainingSpec, Worker,
    TrainingCost, VerificationSpend, WorkerContract, WorkerReport, fit_problem, largest_machine, reported_accuracy,
)
from ...records._footprint import describe
from ...tasks._bound_task import rehearsal_size
from ...data._file_sharding import partition_problem
from ...tasks._task import TrainingTask
from ...data._dataset_dirs import manifest_shape
from ._deadlines import job_work, round_timeout
from ..data._inputs import RoundInputs
from ._stopping import settle_stopped
from ._liveness import LivenessWatch
from ._pool import PoolPorts, adapt_pool
from .._phases import is_terminal
from ._reassign import Reassigner, hire, new_replacement
from ._rounds import RoundPorts, RoundRunner
from ..data._tasks import spec_for_dataset
from .._service import Coordinator
from .._experiment import ExperimentRecorder

log = logging.getLogger(__name__)
P = TrainingPhase


@dataclass(frozen=True)
class RunRequest:
    spec: TrainingSpec
    dataset: str | Path = "digits"
    label_column: str | None = None
    min_gpu: str | None = None
    round_timeout_s: float | None = None  # None: the training's FaultPolicy decides (see deadlines.round_timeout)


class Prepared(NamedTuple):
    """What prepare() checked: the dataset's CID, the workers and spares, the model's measured footprint."""

    dataset_cid: str
    workers: list[Worker]
    spares: list[Worker]
    footprint: ModelFootprint


async def prepare(coordinator: Coordinator, request: RunRequest) -> Prepared:
    """All the checks before a training is written: data, model, market, money. Returns (dataset, workers, spares).

    The dataset goes into the content store here (content-addressed: a failed start leaves only
    blocks a later run reuses), so it is read once and a rehearsal reads a few samples of it."""
    spec = request.spec
    dataset_cid, manifest = await coordinator.data.import_dataset(request.dataset, label_column=request.label_column,
                                                                  target=spec.target,
                                                                  declared_size=spec.dataset_size,
                                                                  encrypt=spec.encrypt, vocab_size=spec.vocab_size)
    spec = spec_for_dataset(spec, manifest.kind)  # transformer on a corpus: the language model
    if (problem := partition_problem(manifest, spec.partition)) is not None:  # before anything is funded
        raise ConfigError(problem)
    task = await coordinator.tasks.bound(spec)  # an unknown task or bad parameters: fail now
    task.model_spec(manifest_shape(manifest))
    sample = await coordinator.data.load_sample(manifest, spec, rehearsal_size(manifest.kind))
    # A broken task fails here, before funding; the market is asked meanwhile (its answers take a while).
    discovery = asyncio.create_task(coordinator.discover(min_gpu=request.min_gpu, max_price_wei=spec.max_price_wei,
                                                         task=spec.task, min_stake_wei=spec.min_stake_wei))
    try:
        footprint = await asyncio.to_thread(task.rehearse, sample, spec.job, spec.seed)
    except BaseException:
        discovery.cancel()
        await asyncio.gather(discovery, return_exceptions=True)
        raise
    spec = spec.model_copy(update={"footprint": footprint})
    offered = await discovery
    found = [w for w in offered if fit_problem(footprint, spec.job.batch_size, w.offer.hardware) is None]
    if offered and not found:
        raise ConfigError(f"no provider can hold this model: {describe(footprint, spec.job.batch_size)}; "
                          f"{largest_machine(w.offer.hardware for w in offered)} "
                          f"(a smaller --batch-size or model needs less)")
    if len(found) < spec.target_workers:
        too_small = f"; {len(offered) - len(found)} too small for the model" if len(found) < len(offered) else ""
        raise NotEnoughWorkersError(
            f"asked for {spec.target_workers} workers but only {len(found)} suitable providers answered"
            f"{too_small}{coordinator.stake_note(spec.min_stake_wei)}")
    ranked = coordinator.select(found, spec.target_workers + spec.spare_workers)
    coordinator.hold(ranked)  # before the next await: a training starting beside this one picks others
    selected, spares = ranked[:spec.target_workers], ranked[spec.target_workers:]
    try:
        await coordinator.money.ensure_funds(sum(w.price for w in selected) * spec.rounds,
                                             f"{spec.target_workers} workers x {spec.rounds} rounds")
    except BaseException:
        coordinator.release(ranked)
        raise
    return Prepared(dataset_cid, selected, spares, footprint)


async def run_training(coordinator: Coordinator, request: RunRequest, prepared: Prepared | None = None) -> TrainingReport:
    """Prepare (unless ``prepared`` is what a cost preview already checked and priced), fund, train, settle."""
    started = time.perf_counter()
    dataset_cid, selected, spares, footprint = prepared if prepared is not None else await prepare(coordinator,
                                                                                                  request)
    try:
        return await _run_prepared(coordinator, request, dataset_cid, selected, spares, footprint, started)
    finally:
        coordinator.release([*selected, *spares])  # what prepare held for this training


async def _run_prepared(coordinator: Coordinator, request: RunRequest, dataset_cid: str, selected: list[Worker],
                        spares: list[Worker], footprint: ModelFootprint, started: float) -> TrainingReport:
    record = await coordinator.initialize(request.spec.model_copy(update={"footprint": footprint}))
    tid = record.training_id
    try:
        await coordinator.use_dataset(tid, dataset_cid)
        await coordinator.create_shards(tid, len(selected))
        await hire(coordinator, coordinator.logs.of(tid), tid, selected, spares)
        await coordinator.money.fund_escrow(tid)
    except (AitbcError, asyncio.CancelledError) as exc:
        await fail_training(coordinator, tid, str(exc) or type(exc).__name__)
        raise
    try:
        settlement, compute = await drive_training(coordinator, tid, round_timeout_s=request.round_timeout_s)
    except asyncio.CancelledError:
        # The caller gave up on a funded training (Ctrl-C, a timeout, a cancelled task): pay the accepted
        # rounds and refund the rest now, as `stop` does, instead of leaving the deposit to the deadline.
        # Shielded: a second cancel while settling does not cut the settlement short.
        await asyncio.shield(wind_down(coordinator, tid))
        raise
    return await _report(coordinator, tid, [*selected, *spares], settlement.refund_tx, started, compute)


async def drive_training(coordinator: Coordinator, tid: str, *,
                         round_timeout_s: float | None = None) -> tuple[Settlement, float]:
    """Run the remaining rounds of a funded training, then pay and refund.

    Returns the settlement and the training compute time (slowest worker per round, summed).
    Used by ``run`` in-process, by the detached coordinator daemon after ``distribute``, and
    by ``resume`` after a coordinator died. ``round_timeout_s`` overrides the training's FaultPolicy.
    """
    limit = round_timeout_s
    try:
        record = await coordinator.db.training(tid)
        await _assign_shards(coordinator, tid)
        await coordinator.round_times.load(tid)
        compute = 0.0
        unusable: set[str] = set()
        audit, reassign = coordinator.logs.of(tid), reassigner_for(coordinator, tid)
        ports = await round_ports(coordinator, tid)
        experiment = await ExperimentRecorder.open(coordinator.db, coordinator.settings.audit_dir, record)
        async with LivenessWatch(coordinator.channel) as liveness, experiment:
            while record.round < record.spec.rounds:
                await coordinator.update_phase(tid, P.DISTRIBUTING)
                inputs = await coordinator.round_inputs(tid)
                runner = RoundRunner(ports, inputs, liveness, unusable, audit=audit, reassign=reassign)
                limit = _round_limit(coordinator, inputs, round_timeout_s)
                stats = await runner.run(limit)
                compute += stats.slowest_s
                await coordinator.save_results(tid, stats.model_cid, stats=stats, inputs=inputs)
                await experiment.after_round()
                record = await coordinator.db.training(tid)
                if record.spec.elastic is not None and record.round < record.spec.rounds:
                    await adapt_pool(pool_ports(coordinator), tid, stats, inputs.manifest)
        settlement = await coordinator.money.settle(tid)
        await coordinator.update_phase(tid, P.COMPLETE)
        return settlement, compute
    except asyncio.CancelledError:
        # Interrupted, not failed: the training stays funded and open, as after a crash. run_training settles
        # it as `stop` does; a resumed one (Agent.stop ending an auto-resume) is carried on by the next resume.
        raise
    except (AitbcError, TimeoutError) as exc:
        await fail_training(coordinator, tid, str(exc) or type(exc).__name__)
        if isinstance(exc, TimeoutError):
            within = f" within {limit:g}s" if limit is not None else ""
            raise TrainingError(f"training {tid}: a round did not finish{within}") from exc
        raise


def reassigner_for(coordinator: Coordinator, training_id: str) -> Reassigner:
    """The training's :class:`Reassigner`, on the coordinator's connections and the training's audit log."""
    return Reassigner(training_id, channel=coordinator.channel, db=coordinator.db, escrow=coordinator.escrow,
                      audit=coordinator.logs.of(training_id), registry=coordinator.registry)


def pool_ports(coordinator: Coordinator) -> PoolPorts:
    """The coordinator's connections the elastic pool uses; the coordinator itself hires."""
    c = coordinator
    return PoolPorts(db=c.db, store=c.store, data=c.data, logs=c.logs, money=c.money, escrow=c.escrow, market=c)


async def wind_down(coordinator: Coordinator, training_id: str) -> tuple[int, int, str | None]:
    """Stop ``training_id`` now: the open round's jobs cancelled, the accepted work paid, the rest refunded."""
    c = coordinator
    return await settle_stopped(training_id, db=c.db, escrow=c.escrow, money=c.money,
                                reassign=reassigner_for(c, training_id), update_phase=c.update_phase)


async def round_ports(coordinator: Coordinator, tid: str) -> RoundPorts:
    """The coordinator's connections a round of ``tid`` uses, the training's listener already subscribed."""
    async def hire_spare(exclude: Collection[str]) -> WorkerContract:
        spec = (await coordinator.db.training(tid)).spec  # read when a spare is needed, not every round
        return await new_replacement(coordinator, spec, tid, exclude, max_price_wei=spec.max_price_wei)

    c = coordinator
    return RoundPorts(db=c.db, store=c.store, data=c.data, channel=c.channel, listener=await c.listener(tid),
                      escrow=c.escrow, money=c.money, receipts=c.receipts, round_times=c.round_times,
                      spot_check_turn=c.spot_check_turn, publish_job=c.publish_job, update_phase=c.update_phase,
                      hire_spare=hire_spare)


def _round_limit(coordinator: Coordinator, inputs: RoundInputs, override: float | None) -> float:
    """Seconds this round may take: ``override``, or derived from its jobs' work and their providers' history."""
    if override is not None:
        return override
    epochs, tid = inputs.record.spec.job.epochs, inputs.training_id
    jobs = [(job_work(inputs.shards[c.shard_index].samples, epochs), coordinator.round_times.of(tid, c.worker_id))
            for c in inputs.contracts if c.shard_index is not None]
    return round_timeout(jobs, inputs.policy)


async def _assign_shards(coordinator: Coordinator, tid: str) -> None:
    """Give each funded worker a shard (contracts made before shards existed get them in order)."""
    contracts = await coordinator.db.contracts(tid, "worker")
    if contracts and all(c.shard_index is not None for c in contracts):
        return
    shards = await coordinator.db.shards(tid)
    if not contracts or len(shards) != len(contracts):
        raise TrainingError(f"training {tid} needs one shard per contracted worker "
                            f"({len(shards)} shards, {len(contracts)} contracts)")
    taken = {c.shard_index for c in contracts if c.shard_index is not None}
    free = iter(sorted({s.index for s in shards} - taken))
    for contract in contracts:
        if contract.shard_index is None:
            await coordinator.db.save_contract(contract.model_copy(update={"shard_index": next(free)}))


async def resume_training(coordinator: Coordinator, tid: str, *,
                          round_timeout_s: float | None = None) -> tuple[Settlement, float] | None:
    """Carry on a funded training after its coordinator died; None if it already ended.

    The interrupted round starts over (its jobs are cancelled and sent again); rounds already
    aggregated are kept. Settlement checks the chain before paying, so nothing is paid twice.
    """
    record = await coordinator.db.training(tid)
    if is_terminal(record.phase):
        return None
    if await coordinator.db.escrow(tid) is None:
        raise TrainingError(f"training {tid} was never funded; run distribute instead of resume")
    state = await coordinator.escrow.state(tid)
    if not state.exists:
        raise TrainingError(f"the escrow of training {tid} is not on this chain "
                            "(an embedded chain does not outlive its process)")
    reassign = reassigner_for(coordinator, tid)
    await reassign.reconcile()  # a crash mid-replacement: the chain says who holds the slot
    interrupted = [j for j in await coordinator.db.jobs(tid, record.round + 1)
                   if await coordinator.db.checkpoint(j.job_id) is None]
    await reassign.audit.append("training_resumed", round=record.round + 1, phase=record.phase.value,
                                escrow_closed=state.closed, interrupted_jobs=len(interrupted))
    for job in interrupted:
        await reassign.cancel_job(job.worker_id, job.job_id, "the coordinator restarted this round")
    if state.closed:  # died after the refund: only the bookkeeping is left
        settlement = await coordinator.money.settle(tid)
        await coordinator.update_phase(tid, P.COMPLETE)
        return settlement, 0.0
    return await drive_training(coordinator, tid, round_timeout_s=round_timeout_s)


async def fail_training(coordinator: Coordinator, tid: str, reason: str = "") -> None:
    """Mark the training failed and refund whatever the escrow still holds for it."""
    try:
        await coordinator.logs.note(tid, "training_failed", reason=reason)
        await coordinator.update_phase(tid, P.FAILED)
        if (await coordinator.db.escrow(tid)) is not None:
            refunded, tx = await coordinator.escrow.refund(tid)
            await coordinator.logs.note(tid, "refund", amount_wei=refunded, tx=tx, after="failure")
            await coordinator.db.save_escrow(tid, await coordinator.escrow.summary(tid))
    except AitbcError as exc:  # keep the original error; note the cleanup failure
        log.error("cleanup of failed training %s: %s", tid, exc)


async def _report(coordinator: Coordinator, tid: str, selected: list[Worker], refund_tx: str | None,
                  started: float, compute: float) -> TrainingReport:
    record: TrainingRecord = await coordinator.db.training(tid)
    rounds = await coordinator.db.rounds(tid)
    accepted = await coordinator.db.checkpoints(tid, "accepted")
    payments = await coordinator.db.payments(tid)
    escrow = await coordinator.escrow.summary(tid)
    by_worker = {w.worker_id: w for w in selected}
    workers = []
    for contract in await coordinator.db.contracts(tid):
        if contract.role == "spare":
            continue
        mine = [c for c in accepted if c.worker_id == contract.worker_id]
        paid = [p for p in payments if p.worker_id == contract.worker_id]
        workers.append(WorkerReport(
            address=contract.worker_id, samples=max((c.samples for c in mine), default=0),
            rounds_accepted=len({c.round for c in mine}), paid_wei=sum(p.amount_wei for p in paid),
            tx_hash=paid[-1].tx_hash if paid else None, status="paid" if paid else "unpaid",
            price_wei=contract.price_wei, role=contract.role,
            gpu_type=by_worker[contract.worker_id].gpu_type if contract.worker_id in by_worker else "unknown"))
    round_reports = tuple(
        RoundReport(round=r.round, accuracy=reported_accuracy(r), loss=r.loss, model_cid=r.model_cid,
                    worker_losses={c.worker_id: c.loss for c in accepted if c.round == r.round},
                    workers=r.workers, throughput=r.throughput, metrics=r.metrics,
                    bytes_sent=r.bytes_sent, bytes_received=r.bytes_received)
        for r in rounds)
    assert record.model_cid is not None and record.manifest_cid is not None
    task = await _reported_task(coordinator, record)
    checks = [e.fields for e in await coordinator.logs.entries(tid, "spot_check")]
    fees = [e.fields for e in await coordinator.logs.entries(tid, "verifiers_paid")]
    trained = {c.job_id: c.train_seconds for c in await coordinator.db.checkpoints(tid, None)}
    receipts = [e.fields for e in await coordinator.logs.entries(tid, "receipt_sent")]
    cost = TrainingCost.of(rounds_done=record.round, rounds=record.spec.rounds, finished=True,
                           deposit_wei=escrow.deposited_wei, payments=[(p.worker_id, p.amount_wei) for p in payments],
                           receipts=receipts)
    return TrainingReport(
        metric=task.metric, higher_is_better=task.higher_is_better, loss_name=task.loss_name,
        final_metric=rounds[-1].metrics.get(task.metric),
        training_id=tid, status=record.phase, final_accuracy=reported_accuracy(rounds[-1]), model_cid=record.model_cid,
        manifest_cid=record.manifest_cid, rounds=round_reports, workers=tuple(workers), escrow=escrow,
        refund_tx=refund_tx, wall_seconds=time.perf_counter() - started, compute_seconds=compute,
        verification=VerificationSpend.of_checks(checks, trained, fees), cost=cost)


async def _reported_task(coordinator: Coordinator, record: TrainingRecord) -> TrainingTask:
    """The task as the report labels it: its metric and loss on the dataset's target kind."""
    bound = await coordinator.tasks.bound(record.spec)
    target = "classes"
    if record.dataset_cid is not None:
        manifest = await coordinator.data.manifest(record.dataset_cid)
        target = manifest.arrays.target if manifest.arrays is not None else "classes"
    return bound.task.for_target(target)
