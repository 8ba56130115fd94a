"""Text from a training's language model: its current global weights, its task, its dataset's tokens.

The model is the one the round loop keeps (``record.model_cid``), rebuilt the way the coordinator
builds it to score a round (the training's bound task, the data shape from the dataset's
manifest), and sampled on this machine's CPU. The prompt is byte-level tokens, as the corpus
import writes them; an empty prompt starts at a document boundary.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError, TrainingError
from ..models import MAX_PROMPT_BYTES, MAX_SAMPLE_TOKENS, MAX_WEIGHTS_BYTES, SampleResult, TrainingRecord
from ..models.datasets import TokenLayout
from ..storage import ContentStore
from ..training.checkpoint import decode_state
from ..training.corpus import decode_bytes, encode_bytes
from ..training.dataset_dirs import manifest_shape
from ..training.gpt import GPT, generate
from .datasets import DatasetStore
from .tasks import TaskCache

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


def prompt_tokens(prompt: str, layout: TokenLayout) -> list[int]:
    """The prompt as the corpus import tokenizes text; an empty prompt is the document separator."""
    return [int(t) for t in encode_bytes(prompt)] or [layout.eot]


def complete(model: GPT, layout: TokenLayout, request: SampleRequest) -> tuple[str, int]:
    """The continuation of ``request.prompt`` as text, and how many tokens it has (blocking: torch)."""
    generator = torch.Generator().manual_seed(request.seed)
    new = generate(model, prompt_tokens(request.prompt, layout), request.tokens, temperature=request.temperature,
                   top_k=request.top_k, generator=generator)
    return decode_bytes(np.asarray(new, dtype=np.int64)), len(new)


async def load_language_model(store: ContentStore, data: DatasetStore, tasks: TaskCache,
                              record: TrainingRecord) -> tuple[GPT, TokenLayout]:
    """The training's current model and its tokens' layout; NotSampleableError when it has none to sample."""
    tid = record.training_id
    if record.dataset_cid is None:
        raise NotSampleableError(f"training {tid} has no dataset yet, so no model to sample")
    manifest = await data.manifest(record.dataset_cid)
    layout = manifest.tokens
    task_name = record.spec.task.name if record.spec.task is not None else record.spec.model_type
    if layout is None:
        raise NotSampleableError(f"training {tid} is not a language model: its task {task_name!r} trains on "
                                 f"{manifest.kind} data; sample needs a training on a text corpus (--task gpt)")
    if layout.tokenizer != "bytes":
        raise NotSampleableError(f"training {tid}'s corpus uses a {layout.tokenizer} tokenizer; sample reads "
                                 "byte-level corpora only")
    if record.model_cid is None:
        raise NotSampleableError(f"training {tid} has no model yet (phase {record.phase.value}); "
                                 "sample it once its first round is done")
    bound = await tasks.bound(record.spec)
    spec = bound.model_spec(manifest_shape(manifest))
    state = decode_state(await store.cat(record.model_cid, max_bytes=MAX_WEIGHTS_BYTES))
    try:
        model = await asyncio.to_thread(bound.loaded, spec, state)
    except RuntimeError as exc:  # load_state_dict: the stored tensors are not this task's model
        raise TrainingError(f"the model {record.model_cid} of {tid} does not fit its task {task_name!r}: "
                            f"{exc}") from exc
    if not isinstance(model, GPT):
        raise NotSampleableError(f"training {tid}'s task {task_name!r} builds a {type(model).__name__}, not the "
                                 "built-in gpt model sample generates with")
    return model, layout


async def sample_text(store: ContentStore, data: DatasetStore, tasks: TaskCache, record: TrainingRecord,
                      request: SampleRequest) -> SampleResult:
    """``request.tokens`` tokens sampled from the training's model after ``request.prompt``."""
    request.check()
    model, layout = await load_language_model(store, data, tasks, record)
    text, count = await asyncio.to_thread(complete, model, layout, request)
    assert record.model_cid is not None
    return SampleResult(training_id=record.training_id, prompt=request.prompt, text=text, tokens=count,
                        model_cid=record.model_cid, round=record.round, temperature=request.temperature,
                        top_k=request.top_k, seed=request.seed)


__all__ = ["NotSampleableError", "SampleRequest", "complete", "load_language_model", "prompt_tokens", "sample_text"]
