"""The (sender, nonce) pairs a verifier has accepted, in memory or in SQLite across restarts.

An entry is needed only while its message could still pass the freshness check: once
``sent_at`` is older than the clock-skew window the message is refused as stale anyway, so
``forget_before`` drops it. That bounds either store by the traffic of one window.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Protocol


class SeenStore(Protocol):
    def contains(self, sender: str, nonce: int) -> bool: ...

    def add(self, sender: str, nonce: int, sent_at: float) -> None: ...

    def forget_before(self, sent_at: float) -> None: ...


class MemorySeen:
    """One process's memory; a new process starts empty (fine for sessions that do not persist)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], float] = {}

    def contains(self, sender: str, nonce: int) -> bool:
        return (sender, nonce) in self._seen

    def add(self, sender: str, nonce: int, sent_at: float) -> None:
        self._seen[(sender, nonce)] = sent_at

    def forget_before(self, sent_at: float) -> None:
        # Insertion order is roughly sent_at order; stop at the first entry still in the window.
        for key, at in list(self._seen.items()):
            if at >= sent_at:
                break
            del self._seen[key]

    def __len__(self) -> int:
        return len(self._seen)


class SqliteSeen:
    """Shared by the processes of one home; ``scope`` keeps one session's view apart from another's.

    Writes are small and local (WAL, synchronous=NORMAL: a power cut may lose the last few
    entries, a crash of the process does not), so they run inline rather than in a thread.
    """

    def __init__(self, path: Path, scope: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.scope = scope
        self._db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS seen (scope TEXT NOT NULL, sender TEXT NOT NULL,"
                         " nonce TEXT NOT NULL, sent_at REAL NOT NULL, PRIMARY KEY (scope, sender, nonce))")
        self._db.execute("CREATE INDEX IF NOT EXISTS seen_age ON seen (sent_at)")
        self._adds = 0

    def contains(self, sender: str, nonce: int) -> bool:
        row = self._db.execute("SELECT 1 FROM seen WHERE scope=? AND sender=? AND nonce=?",
                               (self.scope, sender, str(nonce))).fetchone()
        return row is not None

    def add(self, sender: str, nonce: int, sent_at: float) -> None:
        # Nonces are microsecond timestamps (> 2**63 is possible in principle): store them as text.
        self._db.execute("INSERT OR IGNORE INTO seen VALUES (?, ?, ?, ?)", (self.scope, sender, str(nonce), sent_at))
        self._adds += 1

    def forget_before(self, sent_at: float) -> None:
        if self._adds % 64:  # prune now and then, not on every message
            return
        self._db.execute("DELETE FROM seen WHERE sent_at < ?", (sent_at,))

    def close(self) -> None:
        self._db.close()
