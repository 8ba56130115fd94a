"""Property test: random call sequences against TrainingEscrow never create or lose a wei.

Each example runs on a fresh embedded chain (eth-tester): a training with three slots, one of
them a contract that refuses ETH, then a random mix of releases (some over the cap), slot
replacements, refunds by the coordinator or a stranger, receipts redeemed by a stranger (some
spent or over the cap), reclaims and clock jumps. After every call:

* the escrow's balance is exactly what it still holds for the training plus what it owes;
* ``deposited == paid + refunded + held``, and once closed the training holds exactly what the
  active slots were not paid (what receipts can still claim);
* what workers hold plus what they are owed equals what was released;
* the coordinator's balance is its start minus the deposit and its gas plus the refund;
* the contract agreed with a plain Python model on which calls must revert.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from eth_account import Account
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aitbc_agent_sdk.chain import (
    ContractArtifact,
    TransactionSender,
    deploy,
    load_artifact,
    result_hash,
    sign_receipt,
    start_embedded_chain,
    training_salt,
)
from aitbc_agent_sdk.chain._escrow import CLAIM_WINDOW_S, GRACE_PERIOD_S, key_of
from aitbc_agent_sdk.errors import ContractRevertError
from test_escrow import ETH, TEST_ARTIFACTS, ConsentingEscrow, _gas_cost, advance_time, worker_account

SLOTS = [ETH, 2 * ETH, 3 * ETH]
DEADLINE_S = 3600
GRACE_S = GRACE_PERIOD_S
# A call sent now is mined at a later block time; near a time limit either outcome is right.
CLOCK_SLACK_S = 15

release_op = st.tuples(
    st.just("release"),
    st.lists(st.tuples(st.integers(0, 4), st.integers(1, 4 * ETH // 3)), min_size=1, max_size=3),
)
replace_op = st.tuples(st.just("replace"), st.tuples(st.integers(0, 4), st.integers(0, 4)))
drop_op = st.tuples(st.just("drop"), st.integers(0, 4))
refund_op = st.tuples(st.just("refund"), st.booleans())  # True: a stranger calls
redeem_op = st.tuples(st.just("redeem"), st.tuples(st.integers(0, 4), st.integers(1, 4 * ETH // 3)))
reclaim_op = st.tuples(st.just("reclaim"), st.none())
advance_op = st.tuples(st.just("advance"), st.sampled_from([60, DEADLINE_S, CLAIM_WINDOW_S, GRACE_S]))
operations = st.lists(st.one_of(release_op, release_op, replace_op, drop_op, refund_op, redeem_op, redeem_op,
                                reclaim_op, advance_op), max_size=10)


@dataclass
class Model:
    slots: dict[str, list[int]]  # worker -> [amount, paid]; replaced workers keep amount 0
    replaced: set[str] = field(default_factory=set)
    closed: bool = False
    closed_at: int = 0
    reclaimed: bool = False
    deadline: int = 0

    def active(self, worker: str) -> bool:
        return worker in self.slots and worker not in self.replaced

    def claimable(self, now: int) -> bool:
        return not self.closed or now < self.closed_at + CLAIM_WINDOW_S


async def _scenario(ops: list[tuple]) -> None:
    chain = await start_embedded_chain()
    coordinator_account = Account.create()
    await chain.fund(coordinator_account.address, 100 * ETH)
    coordinator = TransactionSender(chain.w3, coordinator_account)
    stranger_account = Account.create()
    await chain.fund(stranger_account.address, ETH)
    stranger = TransactionSender(chain.w3, stranger_account)
    escrow = ConsentingEscrow(chain.w3, await deploy(coordinator, load_artifact("TrainingEscrow")))
    receiver = await deploy(coordinator, ContractArtifact.from_file(TEST_ARTIFACTS / "RevertingReceiver.json"))
    people = [receiver] + [worker_account().address for _ in range(4)]  # 0-2 open with slots, 3-4 spare

    start = await chain.balance(coordinator.address)
    chain_id = await escrow.chain_id()
    gas = 0
    tid = key_of(coordinator.address, training_salt("prop"))
    now = int((await chain.w3.eth.get_block("latest"))["timestamp"])
    receipt = await escrow.open(coordinator, training_salt("prop"), people[:3], SLOTS, deadline=now + DEADLINE_S)
    gas += _gas_cost(receipt)
    model = Model({w: [a, 0] for w, a in zip(people[:3], SLOTS)}, deadline=now + DEADLINE_S)

    async def pending_time() -> int:
        return int((await chain.w3.eth.get_block("pending"))["timestamp"])

    async def mined_time(receipt: dict) -> int:
        return int((await chain.w3.eth.get_block(receipt["blockNumber"]))["timestamp"])

    async def check() -> None:
        state = await escrow.training(tid)
        owed = sum([await escrow.owed(p) for p in people])
        held, until = await escrow.held(tid)
        assert held >= 0 and state.deposited == state.paid + state.refunded + held
        if model.closed:
            assert until == model.closed_at + CLAIM_WINDOW_S
            unpaid = sum(a - p for w, (a, p) in model.slots.items() if model.active(w))
            reclaimed = model.reclaimed
            assert held == (0 if reclaimed else unpaid)
        assert await chain.balance(escrow.address) == held + owed
        assert sum([await chain.balance(p) for p in people]) + owed == state.paid
        assert await chain.balance(coordinator.address) == start - state.deposited - gas + state.refunded
        for worker, (amount, paid) in model.slots.items():
            assert await escrow.slot(tid, worker) == (amount, paid)
        assert state.closed == model.closed

    for op, arg in ops:
        if op == "release":
            batch = [(people[i], amount) for i, amount in arg]
            remaining = {w: a - p for w, (a, p) in model.slots.items() if w not in model.replaced}
            ok = not model.closed
            for worker, amount in batch:
                ok = ok and worker in remaining and amount <= remaining[worker]
                if ok:
                    remaining[worker] -= amount
            try:
                receipt = await escrow.release(coordinator, tid, [w for w, _ in batch], [a for _, a in batch],
                                               [result_hash("cid")] * len(batch))
            except ContractRevertError:
                assert not ok, batch
            else:
                assert ok, batch
                gas += _gas_cost(receipt)
                for worker, amount in batch:
                    model.slots[worker][1] += amount
        elif op == "replace":
            old, new = people[arg[0]], people[arg[1]]
            # Into a worker that holds a funded slot of its own, the old slot is only retired.
            into_own = new in model.slots and new not in model.replaced and new != old
            ok = (not model.closed and old in model.slots and old not in model.replaced
                  and model.slots[old][1] == 0 and (new not in model.slots or into_own))
            try:
                receipt = await escrow.replace_worker(coordinator, tid, old, new)
            except ContractRevertError:
                assert not ok, (old, new)
            else:
                assert ok, (old, new)
                gas += _gas_cost(receipt)
                if not into_own:
                    model.slots[new] = [model.slots[old][0], 0]
                model.slots[old] = [0, 0]
                model.replaced.add(old)
        elif op == "drop":
            worker = people[arg]
            ok = (not model.closed and worker in model.slots and worker not in model.replaced
                  and model.slots[worker][1] == 0)
            try:
                receipt = await escrow.drop_worker(coordinator, tid, worker)
            except ContractRevertError:
                assert not ok, worker
            else:
                assert ok, worker
                gas += _gas_cost(receipt)
                model.slots[worker] = [0, 0]
                model.replaced.add(worker)
        elif op == "refund":
            by_stranger = arg
            block_time = int((await chain.w3.eth.get_block("pending"))["timestamp"])
            ok = not model.closed and (not by_stranger or block_time >= model.deadline + GRACE_S)
            try:
                receipt = await escrow.refund(stranger if by_stranger else coordinator, tid)
            except ContractRevertError:
                # The pending block's time may still move on; only a closed training must always fail.
                assert not ok or by_stranger
            else:
                assert not model.closed
                if not by_stranger:
                    gas += _gas_cost(receipt)
                model.closed = True
                model.closed_at = await mined_time(receipt)
        elif op == "redeem":
            worker, cumulative = people[arg[0]], arg[1]
            signature = sign_receipt(coordinator_account, chain_id, escrow.address, tid, worker, 1, cumulative)
            fits = model.active(worker) and model.slots[worker][1] < cumulative <= model.slots[worker][0]
            now = await pending_time()
            try:
                receipt = await escrow.redeem(stranger, tid, worker, 1, cumulative, signature)
            except ContractRevertError:
                assert not (fits and model.claimable(now + CLOCK_SLACK_S)), (worker, cumulative)
            else:
                assert fits and model.claimable(await mined_time(receipt)), (worker, cumulative)
                model.slots[worker][1] = cumulative
        elif op == "reclaim":
            now = await pending_time()
            unpaid = sum(a - p for w, (a, p) in model.slots.items() if model.active(w))
            due = model.closed and not model.reclaimed and unpaid > 0
            try:
                receipt = await escrow.reclaim(stranger, tid)
            except ContractRevertError:
                assert not (due and not model.claimable(now))
            else:
                assert due and not model.claimable(await mined_time(receipt))
                model.reclaimed = True
        else:
            await advance_time(chain, arg)
        await check()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_random_call_sequences_conserve_every_wei(ops: list[tuple]) -> None:
    asyncio.run(_scenario(ops))
