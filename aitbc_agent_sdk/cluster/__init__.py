"""Trusted multi-host training: cluster specs, hardware inventory, balanced batches, sandboxed runs.

- :mod:`._spec`: ``ClusterSpec`` (the allow-listed hosts, by signing address), saved under
  ``$AITBC_HOME/clusters/<name>.json``.
- :mod:`._inventory` / :mod:`._transport`: ``HostInventory`` read through NVML (CPU-only fallback),
  answered by each host's ``InventoryResponder`` and gathered by ``collect_inventory``.
- :mod:`._balance`: ``plan_batches`` / ``shrink_after_oom`` (pure) and
  ``weighted_allreduce_gradients`` (torch.distributed), so uneven batches train exactly.
- the sandbox (``run_sandboxed`` / ``start_sandboxed`` under bubblewrap, or unshare + setpriv) lives in
  :mod:`aitbc_agent_sdk.host._sandbox`, shared with the provider; its names are re-exported here.
- :mod:`._protocol`: the wire protocol (topics, control messages, job events) and torchrun log parsing (pure).
- :mod:`._plan`: ``plan_launch`` / ``torchrun_argv`` / ``torchrun_env`` (pure).
- :mod:`._launcher` / :mod:`._job_watch` / :mod:`._job`: ``TrainingCoordinator`` (torchrun on N hosts), the
  watch of a launched job, and ``TrainRequest`` / ``TrainResult``.
- :mod:`._host_agent`: ``ClusterAgent`` and ``HostAgentConfig``, the per-host daemon (inventory, preflight,
  torchrun, mounts), with :mod:`._preflight`, :mod:`._host_job` and :mod:`._rendezvous_port`.
- :mod:`._recovery`: ``choose_spare`` and ``verify_step_log`` (crash recovery, pure).
- :mod:`._monitor`: ``ClusterMonitor``, the latest per-rank metrics of the running jobs.
- :mod:`.mounts`: NFS / s3fs / IPFS datasets with access, hash-manifest and speed checks.
- :mod:`.ddp`: helpers for training scripts (setup, ``Checkpointer``, ``BalancedStep``, metrics).

Names are imported on first use, so reading a spec does not import torch or eth-account.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "_errors": ("BatchPlanError", "ClusterError", "ClusterConfigError"),
    # Relative to this package: ``..host`` is the SDK's host package, below both cluster and provider.
    ".host._errors": ("SandboxError",),
    "_spec": ("ClusterSpec", "HostSpec", "cluster_path", "list_clusters", "load_cluster", "read_cluster_file",
             "save_cluster"),
    "_inventory": ("ClusterInventory", "GpuInventory", "HostInventory", "read_gpus", "read_local_inventory"),
    "_transport": ("InventoryRequest", "InventoryResponder", "collect_inventory", "inventory_reply_topic",
                  "inventory_topic", "local_host_name", "local_inventory", "DEFAULT_TIMEOUT_S"),
    "_report": ("inventory_html", "gib", "host_status"),
    "_balance": ("BatchPlan", "RankBudget", "budgets_from_inventory", "plan_batches", "shrink_after_oom",
                "weighted_allreduce_gradients"),
    ".host._sandbox": ("SandboxLimits", "SandboxReport", "SandboxResult", "SandboxSpec", "available_backends",
                      "build_command", "run_sandboxed", "start_sandboxed", "verify_sandbox"),
    "_protocol": ("ControlReply", "HostStatus", "JobEvent", "PreflightReport", "TorchrunSpec", "is_torchrun_line",
                 "new_job_id"),
    "_plan": ("HostSlot", "LaunchPlan", "plan_launch", "torchrun_argv", "torchrun_env"),
    "_job": ("HostOutcome", "TrainRequest", "TrainResult"),
    "_launcher": ("TrainingCoordinator",),
    "_host_agent": ("ClusterAgent", "HostAgentConfig"),
    "_monitor": ("ClusterMonitor", "MetricRow", "RowSink"),
    "_recovery": ("ContinuityReport", "choose_spare", "verify_step_log"),
    "mounts": ("ClusterMountReport", "Manifest", "MountCommand", "MountReport", "MountSettings", "compare_manifests",
               "hash_manifest", "perform_mount", "summarize_mounts"),
    "ddp": ("BalancedStep", "Checkpointer", "DistInfo", "emit", "global_batch_indices", "weights_digest"),
}, globals())

if TYPE_CHECKING:
    from ..host._errors import SandboxError
    from ..host._sandbox import (
        SandboxLimits, SandboxReport, SandboxResult, SandboxSpec, available_backends, build_command, run_sandboxed,
        start_sandboxed, verify_sandbox,
    )
    from ._balance import (
        BatchPlan, RankBudget, budgets_from_inventory, plan_batches, shrink_after_oom, weighted_allreduce_gradients,
    )
    from .ddp import BalancedStep, Checkpointer, DistInfo, emit, global_batch_indices, weights_digest
    from ._errors import BatchPlanError, ClusterError
    from ._inventory import ClusterInventory, GpuInventory, HostInventory, read_gpus, read_local_inventory
    from ._host_agent import ClusterAgent, HostAgentConfig
    from ._job import HostOutcome, TrainRequest, TrainResult
    from ._launcher import TrainingCoordinator
    from ._monitor import ClusterMonitor
    from .mounts import (
        ClusterMountReport, Manifest, MountCommand, MountReport, MountSettings, compare_manifests, hash_manifest,
        perform_mount, summarize_mounts,
    )
    from ._plan import HostSlot, LaunchPlan, plan_launch, torchrun_argv, torchrun_env
    from ._protocol import ControlReply, HostStatus, JobEvent, PreflightReport, TorchrunSpec, new_job_id
    from ._recovery import ContinuityReport, choose_spare, verify_step_log
    from ._report import inventory_html
    from ._spec import (
        ClusterSpec, HostSpec, cluster_path, list_clusters, load_cluster, read_cluster_file, save_cluster,
    )
    from ._transport import (
        InventoryRequest, InventoryResponder, collect_inventory, inventory_reply_topic, inventory_topic,
        local_host_name, local_inventory,
    )
    from ._errors import ClusterConfigError
    from ._monitor import MetricRow, RowSink
    from ._protocol import is_torchrun_line
    from ._report import gib, host_status
    from ._transport import DEFAULT_TIMEOUT_S
