"""Datasets by CID, decoded once per process: the coordinator's own data, test split and shards."""

from __future__ import annotations

import asyncio

from ..storage import ContentStore
from ..training import LabeledData, decode_data


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
