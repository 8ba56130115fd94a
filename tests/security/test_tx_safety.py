"""Transactions that the node drops, leaves stuck or has not yet confirmed, on a real anvil.

Each test runs its own anvil: they switch automine off, which would stall every other test
sharing the session's node. Before the fix a dropped transaction left the sender's nonce
ahead of the chain (every later send queued behind the gap until it timed out), a stuck
transaction was never replaced, receipts were returned at the block that included them
whatever the chain, and a settlement retried while its ``release`` was pending paid again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import AsyncWeb3

from aitbc_agent_sdk.chain import TransactionSender
from aitbc_agent_sdk.devnet._anvil import dev_accounts

from tests.security.anvil_node import node  # noqa: F401 (a fixture)

WAIT_S = 60.0  # an upper bound for things that happen at once on an idle machine


@pytest.fixture
def account() -> LocalAccount:
    return dev_accounts(2)[1]


async def rpc(w3: AsyncWeb3, method: str, *params: object) -> object:
    answer = await w3.provider.make_request(method, list(params))  # type: ignore[arg-type]
    assert "error" not in answer, answer
    return answer.get("result")


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = WAIT_S) -> None:
    async def poll() -> None:
        while not await check():
            await asyncio.sleep(0.05)
    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


async def pending_txs(w3: AsyncWeb3) -> list[dict]:
    return list((await w3.eth.get_block("pending", full_transactions=True))["transactions"])


async def test_a_dropped_transaction_does_not_block_the_next_send(node: AsyncWeb3, account: LocalAccount) -> None:
    sender = TransactionSender(node, account, poll_interval=0.05)
    a, b = Account.create().address, Account.create().address
    await rpc(node, "evm_setAutomine", False)
    first = asyncio.create_task(sender.send({"to": a, "value": 1}, timeout=30))
    await until(lambda: _has_pending(node), "the first transaction to reach the pool")
    [tx] = await pending_txs(node)
    await rpc(node, "anvil_dropTransaction", tx["hash"].to_0x_hex())  # the node forgets it
    assert await node.eth.get_transaction_count(account.address, "pending") == 0
    await rpc(node, "evm_setAutomine", True)
    second = asyncio.create_task(sender.send({"to": b, "value": 2}, timeout=30))
    receipts = await asyncio.wait_for(asyncio.gather(first, second), WAIT_S)
    assert [r["status"] for r in receipts] == [1, 1]
    assert (await node.eth.get_balance(a), await node.eth.get_balance(b)) == (1, 2)
    assert await node.eth.get_transaction_count(account.address) == 2  # nonces 0 and 1, no gap


async def _has_pending(w3: AsyncWeb3) -> bool:
    return bool(await pending_txs(w3))


async def test_a_stuck_transaction_is_replaced_at_a_higher_fee(node: AsyncWeb3, account: LocalAccount) -> None:
    sender = TransactionSender(node, account, poll_interval=0.05, stuck_after_s=1.0)
    to = Account.create().address
    await rpc(node, "evm_setAutomine", False)
    task = asyncio.create_task(sender.send({"to": to, "value": 1}, timeout=30))
    await until(lambda: _has_pending(node), "the transaction to reach the pool")
    [first] = await pending_txs(node)
    # The base fee jumps past what the transaction offers: the next block leaves it out.
    base = int((await node.eth.get_block("latest"))["baseFeePerGas"])
    await rpc(node, "anvil_setNextBlockBaseFeePerGas", hex(base * 10))
    await rpc(node, "evm_mine")
    assert await node.eth.get_transaction_count(account.address, "latest") == 0
    await rpc(node, "evm_setAutomine", True)  # from now on anything that pays the base fee is mined
    receipt = await asyncio.wait_for(task, WAIT_S)
    mined = await node.eth.get_transaction(receipt["transactionHash"])
    assert receipt["status"] == 1 and mined["nonce"] == first["nonce"] == 0
    assert mined["hash"] != first["hash"] and mined["maxFeePerGas"] > first["maxFeePerGas"]
    assert await node.eth.get_balance(to) == 1
    assert await node.eth.get_transaction_count(account.address) == 1  # one of the two versions, once


async def test_a_receipt_is_returned_only_at_the_configured_depth(node: AsyncWeb3, account: LocalAccount) -> None:
    from aitbc_agent_sdk.chain._tx import default_confirmations

    assert await TransactionSender(node, account).confirmations() == 1  # anvil's chain id: a devnet
    assert default_confirmations(1) > 1  # Ethereum mainnet waits for more
    sender = TransactionSender(node, account, poll_interval=0.05, confirmations=2)
    task = asyncio.create_task(sender.send({"to": Account.create().address, "value": 1}, timeout=30))
    await until(lambda: _mined(node, account), "the transaction to be mined")
    # One block (its own) is not enough. A bounded wait: a wrong early return is seen at once.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(task), 2.0)
    await rpc(node, "evm_mine")
    receipt = await asyncio.wait_for(task, WAIT_S)
    assert await node.eth.block_number >= int(receipt["blockNumber"]) + 1


async def _mined(w3: AsyncWeb3, account: LocalAccount) -> bool:
    return await w3.eth.get_transaction_count(account.address, "latest") >= 1


# --- settlement retried while its release is pending -----------------------------------------

CID = "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH"
PRICE = 10**15


async def funded_training(tmp_path: Path, w3: AsyncWeb3, workers: list[LocalAccount], rounds: int):
    """A real Coordinator (SQLite store, escrow on the test's anvil) with one funded slot per worker."""
    from aitbc_agent_sdk.chain import EscrowClient, deploy, load_artifact, sign_consent
    from aitbc_agent_sdk.coordinator import Coordinator, CoordinatorSettings, EscrowAccount, TrainingDatabase
    from aitbc_agent_sdk.market import WeightedScore
    from aitbc_agent_sdk.messaging import InMemoryBus, SignedChannel
    from aitbc_agent_sdk.records import WorkerContract, new_id
    from aitbc_agent_sdk.storage import LocalContentStore

    coordinator_account: LocalAccount = dev_accounts(3)[2]
    sender = TransactionSender(w3, coordinator_account, poll_interval=0.05)
    address = await deploy(sender, load_artifact("TrainingEscrow"))
    escrow = EscrowAccount(sender, EscrowClient(w3, address))
    db = await TrainingDatabase(tmp_path / "aitbc.db").open()
    coordinator = Coordinator(channel=SignedChannel(InMemoryBus(), coordinator_account),
                              store=LocalContentStore(tmp_path / "store"), db=db, escrow=escrow,
                              scoring=WeightedScore(), settings=CoordinatorSettings(audit_dir=tmp_path / "trainings"))
    tid = new_id("training")
    contracts = [WorkerContract(
        contract_id=new_id("contract"), training_id=tid, worker_id=w.address, coordinator=coordinator_account.address,
        price_wei=PRICE, rounds=rounds, accepted_at=0.0, shard_index=i,
        consent="0x" + sign_consent(w, 31337, address, escrow.key(tid)).hex()) for i, w in enumerate(workers)]
    for contract in contracts:
        await db.save_contract(contract)
    await coordinator.money.fund_escrow(tid)
    return coordinator, tid, contracts


async def accept(coordinator, tid: str, worker: str, round_: int) -> None:
    from aitbc_agent_sdk.records import CheckpointRef, new_id

    job = new_id("job")
    await coordinator.db.save_checkpoint(CheckpointRef(checkpoint_id=job, cid=CID, job_id=job, worker_id=worker,
                                                       training_id=tid, round=round_, samples=10, loss=0.1), "accepted")


async def test_a_settlement_retried_while_its_release_is_pending_pays_each_round_once(
        tmp_path: Path, node: AsyncWeb3) -> None:
    worker = Account.create()
    coordinator, tid, _ = await funded_training(tmp_path, node, [worker], rounds=3)
    try:
        await accept(coordinator, tid, worker.address, 1)  # one round of three is owed: PRICE
        sender = coordinator.escrow.sender
        await rpc(node, "evm_setAutomine", False)
        first = asyncio.create_task(coordinator.money.pay(tid))
        await until(lambda: _has_pending(node), "the first release to reach the pool")
        first.cancel()  # the coordinator gives up on it (a crash, a timeout) while it is pending
        with pytest.raises(asyncio.CancelledError):
            await first
        retry = asyncio.create_task(coordinator.money.pay(tid))
        # Unfixed, the retry reads "nothing paid yet" and sends a second release. A bounded wait:
        # the fixed code sends nothing here, and waiting longer cannot make it fail.
        try:
            await until(lambda: _pending_count(node, sender.address, 2), "a second release", timeout=5.0)
        except pytest.fail.Exception:
            pass
        await rpc(node, "evm_setAutomine", True)  # the first release is mined now
        await asyncio.wait_for(retry, WAIT_S)
        slot = await coordinator.escrow.escrow.slot(coordinator.escrow.key(tid), worker.address)
        assert slot.paid == PRICE  # paid for its one round, once
        assert await node.eth.get_balance(worker.address) == PRICE
        summary = await coordinator.escrow.summary(tid)
        assert summary.deposited_wei == 3 * PRICE and summary.paid_wei == PRICE
    finally:
        await coordinator.db.close()


async def _pending_count(w3: AsyncWeb3, address: str, n: int) -> bool:
    return len([t for t in await pending_txs(w3) if t["from"] == address]) >= n
