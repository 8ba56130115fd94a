"""Errors of the host package, under the SDK's one root (``AitbcError``)."""

from __future__ import annotations

from ..errors import AitbcError


class SandboxError(AitbcError):
    """No sandbox backend works here, or a sandbox could not be set up as asked."""
