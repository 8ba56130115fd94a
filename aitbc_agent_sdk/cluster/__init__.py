"""Trusted multi-host training: cluster specs, hardware inventory, balanced batches, sandboxed runs.

- :mod:`.spec`: ``ClusterSpec`` (the allow-listed hosts, by signing address), saved under
  ``$AITBC_HOME/clusters/<name>.json``.
- :mod:`.inventory` / :mod:`.transport`: ``HostInventory`` read through NVML (CPU-only fallback),
  answered by each host's ``InventoryResponder`` and gathered by ``collect_inventory``.
- :mod:`.balance`: ``plan_batches`` / ``shrink_after_oom`` (pure) and
  ``weighted_allreduce_gradients`` (torch.distributed), so uneven batches train exactly.
- the sandbox (``run_sandboxed`` / ``start_sandboxed`` under bubblewrap, or unshare + setpriv) lives in
  :mod:`aitbc_agent_sdk.host.sandbox`, shared with the provider; its names are re-exported here.
- :mod:`.protocol`: the wire protocol (topics, control messages, job events) and torchrun log parsing (pure).
- :mod:`.plan`: ``plan_launch`` / ``torchrun_argv`` / ``torchrun_env`` (pure).
- :mod:`.launcher` / :mod:`.job_watch` / :mod:`.job`: ``TrainingCoordinator`` (torchrun on N hosts), the
  watch of a launched job, and ``TrainRequest`` / ``TrainResult``.
- :mod:`.host_agent`: ``ClusterAgent`` and ``HostAgentConfig``, the per-host daemon (inventory, preflight,
  torchrun, mounts), with :mod:`.preflight`, :mod:`.host_job` and :mod:`.rendezvous_port`.
- :mod:`.recovery`: ``choose_spare`` and ``verify_step_log`` (crash recovery, pure).
- :mod:`.monitor`: ``ClusterMonitor``, the latest per-rank metrics of the running jobs.
- :mod:`.mounts`: NFS / s3fs / IPFS datasets with access, hash-manifest and speed checks.
- :mod:`.ddp`: helpers for training scripts (setup, ``Checkpointer``, ``BalancedStep``, metrics).

Names are imported on first use, so reading a spec does not import torch or eth-account.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "errors": ("BatchPlanError", "ClusterError", "ClusterConfigError"),
    # Relative to this package: ``..host`` is the SDK's host package, below both cluster and provider.
    ".host.errors": ("SandboxError",),
    "spec": ("ClusterSpec", "HostSpec", "cluster_path", "list_clusters", "load_cluster", "read_cluster_file",
             "save_cluster"),
    "inventory": ("ClusterInventory", "GpuInventory", "HostInventory", "read_gpus", "read_local_inventory"),
    "transport": ("InventoryRequest", "InventoryResponder", "collect_inventory", "inventory_reply_topic",
                  "inventory_topic", "local_host_name", "local_inventory", "DEFAULT_TIMEOUT_S"),
    "report": ("inventory_html", "gib", "host_status"),
    "balance": ("BatchPlan", "RankBudget", "budgets_from_inventory", "plan_batches", "shrink_after_oom",
                "weighted_allreduce_gradients"),
    ".host.sandbox": ("SandboxLimits", "SandboxReport", "SandboxResult", "SandboxSpec", "available_backends",
                      "build_command", "run_sandboxed", "start_sandboxed", "verify_sandbox"),
    "protocol": ("ControlReply", "HostStatus", "JobEvent", "PreflightReport", "TorchrunSpec", "is_torchrun_line",
                 "new_job_id"),
    "plan": ("HostSlot", "LaunchPlan", "plan_launch", "torchrun_argv", "torchrun_env"),
    "job": ("HostOutcome", "TrainRequest", "TrainResult"),
    "launcher": ("TrainingCoordinator",),
    "host_agent": ("ClusterAgent", "HostAgentConfig"),
    "monitor": ("ClusterMonitor", "MetricRow", "RowSink"),
    "recovery": ("ContinuityReport", "choose_spare", "verify_step_log"),
    "mounts": ("ClusterMountReport", "Manifest", "MountCommand", "MountReport", "MountSettings", "compare_manifests",
               "hash_manifest", "perform_mount", "summarize_mounts"),
    "ddp": ("BalancedStep", "Checkpointer", "DistInfo", "emit", "global_batch_indices", "weights_digest"),
}, globals())

if TYPE_CHECKING:
    from ..host.errors import SandboxError
    from ..host.sandbox import (
        SandboxLimits, SandboxReport, SandboxResult, SandboxSpec, available_backends, build_command, run_sandboxed,
        start_sandboxed, verify_sandbox,
    )
    from .balance import (
        BatchPlan, RankBudget, budgets_from_inventory, plan_batches, shrink_after_oom, weighted_allreduce_gradients,
    )
    from .ddp import BalancedStep, Checkpointer, DistInfo, emit, global_batch_indices, weights_digest
    from .errors import BatchPlanError, ClusterError
    from .inventory import ClusterInventory, GpuInventory, HostInventory, read_gpus, read_local_inventory
    from .host_agent import ClusterAgent, HostAgentConfig
    from .job import HostOutcome, TrainRequest, TrainResult
    from .launcher import TrainingCoordinator
    from .monitor import ClusterMonitor
    from .mounts import (
        ClusterMountReport, Manifest, MountCommand, MountReport, MountSettings, compare_manifests, hash_manifest,
        perform_mount, summarize_mounts,
    )
    from .plan import HostSlot, LaunchPlan, plan_launch, torchrun_argv, torchrun_env
    from .protocol import ControlReply, HostStatus, JobEvent, PreflightReport, TorchrunSpec, new_job_id
    from .recovery import ContinuityReport, choose_spare, verify_step_log
    from .report import inventory_html
    from .spec import (
        ClusterSpec, HostSpec, cluster_path, list_clusters, load_cluster, read_cluster_file, save_cluster,
    )
    from .transport import (
        InventoryRequest, InventoryResponder, collect_inventory, inventory_reply_topic, inventory_topic,
        local_host_name, local_inventory,
    )
    from .errors import ClusterConfigError
    from .monitor import MetricRow, RowSink
    from .protocol import is_torchrun_line
    from .report import gib, host_status
    from .transport import DEFAULT_TIMEOUT_S
