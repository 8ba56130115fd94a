"""Per-training audit log: append-only JSONL, hash-chained so tampering is detected.

Each line is the canonical JSON (sorted keys, compact separators, ASCII only) of::

    {"seq": n, "ts": unix_seconds, "event": name, "fields": {...}, "prev": hex, "hash": hex}

* ``seq`` starts at 1, so an entry's ``seq`` equals its line number.
* ``prev`` is the sha256 of the previous line's bytes (without the newline); the first
  line carries :data:`GENESIS_PREV` (64 zeros).
* ``hash`` is the sha256 of the canonical JSON of the entry without its ``hash`` key.

Editing a line breaks its ``hash`` (or, if the hash was recomputed, the next line's
``prev``); dropping, inserting or swapping lines breaks ``seq``/``prev``; a crash in the
middle of a write leaves a last line without its newline. What a chain alone cannot show
is the *tail* being cut off at a line boundary: anchor :attr:`VerifyResult.head`
somewhere else (the chain, the store) to catch that too.

A partial last line, and only that, is repaired on the next append (:func:`repair_log`):
the good prefix is kept, the fragment is cut off, and a ``repaired`` entry recording its
length and sha256 is chained on, so the repair itself is part of the verified record.

The hashing and encoding are plain functions; :class:`AuditLog` only does the I/O. One
:class:`AuditLog` per file and process: writers inside a process are serialised by an
``asyncio.Lock``, but nothing guards against two processes appending to the same file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from .errors import AitbcError

log = logging.getLogger(__name__)
GENESIS_PREV = "0" * 64
# Substrings that mark a field name as secret, compared after lower-casing and dropping
# everything but letters and digits, so "privateKey", "PRIVATE-KEY" and "private_key" match.
SECRET_MARKERS = ("password", "privatekey", "secret", "mnemonic")
ENTRY_KEYS = frozenset({"seq", "ts", "event", "fields", "prev", "hash"})
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TAIL_BLOCK = 8192


class AuditLogError(AitbcError):
    """The audit log on disk is broken (tampered with, or cut by a crash) and cannot be
    read or extended."""


class PartialLineError(AuditLogError):
    """The log ends in a line without its newline: what a crash in the middle of a write leaves."""


REPAIRED_EVENT = "repaired"


class AuditEntry(BaseModel):
    """One line of the log, as written."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    seq: int
    ts: float
    event: str
    fields: dict[str, Any]
    prev: str
    hash: str


class VerifyResult(BaseModel):
    """Outcome of :func:`verify_log`.

    ``entries`` counts the lines that verified, i.e. those before ``first_bad_line``
    (1-based). ``head`` is the sha256 of the last good line: the ``prev`` the next entry
    would carry, and the value to anchor elsewhere to detect a cut-off tail.
    """

    model_config = ConfigDict(frozen=True)

    ok: bool
    entries: int
    first_bad_line: int | None = None
    reason: str | None = None
    head: str = GENESIS_PREV


# --- pure helpers -----------------------------------------------------------------------


def canonical_json(obj: Any) -> bytes:
    """The one byte encoding used for lines and hashes. Raises ``ValueError`` on NaN/inf."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False,
    ).encode("ascii")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry_hash(body: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of an entry without its ``hash`` key."""
    return sha256_hex(canonical_json({k: v for k, v in body.items() if k != "hash"}))


def build_entry(seq: int, ts: float, event: str, fields: Mapping[str, Any], prev: str) -> dict[str, Any]:
    """The full entry dict (with its ``hash``) for the given values."""
    body: dict[str, Any] = {"seq": seq, "ts": ts, "event": event, "fields": dict(fields), "prev": prev}
    body["hash"] = entry_hash(body)
    return body


def is_secret_name(name: str) -> bool:
    folded = "".join(ch for ch in name.lower() if ch.isalnum())
    return any(marker in folded for marker in SECRET_MARKERS)


