"""``aitbc distributed-training sample``: text from a training's language model."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from aitbc_agent_sdk.records import MAX_SAMPLE_TOKENS, SampleResult
from aitbc_agent_sdk.records import visible

from .common import HomeOption, JsonOption, print_json, resolve_home
from .training_views import LATEST, TrainingRefOption, resolve_training_id


def sample(
    prompt: Annotated[str, typer.Option("--prompt", help="the text the model continues (tokenized as its corpus: "
                                                         "bytes or the corpus's BPE; empty: start a new document)")],
    tokens: Annotated[int, typer.Option("--tokens", min=1, max=MAX_SAMPLE_TOKENS,
                                        help="how many tokens to generate (bytes of text on a byte-level corpus)")
                  ] = 200,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, max=10.0,
                                               help="sampling temperature; 0 always takes the likeliest token")] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k", min=0,
                                       help="sample among the k likeliest tokens; 0: among all of them")] = 40,
    seed: Annotated[int, typer.Option("--seed", help="seed of the sampling: the same seed gives the same text")] = 0,
    training_id: TrainingRefOption = LATEST,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print text from a training's language model: its current global model continues the prompt.

    The training must be a language model (the gpt task on a text corpus) with at least one round done; the model is fetched from the home's content store and sampled on this machine's CPU.

    Example: aitbc distributed-training sample --training-id training_... --prompt "def main(" --tokens 120
    """
    from aitbc_agent_sdk.flow import sample_training

    root = resolve_home(home)
    result = asyncio.run(sample_training(root, resolve_training_id(root, training_id), prompt, tokens=tokens,
                                         temperature=temperature, top_k=top_k or None, seed=seed))
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    Console().print(sample_text(result))


def sample_text(result: SampleResult) -> Text:
    """The prompt dimmed, the model's continuation, and where it came from."""
    # A model's bytes never drive the terminal; a Text is not parsed as markup.
    text = Text(visible(result.prompt, multiline=True), style="dim")
    text.append(visible(result.text, multiline=True))
    text.append(f"\n\n{result.tokens} tokens from {result.model_cid} after round {result.round}", style="dim italic")
    return text


def register(app: typer.Typer) -> None:
    app.command()(sample)
