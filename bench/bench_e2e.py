"""End to end: the whole `aitbc distributed-training run` process against central training.

Both sides are timed as whole processes, interleaved, in the same run:
- federated: `aitbc distributed-training run --json` (4 workers, 5 rounds x 2 local epochs,
  payment on-chain included), from interpreter start to exit;
- central: one process that trains the same model on the whole training split for the same
  epoch budget (10 epochs) with the same batch size and learning rate, and evaluates it.

Reported: median wall times and their ratio, both accuracies and the gap, and the federated
run's wall time split into training compute (slowest worker per round, summed) and
orchestration (everything else in the run call). Flower's figures on a comparable task, as
measured on these machines and given in the project's issue (flwr 1.42 + Ray: 16.3 s,
0.883 federated, 0.944 central), are printed beside ours for reference.

    python bench/bench_e2e.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from quick import parse_args

FLOWER = {"wall_s": 16.3, "federated_accuracy": 0.883, "central_accuracy": 0.944}

CENTRAL = """
import json, torch
from aitbc_agent_sdk.models import JobConfig
from aitbc_agent_sdk.training import (build_model, evaluate, fit_normalization, load_dataset, model_spec_for,
                                      train_local, train_test_split)
torch.set_num_threads(1)
data = load_dataset("digits")
train, test = train_test_split(data, 0.2, {seed})
model = build_model(model_spec_for("mlp", train), seed={seed})
fit_normalization(model, train)
train_local(model, train, JobConfig(batch_size={batch}, learning_rate={lr}, epochs={epochs}), seed={seed})
print(json.dumps({{"accuracy": evaluate(model, test).accuracy}}))
"""


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, repeat=1, workers=2, rounds=1, epochs=1)

    fed_times, central_times, reports, central = [], [], [], None
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as home:
            env = {**os.environ, "AITBC_HOME": home}
            seconds, report = timed(
                [sys.executable, "-m", "aitbc_cli.app", "distributed-training", "run", "--json", "--yes",
                 "--workers", str(args.workers), "--providers", str(args.workers), "--rounds", str(args.rounds),
                 "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
                 "--seed", str(args.seed)], env)
            fed_times.append(seconds)
            reports.append(report)
            code = CENTRAL.format(seed=args.seed, batch=args.batch_size, lr=args.lr,
                                  epochs=args.rounds * args.epochs)
            seconds, central = timed([sys.executable, "-c", code], env)
            central_times.append(seconds)

    last = reports[-1]
    fed_wall, central_wall = statistics.median(fed_times), statistics.median(central_times)
    run_wall = statistics.median(r["wall_seconds"] for r in reports)
    compute = statistics.median(r["compute_seconds"] for r in reports)
    result = {
        "federated_accuracy": last["final_accuracy"],
        "central_accuracy": central["accuracy"],
        "gap_points": round(100 * (central["accuracy"] - last["final_accuracy"]), 2),
        "federated_process_s": round(fed_wall, 2),
        "central_process_s": round(central_wall, 2),
        "federated_over_central": round(fed_wall / central_wall, 2),
        "run_call_s": round(run_wall, 2),
        "training_compute_s": round(compute, 2),
        "orchestration_s": round(run_wall - compute, 2),
        "paid_wei": last["escrow"]["paid_wei"],
        "flower_reference": FLOWER,
        "vs_flower_wall": round(fed_wall / FLOWER["wall_s"], 2),
        "repeat": args.repeat,
    }
    print(json.dumps(result))
    print(f"federated {result['federated_accuracy']:.4f} vs central {result['central_accuracy']:.4f} "
          f"({result['gap_points']} points); whole process {fed_wall:.1f} s vs central {central_wall:.1f} s "
          f"(x{result['federated_over_central']}); run call {run_wall:.1f} s = {compute:.1f} s training compute + "
          f"{run_wall - compute:.1f} s orchestration; Flower: {FLOWER['wall_s']} s, {FLOWER['federated_accuracy']}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
