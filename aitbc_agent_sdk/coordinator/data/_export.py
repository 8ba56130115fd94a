"""A training's model as files other tools read: safetensors with its provenance, or a ``transformers`` GPT-2.

``safetensors`` (any task): ``model.safetensors`` holds the round's global weights under the task's own
names, its metadata says where they came from (task, parameters, round, model CID, training id), and
``README.md`` is a short model card (task, data, rounds, workers, final metrics: the round records
``monitor`` reads). ``hf`` (the built-in gpt): a directory ``AutoModelForCausalLM.from_pretrained`` loads,
with the corpus's tokenizer (see :mod:`~aitbc_agent_sdk.tasks._gpt_export` for the mapping).

Everything is checked and fetched before ``out`` is touched; the files are written into a directory
beside it that is renamed to ``out`` at the end, so a failure leaves ``out`` as it was.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from ...errors import ConfigError, TrainingError
from ...records import ExportFormat, ExportResult, RoundMetrics, TrainingRecord, weights_limit
from ...records._datasets import MAX_TOKENIZER_BYTES, DatasetManifest
from ...storage import ContentStore
from ...wire._checkpoint import decode_state, encode_state
from ...data._bpe import EOT_TEXT, byte_tokenizer, load_tokenizer
from ...data._dataset_dirs import manifest_shape
from ...tasks import task_ref_of
from ...tasks._gpt import GPT
from ...tasks._gpt_export import gpt2_config, gpt2_state_dict
from ._datasets import DatasetStore
from ._tasks import TaskCache

FORMATS: tuple[ExportFormat, ...] = ("safetensors", "hf")
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "README.md"


class NotExportableError(ConfigError):
    """Nothing to export as asked: no model yet, no such round, a format the task has no mapping to, a used ``out``."""


# -- what the files say (pure) -------------------------------------------------------------------


def pick_round(record: TrainingRecord, rounds: Sequence[RoundMetrics], round_: int | None) -> RoundMetrics:
    """The round to export: ``round_``, else the last one done; NotExportableError when there is none."""
    tid = record.training_id
    if not rounds:
        raise NotExportableError(f"training {tid} has no trained model yet (phase {record.phase.value}, no round "
                                 "done); export it once its first round is done")
    if round_ is None:
        return rounds[-1]
    found = [r for r in rounds if r.round == round_]
    if not found:
        raise NotExportableError(f"training {tid} has no round {round_}: its rounds done are "
                                 f"{rounds[0].round} to {rounds[-1].round}")
    return found[0]


def check_format(record: TrainingRecord, format_: str) -> None:
    """NotExportableError for a format unknown, or one the training's task has no mapping to."""
    if format_ not in FORMATS:
        raise NotExportableError(f"unknown export format {format_!r}; formats are {', '.join(FORMATS)}")
    ref = task_ref_of(record.spec)
    if format_ == "hf" and not (ref.builtin and ref.name == "gpt"):
        raise NotExportableError(f"--format hf exports the built-in gpt task as a transformers GPT-2; training "
                                 f"{record.training_id} runs task {ref.name!r}: export it as safetensors")


def check_out(out: Path) -> None:
    """NotExportableError unless ``out`` is absent or an empty directory: an export never mixes with other files."""
    if out.is_dir() and not any(out.iterdir()):
        return
    if out.exists() or out.is_symlink():
        raise NotExportableError(f"{out} already exists and is not an empty directory: choose a new --out")


def export_metadata(record: TrainingRecord, round_: RoundMetrics) -> dict[str, str]:
    """The safetensors header's metadata (strings only): where these weights come from."""
    ref = task_ref_of(record.spec)
    return {"format": "pt",  # transformers refuses a safetensors file without it
            "training_id": record.training_id, "round": str(round_.round), "model_cid": round_.model_cid,
            "task": ref.model_dump_json(), "task_params": json.dumps(ref.params, sort_keys=True),
            "dataset_cid": record.dataset_cid or ""}


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def model_card(record: TrainingRecord, rounds: Sequence[RoundMetrics], round_: RoundMetrics,
               manifest: DatasetManifest | None, format_: ExportFormat) -> str:
    """README.md of an export: the task, the data, the rounds, the workers and the metrics."""
    ref = task_ref_of(record.spec)
    task = f"`{ref.name}`" + ("" if ref.builtin else f" (user task, package `{ref.cid}`)")
    data = f"dataset `{record.dataset_cid}`" if record.dataset_cid else "no dataset recorded"
    if manifest is not None:
        data += f", {manifest.kind}"
        if manifest.tokens is not None:
            tokens = manifest.tokens
            data += f", {tokens.vocab_size} tokens ({'byte-level BPE' if tokens.tokenizer == 'bpe' else 'bytes'})"
    names = sorted(set(round_.metrics) - {"loss"})  # the loss has its own column
    final = ", ".join(f"{name} {_number(round_.metrics[name])}" for name in names)
    lines = [
        f"# {record.training_id}, round {round_.round}", "",
        f"Exported by `aitbc distributed-training export --format {format_}` from a federated training.", "",
        f"- Task: {task}, parameters `{json.dumps(ref.params, sort_keys=True)}`",
        f"- Data: {data}",
        f"- Rounds: {round_.round} of {record.spec.rounds} done when exported (phase {record.phase.value})",
        f"- Workers: {round_.workers} in round {round_.round}, {record.spec.target_workers} targeted",
        f"- Final metrics: loss {_number(round_.loss)}" + (f", {final}" if final else ""),
        f"- Model: `{round_.model_cid}`", "",
        _row(["round", "workers", "loss", *names]), _row(["---"] * (3 + len(names))),
    ]
    lines += [_row([str(r.round), str(r.workers), _number(r.loss), *(_number(r.metrics.get(n)) for n in names)])
              for r in rounds if r.round <= round_.round]
    return "\n".join(lines) + "\n"


