"""The coordinator: phase machine, persistence, result listener, settlement and the round loop."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "_phases": ("TRANSITIONS", "can_transition", "check_transition", "is_terminal"),
    "round._run": ("RunRequest", "drive_training", "fail_training", "prepare", "resume_training", "run_training"),
    "_service": ("Coordinator", "audit_path"),
    "_settings": ("CoordinatorSettings",),
    "money._settlement": ("EscrowAccount", "Payout", "earned_wei", "plan_payouts"),
    "_training_db": ("TrainingDatabase",),
    "data._tasks": ("spec_for_dataset",),
    "_monitor": ("Snapshot", "snapshot",),
    "_lock": ("is_driven", "training_lock",),
}, globals())

if TYPE_CHECKING:
    from ._phases import TRANSITIONS, can_transition, check_transition, is_terminal
    from .round._run import RunRequest, drive_training, fail_training, prepare, resume_training, run_training
    from ._service import Coordinator
    from ._settings import CoordinatorSettings
    from .money._settlement import EscrowAccount, Payout, earned_wei, plan_payouts
    from ._training_db import TrainingDatabase
    from .data._tasks import spec_for_dataset
    from ._monitor import Snapshot, snapshot
    from ._lock import is_driven, training_lock
    from ._service import audit_path
