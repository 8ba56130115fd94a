"""Plain-words answers from plan outcomes (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import EFFECT_WORDS
from .executor import StepOutcome
from .tools import Registry


def not_understood(request: str, registry: Registry) -> str:
    lines = [f"Sorry, I did not understand \"{request.strip()}\". Here is what I can do:"]
    lines += [f"  - {line}" for line in registry.capabilities()]
    return "\n".join(lines)


def plan_lines(outcomes: Sequence[StepOutcome]) -> list[str]:
    """One line per step: what will run, with which arguments, and what it does to the world."""
    lines = []
    for n, o in enumerate(outcomes, 1):
        args = ", ".join(f"{k}={v}" for k, v in o.arguments.items() if v not in (None, [], {}))
        gate = " [needs confirmation]" if o.gated else ""
        lines.append(f"{n}. {o.tool}({args}): {EFFECT_WORDS.get(o.effect, o.effect)}{gate}")
    return lines


def answer(outcomes: Sequence[StepOutcome]) -> str:
    """What happened, step by step, in plain words."""
    if outcomes and all(o.status == "declined" for o in outcomes):
        return "Nothing was done: the plan was not confirmed."
    if outcomes and all(o.status == "dry-run" for o in outcomes):
        return "Dry run: this is the plan; nothing was run."
    lines = []
    for o in outcomes:
        if o.status == "done" and o.result is not None:
            lines.append(o.result.summary)
        elif o.status == "failed":
            lines.append(f"{o.tool} failed: {o.error}")
        elif o.status == "invalid":
            lines.append(f"I understood that you want {o.tool}, but I cannot run it yet: {o.error}")
        elif o.status == "skipped" and any(x.status in ("failed", "invalid") for x in outcomes):
            lines.append(f"{o.tool} was not run (an earlier step did not succeed).")
        elif o.status == "needs-confirmation":
            lines.append(f"{o.tool} was not run: it needs confirmation.")
    return "\n".join(lines) or "Nothing to do."
