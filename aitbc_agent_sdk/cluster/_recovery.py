"""Crash recovery decisions (pure): who takes a failed host's slot, whether the job can go on, and
whether the optimizer steps after a restart continue exactly from the last checkpoint.

What recovers a job is torchrun's elastic agent (``--nnodes MIN:MAX --max-restarts R``): when a
node dies the others' workers fail, their agents re-rendezvous and restart the workers, which
load the last checkpoint. The coordinator (:mod:`._job_watch`) only adds the decisions here:

* :func:`choose_spare`: the first healthy, unused spare (spares are kept most capable first);
  it is launched with the same rendezvous id and joins as a new node;
* :func:`enough_hosts`: without a spare the job goes on while ``MIN`` nodes remain;
* :func:`verify_step_log`: from rank 0's ``resume`` / ``step`` / ``checkpoint`` metric lines,
  that every restart resumed from the latest checkpoint saved before it and that the steps
  kept (each attempt's steps up to the checkpoint the next one resumed from) are 1..N with
  no step lost or applied twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ._plan import HostSlot


def choose_spare(spares: Sequence[HostSlot], *, used: Iterable[str], unhealthy: Iterable[str]) -> HostSlot | None:
    """The first spare (most capable first) that is neither in use nor known unhealthy."""
    skip = set(used) | set(unhealthy)
    return next((s for s in spares if s.name not in skip), None)


def enough_hosts(alive: int, min_nodes: int) -> bool:
    return alive >= min_nodes


class AttemptSummary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    attempt: str
    resumed_from: int | None
    first_step: int | None
    last_step: int | None
    steps: int
    kept: int = Field(description="steps that count: those up to the checkpoint the next attempt resumed from")


class ContinuityReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    attempts: tuple[AttemptSummary, ...]
    checkpoints: tuple[int, ...]
    effective_steps: int = Field(description="length of the kept step sequence, 1..N when ok")
    rolled_back_steps: int = Field(description="steps run after the last checkpoint before a crash, run again")
    problems: tuple[str, ...] = ()


def verify_step_log(records: Iterable[Mapping[str, Any]]) -> ContinuityReport:
    """Check rank 0's log of one job (records in any order; sorted by their ``time``).

    Records (as :mod:`.ddp` prints them): ``{"event": "resume", "attempt": A, "resumed_from": S}``
    once per worker start, ``{"event": "step", "attempt": A, "step": k}`` after each optimizer
    step, ``{"event": "checkpoint", "step": k}`` after each checkpoint is durably in place.
    """
    attempts, saved = _attempts(records)
    problems: list[str] = []
    names = list(attempts)
    summaries: list[AttemptSummary] = []
    effective: list[int] = []
    rolled_back = 0
    for i, name in enumerate(names):
        entry = attempts[name]
        steps: list[int] = entry["steps"]
        resumed = entry["resumed_from"]
        if resumed is None:
            problems.append(f"attempt {name}: no resume record")
            resumed = steps[0] - 1 if steps else 0
        elif resumed < entry["last_saved"]:
            problems.append(f"attempt {name} resumed from step {resumed}, but step {entry['last_saved']} had been "
                            f"checkpointed: steps {resumed + 1}..{entry['last_saved']} were run twice")
        elif resumed and resumed not in saved:
            problems.append(f"attempt {name} resumed from step {resumed}, which no checkpoint record shows")
        if steps and steps != list(range(resumed + 1, resumed + 1 + len(steps))):
            problems.append(f"attempt {name}: steps are not consecutive from {resumed + 1}: "
                            f"{_abbrev(steps)}")
        nxt = attempts[names[i + 1]]["resumed_from"] if i + 1 < len(names) else None
        kept = [s for s in steps if nxt is None or s <= nxt]
        if nxt is not None and steps and nxt > steps[-1]:
            problems.append(f"attempt {names[i + 1]} resumed from step {nxt}, beyond the last step {steps[-1]} of "
                            f"attempt {name}")
        rolled_back += len(steps) - len(kept)
        effective += kept
        summaries.append(AttemptSummary(attempt=name, resumed_from=entry["resumed_from"],
                                        first_step=steps[0] if steps else None,
                                        last_step=steps[-1] if steps else None, steps=len(steps), kept=len(kept)))
    if effective != list(range(1, len(effective) + 1)):
        problems.append(f"the steps kept are not 1..N exactly once: {_abbrev(effective)}")
    if not effective:
        problems.append("no optimizer step recorded")
    return ContinuityReport(ok=not problems, attempts=tuple(summaries), checkpoints=tuple(saved),
                            effective_steps=len(effective), rolled_back_steps=rolled_back, problems=tuple(problems))


def _attempts(records: Iterable[Mapping[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[int]]:
    """Rank 0's records by attempt, in time order: where each resumed from, the last checkpoint saved
    before it, its steps; and every checkpoint's step."""
    attempts: dict[str, dict[str, Any]] = {}
    saved: list[int] = []
    for record in sorted(records, key=lambda r: float(r.get("time", 0.0))):
        event = record.get("event")
        if event == "checkpoint":
            saved.append(int(record["step"]))
            continue
        if event not in ("resume", "step"):
            continue  # other metric lines (oom, final, ...) say nothing about continuity
        attempt = str(record.get("attempt", "?"))
        entry = attempts.setdefault(attempt, {"resumed_from": None, "last_saved": max(saved, default=0),
                                              "steps": []})
        if event == "resume":
            entry["resumed_from"] = int(record["resumed_from"])
            entry["last_saved"] = max(saved, default=0)
        elif event == "step":
            entry["steps"].append(int(record["step"]))
    return attempts, saved


def _abbrev(steps: Sequence[int], limit: int = 12) -> str:
    return str(list(steps)) if len(steps) <= limit else f"{list(steps[:6])} ... {list(steps[-6:])}"
