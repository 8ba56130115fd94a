"""Time from a job reaching the training process to its first training step, with and without the sandbox.

``python bench/bench_sandbox_startup.py [runs] [--quick]``. Three cases, each on a fresh provider work directory:

* cold: the process is started and handed the job at once (torch imports inside the measurement);
* same training: the training's next job, handed over the moment the previous one finished
  (a provider's steady state between rounds: sandboxed, the same process serves it);
* another training: another customer's job, handed over the moment the previous one finished
  (sandboxed, it gets a fresh process, which imports torch first);
* user task, cold: a job whose task is the customer's own code: a fresh process is started when
  the job arrives, the task package is fetched by its CID from a LocalContentStore into the job
  directory, and the process imports the task and trains (the whole path of a stranger's first job).

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

from aitbc_agent_sdk.records import MAX_TASK_BYTES, JobConfig, TaskRef
from aitbc_agent_sdk.provider._process import TASK_FILE, WEIGHTS_FILE, TrainingProcess
from aitbc_agent_sdk.provider._sandbox import TrainingSandbox
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.tasks._networks import build_model, model_spec_for
from aitbc_agent_sdk.wire._checkpoint import encode_state
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.tasks._task_package import encode_package, load_task, pack_task
from aitbc_agent_sdk.data._shard_files import write_shard

from quick import parse_args

USER_TASK = """from torch import nn

from aitbc_agent_sdk import TrainingTask


class StartupProbe(TrainingTask):
    name = "startup-probe"

    def build_model(self, info, params):
        return nn.Sequential(nn.Flatten(), nn.Linear(info.feature_shape[0], 32), nn.ReLU(),
                             nn.Linear(32, info.num_classes))
"""


def write_inputs(job_dir: Path):
    data = load_dataset("digits").subset(list(range(64)))
    spec = model_spec_for("mlp", data)
    job_dir.mkdir(parents=True, exist_ok=True)
    write_shard(job_dir, data)
    (job_dir / WEIGHTS_FILE).write_bytes(encode_state(build_model(spec, seed=0).state_dict()))
    return spec


async def to_first_step(process: TrainingProcess, job_dir: Path, spec, owner: str, task: TaskRef | None = None,
                        received: float | None = None) -> float:
    """Seconds from ``received`` (default: now) to the end of the job's first training step."""
    first = asyncio.get_running_loop().create_future()
    start = time.perf_counter() if received is None else received
    # One epoch of 64 samples in batches of 64: the first epoch event is the first step.
    await process.train(job_dir, job_id="bench", model=spec, config=JobConfig(epochs=1, batch_size=64), seed=0,
                        owner=owner, task=task,
                        on_epoch=lambda e: first.done() or first.set_result(time.perf_counter() - start))
    return first.result()


async def user_task_cold(work: Path, sandbox: TrainingSandbox | None) -> float:
    """A customer's own task, stored by CID; the clock starts when its job arrives at a provider with no process."""
    store = LocalContentStore(work / "store")
    (work / "startup_probe.py").write_text(USER_TASK)
    package = pack_task(work / "startup_probe.py")
    ref = TaskRef(name=package.manifest.name, cid=await store.add(encode_package(package)))
    data = load_dataset("digits").subset(list(range(64)))
    bound = bind_task(ref, load_task(package, work / "local_task"))
    job = work / "jobs" / "user-task"
    job.mkdir(parents=True)
    write_shard(job, data)
    (job / WEIGHTS_FILE).write_bytes(bound.initial_state(data, seed=0))
    process = TrainingProcess(work / "provider-cold", sandbox=sandbox)
    try:
        received = time.perf_counter()
        await process.start()
        (job / TASK_FILE).write_bytes(await store.cat(ref.cid, max_bytes=2 * MAX_TASK_BYTES))
        return await to_first_step(process, job, bound.model_spec(data), "training_c", ref, received)
    finally:
        await process.stop()


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
        user_task = await user_task_cold(Path(tmp), sandbox)
    return {"cold": cold, "same training": same, "another training": other, "user task, cold": user_task}


async def main(runs: int) -> None:
    medians: dict[str, dict[str, float]] = {}
    for name, sandbox in (("no sandbox", None), ("bwrap sandbox", TrainingSandbox())):
        results = [await one_run(sandbox) for _ in range(runs)]
        medians[name] = {case: statistics.median(r[case] for r in results) for case in results[0]}
        line = ", ".join(f"{case} {medians[name][case] * 1000:.0f} ms"
                         f" (min {min(r[case] for r in results) * 1000:.0f}, max {max(r[case] for r in results) * 1000:.0f})"
                         for case in results[0])
        print(f"{name}: median of {runs}: {line}")
    plain, boxed = medians["no sandbox"], medians["bwrap sandbox"]
    print(json.dumps({"bench": "sandbox_startup", "runs": runs,
                      "median_ms": {side: {case: round(s * 1000, 1) for case, s in m.items()} for side, m in medians.items()},
                      "ratio_sandbox_over_plain": {case: round(boxed[case] / plain[case], 3) for case in plain}}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=int, nargs="?", default=3)
    asyncio.run(main(parse_args(parser, runs=1).runs))
