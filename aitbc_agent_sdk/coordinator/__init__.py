"""The coordinator: phase machine, persistence, result listener, settlement and the round loop."""

from .phases import TRANSITIONS, can_transition, check_transition, is_terminal
from .run import RunRequest, drive_training, fail_training, prepare, run_training
from .service import Coordinator, CoordinatorSettings
from .settlement import EscrowAccount, Payout, earned_wei, plan_payouts
from .store import TrainingStore

__all__ = [
    "TRANSITIONS", "Coordinator", "CoordinatorSettings", "EscrowAccount", "Payout", "RunRequest", "TrainingStore",
    "can_transition", "check_transition", "drive_training", "fail_training", "earned_wei", "is_terminal", "plan_payouts", "prepare", "run_training",
]
