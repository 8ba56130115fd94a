"""Samples/s of the provider path against a plain PyTorch loop: same task, model, data, device and threads.

``python bench/bench_task_path.py [--device cpu|cuda] [--tasks mlp,resnet,gpt] [--repeats N] [--quick]``.

The provider path is a real :class:`TrainingProcess` (in the bwrap sandbox where bubblewrap
works) that takes each job through its JSON-lines protocol: inputs staged, shard decoded, the
task's model built and loaded, :func:`train_task` (device, bf16 autocast on CUDA, the task's
loss and optimizer), the checkpoint written and taken back. Its time is the job's wall clock
as the provider sees it. The plain loop, in this process, trains the same model from the same
weights on the same tensors, already on the device: Adam, cross-entropy, shuffled batches,
bf16 autocast on CUDA where the task allows it, one loss read per epoch.

Tasks: ``mlp`` (the built-in, on synthetic tabular rows) and ``resnet`` (a small residual CNN
on synthetic ``[N, 3, side, side]`` images, user code: packed, stored in a LocalContentStore
and fetched by its CID into the job directory, as a provider fetches a stranger's task).
``gpt`` (the built-in language model, ``--gpt-*`` sized) trains on a token shard of the standard
library's own sources (bytes); its unit is tokens (windows x context x epochs), and its plain loop is
nanoGPT's: random windows of a token tensor on the device, AdamW, gradient clipping, bf16 autocast.
First job: the first job of a process that is ready (torch imported); steady: the later ones.
Steady jobs run in adjacent pairs (plain, provider), and the steady ratio is the median of the
pairs' ratios: on a shared machine the load drifts, and a pair sees nearly the same load.
Prints a line per task, then one JSON line with min/median/max samples/s and the ratios
provider / plain (steady, first job), plus the worker's own loop time against the plain loop and
the job's overhead around that loop (wall clock minus the worker's loop: staging, decoding, building,
the checkpoint), which the machine's load moves far less than samples/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from aitbc_agent_sdk.host._errors import SandboxError
from aitbc_agent_sdk.records import MAX_TASK_BYTES, JobConfig, ModelSpec, TaskRef
from aitbc_agent_sdk.records._datasets import DataSlices, FileSlice, ShardData, TokenLayout
from aitbc_agent_sdk.provider._process import TASK_FILE, WEIGHTS_FILE, TrainingProcess
from aitbc_agent_sdk.provider._sandbox import TrainingSandbox, require_bwrap
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.storage._unixfs import compute_cid
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.wire._checkpoint import decode_state
from aitbc_agent_sdk.tasks._bound_task import BoundTask, bind_task
from aitbc_agent_sdk.tasks._gpt_task import GptParams
from aitbc_agent_sdk.tasks._task_package import encode_package, load_task, pack_task
from aitbc_agent_sdk.data._shard_files import SHARD_INFO, TokenData, part_name, write_shard

from quick import parse_args

# The user task: written to a file, packed and stored as a customer's would be. {bf16} is the
# TrainingTask.bf16 class attribute, so the same model can be measured with and without autocast.
RESNET_SOURCE = '''
from pydantic import Field
from torch import nn

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width))

    def forward(self, x):
        return nn.functional.relu(x + self.body(x))


class BenchResNet(TrainingTask):
    name = "bench-resnet"
    bf16 = {bf16}

    class Params(TaskParams):
        width: int = Field(default=16, ge=4, le=256)
        blocks: int = Field(default=2, ge=1, le=8)

    def build_model(self, info: DataInfo, params) -> nn.Module:
        channels, width = info.feature_shape[0], params.width
        return nn.Sequential(nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                             *[Block(width) for _ in range(params.blocks)],
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, info.num_classes))
'''
CLASSES = 10


@dataclass(frozen=True)
class Job:
    """One task's job, as both sides run it."""

    name: str
    bound: BoundTask
    spec: ModelSpec
    data: LabeledData | TokenData
    weights: bytes
    job_dir: Path

    @property
    def unit(self) -> str:
        return "tokens" if isinstance(self.data, TokenData) else "samples"

    def work(self, config: JobConfig) -> int:
        """Samples (or tokens) one job trains on."""
        if isinstance(self.bound.params, GptParams):
            return self.bound.params.windows_per_epoch * self.bound.params.context * config.epochs
        return len(self.data) * config.epochs


