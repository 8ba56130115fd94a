"""Files a command will write, checked before it spends or starts anything: a bad path costs nothing."""

from __future__ import annotations

import os
from pathlib import Path

from aitbc_agent_sdk.errors import ConfigError


class OutputPathError(ConfigError):
    """An option names a file that cannot be written (exit 2)."""


def check_output_file(path: Path, option: str, *, suffix: str | None = None) -> Path:
    """PATH if a file can be written there: not a directory, writable if it exists, else its nearest
    existing parent is a writable directory (missing directories are made when the file is written).
    OutputPathError names OPTION and the path otherwise."""
    if suffix is not None and path.suffix.lower() != suffix:
        raise OutputPathError(f"{option} {path}: name a {suffix} file")
    if path.is_dir():
        raise OutputPathError(f"{option} {path} is a directory: name the file to write")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise OutputPathError(f"{option} {path}: the file is not writable; choose another path")
        return path
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputPathError(f"{option} {path}: {parent} is a file, not a directory; choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{option} {path}: cannot write in {parent} (permission denied); choose another path")
    return path


def check_writable_png(path: Path) -> Path:
    """The --plot of ``run``: a .png that can be written."""
    return check_output_file(path, "--plot", suffix=".png")
