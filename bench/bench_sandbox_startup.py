"""Time from a job reaching the training process to its first training step, with and without the sandbox.

``python bench/bench_sandbox_startup.py [runs] [--quick]``. Three cases, each on a fresh provider work directory:

* cold: the process is started and handed the job at once (torch imports inside the measurement);
* same training: the training's next job, handed over the moment the previous one finished
  (a provider's steady state between rounds: sandboxed, the same process serves it);
* another training: another customer's job, handed over the moment the previous one finished
  (sandboxed, it gets a fresh process, which imports torch first).

Prints a line per side, then one JSON line with the medians and sandboxed / plain per case.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from aitbc_agent_sdk.models import JobConfig
from aitbc_agent_sdk.provider.process import SHARD_FILE, WEIGHTS_FILE, TrainingProcess
from aitbc_agent_sdk.provider.sandbox import TrainingSandbox
from aitbc_agent_sdk.training import build_model, encode_data, encode_state, load_dataset, model_spec_for

from quick import parse_args


def write_inputs(job_dir: Path):
    data = load_dataset("digits").subset(list(range(64)))
    spec = model_spec_for("mlp", data)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / SHARD_FILE).write_bytes(encode_data(data))
    (job_dir / WEIGHTS_FILE).write_bytes(encode_state(build_model(spec, seed=0).state_dict()))
    return spec


async def to_first_step(process: TrainingProcess, job_dir: Path, spec, owner: str) -> float:
    first = asyncio.get_running_loop().create_future()
    start = time.perf_counter()
    # One epoch of 64 samples in batches of 64: the first epoch event is the first step.
    await process.train(job_dir, job_id="bench", model=spec, config=JobConfig(epochs=1, batch_size=64), seed=0,
                        owner=owner, on_epoch=lambda e: first.done() or first.set_result(time.perf_counter() - start))
    return first.result()


async def one_run(sandbox: TrainingSandbox | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "provider"
        spec = write_inputs(work / "jobs" / "bench")
        process = TrainingProcess(work, sandbox=sandbox)
        try:
            await process.start()
            job = work / "jobs" / "bench"
            cold = await to_first_step(process, job, spec, "training_a")
            same = await to_first_step(process, job, spec, "training_a")
            other = await to_first_step(process, job, spec, "training_b")
        finally:
            await process.stop()
    return {"cold": cold, "same training": same, "another training": other}


async def main(runs: int) -> None:
    medians: dict[str, dict[str, float]] = {}
    for name, sandbox in (("no sandbox", None), ("bwrap sandbox", TrainingSandbox())):
        results = [await one_run(sandbox) for _ in range(runs)]
        medians[name] = {case: statistics.median(r[case] for r in results) for case in results[0]}
        line = ", ".join(f"{case} {medians[name][case] * 1000:.0f} ms"
                         f" (min {min(r[case] for r in results) * 1000:.0f})" for case in results[0])
        print(f"{name}: median of {runs}: {line}")
    plain, boxed = medians["no sandbox"], medians["bwrap sandbox"]
    print(json.dumps({"bench": "sandbox_startup", "runs": runs,
                      "median_ms": {side: {case: round(s * 1000, 1) for case, s in m.items()} for side, m in medians.items()},
                      "ratio_sandbox_over_plain": {case: round(boxed[case] / plain[case], 3) for case in plain}}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=int, nargs="?", default=3)
    asyncio.run(main(parse_args(parser, runs=1).runs))
