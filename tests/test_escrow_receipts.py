"""Payment receipts on TrainingEscrow: a provider redeems the coordinator's signed acceptance itself,
and a refund keeps back what receipts can still claim until the claim window is over.

All on the embedded py-evm chain. After every step the escrow's books are checked against real
balances: the escrow holds exactly ``deposited - paid - refunded`` (the training's ``held``) plus
what it owes, workers hold what was paid to them, the coordinator what it got back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from aitbc_agent_sdk.chain import (
    ETH_TOKEN,
    ContractArtifact,
    DevChain,
    TransactionSender,
    deploy,
    load_artifact,
    receipt_digest,
    receipt_signer,
    result_hash,
    sign_receipt,
    start_embedded_chain,
    training_salt,
)
from aitbc_agent_sdk.chain._escrow import CLAIM_WINDOW_S, key_of
from aitbc_agent_sdk.errors import ContractRevertError
from test_escrow import ETH, KEYS, TEST_ARTIFACTS, ConsentingEscrow, _gas_cost, advance_time, worker_account

SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


@dataclass
class Rig:
    chain: DevChain
    escrow: ConsentingEscrow
    coordinator_key: LocalAccount
    coordinator: TransactionSender
    relayer: TransactionSender  # a stranger that submits receipts for workers
    workers: list[str]
    chain_id: int
    start: int  # the coordinator's balance before its first training
    gas: int = 0  # what the coordinator spent on gas since
    deposited: int = 0
    trainings: tuple[bytes, ...] = ()

    def receipt(self, key: bytes, worker: str, round: int, cumulative: int, *,
                signer: LocalAccount | None = None, chain_id: int | None = None, escrow: str | None = None) -> bytes:
        """A receipt signed by the coordinator unless told otherwise (another signer, chain or escrow)."""
        return sign_receipt(signer or self.coordinator_key, self.chain_id if chain_id is None else chain_id,
                            escrow or self.escrow.address, key, worker, round, cumulative)

    async def open(self, name: str, amounts: Sequence[int]) -> bytes:
        key = key_of(self.coordinator.address, training_salt(name))
        receipt = await self.escrow.open(self.coordinator, training_salt(name), self.workers[: len(amounts)], amounts)
        self.gas += _gas_cost(receipt)
        self.deposited += sum(amounts)
        self.trainings += (key,)
        return key

    async def by_coordinator(self, call: str, *args: object) -> None:
        receipt = await getattr(self.escrow, call)(self.coordinator, *args)
        self.gas += _gas_cost(receipt)

    async def redeem(self, key: bytes, worker: str, round: int, cumulative: int, signature: bytes) -> None:
        await self.escrow.redeem(self.relayer, key, worker, round, cumulative, signature)

    async def reverts(self, reason: str, key: bytes, worker: str, round: int, cumulative: int,
                      signature: bytes) -> None:
        with pytest.raises(ContractRevertError) as info:
            await self.redeem(key, worker, round, cumulative, signature)
        assert info.value.reason == reason

    async def assert_books(self) -> None:
        """Not a wei made or lost: escrow = held + owed, workers = paid, coordinator = start - deposit + refunds."""
        held = paid = refunded = 0
        for key in self.trainings:
            state = await self.escrow.training(key)
            amount, _ = await self.escrow.held(key)
            assert state.deposited == state.paid + state.refunded + amount
            held, paid, refunded = held + amount, paid + state.paid, refunded + state.refunded
        owed = sum([await self.escrow.owed(w) for w in self.workers])
        assert await self.chain.balance(self.escrow.address) == held + owed
        assert sum([await self.chain.balance(w) for w in self.workers]) + owed == paid
        assert await self.chain.balance(self.coordinator.address) == self.start - self.deposited - self.gas + refunded


@pytest.fixture
async def rig() -> Rig:
    chain = await start_embedded_chain()
    coordinator_key: LocalAccount = Account.create()
    await chain.fund(coordinator_key.address, 100 * ETH)
    coordinator = TransactionSender(chain.w3, coordinator_key)
    relayer_key: LocalAccount = Account.create()
    await chain.fund(relayer_key.address, ETH)
    escrow = ConsentingEscrow(chain.w3, await deploy(coordinator, load_artifact("TrainingEscrow")))
    workers = [worker_account().address for _ in range(3)]
    return Rig(chain, escrow, coordinator_key, coordinator, TransactionSender(chain.w3, relayer_key), workers,
               await escrow.chain_id(), await chain.balance(coordinator.address))


async def test_a_redeemed_receipt_pays_the_worker_what_was_not_released_once(rig: Rig) -> None:
    w0, w1, _ = rig.workers
    key = await rig.open("redeem", [3 * ETH, 3 * ETH])
    # The SDK's digest is the contract's, and the signer recovers from it.
    assert receipt_digest(rig.chain_id, rig.escrow.address, key, w0, 3, 2 * ETH) == bytes(
        await rig.escrow._call("receiptDigest", key, w0, 3, 2 * ETH))
    signature = rig.receipt(key, w0, 3, 5 * ETH // 2)
    assert receipt_signer(rig.chain_id, rig.escrow.address, key, w0, 3, 5 * ETH // 2, signature) == (
        rig.coordinator.address)

    await rig.by_coordinator("release", key, [w0], [ETH], [result_hash("round-1")])
    await rig.redeem(key, w0, 3, 5 * ETH // 2, signature)
    assert await rig.chain.balance(w0) == 5 * ETH // 2  # the receipt's total: 1 released + 1.5 redeemed
    assert await rig.escrow.slot(key, w0) == (3 * ETH, 5 * ETH // 2)
    assert (await rig.escrow.training(key)).paid == 5 * ETH // 2
    redeemed = [e.args for e in await rig.escrow.events(key) if e.name == "Redeemed"]
    assert redeemed == [{"trainingId": key, "worker": w0, "round": 3, "amount": 3 * ETH // 2}]
    await rig.assert_books()

    # The same receipt again, or an older (smaller) one, has nothing left to pay.
    await rig.reverts("NothingToRedeem", key, w0, 3, 5 * ETH // 2, signature)
    await rig.reverts("NothingToRedeem", key, w0, 2, 2 * ETH, rig.receipt(key, w0, 2, 2 * ETH))
    # A release after the redemption cannot pay the redeemed wei again: only the slot's rest is left.
    with pytest.raises(ContractRevertError) as info:
        await rig.by_coordinator("release", key, [w0], [ETH // 2 + 1], [result_hash("round-3")])
    assert info.value.reason == "OverRelease" and f"remaining={ETH // 2}" in str(info.value)
    # And a receipt whose total was already released pays nothing more either.
    await rig.by_coordinator("release", key, [w1], [2 * ETH], [result_hash("w1")])
    await rig.reverts("NothingToRedeem", key, w1, 2, 2 * ETH, rig.receipt(key, w1, 2, 2 * ETH))
    assert [await rig.chain.balance(w) for w in (w0, w1)] == [5 * ETH // 2, 2 * ETH]
    await rig.assert_books()


async def test_a_receipt_is_good_only_for_its_training_worker_round_amount_chain_and_escrow(rig: Rig) -> None:
    w0, w1, w2 = rig.workers
    key = await rig.open("bound", [2 * ETH, 2 * ETH])
    other = await rig.open("other", [2 * ETH, 2 * ETH])
    stranger: LocalAccount = Account.create()
    worker_key = KEYS[w0]  # a worker signing its own receipt is a stranger too
    signature = rig.receipt(key, w0, 2, ETH)
    high_s = bytearray(signature)  # the same signature in its malleable (high s) form
    s = int.from_bytes(signature[32:64], "big")
    high_s[32:64] = (SECP256K1_ORDER - s).to_bytes(32, "big")
    high_s[64] = 55 - signature[64]  # flips 27 <-> 28
    forged = {
        "another training": (other, w0, 2, ETH, signature),
        "another worker": (key, w1, 2, ETH, signature),
        "another round": (key, w0, 3, ETH, signature),
        "another amount": (key, w0, 2, ETH + 1, signature),
        "another chain": (key, w0, 2, ETH, rig.receipt(key, w0, 2, ETH, chain_id=rig.chain_id + 1)),
        "another escrow": (key, w0, 2, ETH, rig.receipt(key, w0, 2, ETH, escrow=rig.relayer.address)),
        "not the coordinator": (key, w0, 2, ETH, rig.receipt(key, w0, 2, ETH, signer=stranger)),
        "the worker itself": (key, w0, 2, ETH, rig.receipt(key, w0, 2, ETH, signer=worker_key)),
        "a malleated signature": (key, w0, 2, ETH, bytes(high_s)),
        "no signature": (key, w0, 2, ETH, b""),
    }
    for what, args in forged.items():
        with pytest.raises(ContractRevertError) as info:
            await rig.redeem(*args)
        assert info.value.reason == "InvalidSignature", what
    # More than the slot holds, even signed by the coordinator; a worker without a slot; no training.
    await rig.reverts("OverRelease", key, w0, 2, 2 * ETH + 1, rig.receipt(key, w0, 2, 2 * ETH + 1))
    await rig.reverts("NotAWorker", key, w2, 2, ETH, rig.receipt(key, w2, 2, ETH))
    unknown = key_of(rig.coordinator.address, training_salt("never-opened"))
    await rig.reverts("UnknownTraining", unknown, w0, 2, ETH, rig.receipt(unknown, w0, 2, ETH))
    assert [await rig.chain.balance(w) for w in rig.workers] == [0, 0, 0]
    await rig.assert_books()

    # The control: the genuine receipt pays, and a replaced worker's receipts die with its slot.
    await rig.redeem(key, w0, 2, ETH, signature)
    assert await rig.chain.balance(w0) == ETH
    await rig.by_coordinator("replace_worker", other, w1, w2)
    await rig.reverts("NotAWorker", other, w1, 1, ETH, rig.receipt(other, w1, 1, ETH))
    await rig.assert_books()


async def test_a_redemption_before_the_refund_is_kept_and_the_rest_is_held(rig: Rig) -> None:
    w0, w1, w2 = rig.workers
    key = await rig.open("redeem-then-refund", [2 * ETH, 3 * ETH, ETH])
    await rig.by_coordinator("release", key, [w2], [ETH], [result_hash("w2")])
    await rig.redeem(key, w0, 1, ETH, rig.receipt(key, w0, 1, ETH))
    await rig.by_coordinator("drop_worker", key, w1)  # never accepted: nothing can be claimed for it

    await rig.by_coordinator("refund", key)
    closed_at = int((await rig.chain.w3.eth.get_block("latest"))["timestamp"])
    state = await rig.escrow.training(key)
    # Back at once: w1's dropped 3 ETH; held: what w0's active slot could still claim.
    assert (state.closed, state.paid, state.refunded) == (True, 2 * ETH, 3 * ETH)
    assert await rig.escrow.held(key) == (ETH, closed_at + CLAIM_WINDOW_S)
    assert [e.args["amount"] for e in await rig.escrow.events(key) if e.name == "Refunded"] == [3 * ETH]
    await rig.assert_books()

    # A later receipt for w0 is still good inside the window, up to its slot.
    await rig.redeem(key, w0, 2, 2 * ETH, rig.receipt(key, w0, 2, 2 * ETH))
    assert [await rig.chain.balance(w) for w in rig.workers] == [2 * ETH, 0, ETH]
    assert (await rig.escrow.held(key)).amount == 0
    await rig.assert_books()
    await advance_time(rig.chain, CLAIM_WINDOW_S)
    with pytest.raises(ContractRevertError) as info:  # receipts took everything held
        await rig.escrow.reclaim(rig.relayer, key)
    assert info.value.reason == "NothingHeld"


async def test_a_refund_first_leaves_every_receipt_redeemable_for_the_claim_window(rig: Rig) -> None:
    w0, w1, w2 = rig.workers
    key = await rig.open("refund-then-redeem", [2 * ETH, 2 * ETH, 2 * ETH])
    receipts = {w0: rig.receipt(key, w0, 4, 2 * ETH), w1: rig.receipt(key, w1, 1, ETH // 2)}
    await rig.by_coordinator("release", key, [w2], [ETH // 2], [result_hash("w2")])
    with pytest.raises(ContractRevertError) as info:  # nothing to reclaim while the training is open
        await rig.escrow.reclaim(rig.relayer, key)
    assert info.value.reason == "TrainingOpen"
    assert await rig.escrow.held(key) == (ETH * 11 // 2, 0)

    await rig.by_coordinator("refund", key)  # the customer quits before paying w0 and w1
    until = int((await rig.chain.w3.eth.get_block("latest"))["timestamp"]) + CLAIM_WINDOW_S
    state = await rig.escrow.training(key)
    assert (state.paid, state.refunded) == (ETH // 2, 0)  # every unpaid wei is in an active slot
    assert await rig.escrow.held(key) == (ETH * 11 // 2, until)
    await rig.assert_books()

    await rig.redeem(key, w0, 4, 2 * ETH, receipts[w0])
    with pytest.raises(ContractRevertError) as info:
        await rig.escrow.reclaim(rig.relayer, key)
    assert info.value.reason == "ClaimWindowOpen" and f"claimableUntil={until}" in str(info.value)
    assert [await rig.chain.balance(w) for w in rig.workers] == [2 * ETH, 0, ETH // 2]
    await rig.assert_books()

    await advance_time(rig.chain, CLAIM_WINDOW_S)
    await rig.reverts("ClaimWindowOver", key, w1, 1, ETH // 2, receipts[w1])
    before = await rig.chain.balance(rig.coordinator.address)
    await rig.escrow.reclaim(rig.relayer, key)  # anyone may; the money goes to the depositor
    assert await rig.chain.balance(rig.coordinator.address) == before + ETH * 7 // 2
    state = await rig.escrow.training(key)
    assert (state.paid, state.refunded) == (ETH * 5 // 2, ETH * 7 // 2)
    assert await rig.escrow.held(key) == (0, until)
    reclaimed = [e.args for e in await rig.escrow.events(key) if e.name == "Reclaimed"]
    assert reclaimed == [{"trainingId": key, "to": rig.coordinator.address, "amount": ETH * 7 // 2}]
    with pytest.raises(ContractRevertError) as info:
        await rig.escrow.reclaim(rig.relayer, key)
    assert info.value.reason == "NothingHeld"
    await rig.assert_books()


async def test_a_refund_by_a_stranger_after_the_grace_period_holds_the_claims_too(rig: Rig) -> None:
    """The customer vanished (Ctrl-C): after deadline + grace anyone closes, and receipts still pay."""
    w0 = rig.workers[0]
    key = await rig.open("vanished", [2 * ETH])
    grace = int(await rig.escrow._call("GRACE_PERIOD"))
    deadline = (await rig.escrow.training(key)).deadline
    now = int((await rig.chain.w3.eth.get_block("latest"))["timestamp"])
    await advance_time(rig.chain, deadline - now + grace + 1)
    await rig.escrow.refund(rig.relayer, key)
    assert (await rig.escrow.training(key)).refunded == 0
    await rig.redeem(key, w0, 7, 3 * ETH // 2, rig.receipt(key, w0, 7, 3 * ETH // 2))
    assert await rig.chain.balance(w0) == 3 * ETH // 2
    await rig.assert_books()


async def test_a_contract_coordinator_approves_receipts_through_eip1271_and_a_reentrant_worker_is_paid_once(
        rig: Rig) -> None:
    """The test wallet (ReentrantAttacker) approves any signature as coordinator, and re-enters on payment."""
    artifact = ContractArtifact.from_file(TEST_ARTIFACTS / "ReentrantAttacker.json")
    wallet = rig.chain.w3.eth.contract(address=await deploy(rig.coordinator, artifact), abi=artifact.abi)
    worker = rig.chain.w3.eth.contract(address=await deploy(rig.coordinator, artifact), abi=artifact.abi)

    async def call(contract: Any, fn: str, *args: Any, value: int = 0) -> None:
        tx = {"to": contract.address, "data": contract.encode_abi(fn, args=list(args)), "value": value}
        await rig.relayer.send(tx, abi=[*artifact.abi, *rig.escrow.abi])  # type: ignore[typeddict-item]

    salt = training_salt("contract-coordinator")
    key = key_of(wallet.address, salt)
    deadline = int((await rig.chain.w3.eth.get_block("latest"))["timestamp"]) + 3600
    await rig.chain.fund(rig.relayer.address, 3 * ETH)
    opening = rig.escrow.build("open", salt, ETH_TOKEN, [worker.address], [2 * ETH], [b"\x01"], deadline)["data"]
    await call(wallet, "exec", rig.escrow.address, opening, value=2 * ETH)

    # The worker re-enters redeem with the same receipt when it is paid: the lock refuses it.
    redeem = rig.escrow.build("redeem", key, worker.address, 1, ETH, b"any bytes the wallet approves")["data"]
    await call(worker, "arm", rig.escrow.address, redeem)
    await rig.escrow.redeem(rig.relayer, key, worker.address, 1, ETH, b"any bytes the wallet approves")
    if await rig.escrow.owed(worker.address):  # its hook ran out of the push's gas cap: pull
        await call(worker, "exec", rig.escrow.address, rig.escrow.build("withdraw", ETH_TOKEN)["data"])
    assert await worker.functions.successes().call() == 0
    assert await rig.chain.balance(worker.address) == ETH
    assert await rig.escrow.slot(key, worker.address) == (2 * ETH, ETH)
    # Whatever the wallet approves, a receipt still pays only what the slot was not paid yet.
    await rig.reverts("NothingToRedeem", key, worker.address, 1, ETH, b"any bytes the wallet approves")
    await rig.reverts("OverRelease", key, worker.address, 2, 2 * ETH + 1, b"any bytes the wallet approves")
