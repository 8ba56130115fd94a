"""The training phase machine (pure).

initializing -> distributing -> training -> aggregating -> complete
aggregating -> distributing starts the next round; training -> distributing restarts an
interrupted round (resume); any unfinished phase may go to failed.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import PhaseError
from ..records import TrainingPhase as P

TRANSITIONS: Mapping[P, frozenset[P]] = {
    P.INITIALIZING: frozenset({P.DISTRIBUTING, P.FAILED}),
    P.DISTRIBUTING: frozenset({P.TRAINING, P.FAILED}),
    P.TRAINING: frozenset({P.AGGREGATING, P.DISTRIBUTING, P.FAILED}),
    P.AGGREGATING: frozenset({P.DISTRIBUTING, P.COMPLETE, P.FAILED}),
    P.COMPLETE: frozenset(),
    P.FAILED: frozenset(),
}


def can_transition(current: P, target: P) -> bool:
    return target in TRANSITIONS[current] or current == target


def check_transition(current: P | str, target: P | str) -> P:
    """Return the target phase, or raise PhaseError naming the allowed moves."""
    try:
        cur, tgt = P(current), P(target)
    except ValueError as exc:
        raise PhaseError(f"unknown phase: {exc}") from exc
    if not can_transition(cur, tgt):
        allowed = ", ".join(sorted(p.value for p in TRANSITIONS[cur])) or "none (terminal)"
        raise PhaseError(f"cannot move a training from {cur.value} to {tgt.value}; allowed: {allowed}")
    return tgt


def is_terminal(phase: P | str) -> bool:
    return not TRANSITIONS[P(phase)]
