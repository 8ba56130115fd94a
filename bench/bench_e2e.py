"""End to end: the whole `aitbc distributed-training run` process against central training.

Both sides are timed as whole processes, interleaved, in the same run:
- federated: `aitbc distributed-training run --json` (4 workers, 5 rounds x 2 local epochs,
  payment on-chain included), from interpreter start to exit;
- central: one process that trains the same model on the whole training split for the same
  epoch budget (10 epochs) with the same batch size and learning rate, and evaluates it.

Reported: median wall times and their ratio (the goal: the federated process within 2x the
central one), both accuracies and the gap, the federated run's wall time split into training
compute (slowest worker per round, summed) and orchestration (everything else in the run call),
and the federated process split into its parts (``process_split_s``, medians): start-up (the
interpreter and the imports), the embedded stack with its providers, the dataset's import, the
rehearsal (the task run once before funding), discovery (asked while the rehearsal runs, so the
two overlap), funding (training record, shards, hiring, escrow), training (the rounds),
settlement (payments and refund) and exit (the stack's stop and the interpreter's teardown).
The parts come from timers the federated process wraps around these steps (see ``PHASED``).
Flower's figures on a comparable task, as measured on these machines and given in the project's
issue (flwr 1.42 + Ray: 16.3 s, 0.883 federated, 0.944 central), are printed beside ours for
reference.

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
GOAL_OVER_CENTRAL = 2.0  # the whole federated process against the central one, in the same run
PHASES_MARK = "AITBC_PHASES "  # the federated process's last stderr line: its steps' (start, end) times

# The CLI's `run`, with each step timed where it starts and ends (wall-clock epoch seconds, so the
# parent can place them against the moment it started the process). Only timers are added.
PHASED = """
import asyncio, functools, json, sys, time
marks = {"imported": None}
def timed(owner, name, label):
    inner = getattr(owner, name)
    def note(start):
        first, _ = marks.get(label) or (start, None)
        marks[label] = (first, time.time())
    if asyncio.iscoroutinefunction(inner):
        async def outer(*args, **kwargs):
            start = time.time()
            try:
                return await inner(*args, **kwargs)
            finally:
                note(start)
    else:
        def outer(*args, **kwargs):
            start = time.time()
            try:
                return inner(*args, **kwargs)
            finally:
                note(start)
    setattr(owner, name, functools.wraps(inner)(outer))
from aitbc_cli import app
from aitbc_agent_sdk import _agent as agent
from aitbc_agent_sdk.coordinator import _service as service
from aitbc_agent_sdk.coordinator.data import _datasets as datasets
from aitbc_agent_sdk.coordinator.money import _money as money
from aitbc_agent_sdk.coordinator.round import _run as run
from aitbc_agent_sdk.tasks import _bound_task as bound_task
marks["imported"] = (time.time(), time.time())
timed(agent.Agent, "start", "stack")
timed(agent.Agent, "stop", "stop")
timed(datasets.DatasetStore, "import_dataset", "dataset")
timed(bound_task.BoundTask, "rehearse", "rehearsal")
timed(service.Coordinator, "discover", "discovery")
timed(run, "prepare", "prepare")
timed(run, "drive_training", "drive")
timed(money.EscrowSteps, "settle", "settlement")
try:
    app.main(sys.argv[1:])
finally:
    marks["exit"] = (time.time(), time.time())
    print(MARK + json.dumps(marks), file=sys.stderr, flush=True)
"""

CENTRAL = """
import json, torch
from aitbc_agent_sdk.records import JobConfig, TaskRef
from aitbc_agent_sdk.data._datasets import load_dataset, train_test_split
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.tasks._evaluation import evaluate
from aitbc_agent_sdk.tasks._networks import build_model, fit_normalization, model_spec_for
torch.set_num_threads(1)
data = load_dataset("digits")
train, test = train_test_split(data, 0.2, {seed})
model = build_model(model_spec_for("mlp", train), seed={seed})
fit_normalization(model, train)
mlp = bind_task(TaskRef(name="mlp"))
mlp.train(model, train, JobConfig(batch_size={batch}, learning_rate={lr}, epochs={epochs}), seed={seed})
print(json.dumps({{"accuracy": evaluate(model, test).accuracy}}))
"""


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, dict]:
    seconds, output, _ = timed_process(cmd, env)
    return seconds, output


def timed_process(cmd: list[str], env: dict[str, str]) -> tuple[float, dict, str]:
    """(wall seconds, the last stdout line as JSON, stderr) of one process; the wall clock's start too."""
    started = time.time()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    done_at = time.time()
    return done_at - started, json.loads(done.stdout.strip().splitlines()[-1]), f"{started} {done_at}\n{done.stderr}"


def process_split(stderr: str) -> dict[str, float]:
    """The federated process's seconds per part, from its marks (pure: the text in, the split out)."""
    clock, _, rest = stderr.partition("\n")
    started, ended = (float(v) for v in clock.split())
    line = next(l for l in reversed(rest.splitlines()) if l.startswith(PHASES_MARK))
    marks = {k: tuple(v) for k, v in json.loads(line[len(PHASES_MARK):]).items()}

    def span(name: str) -> float:
        return marks[name][1] - marks[name][0] if name in marks else 0.0
    drive_start = marks["drive"][0] if "drive" in marks else marks["exit"][0]
    prepare_end = marks["prepare"][1] if "prepare" in marks else drive_start
    return {
        "startup": marks["imported"][1] - started,
        "stack_and_providers": span("stack"),
        "dataset": span("dataset"),
        "rehearsal": span("rehearsal"),
        "discovery": span("discovery"),
        "funding": drive_start - prepare_end,
        "training": span("drive") - span("settlement"),
        "settlement": span("settlement"),
        "exit": ended - (marks["drive"][1] if "drive" in marks else prepare_end),
    }


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

    fed_times, central_times, reports, splits, central = [], [], [], [], None
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as home:
            env = {**os.environ, "AITBC_HOME": home}
            phased = PHASED.replace("MARK", repr(PHASES_MARK))
            seconds, report, stderr = timed_process(
                [sys.executable, "-c", phased, "distributed-training", "run", "--json",
                 "--yes", "--workers", str(args.workers), "--providers", str(args.workers), "--rounds",
                 str(args.rounds), "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr",
                 str(args.lr), "--seed", str(args.seed)], env)
            fed_times.append(seconds)
            reports.append(report)
            splits.append(process_split(stderr))
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
        "goal_over_central": GOAL_OVER_CENTRAL,
        "within_goal": fed_wall / central_wall <= GOAL_OVER_CENTRAL,
        "process_split_s": {part: round(statistics.median(s[part] for s in splits), 2) for part in splits[0]},
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
    print("federated process: " + ", ".join(f"{part} {seconds:.2f} s" for part, seconds in
                                            result["process_split_s"].items()), file=sys.stderr)


if __name__ == "__main__":
    main()
