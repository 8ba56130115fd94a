"""The hardware challenge at discovery, as the coordinator runs it: challenge, wait, fetch, check.

Only offers that claim a GPU are challenged, all at once; one GPU of each, chosen at random, so a
provider claiming eight GPUs and holding one is caught most of the time. The decision itself is
``market.hardware_check.hardware_verdict``; this module only does the I/O around it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Sequence

from ...errors import AitbcError, MessagingError
from ...market._hardware_check import PRODUCT_KEY, HardwareVerdict, challenge_deadline, hardware_verdict, product_ok
from ...messaging import SignedChannel, topics
from ...records import HardwareAnswer, HardwareChallenge, Offer, Worker, new_id
from ...storage import ContentStore
from ...wire._checkpoint import decode_state
from .._settings import CoordinatorSettings

log = logging.getLogger(__name__)
HEADER_BYTES = 1024  # room for the safetensors header next to rows * cols * 4 bytes of product


async def check_hardware(channel: SignedChannel, store: ContentStore, workers: Sequence[Worker],
                         settings: CoordinatorSettings) -> list[Worker]:
    """``workers`` with the outcome of the challenge: those that claim no GPU stay unchecked."""
    if not settings.hardware_check:
        return list(workers)
    checking = asyncio.Semaphore(1)  # one Freivalds check at a time: each uses every core
    verdicts = await asyncio.gather(*(challenge_offer(channel, store, w.offer, settings, checking)
                                      for w in workers if w.offer.hardware.gpus))
    by_provider = dict(zip((w.worker_id for w in workers if w.offer.hardware.gpus), verdicts, strict=True))
    checked = []
    for worker in workers:
        verdict = by_provider.get(worker.worker_id)
        if verdict is None:
            checked.append(worker)
            continue
        if verdict.flagged:
            log.warning("offer of %s (%s) flagged: %s", worker.worker_id, worker.gpu_type, verdict.reason)
        checked.append(worker.model_copy(update={"hardware_check": verdict.outcome,
                                                 "hardware_reason": verdict.reason}))
    return checked


async def challenge_offer(channel: SignedChannel, store: ContentStore, offer: Offer, settings: CoordinatorSettings,
                          checking: asyncio.Semaphore | None = None) -> HardwareVerdict:
    """Challenge one GPU the offer claims; the verdict says whether what answered can be that GPU."""
    rows, inner, cols = settings.hardware_challenge
    index = secrets.randbelow(len(offer.hardware.gpus))
    deadline = challenge_deadline(offer.hardware.gpus[index].name, settings.hardware_challenge,
                                  settings.hardware_allowance_s)
    challenge = HardwareChallenge(nonce=new_id("hwcheck"), seed=secrets.randbits(63), rows=rows, inner=inner,
                                  cols=cols, gpu_index=index, deadline_s=deadline)
    started = time.monotonic()
    try:
        answer = await channel.request(
            topics.hardware_check(offer.provider), challenge, topics.hardware_answer(channel.address, challenge.nonce),
            HardwareAnswer, timeout=deadline + settings.hardware_grace_s, expected_sender=offer.provider)
    except MessagingError:
        return hardware_verdict(deadline, None)
    answered_s = time.monotonic() - started
    if answer.nonce != challenge.nonce or answer.provider != offer.provider:
        return hardware_verdict(deadline, answered_s, product_problem="the answer names another challenge")
    if answer.cid is None:
        return hardware_verdict(deadline, answered_s, declined=answer.reason or "no reason given")
    if answered_s > deadline:  # late: the product is not worth fetching
        return hardware_verdict(deadline, answered_s)
    problem = await product_problem(store, answer.cid, challenge, settings.hardware_fetch_s,
                                    checking or asyncio.Semaphore(1))
    return hardware_verdict(deadline, answered_s, product_problem=problem)


async def product_problem(store: ContentStore, cid: str, challenge: HardwareChallenge, fetch_s: float,
                          checking: asyncio.Semaphore) -> str | None:
    """What is wrong with the product stored under ``cid``, or None when it is the challenge's product."""
    rows, cols = challenge.rows, challenge.cols
    try:
        blob = await store.cat(cid, max_bytes=rows * cols * 4 + HEADER_BYTES, timeout_s=fetch_s)
        state = await asyncio.to_thread(decode_state, blob)
    except (AitbcError, TimeoutError) as exc:  # not found, too large, too slow, not safetensors
        return f"product {cid} unusable: {type(exc).__name__}: {exc}"
    product = state.get(PRODUCT_KEY)
    if set(state) != {PRODUCT_KEY} or product is None:
        return f"product {cid} holds {sorted(state)[:4]}, not one {PRODUCT_KEY!r} tensor"
    async with checking:
        ok = await asyncio.to_thread(product_ok, challenge.seed, rows, challenge.inner, cols, product)
    return None if ok else f"wrong product for a {rows} x {challenge.inner} x {cols} challenge"
