"""Training tasks: the task interface and its loop, the built-in tasks (networks, the gpt model), task
packages, a bound task that scores results, the footprint measured in a rehearsal, and the replay of a
committed trajectory. Everything here is torch and pure; no I/O but the files a caller names."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

# Imported on first use (PEP 562): a worker process imports only the modules it runs.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "_bound_task": ("BoundTask", "bind_task", "task_ref_of"),
    "_task_loop": ("EpochStats", "LocalTrainResult", "train_task"),
    "_task": ("regression_metrics", "Batch", "DataInfo", "TaskParams", "TrainingTask"),
}, globals())

if TYPE_CHECKING:
    from ._bound_task import BoundTask, bind_task, task_ref_of
    from ._task_loop import EpochStats, LocalTrainResult, train_task
    from ._task import regression_metrics
    from ._task import Batch, DataInfo, TaskParams, TrainingTask
