"""Text from a training's language model: its current global weights, its task, its dataset's tokens.

The model is the one the round loop keeps (``record.model_cid``), rebuilt the way the coordinator
builds it to score a round (the training's bound task, the data shape from the dataset's
manifest), and sampled on this machine's CPU. The prompt is tokenized as the corpus import tokenized the
corpus (bytes, or the dataset's own BPE, read from the store and checked); an empty prompt starts at a
document boundary.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import torch

from ...errors import ConfigError, TrainingError
from ...records import MAX_PROMPT_BYTES, MAX_SAMPLE_TOKENS, SampleResult, TrainingRecord, weights_limit
from ...records._datasets import MAX_TOKENIZER_BYTES, DatasetManifest, TokenLayout
from ...storage import ContentStore
from ...wire._checkpoint import decode_state
from ...data._bpe import TextCodec, load_tokenizer
from ...data._corpus import ByteCodec
from ...data._dataset_dirs import manifest_shape
from ...tasks._gpt import GPT, generate
from ._datasets import DatasetStore
from ._tasks import TaskCache

MAX_TEMPERATURE = 10.0


class NotSampleableError(ConfigError):
    """The training has no language model to sample: a classifier, no model yet, or tokens this SDK cannot read."""


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    tokens: int = 200
    temperature: float = 0.8  # 0: greedy
    top_k: int | None = 40  # None: sample among every token
    seed: int = 0

    def check(self) -> None:
        """ConfigError for a request out of bounds, before anything is fetched."""
        if len(self.prompt.encode()) > MAX_PROMPT_BYTES:
            raise ConfigError(f"the prompt has {len(self.prompt.encode())} bytes, above the limit of "
                              f"{MAX_PROMPT_BYTES}")
        if not 1 <= self.tokens <= MAX_SAMPLE_TOKENS:
            raise ConfigError(f"tokens must lie in [1, {MAX_SAMPLE_TOKENS}], got {self.tokens}")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise ConfigError(f"temperature must lie in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be at least 1 (or None for every token), got {self.top_k}")


def prompt_tokens(prompt: str, layout: TokenLayout, codec: TextCodec | None = None) -> list[int]:
    """The prompt as the corpus import tokenizes text (``codec``; None: bytes); an empty prompt is the
    document separator."""
    return (codec or ByteCodec()).encode(prompt) or [layout.eot]


def complete(model: GPT, layout: TokenLayout, request: SampleRequest,
             codec: TextCodec | None = None) -> tuple[str, int]:
    """The continuation of ``request.prompt`` as text, and how many tokens it has (blocking: torch)."""
    codec = codec or ByteCodec()
    generator = torch.Generator().manual_seed(request.seed)
    new = generate(model, prompt_tokens(request.prompt, layout, codec), request.tokens,
                   temperature=request.temperature, top_k=request.top_k, generator=generator)
    return codec.decode([int(t) for t in new]), len(new)


async def load_codec(data: DatasetStore, manifest: DatasetManifest) -> TextCodec:
    """How the corpus of ``manifest`` was tokenized: bytes, or its BPE (fetched by CID, bounded, JSON only)."""
    layout = manifest.tokens
    assert layout is not None
    if layout.tokenizer_file is None:
        return ByteCodec()
    blob = await data.read_file(manifest, layout.tokenizer_file, max_bytes=MAX_TOKENIZER_BYTES)
    return await asyncio.to_thread(load_tokenizer, blob, layout)


async def load_language_model(store: ContentStore, data: DatasetStore, tasks: TaskCache,
                              record: TrainingRecord) -> tuple[GPT, TokenLayout, TextCodec]:
    """The training's current model, its tokens' layout and tokenizer; NotSampleableError when it has none to
    sample."""
    tid = record.training_id
    if record.dataset_cid is None:
        raise NotSampleableError(f"training {tid} has no dataset yet, so no model to sample")
    manifest = await data.manifest(record.dataset_cid)
    layout = manifest.tokens
    task_name = record.spec.task.name if record.spec.task is not None else record.spec.model_type
    if layout is None:
        raise NotSampleableError(f"training {tid} is not a language model: its task {task_name!r} trains on "
                                 f"{manifest.kind} data; sample needs a training on a text corpus (--task gpt)")
    if record.model_cid is None:
        raise NotSampleableError(f"training {tid} has no model yet (phase {record.phase.value}); "
                                 "sample it once its first round is done")
    bound = await tasks.bound(record.spec)
    spec = bound.model_spec(manifest_shape(manifest))
    state = decode_state(await store.cat(record.model_cid, max_bytes=weights_limit(record.spec.footprint)))
    try:
        model = await asyncio.to_thread(bound.loaded, spec, state)
    except RuntimeError as exc:  # load_state_dict: the stored tensors are not this task's model
        raise TrainingError(f"the model {record.model_cid} of {tid} does not fit its task {task_name!r}: "
                            f"{exc}") from exc
    if not isinstance(model, GPT):
        raise NotSampleableError(f"training {tid}'s task {task_name!r} builds a {type(model).__name__}, not the "
                                 "built-in gpt model sample generates with")
    return model, layout, await load_codec(data, manifest)


async def sample_text(store: ContentStore, data: DatasetStore, tasks: TaskCache, record: TrainingRecord,
                      request: SampleRequest) -> SampleResult:
    """``request.tokens`` tokens sampled from the training's model after ``request.prompt``."""
    request.check()
    model, layout, codec = await load_language_model(store, data, tasks, record)
    text, count = await asyncio.to_thread(complete, model, layout, request, codec)
    assert record.model_cid is not None
    return SampleResult(training_id=record.training_id, prompt=request.prompt, text=text, tokens=count,
                        model_cid=record.model_cid, round=record.round, temperature=request.temperature,
                        top_k=request.top_k, seed=request.seed)


__all__ = ["NotSampleableError", "SampleRequest", "complete", "load_codec", "load_language_model",
           "prompt_tokens", "sample_text"]