def tokenizer_config(context: int) -> dict[str, object]:
    """``tokenizer_config.json``: the tokenizer.json as is, the corpus's separator as GPT-2's special token (no
    unknown token: every byte has one)."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": context, "add_prefix_space": False,
            "bos_token": EOT_TEXT, "eos_token": EOT_TEXT}


# -- reading the model and writing the files -------------------------------------------------------------


async def _hf_files(data: DatasetStore, tasks: TaskCache, record: TrainingRecord, manifest: DatasetManifest,
                    state: Mapping[str, torch.Tensor], metadata: dict[str, str]) -> dict[str, bytes]:
    """config.json, model.safetensors under GPT-2's names, tokenizer.json and tokenizer_config.json."""
    layout = manifest.tokens
    if layout is None:
        raise NotExportableError(f"training {record.training_id} is not a language model: it trains on "
                                 f"{manifest.kind} data")
    bound = await tasks.bound(record.spec)
    try:
        model = await asyncio.to_thread(bound.loaded, bound.model_spec(manifest_shape(manifest)), dict(state))
    except RuntimeError as exc:  # load_state_dict: the stored tensors are not this task's model
        raise TrainingError(f"the model of {record.training_id} does not fit its task: {exc}") from exc
    assert isinstance(model, GPT)  # check_format let only the built-in gpt through
    weights = gpt2_state_dict(model.state_dict(), model.config)
    if layout.tokenizer_file is None:
        tokenizer = byte_tokenizer(layout.eot).to_str()
    else:  # the corpus's own BPE, checked as sample checks it before anything parses it
        blob = await data.read_file(manifest, layout.tokenizer_file, max_bytes=MAX_TOKENIZER_BYTES)
        await asyncio.to_thread(load_tokenizer, blob, layout)
        tokenizer = blob.decode("utf-8")
    dtype = next(iter(weights.values())).dtype
    return {"config.json": _json(gpt2_config(model.config, eot=layout.eot, dtype=dtype)),
            WEIGHTS_FILE: encode_state(weights, metadata), "tokenizer.json": tokenizer.encode(),
            "tokenizer_config.json": _json(tokenizer_config(model.config.context))}


def _json(doc: object) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def write_dir(out: Path, files: Mapping[str, bytes]) -> None:
    """``files`` in a new directory ``out`` (absent or empty), written beside it and renamed in place at the end."""
    check_out(out)
    partial = out.parent / f".{out.name}.partial-{secrets.token_hex(4)}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        partial.mkdir()  # the user's umask, unlike mkdtemp's 0700
    except OSError as exc:  # a parent that is a file, or not writable
        raise NotExportableError(f"cannot create {out}: {exc.strerror or exc}") from exc
    try:
        for name, blob in files.items():
            (partial / name).write_bytes(blob)
        if out.is_dir():
            out.rmdir()  # empty (check_out); a file put there meanwhile fails this, and nothing is lost
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


async def export_model(store: ContentStore, data: DatasetStore, tasks: TaskCache, record: TrainingRecord,
                       rounds: Sequence[RoundMetrics], out: Path, *, round_: int | None = None,
                       format_: str = "safetensors") -> ExportResult:
    """Write the global model after ``round_`` (None: the last round done) into ``out`` as ``format_``."""
    check_format(record, format_)
    fmt: ExportFormat = "hf" if format_ == "hf" else "safetensors"
    chosen = pick_round(record, rounds, round_)
    check_out(out)  # before the fetch: a used --out costs no download
    manifest = await data.manifest(record.dataset_cid) if record.dataset_cid else None
    state = decode_state(await store.cat(chosen.model_cid, max_bytes=weights_limit(record.spec.footprint)))
    metadata = export_metadata(record, chosen)
    if fmt == "hf":
        assert manifest is not None  # a round was done, so the training has its dataset
        files = await _hf_files(data, tasks, record, manifest, state, metadata)
    else:
        files = {WEIGHTS_FILE: encode_state(state, metadata)}
    files[CARD_FILE] = model_card(record, rounds, chosen, manifest, fmt).encode()
    await asyncio.to_thread(write_dir, out, files)
    return ExportResult(training_id=record.training_id, round=chosen.round, model_cid=chosen.model_cid,
                        format=fmt, out=str(out), files=tuple(sorted(files)))


__all__ = ["CARD_FILE", "FORMATS", "NotExportableError", "WEIGHTS_FILE", "check_format", "check_out",
           "export_metadata", "export_model", "model_card", "pick_round", "tokenizer_config", "write_dir"]
