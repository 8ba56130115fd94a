"""The provider's side of the hardware challenge: multiply on the GPU the coordinator names, store, answer.

The product goes into the content store as safetensors (int32, entry ``product``) and the answer names
its CID; the coordinator checks it (``coordinator.hardware``). Challenges are served one at a time, in
a thread; one beyond the provider's bounds, or naming a GPU its offer does not list, is declined, and
one older than its own deadline (it waited behind others) is dropped: nobody is waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import torch

from ..errors import AitbcError
from ..market._hardware_check import PRODUCT_KEY, compute_product
from ..messaging import SignedChannel, Verified, topics
from ..records import MAX_HARDWARE_FLOPS, MAX_HARDWARE_PRODUCT, Hardware, HardwareAnswer, HardwareChallenge
from ..storage import ContentStore
from ..wire._checkpoint import encode_state

log = logging.getLogger(__name__)
CLOCK_SKEW_S = 30.0  # a challenge counts as stale only this long past its deadline: clocks differ
# Anyone on the bus may challenge: past these (per minute), a challenge is declined, so strangers cannot
# keep a provider's GPU busy. A coordinator hiring, or looking for a replacement, asks once per discovery.
PER_SENDER_PER_MINUTE = 6
TOTAL_PER_MINUTE = 30


class ChallengeBudget:
    """Challenges answered in the last minute, per sender and in all (pure bookkeeping: the clock is passed)."""

    def __init__(self, per_sender: int = PER_SENDER_PER_MINUTE, total: int = TOTAL_PER_MINUTE) -> None:
        self.per_sender, self.total = per_sender, total
        self._times: list[tuple[float, str]] = []

    def allow(self, sender: str, now: float) -> bool:
        self._times = [(t, s) for t, s in self._times if now - t < 60.0]
        if len(self._times) >= self.total or sum(s == sender for _, s in self._times) >= self.per_sender:
            return False
        self._times.append((now, sender))
        return True


def challenge_refusal(challenge: HardwareChallenge, hardware: Hardware | None) -> str | None:
    """Pure: why this provider declines ``challenge``, or None when it computes it."""
    rows, inner, cols = challenge.rows, challenge.inner, challenge.cols
    if hardware is None or challenge.gpu_index >= len(hardware.gpus):
        return f"no GPU {challenge.gpu_index} on this host"
    if rows * cols > MAX_HARDWARE_PRODUCT or 2 * rows * inner * cols > MAX_HARDWARE_FLOPS:
        return f"a {rows} x {inner} x {cols} challenge is beyond this provider's bounds"
    return None


def challenge_device(gpu_index: int) -> str:
    """The torch device of NVML GPU ``gpu_index``: CUDA when this process sees it, else the CPU."""
    if torch.cuda.is_available() and gpu_index < torch.cuda.device_count():
        return f"cuda:{gpu_index}"
    return "cpu"


def product_blob(challenge: HardwareChallenge, device: str) -> bytes:
    product = compute_product(challenge.seed, challenge.rows, challenge.inner, challenge.cols, device)
    return encode_state({PRODUCT_KEY: product})


class HardwareAnswers:
    """The handler of ``topics.hardware_check``: ``await answers(verified)`` answers one challenge.

    ``device`` forces where every product is computed (the chaos suite's fake GPU computes on its CPU)."""

    def __init__(self, channel: SignedChannel, store: ContentStore, hardware: Callable[[], Hardware | None],
                 *, device: str | None = None) -> None:
        self._channel = channel
        self._store = store
        self._hardware = hardware
        self.device = device
        self._one_at_a_time = asyncio.Lock()
        self.budget = ChallengeBudget()
        self.answered = 0

    async def warm_up(self) -> None:
        """Create the CUDA contexts (and cuBLAS handles) of the offer's GPUs now, not on the first challenge."""
        hardware = self._hardware()
        if self.device is not None or hardware is None or not hardware.gpus or not torch.cuda.is_available():
            return

        def warm() -> None:
            for index in range(min(len(hardware.gpus), torch.cuda.device_count())):
                ones = torch.ones(8, 8, dtype=torch.float16, device=f"cuda:{index}")
                (ones @ ones).sum().item()  # waits for the GPU
        with contextlib.suppress(RuntimeError):  # a broken GPU fails its challenges instead
            await asyncio.to_thread(warm)

    async def __call__(self, verified: Verified[HardwareChallenge]) -> None:
        challenge = verified.message
        if not self.budget.allow(verified.sender, time.monotonic()):
            log.info("hardware challenge %s from %s declined: too many this minute", challenge.nonce, verified.sender)
            answer = HardwareAnswer(nonce=challenge.nonce, provider=self._channel.address,
                                    reason="too many hardware challenges this minute")
            with contextlib.suppress(AitbcError):
                await self._channel.publish(topics.hardware_answer(verified.sender, challenge.nonce), answer)
            return
        async with self._one_at_a_time:
            if time.time() - verified.sent_at > challenge.deadline_s + CLOCK_SKEW_S:
                log.info("hardware challenge %s from %s dropped: past its deadline", challenge.nonce, verified.sender)
                return
            answer = await self._answer(challenge)
        with contextlib.suppress(AitbcError):
            await self._channel.publish(topics.hardware_answer(verified.sender, challenge.nonce), answer)
        self.answered += 1

    async def _answer(self, challenge: HardwareChallenge) -> HardwareAnswer:
        address = self._channel.address
        refusal = challenge_refusal(challenge, self._hardware())
        if refusal is not None:
            return HardwareAnswer(nonce=challenge.nonce, provider=address, reason=refusal)
        device = self.device or challenge_device(challenge.gpu_index)
        try:
            blob = await asyncio.to_thread(product_blob, challenge, device)
        except RuntimeError as exc:  # CUDA out of memory, a lost device: say so rather than go silent
            return HardwareAnswer(nonce=challenge.nonce, provider=address, reason=f"failed on {device}: {exc}"[:256])
        cid = await self._store.add(blob, pin=False)
        return HardwareAnswer(nonce=challenge.nonce, provider=address, cid=cid)
