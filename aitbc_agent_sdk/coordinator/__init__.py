"""The coordinator: phase machine, persistence, result listener, settlement and the round loop."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "phases": ("TRANSITIONS", "can_transition", "check_transition", "is_terminal"),
    "round.run": ("RunRequest", "drive_training", "fail_training", "prepare", "resume_training", "run_training"),
    "service": ("Coordinator", "audit_path"),
    "settings": ("CoordinatorSettings",),
    "money.settlement": ("EscrowAccount", "Payout", "earned_wei", "plan_payouts"),
    "training_db": ("TrainingStore",),
    "data.tasks": ("spec_for_dataset",),
    "monitor": ("Snapshot", "snapshot",),
    "lock": ("is_driven", "training_lock",),
}, globals())

if TYPE_CHECKING:
    from .phases import TRANSITIONS, can_transition, check_transition, is_terminal
    from .round.run import RunRequest, drive_training, fail_training, prepare, resume_training, run_training
    from .service import Coordinator
    from .settings import CoordinatorSettings
    from .money.settlement import EscrowAccount, Payout, earned_wei, plan_payouts
    from .training_db import TrainingStore
    from .data.tasks import spec_for_dataset
    from .monitor import Snapshot, snapshot
    from .lock import is_driven, training_lock
    from .service import audit_path
