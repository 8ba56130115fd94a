"""A fixed pool with one quarter-speed provider against the elastic pool, same task, same machine.

Both runs train digits with the MLP on the embedded stack: 4 workers to start, one of them
honest but four times slower than it needs to be (scripts/chaos/byzantine.py QuarterSpeedProvider).
The fixed pool waits for it every round. The elastic pool (target throughput far above what
the pool reaches, so it hires up to --max-workers, and rebalancing on) moves most of the slow
worker's data to the others and adds providers from the market. Prints one JSON line: the wall
time of each run's training call, and elastic / fixed.

    python bench/bench_elastic.py --rounds 6 --repeat 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingSpec  # noqa: E402
from aitbc_agent_sdk.records import ElasticPolicy  # noqa: E402
from aitbc_agent_sdk._stack import join_embedded_market  # noqa: E402
from scripts.chaos.byzantine import QuarterSpeedProvider  # noqa: E402
from quick import parse_args  # noqa: E402  (bench/ is on sys.path when a benchmark runs)

SLOW_PRICE_WEI = 9 * 10**15  # cheapest, so it is hired in both runs


async def one_run(rounds: int, elastic: ElasticPolicy | None, market: int, workers: int,
                  epochs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="aitbc-bench-elastic-") as tmp:
        async with Agent(AgentConfig(home=Path(tmp), providers=market)) as agent:
            slow = await join_embedded_market(agent.stack, Path(tmp), SLOW_PRICE_WEI, factory=QuarterSpeedProvider)
            async with slow:
                spec = TrainingSpec(model_type="mlp", target_workers=workers, rounds=rounds, seed=0, elastic=elastic,
                                    job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=epochs))
                started = time.perf_counter()
                report = await agent.run_distributed_training(spec)
                wall = time.perf_counter() - started
        return {"wall_s": wall, "accuracy": report.final_accuracy,
                "pool": [r.workers for r in report.rounds]}  # type: ignore[dict-item]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--max-workers", type=int, default=6)
    parser.add_argument("--workers", type=int, default=4, help="workers to start with (one of them the slow one)")
    parser.add_argument("--epochs", type=int, default=2, help="local epochs per round")
    args = parse_args(parser, rounds=2, workers=2, max_workers=2, epochs=1)
    policy = ElasticPolicy(target_samples_per_s=1e9, min_workers=min(3, args.workers), max_workers=args.max_workers,
                           window_rounds=1)
    fixed, elastic = [], []
    for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits both alike
        fixed.append(await one_run(args.rounds, None, args.max_workers, args.workers, args.epochs))
        elastic.append(await one_run(args.rounds, policy, args.max_workers, args.workers, args.epochs))
    best_fixed = min(r["wall_s"] for r in fixed)
    best_elastic = min(r["wall_s"] for r in elastic)
    print(json.dumps({"bench": "elastic", "rounds": args.rounds, "fixed_wall_s": round(best_fixed, 2),
                      "elastic_wall_s": round(best_elastic, 2), "elastic_over_fixed": round(best_elastic / best_fixed, 3),
                      "fixed_accuracy": fixed[0]["accuracy"], "elastic_accuracy": elastic[0]["accuracy"],
                      "elastic_pool": elastic[0]["pool"]}))


if __name__ == "__main__":
    asyncio.run(main())
