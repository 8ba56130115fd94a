"""What the experiment logs cost a training: a whole embedded run with TensorBoard (the default) against
the same run with no experiment log, and each log's time to write one round.

``python bench/bench_experiment_logs.py [--rounds N] [--repeat N] [--workers N] [--quick]``

- **import**: the one-time cost of importing TensorBoard's writer (``torch.utils.tensorboard``) in a
  process that has torch already: what a coordinator process pays once, at its first training.
- **run**: ``Agent.run_distributed_training`` of an MLP on digits (``--workers`` embedded providers,
  ``--rounds`` rounds of one epoch), with ``log_to=("tensorboard",)`` and with ``log_to=()``, after one
  untimed warm-up run, taking turns (and swapping who goes first) so a busy machine slows both alike;
  medians and their ratio.
- **write**: one round of a ``--workers``-worker training's figures (about 15 + workers tags) written
  ``--writes`` times to each log installed here (W&B offline, MLflow on a file store), against computing
  those figures alone; seconds per round.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from quick import parse_args

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingSpec
from aitbc_agent_sdk.coordinator._experiment import round_scalars
from aitbc_agent_sdk.records import RoundMetrics
from aitbc_agent_sdk.tracking import ExperimentRun, open_experiment_log

CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


async def one_run(home: Path, workers: int, rounds: int, log_to: tuple[str, ...]) -> float:
    async with Agent(AgentConfig(home=home, providers=workers)) as agent:
        spec = TrainingSpec(model_type="mlp", target_workers=workers, rounds=rounds, log_to=log_to,
                            job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=1))
        started = time.perf_counter()
        await agent.run_distributed_training(spec)
        return time.perf_counter() - started


def figures(workers: int, round_: int) -> dict[str, float]:
    metrics = RoundMetrics(round=round_, accuracy=0.9, loss=0.3, model_cid=CID, workers=workers, round_seconds=4.0,
                           throughput=500.0, metrics={"accuracy": 0.9}, bytes_sent=10**6, bytes_received=10**6)
    losses = {f"0x{i:040x}": 0.3 + i / 100 for i in range(workers)}
    return round_scalars(metrics, worker_losses=losses, spend_wei=10**16, spent_wei=round_ * 10**16,
                         checks=[{"passed": True}] * round_, slashes=0)


def write_seconds(name: str, directory: Path, workers: int, writes: int) -> float:
    log = open_experiment_log(name, ExperimentRun(f"training_bench_{name}", directory, {"rounds": writes}))
    started = time.perf_counter()
    for step in range(1, writes + 1):
        log.log(step, figures(workers, step))
    seconds = (time.perf_counter() - started) / writes
    log.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--writes", type=int, default=200)
    args = parse_args(parser, rounds=2, repeat=1, workers=2, writes=20)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import torch  # noqa: F401  (the coordinator has it before any experiment log is opened)
    started = time.perf_counter()
    import torch.utils.tensorboard  # noqa: F401
    import_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        asyncio.run(one_run(root / "warm-up", args.workers, 1, ()))
        runs: dict[str, list[float]] = {"tensorboard": [], "none": []}
        cases = [("tensorboard", ("tensorboard",)), ("none", ())]
        for i in range(args.repeat):
            for label, log_to in cases if i % 2 == 0 else cases[::-1]:
                runs[label].append(asyncio.run(one_run(root / f"{label}-{i}", args.workers, args.rounds, log_to)))
        medians = {label: statistics.median(times) for label, times in runs.items()}
        started = time.perf_counter()
        for step in range(1, args.writes + 1):
            figures(args.workers, step)
        figures_s = (time.perf_counter() - started) / args.writes
        installed = [n for n, m in (("tensorboard", "tensorboard"), ("wandb", "wandb"), ("mlflow", "mlflow"))
                     if importlib.util.find_spec(m) is not None]
        per_round = {name: write_seconds(name, root / f"write-{name}", args.workers, args.writes)
                     for name in installed}
    print(f"importing TensorBoard's writer: {import_s:.2f} s, once per process")
    for label, median in medians.items():
        print(f"run with {label}: median {median:.2f} s of {args.repeat} "
              f"({args.rounds} rounds, {args.workers} workers)")
    for name, seconds in per_round.items():
        print(f"{name}: {seconds * 1000:.2f} ms to write a round ({len(figures(args.workers, 1))} tags)")
    print(json.dumps({"bench": "experiment_logs", "rounds": args.rounds, "repeat": args.repeat,
                      "workers": args.workers, "tensorboard_import_s": import_s, "run_median_s": medians,
                      "run_ratio_tensorboard_over_none": medians["tensorboard"] / medians["none"],
                      "write_s_per_round": per_round, "figures_s_per_round": figures_s,
                      "write_ratio_over_figures": {n: s / figures_s for n, s in per_round.items()}}))


if __name__ == "__main__":
    main()
