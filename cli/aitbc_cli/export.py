"""``aitbc distributed-training export``: a training's model as files other tools read."""

from __future__ import annotations

import asyncio
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

from aitbc_agent_sdk.records import ExportResult

from .common import HomeOption, JsonOption, print_json, resolve_home
from .training_views import LATEST, TrainingRefOption, resolve_training_id


class Format(str, Enum):
    safetensors = "safetensors"
    hf = "hf"


def export(
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help=(
        "the directory to create (absent or empty); written beside it and renamed at the end, so a failure "
        "leaves it as it was"))],
    round_: Annotated[Optional[int], typer.Option("--round", min=1, help="the round whose global model to export "
                                                                          "(default: the last round done)")] = None,
    format_: Annotated[Format, typer.Option("--format", help="safetensors: the weights with their provenance and a "
                                                             "model card (any task); hf: a transformers GPT-2 "
                                                             "directory with the tokenizer (the gpt task)")
                       ] = Format.safetensors,
    training_id: TrainingRefOption = LATEST,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Export a training's model: safetensors with a model card, or a Hugging Face transformers directory.

    The model is fetched from the home's content store and written on this machine. Load an hf export with
    transformers: AutoModelForCausalLM.from_pretrained(DIR) and AutoTokenizer.from_pretrained(DIR).

    Example: aitbc distributed-training export --training-id training_... --out gpt-hf --format hf
    """
    from aitbc_agent_sdk.flow import export_training

    root = resolve_home(home)
    result = asyncio.run(export_training(root, resolve_training_id(root, training_id), out, round_=round_,
                                         format_=format_.value))
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    Console().print(export_text(result))


def export_text(result: ExportResult) -> Text:
    """What was written, where, and from which model (a Text: paths are never parsed as markup)."""
    text = Text(f"Exported round {result.round} of {result.training_id} as {result.format} to {result.out}\n")
    text.append(f"  model {result.model_cid}\n", style="dim")
    text.append("  " + "  ".join(result.files))
    return text


def register(app: typer.Typer) -> None:
    app.command()(export)