def synthetic(shape: tuple[int, ...], samples: int, seed: int) -> LabeledData:
    """Seeded random inputs with learnable labels (a fixed random projection's argmax)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, *shape, generator=g)
    labels = (x.reshape(samples, -1) @ torch.randn(x[0].numel(), CLASSES, generator=g)).argmax(dim=1)
    return LabeledData(x, labels, CLASSES)


def stdlib_tokens(count: int) -> np.ndarray:
    """``count`` byte tokens of the standard library's sources (real text; files in a fixed order)."""
    chunks, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        chunks.append(np.frombuffer(path.read_bytes(), dtype=np.uint8))
        total += len(chunks[-1])
        if total >= count:
            break
    return np.concatenate(chunks)[:count].astype("<u2")


def write_token_shard(directory: Path, tokens: np.ndarray) -> TokenData:
    """A one-part byte-token shard in ``directory``, as a provider's job directory holds one."""
    raw = tokens.tobytes()
    shard = ShardData(kind="tokens", data=DataSlices(slices=(FileSlice(path="corpus.u16", cid=compute_cid(raw), offset=0,
                                                                       length=len(raw)),), samples=len(tokens)),
                      tokens=TokenLayout(vocab_size=256, eot=0))
    (directory / part_name(0)).write_bytes(raw)
    (directory / SHARD_INFO).write_text(shard.model_dump_json())
    return TokenData((np.memmap(directory / part_name(0), dtype="<u2", mode="r"),), vocab_size=256, eot=0)


async def mlp_job(args: argparse.Namespace, work: Path, store: LocalContentStore, job_dir: Path):
    data = synthetic((args.features,), args.samples, seed=1)
    write_shard(job_dir, data)
    return bind_task(TaskRef(name="mlp", params={"hidden": args.width * 64})), data


async def resnet_job(args: argparse.Namespace, work: Path, store: LocalContentStore, job_dir: Path):
    source = work / "bench_resnet.py"
    source.write_text(RESNET_SOURCE.replace("{bf16}", str(not args.no_bf16)))
    package = pack_task(source)
    cid = await store.add(encode_package(package))
    ref = TaskRef(name=package.manifest.name, cid=cid, params={"width": args.width})
    # As the provider fetches it: the package by CID from the store, verified, into the job directory.
    (job_dir / TASK_FILE).write_bytes(await store.cat(cid, max_bytes=2 * MAX_TASK_BYTES))
    data = synthetic((3, args.side, args.side), args.samples, seed=2)
    write_shard(job_dir, data)
    return bind_task(ref, load_task(package, work / "local_task")), data


async def gpt_job(args: argparse.Namespace, work: Path, store: LocalContentStore, job_dir: Path):
    data = write_token_shard(job_dir, stdlib_tokens(args.gpt_tokens))
    params = {"layers": args.gpt_layers, "heads": args.gpt_heads, "width": args.gpt_width,
              "context": args.gpt_context, "windows_per_epoch": args.gpt_windows, "eval_windows": 8}
    return bind_task(TaskRef(name="gpt", params=params)), data