def check_fields(fields: Mapping[str, Any]) -> None:
    """Refuse (``ValueError``) secret-looking names at any depth and values that would not
    round-trip exactly through JSON: non-str keys, tuples, sets, NaN/inf, arbitrary objects."""

    def walk(value: Any, where: str) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError(f"audit field {where or 'fields'} has a non-string key {key!r}")
                if is_secret_name(key):
                    raise ValueError(f"refusing to write secret-looking audit field {where + key!r}")
                walk(item, f"{where}{key}.")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{where}{index}.")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"audit field {where.rstrip('.')!r} is not a finite number")
        elif value is not None and not isinstance(value, (str, int)):  # bool is an int
            raise ValueError(
                f"audit field {where.rstrip('.')!r} has type {type(value).__name__}, "
                "which does not round-trip through JSON",
            )

    walk(fields, "")


def parse_line(raw: bytes) -> dict[str, Any]:
    """Parse one line (no newline) and check it on its own: JSON, shape, canonical bytes
    and its own hash. Raises ``ValueError`` with the reason; chain links are the caller's."""
    try:
        entry = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not valid JSON ({exc})") from exc
    if not isinstance(entry, dict) or set(entry) != ENTRY_KEYS:
        raise ValueError("not an audit entry (wrong keys)")
    if not (
        type(entry["seq"]) is int and type(entry["ts"]) is float and isinstance(entry["event"], str)
        and isinstance(entry["fields"], dict) and isinstance(entry["prev"], str)
        and isinstance(entry["hash"], str) and _HEX64.fullmatch(entry["prev"])
        and _HEX64.fullmatch(entry["hash"])
    ):
        raise ValueError("not an audit entry (wrong value types)")
    try:
        canonical = canonical_json(entry)
    except ValueError as exc:
        raise ValueError(f"not canonical JSON ({exc})") from exc
    if canonical != raw:
        raise ValueError("not canonical JSON (line was re-encoded or edited)")
    if entry_hash(entry) != entry["hash"]:
        raise ValueError("hash mismatch (line was modified)")
    return entry


def _walk_chain(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None, str]]:
    """Yield ``(line_no, entry, None, head)`` per good line, then at most one
    ``(line_no, None, reason, head)`` for the first bad one, where it stops."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if not data:
        return
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail is b"" when the file ends with a newline
    head = GENESIS_PREV
    for line_no, raw in enumerate(complete, start=1):
        try:
            entry = parse_line(raw)
        except ValueError as exc:
            yield line_no, None, str(exc), head
            return
        if entry["seq"] != line_no:
            yield line_no, None, (
                f"seq {entry['seq']} where {line_no} was expected (line dropped, inserted or reordered)"
            ), head
            return
        if entry["prev"] != head:
            reason = "prev does not match the previous line (line dropped, inserted, reordered or edited)"
            yield line_no, None, reason, head
            return
        head = sha256_hex(raw)
        yield line_no, entry, None, head
    if tail:
        yield len(complete) + 1, None, "truncated last line (no newline: partial write)", head


# --- reading ----------------------------------------------------------------------------


def verify_log(path: Path) -> VerifyResult:
    """Check the whole chain. A missing or empty file is ok with 0 entries. Blocking: call
    it through ``asyncio.to_thread`` (or :meth:`AuditLog.verify`) from async code."""
    entries, head = 0, GENESIS_PREV
    for line_no, entry, reason, head in _walk_chain(Path(path)):
        if entry is None:
            return VerifyResult(ok=False, entries=entries, first_bad_line=line_no, reason=reason, head=head)
        entries += 1
    return VerifyResult(ok=True, entries=entries, head=head)


def read_log(path: Path) -> list[AuditEntry]:
    """All entries, after verifying the chain; raises :class:`AuditLogError` if it is broken.
    A missing file reads as no entries. Blocking, like :func:`verify_log`."""
    out: list[AuditEntry] = []
    for line_no, entry, reason, _ in _walk_chain(Path(path)):
        if entry is None:
            raise AuditLogError(f"audit log {path} is broken at line {line_no}: {reason}")
        out.append(AuditEntry.model_validate(entry))
    return out


def _read_tail(path: Path) -> tuple[int, str]:
    """``(last seq, sha256 of the last line)`` from the end of the file, without reading
    all of it; ``(0, GENESIS_PREV)`` for a missing or empty file."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return 0, GENESIS_PREV
    with handle:
        pos = handle.seek(0, os.SEEK_END)
        if pos == 0:
            return 0, GENESIS_PREV
        buf = b""
        # Read backwards until the last line's start is in view: the newline before it,
        # or the start of the file.
        while pos > 0 and buf.count(b"\n") < 2:
            step = min(_TAIL_BLOCK, pos)
            pos -= step
            handle.seek(pos)
            buf = handle.read(step) + buf
    if not buf.endswith(b"\n"):
        raise PartialLineError(f"audit log {path} ends in a partial line (an interrupted write)")
    raw = buf[:-1].rsplit(b"\n", 1)[-1]
    try:
        entry = parse_line(raw)
    except ValueError as exc:
        raise AuditLogError(f"audit log {path} has a bad last line: {exc}") from exc
    return entry["seq"], sha256_hex(raw)


