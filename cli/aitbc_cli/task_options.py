"""The ``--task`` and ``--task-param`` options of ``run`` and ``init``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

TaskOption = Annotated[Optional[str], typer.Option(
    "--task", metavar="NAME|FILE.py|DIR",
    help="the training task: a built-in (mlp, cnn, transformer, or gpt: a language model for a text corpus) or your own "
         "TrainingTask code, packed into the store and run sandboxed by providers that accept it")]
TaskParamOption = Annotated[Optional[list[str]], typer.Option(
    "--task-param", metavar="KEY=VALUE",
    help="a hyper-parameter of the task (repeatable), checked against the task's Params")]
