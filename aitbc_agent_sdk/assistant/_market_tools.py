"""Marketplace training tools, the seed's step-by-step flow: init, upload-data, discover, distribute,
resume. Each handler makes the same SDK calls as its ``aitbc distributed-training`` command."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from .. import flow
from ..errors import DatasetError
from ..records import JobConfig, OuterName, TaskRef, TrainingSpec, UpdateEncoding
from . import _sdk as sdk
from ._base import Tool, ToolArgs, ToolContext, ToolResult

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

TRAINING_ID_HELP = ("training id (training_...); omitted: the training an earlier step of the same request "
                    "created, else the most recent one")


_JOB = JobConfig.model_fields  # the tuned defaults live on JobConfig, shared with the CLI
_SPEC = TrainingSpec.model_fields
BuiltinTaskName = Literal["mlp", "cnn", "transformer", "gpt"]
TEXT_TASKS = frozenset({"gpt"})  # the built-ins that train on a text corpus
TaskParamValue = int | float | bool | str
UPLOADS = {"weights": "workers upload their weights", "float32": "workers upload their change as float32",
           "bf16": "workers upload their change as bf16",
           "int8": "workers upload their change as blockwise int8 (with error feedback)"}


class InitArgs(ToolArgs):
    model_type: Literal["mlp", "cnn", "transformer"] = Field("mlp", description="classifier to train; task "
                                                             "overrides it")
    task: BuiltinTaskName | None = Field(None, description=(
        "a built-in task by name, in place of model_type: gpt is a decoder-only transformer language model "
        "trained on a text corpus (a directory of .txt files)"))
    task_params: dict[str, TaskParamValue] = Field(default_factory=dict, description=(
        "the task's hyper-parameters, checked against it; gpt: layers, heads, width, context, dropout, "
        "warmup_steps, weight_decay, grad_clip"))
    outer: OuterName | None = Field(None, description=(
        "outer optimizer: fedavg (the new model is the workers' average) or diloco (the average change is a "
        "pseudo-gradient for Nesterov SGD on the coordinator; for language models over slow links); "
        "omitted: fedavg"))
    outer_lr: float | None = Field(None, gt=0.0, le=10.0, description=(
        f"diloco's outer learning rate; omitted: {_SPEC['outer_lr'].default}"))
    outer_momentum: float | None = Field(None, ge=0.0, lt=1.0, description=(
        f"diloco's outer Nesterov momentum; omitted: {_SPEC['outer_momentum'].default}"))
    update_encoding: UpdateEncoding | None = Field(None, description=(
        "what workers upload: weights, or their change over the round as float32, bf16 or blockwise int8 "
        "(about a quarter of float32's bytes); omitted: weights under fedavg, float32 under diloco"))
    target_workers: int = Field(3, ge=1, le=64, description="workers to hire")
    rounds: int = Field(5, ge=1, le=1000, description="federated rounds")
    epochs: int = Field(_JOB["epochs"].default, ge=1, le=100, description="local epochs per round")
    spares: int = Field(0, ge=0, le=64, description="spare providers hired to replace failed workers")
    wallet: str = Field("dev", description="the coordinator's wallet, which pays the escrow")


class UploadArgs(ToolArgs):
    training_id: str | None = Field(None, description=TRAINING_ID_HELP)
    data_path: str = Field("digits", description=(
        ".npz, .pt or .csv file, a directory (of .txt files: a text corpus), or 'digits' (the bundled dataset)"))
    label_column: str | None = Field(None, description="label column of a CSV file")
    text_corpus: bool = Field(False, description=(
        "the data must be a text corpus (a directory of .txt files, tokenized byte-level on import), as a gpt "
        "training needs; checked before anything runs (a gpt training checks it anyway)"))


class DiscoverArgs(ToolArgs):
    training_id: str | None = Field(None, description=TRAINING_ID_HELP)
    required_workers: int | None = Field(None, ge=1, le=64, description="workers to hire; omitted: the training's")
    min_gpu: str | None = Field(None, description="slowest GPU accepted, e.g. RTX3090; omitted or 'cpu': any")
    max_price: float | None = Field(None, gt=0, description="highest price per round per worker, in ETH")


class TrainingArgs(ToolArgs):
    training_id: str | None = Field(None, description=TRAINING_ID_HELP)


def training_spec(a: InitArgs) -> TrainingSpec:
    """The spec ``training_init`` creates (before the task's parameters are checked against the task)."""
    name = a.task or (a.model_type if a.task_params else None)
    options = {k: v for k, v in (("outer", a.outer), ("outer_lr", a.outer_lr), ("outer_momentum", a.outer_momentum),
                                 ("update_encoding", a.update_encoding)) if v is not None}
    task = TaskRef(name=name, params=a.task_params) if name else None
    return TrainingSpec(model_type=name or a.model_type, task=task, target_workers=a.target_workers,
                        rounds=a.rounds, spare_workers=a.spares, job=JobConfig(epochs=a.epochs), **options)


def describe_training(a: InitArgs, data_path: str | None = None) -> str:
    """What ``a`` trains, in words: the model and its size, the data, workers, rounds, outer step, uploads."""
    spec = training_spec(a)
    name = spec.task.name if spec.task is not None else spec.model_type
    params = ", ".join(f"{k}={v}" for k, v in sorted(spec.task.params.items())) if spec.task is not None else ""
    if name in TEXT_TASKS:
        model = f"a GPT language model (task {name}: a decoder-only transformer{'; ' + params if params else ''})"
        where = f" on the text corpus at {data_path}" if data_path else ""
    else:
        model, where = f"a {name}" + (f" ({params})" if params else ""), f" on {data_path}" if data_path else ""
    outer = (f"DiLoCo outer steps (outer learning rate {spec.outer_lr}, Nesterov momentum {spec.outer_momentum})"
             if spec.outer == "diloco" else "FedAvg of the workers' models")
    return (f"{model}{where}, {spec.target_workers} workers, {spec.rounds} rounds, {outer}, "
            f"{UPLOADS[spec.upload_encoding]}")


def check_text_corpus(data_path: str) -> Path:
    """The directory of .txt files a gpt trains on, or a DatasetError saying what ``data_path`` is instead."""
    from ..data import TEXT_SUFFIXES
    from ..data import dataset_kind, visible_files

    need = "a GPT trains on a text corpus, a directory of .txt files"
    if data_path == "digits":
        raise DatasetError(f"no text corpus was named: {need}; say where it is, e.g. 'train a GPT on my text "
                           "corpus ./wiki'")
    path = Path(data_path).expanduser()
    if not path.exists():
        raise DatasetError(f"{data_path}: no such directory; {need}")
    if not path.is_dir():
        raise DatasetError(f"{data_path} is a file; {need} (put it in a folder and name the folder)")
    kind = dataset_kind(path)  # an empty directory is refused here
    if kind != "tokens":
        others = sorted({p.suffix.lower() or p.name for p in visible_files(path)
                         if p.suffix.lower() not in TEXT_SUFFIXES})
        raise DatasetError(f"{data_path} is not a text corpus ({kind} data: it holds {', '.join(others[:5])} "
                           f"files); {need} only")
    return path


def _check_upload(a: UploadArgs) -> None:
    if a.text_corpus:
        check_text_corpus(a.data_path)


async def _trains_text(ctx: ToolContext, tid: str) -> bool:
    spec = (await sdk.training(ctx.home, tid)).spec
    return (spec.task.name if spec.task is not None else spec.model_type) in TEXT_TASKS


async def _signer(ctx: ToolContext, tid: str) -> tuple[str, LocalAccount]:
    wallet = await flow.wallet_of(ctx.home, tid)
    return wallet, await sdk.unlock(ctx, wallet)  # a wrong password fails here, not in a daemon


async def init_training(ctx: ToolContext, a: InitArgs) -> ToolResult:
    from ..devnet import wallet_store

    spec = training_spec(a)
    account = await wallet_store(ctx.home).unlock(a.wallet, ctx.password(a.wallet))
    async with flow.devnet_agent(ctx.home, account, "aitbc-assistant") as agent:
        if spec.task is not None:  # the task's parameters are checked against it, as the CLI's --task does
            spec = await flow.attach_task(agent, spec, spec.task.name, dict(spec.task.params))
        record = await flow.create_training(agent, spec, a.wallet)
    ctx.training_id = record.training_id
    await ctx.acting_on(record.training_id)
    chosen = a.task or a.task_params or a.outer or a.update_encoding
    what = (describe_training(a) if chosen else
            f"a {a.model_type} for {a.target_workers} workers, {a.rounds} rounds")
    return ToolResult(f"Created training {record.training_id}: {what}, paid from wallet {a.wallet}. "
                      "Nothing is spent yet.",
                      {"training_id": record.training_id, "model_type": spec.model_type,
                       "task": spec.task.name if spec.task is not None else None, "outer": spec.outer,
                       "update_encoding": spec.upload_encoding, "target_workers": a.target_workers,
                       "rounds": a.rounds, "coordinator": record.coordinator},
                      training_id=record.training_id)


async def upload_data(ctx: ToolContext, a: UploadArgs) -> ToolResult:
    tid = await sdk.resolve_training(ctx, a.training_id)
    if a.text_corpus or await _trains_text(ctx, tid):  # a gpt on anything else would fail on the providers
        await asyncio.to_thread(check_text_corpus, a.data_path)
    source = flow.dataset_source(a.data_path)
    await asyncio.to_thread(flow.check_dataset, source, a.label_column)  # fail before connecting
    await ctx.acting_on(tid)
    _, account = await _signer(ctx, tid)
    async with flow.devnet_agent(ctx.home, account, "aitbc-assistant") as agent:
        cid = await flow.upload_data(agent, tid, source, a.label_column)
    ctx.training_id = tid
    return ToolResult(f"Uploaded {a.data_path} for {tid}: content id {cid}.",
                      {"training_id": tid, "dataset_cid": cid}, training_id=tid)


async def discover_workers(ctx: ToolContext, a: DiscoverArgs) -> ToolResult:
    tid = await sdk.resolve_training(ctx, a.training_id)
    await ctx.acting_on(tid)
    max_wei = sdk.to_wei(a.max_price) if a.max_price is not None else None
    _, account = await _signer(ctx, tid)
    async with flow.devnet_agent(ctx.home, account, "aitbc-assistant") as agent:
        hired = await flow.hire_workers(agent, tid, a.required_workers, min_gpu=a.min_gpu, max_price_wei=max_wei)
    rows = [h.as_dict() for h in hired]
    total = sum(h.price_wei for h in hired if h.role == "worker")
    ctx.training_id = tid
    return ToolResult(f"Signed contracts with {len(rows)} workers for {tid}; together they cost "
                      f"{sdk.eth(total)} ETH per round (paid from the escrow only for accepted work).",
                      {"training_id": tid, "workers": rows}, training_id=tid)


async def distribute(ctx: ToolContext, a: TrainingArgs) -> ToolResult:
    tid = await sdk.resolve_training(ctx, a.training_id)
    wallet, account = await _signer(ctx, tid)
    await ctx.acting_on(tid)
    started = await flow.distribute(ctx.home, tid, account, ctx.password(wallet))
    ctx.training_id = tid
    return ToolResult(f"Funded the escrow of {tid} (tx {started.escrow_tx}) and handed {started.workers} jobs to a "
                      f"coordinator daemon (pid {started.pid}); ask 'how is {tid} doing?' to follow it.",
                      {"training_id": tid, "escrow_tx": started.escrow_tx, "workers": started.workers,
                       "coordinator_pid": started.pid, "log": str(started.log)}, training_id=tid)


async def resume(ctx: ToolContext, a: TrainingArgs) -> ToolResult:
    tid = await sdk.resolve_training(ctx, a.training_id)
    record = await flow.load_training(ctx.home, tid)
    if (reason := flow.resume_blocker(ctx.home, record)) is not None:
        return ToolResult(f"{reason}; nothing to do.", {"training_id": tid, "phase": record.phase.value},
                          training_id=tid)
    wallet, _ = await _signer(ctx, tid)
    await ctx.acting_on(tid)
    started = await flow.resume(ctx.home, tid, ctx.password(wallet))
    return ToolResult(f"Resumed {tid} after round {record.round} in a new coordinator daemon (pid {started.pid}).",
                      {"training_id": tid, "round": record.round, "phase": record.phase.value,
                       "coordinator_pid": started.pid}, training_id=tid)


TOOLS: tuple[Tool, ...] = (
    Tool("training_init", "Create a marketplace training (a classifier, or task gpt: a language model for a text "
         "corpus; workers, rounds, outer optimizer fedavg or diloco, update encoding). Writes a local record; "
         "nothing is spent.", InitArgs, "write", init_training, "train a GPT on my text corpus ./wiki"),
    Tool("upload_data", "Validate a dataset (a text corpus for a gpt) and store it by content id for a training.",
         UploadArgs, "write", upload_data, "upload ./data.npz to training_...", preflight=_check_upload),
    Tool("discover_workers", "Find providers on the market (GPU model, price cap), score them, and sign "
         "contracts with the best for a training. Commits money per accepted round.", DiscoverArgs, "spend",
         discover_workers, "hire 10 RTX 3090 workers under 0.5 ETH each"),
    Tool("distribute", "Fund a training's escrow, shard its data and start the coordinator daemon that runs "
         "the rounds and pays the workers.", TrainingArgs, "spend", distribute, "distribute training_..."),
    Tool("resume", "Start a new coordinator daemon for a funded training whose coordinator died.", TrainingArgs,
         "spend", resume, "resume training_... after its coordinator crashed"),
)

