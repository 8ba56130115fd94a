"""Hiring a replacement asks several candidates at once (``REPLACEMENT_ASKS_AT_ONCE``) in rank order.

Before, each candidate that never answered cost the whole reply timeout in turn: at 3,000 providers a
replacement took 186-300 s. The market port here is a stand-in (labelled): its negotiations are scripted,
so the test sees which asks were open together and which contract came back, with no clock involved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from eth_account import Account

from aitbc_agent_sdk.coordinator.round._reassign import REPLACEMENT_ASKS_AT_ONCE, new_replacement
from aitbc_agent_sdk.errors import MessagingError, NotEnoughWorkersError
from aitbc_agent_sdk.records import Hardware, Offer, TrainingSpec, Worker, WorkerContract

HARDWARE = Hardware(cpu_model="test cpu", cpu_cores=1, ram_bytes=1 << 30)
SPEC = TrainingSpec(model_type="mlp", target_workers=1)


class ScriptedMarket:
    """Stand-in for the Hiring port. ``silent`` candidates answer only when ``timeout`` is set (their reply
    timeout); ``declining`` ones refuse at once; the rest agree once every silent ask is open."""

    hardware_flags: dict[str, str] = {}

    def __init__(self, workers: list[Worker], silent: set[str], declining: set[str] = frozenset()) -> None:
        self.workers, self.silent, self.declining = workers, silent, declining
        self.timeout = asyncio.Event()
        self.asked: list[str] = []
        self.open: set[str] = set()
        self.open_together = 0
        self.agreed: list[str] = []

    async def discover(self, **_: object) -> list[Worker]:
        return list(self.workers)

    def select(self, workers: Sequence[Worker], count: int) -> list[Worker]:
        return sorted(workers, key=lambda w: w.price)[:count]  # the cheapest first

    def stake_note(self, requested_wei: int | None = None) -> str:
        return ""

    async def negotiate(self, worker_id: str, training_id: str, price_wei: int, **_: object) -> WorkerContract:
        self.asked.append(worker_id)
        self.open.add(worker_id)
        self.open_together = max(self.open_together, len(self.open))
        try:
            if worker_id in self.declining:
                raise MessagingError(f"worker {worker_id} declined: busy")
            if worker_id in self.silent:
                await self.timeout.wait()
                raise MessagingError(f"no reply from {worker_id}")
            while not self.silent <= set(self.asked):  # the silent ones ranked above are asked too
                await asyncio.sleep(0)
            self.agreed.append(worker_id)
            return WorkerContract(contract_id=f"c-{worker_id}", training_id=training_id, worker_id=worker_id,
                                  coordinator=Account.create().address, price_wei=price_wei, rounds=1,
                                  accepted_at=0.0, role="spare")
        finally:
            self.open.discard(worker_id)


def workers(count: int) -> list[Worker]:
    made = []
    for i in range(count):
        offer = Offer(provider=Account.create().address, price_wei=10**15 + i, hardware=HARDWARE)
        made.append(Worker(worker_id=offer.provider, offer=offer, reputation=2.5, stake_wei=10**17))
    return made


async def test_silent_candidates_cost_one_timeout_together_and_the_best_ranked_that_agrees_is_hired():
    pool = workers(5)
    market = ScriptedMarket(pool, silent={w.worker_id for w in pool[:3]})

    async def time_out_once_all_asked() -> None:
        while len(market.asked) < len(pool):
            await asyncio.sleep(0)
        market.timeout.set()  # one reply timeout, for every silent ask at once

    timer = asyncio.create_task(time_out_once_all_asked())
    async with asyncio.timeout(30):
        contract = await new_replacement(market, SPEC, "t1", set(), max_price_wei=None)
    await timer
    assert contract.worker_id == pool[3].worker_id  # the cheapest that agreed, not the first to answer
    assert market.open_together >= 4  # the three silent asks and the one that agreed were open at once
    assert market.asked[:5] == [w.worker_id for w in pool]  # in rank order


async def test_waves_go_on_until_one_agrees_and_nobody_left_is_a_clear_error():
    pool = workers(REPLACEMENT_ASKS_AT_ONCE + 2)
    everyone_but_last = {w.worker_id for w in pool[:-1]}
    market = ScriptedMarket(pool, silent=set(), declining=everyone_but_last)
    contract = await new_replacement(market, SPEC, "t1", set(), max_price_wei=None)
    assert contract.worker_id == pool[-1].worker_id  # found in the second wave
    assert market.open_together <= REPLACEMENT_ASKS_AT_ONCE

    nobody = ScriptedMarket(pool, silent=set(), declining={w.worker_id for w in pool})
    with pytest.raises(NotEnoughWorkersError, match="no provider is available"):
        await new_replacement(nobody, SPEC, "t2", set(), max_price_wei=None)
    excluded = ScriptedMarket(pool, silent=set())
    with pytest.raises(NotEnoughWorkersError):
        await new_replacement(excluded, SPEC, "t3", {w.worker_id for w in pool}, max_price_wei=None)
    assert excluded.asked == []