async def make_job(name: str, args: argparse.Namespace, work: Path, store: LocalContentStore) -> Job:
    job_dir = work / "jobs" / name
    job_dir.mkdir(parents=True)
    bound, data = await JOB_MAKERS[name](args, work, store, job_dir)
    weights = bound.initial_state(data, seed=0)
    (job_dir / WEIGHTS_FILE).write_bytes(weights)
    return Job(name, bound, bound.model_spec(data), data, weights, job_dir)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(job: Job, config: JobConfig, device: torch.device, seed: int) -> float:
    """Seconds of a plain PyTorch loop over ``config.epochs`` epochs of the job's data."""
    model = job.bound.loaded(job.spec, decode_state(job.weights)).to(device)
    x, y = job.data.features.to(device), job.data.labels.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    generator = torch.Generator().manual_seed(seed)
    use_bf16 = device.type == "cuda" and job.bound.task.bf16
    model.train()
    sync(device)
    start = time.perf_counter()
    for _ in range(config.epochs):
        order = torch.randperm(len(job.data), generator=generator).to(device)
        total = torch.zeros((), device=device)
        for first in range(0, len(job.data), config.batch_size):
            idx = order[first:first + config.batch_size]
            with torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext():
                loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach()
        float(total)  # one read per epoch, as a loop that logs the epoch's loss does
    sync(device)
    return time.perf_counter() - start


def plain_gpt_loop(job: Job, config: JobConfig, device: torch.device, seed: int) -> float:
    """Seconds of nanoGPT's loop over as many windows as the job's epochs draw: the token tensor on the
    device, random windows, AdamW (decay on the matrices), gradient clipping, bf16 autocast on CUDA."""
    params = job.bound.params
    assert isinstance(params, GptParams) and isinstance(job.data, TokenData)
    model = job.bound.loaded(job.spec, decode_state(job.weights)).to(device)
    tokens = torch.from_numpy(np.concatenate(job.data.parts).astype(np.int64)).to(device)
    decayed = [p for n, p in model.named_parameters() if p.ndim >= 2 and "position" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "position" not in n)]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": params.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=config.learning_rate, betas=(0.9, 0.95))
    generator = torch.Generator(device=device).manual_seed(seed)
    offsets = torch.arange(params.context + 1, device=device)
    batches = [min(config.batch_size, params.windows_per_epoch - first)  # the task's batches, the last one short
               for first in range(0, params.windows_per_epoch, config.batch_size)]
    model.train()
    sync(device)
    start = time.perf_counter()
    for _ in range(config.epochs):
        total = torch.zeros((), device=device)
        for size in batches:
            starts = torch.randint(0, len(tokens) - params.context, (size,), generator=generator, device=device)
            window = tokens[starts[:, None] + offsets]
            with torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext():
                logits = model(window[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), window[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), params.grad_clip)
            optimizer.step()
            total += loss.detach()
        float(total)
    sync(device)
    return time.perf_counter() - start


JOB_MAKERS = {"mlp": mlp_job, "resnet": resnet_job, "gpt": gpt_job}
PLAIN_LOOPS: dict[str, Callable[[Job, JobConfig, torch.device, int], float]] = {
    "mlp": plain_loop, "resnet": plain_loop, "gpt": plain_gpt_loop}


async def provider_job(process: TrainingProcess, job: Job, config: JobConfig, seed: int) -> tuple[float, float]:
    """(wall seconds of the job as the provider sees it, seconds of the worker's own training loop)."""
    await process.ready()  # a process replaced after its job limit imports torch outside the measurement
    start = time.perf_counter()
    done = await process.train(job.job_dir, job_id=f"bench-{job.name}", model=job.spec, config=config, seed=seed,
                               owner="bench", task=job.bound.ref)
    return time.perf_counter() - start, float(done["seconds"])


def spread(values: list[float], digits: int = 1) -> dict[str, float]:
    return {"min": round(min(values), digits), "median": round(statistics.median(values), digits),
            "max": round(max(values), digits)}


