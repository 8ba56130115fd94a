"""Errors of the cluster package, under the SDK's one root (``AitbcError``)."""

from __future__ import annotations

from ..errors import AitbcError, ConfigError, NotFoundError


class ClusterError(AitbcError):
    """A cluster operation failed: no spec, an unusable host list, a broken inventory."""


class ClusterConfigError(ClusterError, ConfigError):
    """A cluster spec, or a request of it, that cannot work as given: fix the file or the command line."""


class UnknownClusterError(ClusterError, NotFoundError):
    """No cluster of that name is defined under the home directory."""


class PreflightError(ClusterConfigError):
    """A host cannot run the job as given: script or dataset unreadable, checkpoint directory not
    writable, or the master's rendezvous port out of its reach."""


class BatchPlanError(ConfigError):
    """The global batch cannot be split: the ranks' memory caps together hold fewer samples."""
