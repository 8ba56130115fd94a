"""The provider daemon: offers, heartbeats and jobs run in a separate training process.

This package is also the parent of the training process's entry point, which must
not pay for the networking and signing imports: the names below are imported on
first use (PEP 562), and the submodules (``provider.node``, ``provider.hardware``,
``provider.process``) can be imported directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "_node": ("ProviderAgent", "ProviderConfig", "TrainOutcome"),
    "_process": ("TrainingProcess",),
    "_sandbox": ("TrainingSandbox",),
}, globals())

if TYPE_CHECKING:
    from ._node import ProviderAgent, ProviderConfig, TrainOutcome
    from ._process import TrainingProcess
    from ._sandbox import TrainingSandbox