async def measure(job: Job, process: TrainingProcess, args: argparse.Namespace, device: torch.device) -> dict:
    config = JobConfig(epochs=args.epochs, batch_size=args.batch_size)
    work, run_plain = job.work(config), PLAIN_LOOPS[job.name]
    first_plain = run_plain(job, config, device, seed=0)
    first_provider, _ = await provider_job(process, job, config, seed=0)
    plain, provider, loop, overhead = [], [], [], []
    for repeat in range(1, args.repeats + 1):  # adjacent pairs, in alternating order: load drifts cancel
        if repeat % 2:
            plain.append(work / run_plain(job, config, device, seed=repeat))
        wall, inside = await provider_job(process, job, config, seed=repeat)
        if not repeat % 2:
            plain.append(work / run_plain(job, config, device, seed=repeat))
        provider.append(work / wall)
        loop.append(work / inside)
        overhead.append((wall - inside) * 1000)
    pairs = [b / a for a, b in zip(plain, provider, strict=True)]
    return {"unit": job.unit, "samples": len(job.data), "epochs": config.epochs, "batch_size": config.batch_size,
            "parameters": sum(p.numel() for p in job.bound.build(job.spec).parameters()),
            "bf16": device.type == "cuda" and job.bound.task.bf16,
            "plain_samples_per_s": spread(plain), "provider_samples_per_s": spread(provider),
            "worker_loop_samples_per_s": spread(loop), "job_overhead_ms": spread(overhead),
            "first_job_samples_per_s": {"plain": round(work / first_plain, 1),
                                        "provider": round(work / first_provider, 1)},
            "steady_ratio": round(statistics.median(pairs), 3), "steady_ratio_of_pairs": spread(pairs, 3),
            "first_job_ratio": round(first_plain / first_provider, 3),
            "worker_loop_over_plain": round(statistics.median(b / a for a, b in zip(plain, loop, strict=True)), 3)}


def sandbox_here(unconfined: bool) -> TrainingSandbox | None:
    if unconfined:
        return None
    try:
        require_bwrap()
    except SandboxError:
        return None
    return TrainingSandbox()


async def main(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)  # the worker gets the same through its environment
    sandbox = sandbox_here(args.no_sandbox)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = LocalContentStore(work / "store")
        jobs = [await make_job(name, args, work, store) for name in args.tasks.split(",")]
        process = TrainingProcess(work / "provider", threads=args.threads, sandbox=sandbox,
                                  gpu=0 if device.type == "cuda" else None)
        try:
            await process.start()
            for job in jobs:
                results[job.name] = row = await measure(job, process, args, device)
                print(f"{job.name}: provider {row['provider_samples_per_s']['median']:.0f} {row['unit']}/s, plain "
                      f"{row['plain_samples_per_s']['median']:.0f} (median of {args.repeats}): steady ratio "
                      f"{row['steady_ratio']}, first job {row['first_job_ratio']}", flush=True)
        finally:
            await process.stop()
    print(json.dumps({"bench": "task_path", "device": device.type, "threads": args.threads,
                      "sandboxed": sandbox is not None, "repeats": args.repeats, "tasks": results,
                      "ratio_provider_over_plain": {name: r["steady_ratio"] for name, r in results.items()}}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--tasks", default="mlp,resnet", help="comma-separated: mlp, resnet, gpt")
    parser.add_argument("--samples", type=int, default=4096, help="samples in the shard")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7, help="steady-state jobs per side")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads, both sides")
    parser.add_argument("--width", type=int, default=16, help="resnet channels; the mlp's hidden width is 64x this")
    parser.add_argument("--side", type=int, default=16, help="resnet image side")
    parser.add_argument("--features", type=int, default=512, help="mlp input features")
    parser.add_argument("--no-bf16", action="store_true", help="the resnet task with bf16 = False")
    parser.add_argument("--gpt-layers", type=int, default=4, help="gpt: transformer blocks")
    parser.add_argument("--gpt-heads", type=int, default=4, help="gpt: attention heads")
    parser.add_argument("--gpt-width", type=int, default=128, help="gpt: embedding width")
    parser.add_argument("--gpt-context", type=int, default=128, help="gpt: tokens per window")
    parser.add_argument("--gpt-windows", type=int, default=512, help="gpt: windows per epoch")
    parser.add_argument("--gpt-tokens", type=int, default=2_000_000, help="gpt: byte tokens in the shard")
    parser.add_argument("--no-sandbox", action="store_true", help="run the provider's process unconfined")
    asyncio.run(main(parse_args(parser, samples=256, epochs=1, repeats=1, width=4, side=8, gpt_layers=1,
                                gpt_heads=2, gpt_width=32, gpt_context=32, gpt_windows=64, gpt_tokens=100_000)))
