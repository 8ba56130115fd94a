"""Ctrl-C and SIGTERM on ``run``: the training stops, and is then settled as ``stop`` settles one.

The first signal cancels the work; the accepted rounds are then paid and the rest refunded. A signal
during that settlement is ignored, with a note: cutting it short would leave the escrow to its deadline.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aitbc_agent_sdk import flow  # lazy: its names import on first use

if TYPE_CHECKING:
    from aitbc_agent_sdk.flow import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EMBEDDED_RESUME_NOTE = ("cannot resume: the embedded network's chain and market end with this process; "
                        "start a new run")


@dataclass
class Interruption:
    """The signal that stopped the work, once one has."""

    signum: int | None = None
    outcome: Interrupted | None = None  # what settling did, once done

    @property
    def exit_code(self) -> int:
        """130 for SIGINT, 143 for SIGTERM: the shell's 128 + the signal's number."""
        return 128 + (self.signum or 0)


@asynccontextmanager
async def stop_on_signal(work: asyncio.Future[object], note: Callable[[str], None]) -> AsyncIterator[Interruption]:
    """While inside: the first SIGINT or SIGTERM cancels WORK; later ones are noted and ignored."""
    loop = asyncio.get_running_loop()
    caught = Interruption()

    def on_signal(signum: int) -> None:
        if caught.signum is None:
            caught.signum = signum
            note(f"{signal.Signals(signum).name}: stopping; paying the accepted rounds and refunding the rest...")
            work.cancel()
        else:
            note("still settling the escrow, so this signal is ignored (kill -9 would leave the unpaid "
                 "rounds to the escrow's deadline)")

    for signum in SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield caught
    finally:
        for signum in SIGNALS:
            loop.remove_signal_handler(signum)


def interrupted_line(outcome: Interrupted, resume_note: str = EMBEDDED_RESUME_NOTE) -> str:
    """The one line a user reads after an interrupted run: what was paid, what came back, what next."""
    if outcome.training_id is None or not outcome.funded:
        return "interrupted before the escrow was funded: nothing was spent"
    workers = f"{outcome.workers_paid} worker{'' if outcome.workers_paid == 1 else 's'}"
    rounds = f"{outcome.accepted_rounds} accepted round{'' if outcome.accepted_rounds == 1 else 's'}"
    held = (f" ({flow.eth_text(outcome.held_wei)} ETH more is held for the workers' receipts until "
            f"{time.strftime('%H:%M', time.localtime(outcome.held_until))}, then reclaimable)"
            if outcome.held_wei and outcome.held_until else "")
    return (f"interrupted after round {outcome.accepted_rounds} of {outcome.training_id}: paid {workers} "
            f"{flow.eth_text(outcome.paid_wei)} ETH for {rounds}, refunded "
            f"{flow.eth_text(outcome.refunded_wei)} ETH{held}; {resume_note}")
