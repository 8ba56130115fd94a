"""The elastic pool between rounds: hire or release a worker, then move data so rounds even out.

Every decision is audited with the measurements behind it. Data moves are exact sample ranges
of the original shards; each worker's new share is stored as a new content-addressed shard, and
the moves are published as a JSON manifest (its CID is in the ``rebalanced`` audit event).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ...errors import InsufficientFundsError, MessagingError, NotEnoughWorkersError
from ...records import ElasticPolicy, SampleRange, Shard, ShardManifest, WorkerContract
from ...data._file_sharding import merge_shards, shard_label_counts, sub_shard
from ...storage import ContentStore
from ..data._datasets import DatasetStore
from .._logbook import AuditLogs
from ..money._money import EscrowSteps
from ..money._settlement import EscrowAccount
from .._training_db import TrainingDatabase
from ._elastic import count, needs_rebalance, plan_shares, reassign, scaling_decision
from ._reassign import Hiring
from ._stats import RoundStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolPorts:
    """What growing, shrinking and rebalancing the pool uses."""

    db: TrainingDatabase
    store: ContentStore
    data: DatasetStore
    logs: AuditLogs
    money: EscrowSteps
    escrow: EscrowAccount
    market: Hiring


async def adapt_pool(ports: PoolPorts, tid: str, stats: RoundStats, manifest: ShardManifest) -> None:
    """After a round (``stats``) of a training whose shards ``manifest`` lists."""
    record = await ports.db.training(tid)
    policy = record.spec.elastic
    assert policy is not None
    history = [r.throughput or 0.0 for r in await ports.db.rounds(tid)]
    pool = await ports.db.contracts(tid, "worker")
    measured = {"throughput": round(stats.throughput, 2), "target": policy.target_samples_per_s,
                "window": [round(t, 2) for t in history[-policy.window_rounds:]], "pool_size": len(pool),
                "round": record.round}
    decision = scaling_decision(history, len(pool), policy)
    joining: list[str] = []
    leaving: list[str] = []
    if decision == "hire":
        joined = await _hire(ports, tid, pool, measured)
        joining = [joined] if joined else []
    elif decision == "release":
        rates = {w: stats.worker_samples[w] / max(t, 1e-6) for w, t in stats.worker_seconds.items()}
        slowest = min(rates, key=rates.__getitem__)
        await _release(ports, tid, slowest, manifest, measured | {"samples_per_s": round(rates[slowest], 2)})
        leaving = [slowest]
    if joining or leaving or needs_rebalance(stats.worker_seconds, policy):
        await _rebalance(ports, tid, stats, manifest, joining, leaving, policy)


async def _hire(ports: PoolPorts, tid: str, pool: list[WorkerContract], measured: dict) -> str | None:
    record = await ports.db.training(tid)
    spec, remaining = record.spec, record.spec.rounds - record.round
    known = {c.worker_id for c in await ports.db.contracts(tid)}
    found = [w for w in await ports.market.discover(max_price_wei=spec.max_price_wei, task=spec.task,
                                                    min_stake_wei=spec.min_stake_wei, fit=spec)
             if w.worker_id not in known]
    for worker in ports.market.select(found, len(found)):
        amount = worker.price * remaining
        try:
            await ports.money.ensure_funds(amount, f"one more worker for {remaining} rounds")
        except InsufficientFundsError as exc:
            await ports.logs.note(tid, "scale_up_refused", reason=str(exc), **measured)
            log.warning("not hiring: %s", exc)
            return None
        try:
            slot = max((c.shard_index or 0) for c in await ports.db.contracts(tid)) + 1
            contract = await ports.market.negotiate(worker.worker_id, tid, worker.price, role="worker",
                                                    shard_index=slot, rounds=remaining,
                                                    device_class=worker.device_class)
        except MessagingError as exc:
            log.warning("candidate %s declined: %s", worker.worker_id, exc)
            continue
        tx = await ports.escrow.add_slot(tid, contract, amount)
        await ports.logs.note(tid, "worker_added", worker=worker.worker_id, slot_wei=amount, tx=tx, **measured)
        return contract.worker_id
    refusal = NotEnoughWorkersError("no free provider" + ports.market.stake_note(spec.min_stake_wei))
    await ports.logs.note(tid, "scale_up_refused", reason=str(refusal), **measured)
    return None


async def _release(ports: PoolPorts, tid: str, worker: str, manifest: ShardManifest, measured: dict) -> None:
    """Pay the worker for its accepted rounds now, then stop giving it work."""
    payments = await ports.money.pay(tid, worker)
    contract = next(c for c in await ports.db.contracts(tid, "worker") if c.worker_id == worker)
    # Its data is handed on by the rebalance that follows; spell it out so nothing is lost.
    held = contract.ranges or tuple(_whole(manifest.shards, contract.shard_index))
    await ports.db.save_contract(contract.model_copy(update={"role": "released", "ranges": held}))
    await ports.logs.note(tid, "worker_released", worker=worker, paid_wei=sum(p.amount_wei for p in payments),
                          **measured)


async def _rebalance(ports: PoolPorts, tid: str, stats: RoundStats, manifest: ShardManifest,
                     joining: list[str], leaving: list[str], policy: ElasticPolicy) -> None:
    """Shrink slow workers' shares, give joining workers theirs, hand on what leaving workers held."""
    contracts = {c.worker_id: c for c in await ports.db.contracts(tid) if c.role in ("worker", "released")}
    holdings = {w: list(c.ranges) if c.ranges or c.role == "released" else _whole(manifest.shards, c.shard_index)
                for w, c in contracts.items()}
    holdings = {w: r for w, r in holdings.items() if r}
    current = {w: count(r) for w, r in holdings.items()}
    released = [w for w, c in contracts.items() if c.role == "released" and w in holdings]
    targets = plan_shares(current, stats.worker_seconds, joining, [*leaving, *released], policy)
    new, moves = reassign(holdings, targets)
    if not moves:
        return
    record = await ports.db.training(tid)
    round_ = record.round + 1
    originals = {s.index: s for s in manifest.shards}
    shards = []
    for worker, ranges in sorted(new.items()):
        if tuple(ranges) == contracts[worker].ranges or (not contracts[worker].ranges
                                                         and ranges == _whole(manifest.shards, contracts[worker].shard_index)):
            continue
        shard = await _build_shard(ports, f"{tid}-r{round_}-{worker[2:10]}", contracts[worker].shard_index or 0,
                                   ranges, originals)
        shards.append(shard)
        await ports.db.save_contract(contracts[worker].model_copy(
            update={"ranges": tuple(ranges), "shard_id": shard.shard_id}))
    await ports.db.save_shards(tid, shards)
    for worker in set(holdings) - set(new):  # a released worker keeps nothing
        await ports.db.save_contract(contracts[worker].model_copy(update={"ranges": (), "shard_id": None}))
    plan = {"training_id": tid, "round": round_,
            "round_seconds": {w: round(t, 3) for w, t in stats.worker_seconds.items()},
            "moves": [{"from": a, "to": b, "shard": r.shard, "start": r.start, "end": r.end} for a, b, r in moves],
            "shares": {w: {"samples": count(r), "ranges": [x.model_dump() for x in r]} for w, r in new.items()}}
    plan_cid = await ports.store.add(json.dumps(plan, sort_keys=True).encode())
    await ports.logs.note(tid, "rebalanced", round=round_, plan_cid=plan_cid,
                          shares={w: count(r) for w, r in new.items()},
                          moved=sum(r.end - r.start for _, _, r in moves))


def _whole(shards, index: int | None) -> list[SampleRange]:
    shard = next((s for s in shards if s.index == index), None)
    return [SampleRange(shard=shard.index, start=0, end=shard.samples)] if shard else []


async def _build_shard(ports: PoolPorts, shard_id: str, index: int, ranges: list[SampleRange],
                       originals: dict[int, Shard]) -> Shard:
    """A worker's new share: sample ranges of the original shards, as slices of the same files (no copy)."""
    pieces = [sub_shard(await ports.data.shard(originals[r.shard].cid), r.start, r.end) for r in ranges]
    data = merge_shards(pieces)
    cid = await ports.data.add_shard(data)
    return Shard(shard_id=shard_id, index=index, cid=cid, samples=data.data.samples,
                 label_counts=shard_label_counts(data))