"""A job's weights rebuilt from the last round's model and the model's change, instead of fetched whole.

A provider that trained last round still holds that round's model in its content cache. When the
job names the new model as an encoded change from it (``JobAssignment.weights_delta``), the
provider fetches only the change, rebuilds the new model's bytes and keeps them only if they hash
to the job's ``weights_cid``: the coordinator cannot make it train on anything but the model it
signed for, and any mismatch (another torch, a damaged base) falls back to fetching the model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from ..errors import AitbcError, NotFoundError
from ..records import JobAssignment, weights_limit
from ..storage import ContentStore, fetch_timeout_s
from ..storage._unixfs import compute_cid
from ..wire._checkpoint import decode_state, encode_state
from ..wire._update_codec import decode_update
from ._cache import ContentCache

log = logging.getLogger(__name__)


class RebuiltWeights:
    """A content source holding one blob under its CID: what the cache downloads the rebuilt model from."""

    def __init__(self, cid: str, blob: bytes) -> None:
        self.cid, self.blob = cid, blob

    async def stream(self, address: str, *, max_bytes: int | None = None, timeout_s: float | None = None,
                     offset: int = 0, length: int | None = None) -> AsyncIterator[bytes]:
        if address != self.cid:
            raise NotFoundError(f"{address} is not the rebuilt model {self.cid}")
        end = None if length is None else offset + length
        yield self.blob[offset:end]


def rebuild(base: bytes, change: bytes, encoding: str) -> bytes:
    """The new model's bytes: the base model plus its decoded change, encoded as the coordinator did."""
    reference = decode_state(base)
    return encode_state(decode_update(change, reference, encoding))  # type: ignore[arg-type]


def holds_base(cache: ContentCache, job: JobAssignment) -> bool:
    """Whether the job offers its model as a change from a model this cache holds (then nothing else is fetched)."""
    return job.weights_delta is not None and cache.cached(job.weights_delta.base_cid) is not None


async def rebuilt_weights(cache: ContentCache, store: ContentStore, job: JobAssignment) -> RebuiltWeights | None:
    """The job's weights rebuilt from a cached base, or None (no change offered, no base held, no match)."""
    delta = job.weights_delta
    if delta is None or not holds_base(cache, job) or cache.cached(job.weights_cid) is not None:
        return None
    try:
        with await cache.acquire(store, delta.base_cid, size=weights_limit(job.footprint)) as base, \
                await cache.acquire(store, delta.delta_cid, size=delta.delta_bytes,
                                    timeout_s=fetch_timeout_s(delta.delta_bytes)) as change:
            blob = await asyncio.to_thread(lambda: rebuild(base.read_bytes(), change.read_bytes(), delta.encoding))
    except (AitbcError, OSError) as exc:
        log.info("job %s: the model's change did not apply (%s); fetching the model", job.job_id, exc)
        return None
    if len(blob) != job.weights_bytes or await asyncio.to_thread(compute_cid, blob) != job.weights_cid:
        log.warning("job %s: the rebuilt model does not hash to %s; fetching the model", job.job_id, job.weights_cid)
        return None
    log.info("job %s: model rebuilt from %s and a %d-byte change", job.job_id, delta.base_cid, delta.delta_bytes)
    return RebuiltWeights(job.weights_cid, blob)
