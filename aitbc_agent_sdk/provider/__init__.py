"""The provider daemon: offers, heartbeats and jobs run in a separate training process."""

from .agent import ProviderAgent, ProviderConfig
from .hardware import detect_gpus, detect_hardware
from .process import TrainingProcess, scrubbed_env

__all__ = ["ProviderAgent", "ProviderConfig", "TrainingProcess", "detect_gpus", "detect_hardware", "scrubbed_env"]
