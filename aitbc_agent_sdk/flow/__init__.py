"""The step-by-step flow and training management, shared by the CLI and the assistant.

Above the coordinator (it starts agents and daemons), below the front ends."""

from .costs import CostPreview, eth_text, preview
from .steps import (
    HiredWorker, Started, check_dataset, coordinator_log, create_training, dataset_source, db_path, devnet_agent,
    distribute, distribution_cost, hire_workers, load_training, min_stake_of, resume, resume_blocker,
    start_coordinator, upload_data, wait_for_daemon, wallet_of,
)
from .tasks import TaskChoice, attach_task, check_task_source, parse_task_params
from .trainings import (
    STOPPED_REASON, Stopped, TrainingSummary, audit_text, daemon_pid, end_daemon, is_driven_now, list_trainings,
    log_file, log_lines, stop_training, wind_down,
)

__all__ = [
    "STOPPED_REASON", "CostPreview", "HiredWorker", "Started", "Stopped", "TaskChoice", "TrainingSummary", "attach_task",
    "audit_text", "check_task_source", "parse_task_params",
    "check_dataset", "coordinator_log", "create_training", "daemon_pid", "dataset_source", "db_path",
    "devnet_agent", "distribute", "distribution_cost", "end_daemon", "eth_text", "hire_workers", "is_driven_now",
    "list_trainings", "load_training", "log_file", "log_lines", "min_stake_of", "preview", "resume", "resume_blocker",
    "start_coordinator", "stop_training", "upload_data", "wait_for_daemon", "wallet_of", "wind_down",
]