def repair_log(path: Path, *, clock: Callable[[], float] = time.time) -> AuditEntry | None:
    """Cut off a partial last line and chain on a ``repaired`` entry saying what was cut.

    Returns that entry, or None when the log needed no repair. Anything else wrong (an
    edited, dropped or inserted line) is tampering, not a crash, and is refused with
    :class:`AuditLogError`: the log is left as it is, for someone to look at. Blocking.
    """
    path = Path(path)
    result = verify_log(path)
    if result.ok:
        return None
    data = path.read_bytes()
    good_end = data.rfind(b"\n") + 1
    if result.first_bad_line != result.entries + 1 or data.count(b"\n") != result.entries:
        raise AuditLogError(f"audit log {path} is broken at line {result.first_bad_line}: {result.reason}; "
                            "only a partial last line is repaired, this needs a person to look at it")
    dropped = data[good_end:]
    entry = build_entry(result.entries + 1, float(clock()), REPAIRED_EVENT, {
        "reason": "partial last line (interrupted write)", "dropped_bytes": len(dropped),
        "dropped_sha256": sha256_hex(dropped), "after_seq": result.entries}, result.head)
    with path.open("r+b") as handle:
        handle.truncate(good_end)
        handle.seek(good_end)
        handle.write(canonical_json(entry) + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    return AuditEntry.model_validate(entry)


# --- writing ----------------------------------------------------------------------------


class AuditLog:
    """Appends hash-chained entries to one JSONL file, continuing any chain already there.

    The tail is read on the first append (not in ``__init__``, which stays free of I/O);
    every line is written in one ``write`` to a file opened in append mode and fsynced.
    """

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = asyncio.Lock()
        self._seq: int | None = None  # None: tail not read yet (or a write failed)
        self._head = GENESIS_PREV

    async def append(self, event: str, /, **fields: Any) -> AuditEntry:
        """Record ``event`` with ``fields``. Raises ``ValueError`` for secret-looking field
        names (at any depth) or values that do not round-trip through JSON, and
        :class:`AuditLogError` if the existing file is broken."""
        if not isinstance(event, str) or not event:
            raise ValueError("audit event name must be a non-empty string")
        check_fields(fields)
        async with self._lock:
            if self._seq is None:
                self._seq, self._head = await asyncio.to_thread(self._open_tail)
            entry = build_entry(self._seq + 1, float(self._clock()), event, fields, self._head)
            line = canonical_json(entry)
            try:
                await asyncio.to_thread(self._write_line, line)
            except BaseException:
                self._seq = None  # unknown whether the line landed: re-read the tail next time
                raise
            self._seq, self._head = entry["seq"], sha256_hex(line)
        return AuditEntry.model_validate(entry)

    async def verify(self) -> VerifyResult:
        async with self._lock:
            return await asyncio.to_thread(verify_log, self.path)

    async def read(self) -> list[AuditEntry]:
        async with self._lock:
            return await asyncio.to_thread(read_log, self.path)

    def _open_tail(self) -> tuple[int, str]:
        """The tail to chain onto; a crash's partial last line is repaired first (and logged)."""
        try:
            return _read_tail(self.path)
        except PartialLineError:
            repaired = repair_log(self.path, clock=self._clock)
            log.warning("audit log %s: repaired a partial last line (%s)", self.path,
                        repaired.fields if repaired else "already whole")
            return _read_tail(self.path)

    def _write_line(self, line: bytes) -> None:
        created = not self.path.exists()
        if created:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as handle:
            handle.write(line + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        if created and os.name == "posix":  # make the new directory entry durable too
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
