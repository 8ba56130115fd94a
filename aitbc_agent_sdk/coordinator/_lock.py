"""One coordinator per training: an advisory file lock under the training's directory.

The kernel drops the lock when its holder dies, so a crashed coordinator never blocks a resume.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError
from ..profile import training_dir


@contextmanager
def training_lock(home: Path, training_id: str) -> Iterator[None]:
    """Hold the training's coordinator lock; one driver per training, released if the process dies."""
    directory = training_dir(home, training_id)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "coordinator.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"training {training_id} already has a running coordinator") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_driven(home: Path, training_id: str) -> bool:
    """True while some process holds the training's coordinator lock."""
    try:
        with training_lock(home, training_id):
            return False
    except ConfigError:
        return True
