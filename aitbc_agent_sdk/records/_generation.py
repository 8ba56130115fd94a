"""Text sampled from a trained language model (``aitbc distributed-training sample``), and a model exported
(``aitbc distributed-training export``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Cid, Id, Record

MAX_SAMPLE_TOKENS = 4096  # what one sample may generate: a page or two of text, seconds on a CPU
MAX_PROMPT_BYTES = 16_384  # a prompt's UTF-8 bytes (byte-level tokens: one per byte); the model sees its context


class SampleResult(Record):
    training_id: Id
    prompt: str = Field(max_length=MAX_PROMPT_BYTES)
    text: str = Field(description="the generated continuation, without the prompt")
    tokens: int = Field(ge=0, le=MAX_SAMPLE_TOKENS, description="tokens generated")
    model_cid: Cid = Field(description="the model sampled: the training's global model after `round`")
    round: int = Field(ge=0, description="rounds the model had completed")
    temperature: float = Field(ge=0.0)
    top_k: int | None = Field(default=None, ge=1)
    seed: int


ExportFormat = Literal["safetensors", "hf"]


class ExportResult(Record):
    training_id: Id
    round: int = Field(ge=1, description="the round whose global model was exported")
    model_cid: Cid = Field(description="that round's model in the content store")
    format: ExportFormat
    out: str = Field(description="the directory written")
    files: tuple[str, ...] = Field(description="the files in it, by name")
