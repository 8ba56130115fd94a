"""Elastic pool planning (pure): when to hire or release a worker, and how to move data between workers.

A worker's data is a list of sample ranges over the training's original shards, so every move
can be recorded exactly ("shard 2, samples 300..359, now trained by worker 0x..") and each
worker's round data is rebuilt from the content-addressed shards into a new content-addressed
shard. The thresholds follow the seed: hire below 70 % of the target throughput, release above
130 %, each sustained over a window of rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Literal

from ...records import ElasticPolicy, SampleRange

Decision = Literal["hire", "release"] | None


def scaling_decision(throughput: Sequence[float], pool_size: int, policy: ElasticPolicy) -> Decision:
    """Hire when the last ``window_rounds`` rounds all ran below ``scale_up_below`` x target, release
    when they all ran above ``scale_down_above`` x target; never leave [min_workers, max_workers]."""
    recent = list(throughput[-policy.window_rounds:])
    if len(recent) < policy.window_rounds:
        return None
    target = policy.target_samples_per_s
    if all(t < policy.scale_up_below * target for t in recent) and pool_size < policy.max_workers:
        return "hire"
    if all(t > policy.scale_down_above * target for t in recent) and pool_size > policy.min_workers:
        return "release"
    return None


def needs_rebalance(round_seconds: Mapping[str, float], policy: ElasticPolicy) -> bool:
    """A worker is slow but alive when its round took ``rebalance_ratio`` x the pool's median or more."""
    times = list(round_seconds.values())
    return len(times) >= 2 and max(times) >= policy.rebalance_ratio * statistics.median(times)


def plan_shares(current: Mapping[str, int], seconds: Mapping[str, float], joining: Sequence[str],
                leaving: Sequence[str], policy: ElasticPolicy) -> dict[str, int]:
    """Samples per worker for the next round.

    A worker whose round took ``rebalance_ratio`` x the median or longer keeps the share it can
    train in about the median time; a joining worker gets the mean share; a leaving one none. The
    difference goes to (or comes from) the other workers in proportion to their shares. No share
    falls below a third of the mean, so updates stay comparable for the round's norm check.
    """
    total = sum(current.values())
    stay = [w for w in current if w not in leaving]
    members = stay + [w for w in joining if w not in current]
    if not members:
        raise ValueError("no workers left to train")
    mean = total / len(members)
    floor = max(policy.min_shard_samples, int(mean / 3))
    if floor * len(members) > total:
        raise ValueError(f"{total} samples cannot give {len(members)} workers {floor} each")
    times = [seconds[w] for w in stay if w in seconds]
    median = statistics.median(times) if times else 0.0
    shares = {w: current[w] for w in stay}
    cut = {w for w in stay if median > 0 and seconds.get(w, 0.0) >= policy.rebalance_ratio * median}
    for w in cut:
        shares[w] = max(floor, int(current[w] * median / seconds[w]))
    for w in members:
        if w not in shares:
            shares[w] = max(floor, int(mean))
    others = [w for w in stay if w not in cut] or members
    return _spread(shares, total - sum(shares.values()), others, floor)


def _spread(shares: dict[str, int], diff: int, over: Sequence[str], floor: int) -> dict[str, int]:
    """Add ``diff`` (maybe negative) to ``over`` in proportion to their shares, keeping the floor."""
    weight = sum(shares[w] for w in over)
    exact = {w: shares[w] + diff * shares[w] / weight for w in over}
    result = dict(shares) | {w: max(floor, int(x)) for w, x in exact.items()}
    left = sum(shares.values()) + diff - sum(result.values())
    order = sorted(over, key=lambda w: exact[w] - int(exact[w]), reverse=True)
    i = 0
    while left != 0:  # largest remainder first; never below the floor
        w = order[i % len(order)]
        step = 1 if left > 0 else -1
        if result[w] + step >= floor:
            result[w] += step
            left -= step
        i += 1
    return result


def count(ranges: Sequence[SampleRange]) -> int:
    return sum(r.end - r.start for r in ranges)


def take_tail(ranges: Sequence[SampleRange], amount: int) -> tuple[list[SampleRange], list[SampleRange]]:
    """Split ``amount`` samples off the end of ``ranges``: (kept, taken)."""
    kept, taken = list(ranges), []
    while amount > 0 and kept:
        last = kept.pop()
        size = last.end - last.start
        if size <= amount:
            taken.insert(0, last)
            amount -= size
        else:
            kept.append(SampleRange(shard=last.shard, start=last.start, end=last.end - amount))
            taken.insert(0, SampleRange(shard=last.shard, start=last.end - amount, end=last.end))
            amount = 0
    return kept, taken


def reassign(holdings: Mapping[str, Sequence[SampleRange]],
             targets: Mapping[str, int]) -> tuple[dict[str, list[SampleRange]], list[tuple[str, str, SampleRange]]]:
    """Move ranges from workers above their target to those below it.

    ``holdings`` may include workers leaving (target 0) and ``targets`` workers joining (no
    holdings). Returns the new holdings and each move as (from, to, range).
    """
    if sum(count(r) for r in holdings.values()) != sum(targets.values()):
        raise ValueError("targets must add up to the samples held")
    new = {w: list(holdings.get(w, ())) for w in {*holdings, *targets}}
    pool: list[tuple[str, SampleRange]] = []
    for worker in sorted(new):
        surplus = count(new[worker]) - targets.get(worker, 0)
        if surplus > 0:
            new[worker], taken = take_tail(new[worker], surplus)
            pool.extend((worker, r) for r in taken)
    moves = []
    for worker in sorted(new):
        need = targets.get(worker, 0) - count(new[worker])
        while need > 0:
            donor, piece = pool.pop(0)
            size = piece.end - piece.start
            if size > need:  # give part, keep the rest in the pool
                pool.insert(0, (donor, SampleRange(shard=piece.shard, start=piece.start + need, end=piece.end)))
                piece = SampleRange(shard=piece.shard, start=piece.start, end=piece.start + need)
                size = need
            new[worker].append(piece)
            moves.append((donor, worker, piece))
            need -= size
    return {w: r for w, r in new.items() if targets.get(w, 0) > 0}, moves
