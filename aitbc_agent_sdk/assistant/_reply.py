"""Plain-words answers from plan outcomes (pure).

What a step returns may quote other parties (a worker's error, a provider's hardware name): every such
piece is made inert here (``models.inert.visible``), so an answer is safe as it is, in a terminal or a
JSON reply."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from ..records import visible
from ._base import EFFECT_WORDS
from ._executor import StepOutcome
from ._market_tools import InitArgs, describe_training
from ._tools import Registry


def not_understood(request: str, registry: Registry) -> str:
    lines = [f"Sorry, I did not understand \"{visible(request.strip())}\". Here is what I can do:"]
    lines += [f"  - {line}" for line in registry.capabilities()]
    return "\n".join(lines)


def plan_lines(outcomes: Sequence[StepOutcome]) -> list[str]:
    """One line per step: what will run, with which arguments, and what it does to the world."""
    lines = []
    for n, o in enumerate(outcomes, 1):
        args = visible(", ".join(f"{k}={v}" for k, v in o.arguments.items() if v not in (None, [], {})))
        gate = " [needs confirmation]" if o.gated else ""
        lines.append(f"{n}. {visible(o.tool)}({args}): {EFFECT_WORDS.get(o.effect, o.effect)}{gate}")
    return lines


def what_it_trains(outcomes: Sequence[StepOutcome]) -> str | None:
    """For a plan that names a task (a GPT, say): what it trains, on which data, with which settings."""
    init = next((o for o in outcomes if o.tool == "training_init" and o.arguments.get("task")), None)
    if init is None:
        return None
    upload = next((o for o in outcomes if o.tool == "upload_data"), None)
    data = upload.arguments.get("data_path") if upload is not None else None
    try:
        args = InitArgs.model_validate(init.arguments)
    except ValidationError:
        return None  # the step's own error says what is wrong
    stopped = any(o.status in ("invalid", "declined") for o in outcomes)
    return (f"{'You asked for' if stopped else 'What this trains'}: "
            f"{visible(describe_training(args, data if data != 'digits' else None))}.")


def answer(outcomes: Sequence[StepOutcome]) -> str:
    """What happened, step by step, in plain words, after what the plan trains when it names a task."""
    steps = _steps_answer(outcomes)
    intro = what_it_trains(outcomes)
    return f"{intro}\n{steps}" if intro else steps


def _steps_answer(outcomes: Sequence[StepOutcome]) -> str:
    if outcomes and all(o.status == "declined" for o in outcomes):
        return "Nothing was done: the plan was not confirmed."
    if outcomes and all(o.status == "dry-run" for o in outcomes):
        return "Dry run: this is the plan; nothing was run."
    lines = []
    for o in outcomes:
        tool, error = visible(o.tool), visible(o.error)  # an error is one line: a newline in it is not a new answer
        if o.status == "done" and o.result is not None:
            lines.append(visible(o.result.summary, multiline=True))
        elif o.status == "failed":
            lines.append(f"{tool} failed: {error}")
        elif o.status == "invalid":
            lines.append(f"I understood that you want {tool}, but I cannot run it yet: {error}")
        elif o.status == "skipped" and any(x.status in ("failed", "invalid") for x in outcomes):
            lines.append(f"{tool} was not run (an earlier step did not succeed).")
        elif o.status == "needs-confirmation":
            lines.append(f"{tool} was not run: it needs confirmation.")
    return "\n".join(lines) or "Nothing to do."
