"""Importing a directory tree the way ``ipfs add -r`` does: the walk, the journal, the blocking driver.

The walk (:func:`import_steps`) is a generator: it yields a :class:`FileRequest` for each
file (and is sent back the file's binary CID and Tsize) and a list of finished directory
blocks for each directory it closes (and is sent ``None``); it returns the root CID. A store
drives it with its own I/O, so the local store and the Kubo RPC build the same DAG.

Memory: one listing per open directory level (names and stat results) and the links of the
directories still open, never file data. Directories are closed depth first, so a parent
holds one link per finished child.

The journal makes an interrupted import resumable: an append-only file, one JSON line per
finished file (relative path, size, mtime_ns, CID, Tsize) after a header naming the tree and
the options. A re-run skips every file whose size and mtime still match its line; a header
that does not match starts the journal over.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StorageError
from ._cid import cid_from_str, cid_to_str
from ._port import AddOptions
from ._unixfs import Block
from ._unixfs_dir import MAX_DIR_DEPTH, Entry, directory_blocks, name_bytes

__all__ = [
    "FileRequest", "FileResult", "ImportJournal", "ImportTracker", "Steps", "import_steps", "run_import", "scan_directory",
]

JOURNAL_FORMAT = "aitbc-import-journal/1"
FileResult = tuple[bytes, int]  # a file's binary CID and Tsize


@dataclass(frozen=True, slots=True)
class FileRequest:
    path: Path
    rel: str  # '/'-separated, relative to the imported directory
    size: int
    mtime_ns: int


Steps = Generator["FileRequest | list[Block]", "FileResult | None", str]


def _listing(directory: Path, hidden: bool) -> list[tuple[str, bool, int, int]]:
    """(name, is_dir, size, mtime_ns) of what kubo would add from ``directory``, sorted by name bytes."""
    out = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not hidden and entry.name.startswith("."):  # boxo files.isHidden: skipped without -H
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise StorageError(f"{entry.path} is a symbolic link: links are not followed (copy the"
                                   " target into the directory instead)")
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise StorageError(f"{entry.path} is neither a regular file nor a directory")
            out.append((entry.name, stat.S_ISDIR(st.st_mode), st.st_size, st.st_mtime_ns))
    out.sort(key=lambda item: name_bytes(item[0]))
    return out


def _check_root(root: Path) -> None:
    if root.is_symlink():
        raise StorageError(f"{root} is a symbolic link: links are not followed")
    if not root.is_dir():
        raise StorageError(f"cannot add {root}: not a directory")


def import_steps(root: Path, options: AddOptions, *, hidden: bool = False) -> Steps:
    """The walk described above; OSError from the file system propagates to the driver."""
    root = Path(root)
    _check_root(root)
    # Per open directory: its path, its relative prefix, the entries still to visit, its links so far.
    stack: list[tuple[Path, str, Any, list[Entry]]] = [(root, "", iter(_listing(root, hidden)), [])]
    while True:
        directory, prefix, pending, links = stack[-1]
        item = next(pending, None)
        if item is None:
            blocks, raw_cid, tsize = directory_blocks(links, options.cid_version, options.hamt_threshold)
            yield blocks
            stack.pop()
            if not stack:
                return cid_to_str(raw_cid)
            stack[-1][3].append((name_bytes(directory.name), raw_cid, tsize))
            continue
        name, is_dir, size, mtime_ns = item
        if is_dir:
            if len(stack) > MAX_DIR_DEPTH:
                raise StorageError(f"{directory / name} is more than {MAX_DIR_DEPTH} directories deep")
            stack.append((directory / name, f"{prefix}{name}/", iter(_listing(directory / name, hidden)), []))
            continue
        result = yield FileRequest(directory / name, prefix + name, size, mtime_ns)
        assert result is not None
        links.append((name_bytes(name), *result))


def scan_directory(root: Path, *, hidden: bool = False) -> tuple[int, int]:
    """(files, bytes) that an import of ``root`` will read: for a progress bar's total. Blocking."""
    _check_root(Path(root))
    files = total = 0
    pending = [Path(root)]
    while pending:
        directory = pending.pop()
        for name, is_dir, size, _ in _listing(directory, hidden):
            if is_dir:
                pending.append(directory / name)
            else:
                files += 1
                total += size
    return files, total


class ImportJournal:
    """The append-only journal of finished files (see the module docstring). Blocking."""

    def __init__(self, path: Path, root: Path, options: AddOptions, hidden: bool) -> None:
        self.path = Path(path)
        header = {"format": JOURNAL_FORMAT, "root": str(Path(root).resolve()), "hidden": hidden,
                  "options": options.model_dump(mode="json")}
        self.done: dict[str, tuple[int, int, str, int]] = {}
        lines = self.path.read_text(errors="replace").splitlines() if self.path.is_file() else []
        fresh = not lines or _parse(lines[0]) != header
        if not fresh:
            for line in lines[1:]:
                entry = _parse(line)  # a torn last line (killed mid-write) parses as None
                if entry is not None and {"p", "s", "m", "c", "t"} <= entry.keys():
                    self.done[str(entry["p"])] = (int(entry["s"]), int(entry["m"]), str(entry["c"]), int(entry["t"]))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w" if fresh else "a", encoding="utf-8")
        if fresh:
            self._write(header)

    def lookup(self, request: FileRequest) -> FileResult | None:
        hit = self.done.get(request.rel)
        if hit is None or hit[:2] != (request.size, request.mtime_ns):
            return None
        return cid_from_str(hit[2]), hit[3]

    def record(self, request: FileRequest, result: FileResult) -> None:
        self._write({"p": request.rel, "s": request.size, "m": request.mtime_ns, "c": cid_to_str(result[0]),
                     "t": result[1]})

    def close(self) -> None:
        self._file.close()

    def _write(self, value: dict[str, Any]) -> None:
        self._file.write(json.dumps(value, sort_keys=True) + "\n")
        self._file.flush()  # a killed import keeps every line written before it


def _parse(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class ImportTracker:
    """Journal and progress around each file of one import. ``progress`` gets the bytes done so far."""

    def __init__(self, journal: ImportJournal | None, progress: Callable[[int], None] | None) -> None:
        self.journal = journal
        self.progress = progress
        self.bytes_done = 0

    def reuse(self, request: FileRequest) -> FileResult | None:
        return None if self.journal is None else self.journal.lookup(request)

    def finished(self, request: FileRequest, result: FileResult, *, fresh: bool) -> None:
        if fresh:
            st = os.stat(request.path, follow_symlinks=False)
            if (st.st_size, st.st_mtime_ns) != (request.size, request.mtime_ns):
                raise StorageError(f"{request.path} changed while it was being added")
            if self.journal is not None:
                self.journal.record(request, result)
        self.bytes_done += request.size
        if self.progress is not None:
            self.progress(self.bytes_done)

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()


def run_import(steps: Steps, tracker: ImportTracker, add_file: Callable[[FileRequest], FileResult],
               put_blocks: Callable[[list[Block]], None], has_block: Callable[[bytes], bool]) -> str:
    """Drive :func:`import_steps` with blocking I/O; returns the root CID."""
    try:
        request = next(steps)
        while True:
            if isinstance(request, FileRequest):
                result = tracker.reuse(request)
                fresh = result is None or not has_block(result[0])
                if fresh:
                    result = add_file(request)
                assert result is not None
                tracker.finished(request, result, fresh=fresh)
                request = steps.send(result)
            else:
                put_blocks(request)
                request = steps.send(None)
    except StopIteration as done:
        return str(done.value)
    finally:
        tracker.close()
