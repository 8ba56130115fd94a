"""Errors of the cluster package, under the SDK's one root (``AitbcError``)."""

from __future__ import annotations

from ..errors import AitbcError, ConfigError


class ClusterError(AitbcError):
    """A cluster operation failed: no spec, an unusable host list, a broken inventory."""


class BatchPlanError(ConfigError):
    """The global batch cannot be split: the ranks' memory caps together hold fewer samples."""


class SandboxError(AitbcError):
    """No sandbox backend works here, or a sandbox could not be set up as asked."""
