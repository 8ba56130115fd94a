"""Datasets by CID, decoded once per process: the coordinator's own data, test split and shards."""

from __future__ import annotations

import asyncio

from pathlib import Path

from ..errors import ConfigError
from ..models import format_size
from ..storage import ContentStore
from ..training import LabeledData, decode_data


def check_declared_size(declared: int | None, source: str | Path, actual: int | None = None) -> None:
    """Refuse a dataset larger than the training declared (``--dataset-size``), before it is stored or funded.

    ``actual`` is the stored form's size where ``source`` is not a file (the bundled datasets)."""
    if declared is None:
        return
    path = Path(source)
    size = path.stat().st_size if actual is None and path.is_file() else actual
    if size is not None and size > declared:
        raise ConfigError(f"the dataset {source} holds {format_size(size)} ({size} bytes), more than the "
                          f"{format_size(declared)} ({declared} bytes) the training declared with --dataset-size")


class DatasetCache:
    def __init__(self, store: ContentStore) -> None:
        self._store = store
        self._data: dict[str, LabeledData] = {}

    def put(self, cid: str, data: LabeledData) -> None:
        self._data[cid] = data

    async def get(self, cid: str) -> LabeledData:
        if cid not in self._data:
            # Its own dataset or test split: bounded by what its own root declares, however large.
            blob = await self._store.cat(cid, max_bytes=None)
            self._data[cid] = await asyncio.to_thread(decode_data, blob)
        return self._data[cid]
