"""The coordinator's audit logs: one per training under a directory, or none at all.

The round runner and reassignment are handed their training's log (an :class:`AuditSink`)
directly; a coordinator without an audit directory hands them :class:`NoAudit`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

from ..audit import AuditEntry, AuditLog, read_log
from ..records import id_path


class AuditSink(Protocol):
    async def append(self, event: str, /, **fields: Any) -> object: ...


class NoAudit:
    """Where events go when the coordinator keeps no audit log."""

    async def append(self, event: str, /, **fields: Any) -> None:
        return None


def audit_path(audit_dir: Path, training_id: str) -> Path:
    return id_path(audit_dir, training_id) / "audit.jsonl"


class AuditLogs:
    """One :class:`AuditLog` per training and process (appends to one file are serialised in it)."""

    def __init__(self, directory: Path | None) -> None:
        self._directory = directory
        self._logs: dict[str, AuditLog] = {}

    def of(self, training_id: str) -> AuditSink:
        if self._directory is None:
            return NoAudit()
        if training_id not in self._logs:
            self._logs[training_id] = AuditLog(audit_path(self._directory, training_id))
        return self._logs[training_id]

    async def note(self, training_id: str, event: str, /, **fields: Any) -> None:
        await self.of(training_id).append(event, **fields)

    async def entries(self, training_id: str, event: str) -> list[AuditEntry]:
        """The training's ``event`` entries, its log verified first; none without an audit directory."""
        if self._directory is None:
            return []
        found = await asyncio.to_thread(read_log, audit_path(self._directory, training_id))
        return [e for e in found if e.event == event]
