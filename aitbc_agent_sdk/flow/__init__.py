"""The step-by-step flow and training management, shared by the CLI and the assistant.

Above the coordinator (it starts agents and daemons), below the front ends. Names are imported on
first use (PEP 562): the CLI's --help must not pay for torch and web3."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "_costs": ("CostPreview", "checks_where", "estimate_text", "eth_text", "preview"),
    "_steps": (
        "HiredWorker", "Started", "check_dataset", "coordinator_log", "create_training", "dataset_source",
        "dataset_target", "db_path", "devnet_agent", "distribute", "distribution_cost", "hire_workers", "load_training", "min_stake_of", "resume",
        "resume_blocker", "start_coordinator", "target_line", "upload_data", "wait_for_daemon", "wallet_of",
    ),
    "_tasks": ("TaskChoice", "attach_task", "check_task_source", "parse_task_params"),
    "_trainings": (
        "STOPPED_REASON", "Interrupted", "Stopped", "TrainingSummary", "audit_text", "daemon_pid", "end_daemon",
        "is_driven_now", "list_trainings", "log_file", "log_lines", "settle_interrupted", "stop_training", "wind_down",
    ),
    "_generation": ("export_training", "sample_training"),
    "_provider_daemon": ("STATUS_FILE", "provider_dir", "serve_provider",),
}, globals())

if TYPE_CHECKING:  # static tools see ordinary imports
    from ._costs import CostPreview, checks_where, estimate_text, eth_text, preview
    from ._steps import (
        HiredWorker, Started, check_dataset, coordinator_log, create_training, dataset_source, dataset_target, db_path,
        devnet_agent, distribute, distribution_cost, hire_workers, load_training, min_stake_of, resume,
        resume_blocker, start_coordinator, target_line, upload_data, wait_for_daemon, wallet_of,
    )
    from ._tasks import TaskChoice, attach_task, check_task_source, parse_task_params
    from ._trainings import (
        STOPPED_REASON, Interrupted, Stopped, TrainingSummary, audit_text, daemon_pid, end_daemon, is_driven_now,
        list_trainings, log_file, log_lines, settle_interrupted, stop_training, wind_down,
    )
    from ._generation import export_training, sample_training
    from ._provider_daemon import STATUS_FILE, provider_dir, serve_provider
