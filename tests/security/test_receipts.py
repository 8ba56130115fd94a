"""Attack: accepted work never paid. Only the coordinator could release payment, so a customer who
interrupted ``run`` (or simply never released) refunded the whole escrow and its providers were never
paid for accepted rounds. Now the coordinator signs a cumulative receipt for every accepted round, the
provider keeps the newest valid one (on disk too, so a restart keeps it) and redeems it from the escrow
itself once the training is closed (a refund holds what active slots can still claim for the claim window),
refunding a training left open past its deadline and grace period first; and a coordinator that sends
no receipts gets at most ``max_unreceipted_rounds`` rounds of work.

The provider is the daemon's ProviderAgent on mosquitto, js-ipfs and anvil (tests/security/provider_rig.py);
the attacker plays the coordinator.
"""

from __future__ import annotations

import time

from aitbc_cli import provider as provider_cli
from eth_account import Account
from typer.testing import CliRunner
from web3 import AsyncWeb3
from web3.types import RPCEndpoint

from aitbc_agent_sdk.chain import TransactionSender
from aitbc_agent_sdk.chain._deployment import fund_accounts
from aitbc_agent_sdk.chain._escrow import (EscrowClient, EscrowState, HeldFunds, SlotState, sign_receipt,
                                          training_key)
from aitbc_agent_sdk.chain._registry import EvidenceDomain
from aitbc_agent_sdk.coordinator._logbook import AuditLogs
from aitbc_agent_sdk.coordinator.money._receipts import ReceiptIssuer, receipt_terms
from aitbc_agent_sdk.coordinator.money._settlement import EscrowAccount, plan_payouts
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.messaging import Verified, topics
from aitbc_agent_sdk.records import CheckpointRef, JobAssignment, PaymentReceipt, WorkerContract
from aitbc_agent_sdk.flow._provider_daemon import build_parser
from aitbc_agent_sdk.provider._onchain import GRACE_PERIOD_S, ProviderChain, SlotView
from aitbc_agent_sdk.provider._receipts import (
    MAX_RECEIPTS_FILE_BYTES, RECEIPTS_FILE, ProviderReceipts, ReceiptBook, ReceiptFile, SavedReceipt, redeem_due,
    redemption_verdict, restore_receipts, unreceipted_refusal, unreceipted_rounds,
)

from tests.security.provider_rig import PRICE, TRAINING, WAIT_S, Rig, Servers, provider_rig, servers  # noqa: F401 (servers: a fixture)

WORKER = "0x" + "11" * 20
COORDINATOR = "0x" + "22" * 20
CID = "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG"


# -- the pure rules ------------------------------------------------------------------------------

def test_unreceipted_rounds_are_the_delivered_rounds_the_newest_receipt_does_not_pay_for():
    assert unreceipted_rounds(0, 0, PRICE) == 0
    assert unreceipted_rounds(3, 0, PRICE) == 3
    assert unreceipted_rounds(3, 2 * PRICE, PRICE) == 1
    assert unreceipted_rounds(3, 2 * PRICE - 1, PRICE) == 2  # a round paid in part is not paid
    assert unreceipted_rounds(2, 5 * PRICE, PRICE) == 0
    assert unreceipted_rounds(3, 0, 0) == 0  # a provider working for free waits for nothing


def test_a_provider_stops_at_its_limit_and_a_limit_of_zero_never_stops_it():
    assert unreceipted_refusal(1, 2) is None
    assert "2 delivered rounds have no payment receipt" in unreceipted_refusal(2, 2)
    assert unreceipted_refusal(1000, 0) is None


def _receipt(cumulative: int, round: int = 1) -> PaymentReceipt:
    return PaymentReceipt(training_id=TRAINING, worker_id=WORKER, round=round, cumulative_wei=cumulative,
                          signature="0x" + "ab" * 65)


def _view(*, paid: int = 0, amount: int = 5 * PRICE, closed: bool = False, deadline: int = 2000, now: int = 1000,
          claimable_until: int = 0) -> SlotView:
    state = EscrowState(COORDINATOR, 5 * PRICE, paid, 0, closed, deadline=deadline)
    return SlotView(state, SlotState(amount, paid), HeldFunds(5 * PRICE - paid, claimable_until), now)


def test_a_receipt_is_redeemed_only_once_the_training_is_closed_so_no_release_can_pay_it_again():
    receipt = _receipt(2 * PRICE)
    assert redemption_verdict(receipt, _view()) == "wait"  # open, within its deadline
    assert redemption_verdict(receipt, _view(now=2000)) == "wait"  # past its deadline: the coordinator may still pay
    assert redemption_verdict(receipt, _view(now=2000 + GRACE_PERIOD_S - 1)) == "wait"
    assert redemption_verdict(receipt, _view(now=2000 + GRACE_PERIOD_S)) == "refund"  # anyone may close it now
    assert redemption_verdict(receipt, _view(closed=True, claimable_until=1001)) == "redeem"
    assert redemption_verdict(receipt, _view(closed=True, claimable_until=1000)) == "settled"  # window over
    assert redemption_verdict(receipt, _view(paid=2 * PRICE, now=10**9)) == "settled"  # paid already
    assert redemption_verdict(receipt, _view(amount=PRICE, closed=True, claimable_until=1001)) == "settled"  # over the slot


async def test_the_book_keeps_the_newest_receipt_of_slots_it_delivered_in_and_stays_bounded():
    book = ReceiptBook(max_slots=2)
    key = (b"\x01" * 32, WORKER)
    assert not await book.keep(key, _receipt(PRICE))  # no round delivered there: a stranger's receipt
    book.delivered(key, TRAINING, COORDINATOR, 1, PRICE)
    book.delivered(key, TRAINING, COORDINATOR, 2, PRICE)
    book.delivered(key, TRAINING, COORDINATOR, 2, PRICE)  # a re-sent result is one round
    assert book.unreceipted(key) == 2
    assert await book.keep(key, _receipt(PRICE, round=1))
    assert book.unreceipted(key) == 1
    # A receipt naming a later round without owing more buys no work; neither does an older one.
    assert not await book.keep(key, _receipt(PRICE, round=1000))
    assert not await book.keep(key, _receipt(PRICE // 2, round=2))
    assert book.unreceipted(key) == 1
    assert await book.keep(key, _receipt(2 * PRICE, round=2))
    assert book.unreceipted(key) == 0
    for n in range(2, 5):  # more slots than the bound: the slot with a receipt to redeem stays
        book.delivered((bytes([n]) * 32, WORKER), TRAINING, COORDINATOR, 1, PRICE)
    assert book.entry(key) is not None and len(book.unredeemed()) == 1
    assert book.entry((bytes([4]) * 32, WORKER)) is not None  # the newest slot too


ESCROW = "0x" + "33" * 20
CHAIN_ID = 31337


def _saved(signer: Account, cumulative: int, *, worker: str = WORKER) -> SavedReceipt:
    signature = sign_receipt(signer, CHAIN_ID, ESCROW, training_key(signer.address, TRAINING), worker, 1, cumulative)
    return SavedReceipt(coordinator=signer.address, price_wei=PRICE, receipt=PaymentReceipt(
        training_id=TRAINING, worker_id=worker, round=1, cumulative_wei=cumulative, signature="0x" + signature.hex()))


def test_saved_receipts_are_checked_again_when_read_back_and_only_valid_ones_kept(tmp_path):
    coordinator = Account.create()
    chain = ProviderChain(EscrowClient(AsyncWeb3(), ESCROW), EvidenceDomain(CHAIN_ID, "0x" + "44" * 20))
    valid = _saved(coordinator, PRICE)
    raised = valid.model_copy(update={"receipt": valid.receipt.model_copy(update={"cumulative_wei": 5 * PRICE})})
    other_worker = _saved(coordinator, PRICE, worker="0x" + "55" * 20)
    file = ReceiptFile(tmp_path / "receipts.json")
    file.save([raised, other_worker, valid])
    book = ReceiptBook()
    assert restore_receipts(book, chain, WORKER, file.load()) == 1
    entry = book.entry((training_key(coordinator.address, TRAINING), WORKER))
    assert entry is not None and entry.receipt == valid.receipt and entry.coordinator == coordinator.address
    assert book.saved() == [valid]  # still to redeem: written again on the next save


def test_an_unreadable_receipts_file_reads_as_empty(tmp_path):
    file = ReceiptFile(tmp_path / "receipts.json")
    assert file.load() == []  # none yet
    file.path.write_text('{"receipts": [{"coordinator": "nope"}]}')
    assert file.load() == []
    file.path.write_bytes(b" " * (MAX_RECEIPTS_FILE_BYTES + 1))
    assert file.load() == []


def test_the_limit_is_a_flag_of_the_provider_daemon_and_of_aitbc_provider_start():
    args = ["--wallet", "w", "--price-wei", "1"]
    assert build_parser().parse_args(args).max_unreceipted_rounds is None  # ProviderConfig's default
    assert build_parser().parse_args([*args, "--max-unreceipted-rounds", "0"]).max_unreceipted_rounds == 0
    runner = CliRunner()
    shown = runner.invoke(provider_cli.app, ["start", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "--max-unreceipted-rounds" in shown.output
    refused = runner.invoke(provider_cli.app, ["start", "--wallet", "w", "--price", "1", "--max-unreceipted-rounds",
                                               "1001"], env={"COLUMNS": "200"})  # over ProviderConfig's bound
    assert refused.exit_code == 2 and "Invalid value for '--max-unreceipted-rounds'" in refused.output


def test_receipt_terms_are_cumulative_and_capped_at_the_slot():
    contract = WorkerContract(contract_id="c1", training_id=TRAINING, worker_id=WORKER, coordinator=COORDINATOR,
                              price_wei=PRICE, rounds=5, accepted_at=0.0)
    accepted = [_checkpoint(WORKER, r) for r in (1, 2, 2, 3)]
    assert receipt_terms(contract, [], 5 * PRICE) is None
    assert receipt_terms(contract, accepted, 5 * PRICE) == (3, 3 * PRICE)
    assert receipt_terms(contract, accepted, 2 * PRICE) == (3, 2 * PRICE)


def _checkpoint(worker: str, round: int, cid: str = CID) -> CheckpointRef:
    return CheckpointRef(checkpoint_id=cid, cid=cid, job_id=f"job_{round}", worker_id=worker, training_id=TRAINING,
                         round=round, samples=64, loss=1.0)


# -- on the devnet ---------------------------------------------------------------------------------

async def _deliver(rig: Rig, contract_id: str, round: int) -> tuple[JobAssignment, str]:
    """A job of ``round`` sent to the provider; returns it and the CID of its result."""
    job = (await rig.job(contract_id)).model_copy(update={"round": round})
    await rig.send(topics.jobs(rig.provider.address), job)
    result = await rig.feeds["results"].first(lambda v: v.message.job_id == job.job_id)
    return job, result.message.checkpoint_cid


def _signed(rig: Rig, key: bytes, round: int, cumulative: int, *, signer: Account | None = None) -> PaymentReceipt:
    assert rig.provider.chain is not None
    signature = sign_receipt(signer or rig.sender.account, rig.provider.chain.domain.chain_id, rig.escrow.address,
                             key, rig.provider.address, round, cumulative)
    return PaymentReceipt(training_id=TRAINING, worker_id=rig.provider.address, round=round, cumulative_wei=cumulative,
                          signature="0x" + signature.hex())


async def _fund_provider_gas(parts: Servers, rig: Rig) -> None:
    """A provider pays gas to redeem: a real one holds a bond, so it has ETH."""
    await fund_accounts(TransactionSender(parts.w3, parts.funder), [rig.provider.address], 10**17)


async def test_a_coordinator_that_refunds_without_paying_still_pays_what_it_signed(servers, tmp_path):
    async with provider_rig(servers, offer_refresh_s=0.5) as rig:
        await _fund_provider_gas(servers, rig)
        contract_id = await rig.hire()
        job, cid = await _deliver(rig, contract_id, round=1)

        # The coordinator's own issuer accepts round 1 and sends its receipt.
        async with TrainingDatabase(tmp_path / "coordinator.db") as db:
            contract = WorkerContract(contract_id=contract_id, training_id=TRAINING, worker_id=rig.provider.address,
                                      coordinator=rig.attacker.address, price_wei=PRICE, rounds=5,
                                      accepted_at=time.time())
            await db.save_contract(contract)
            await db.save_checkpoint(_checkpoint(rig.provider.address, 1, cid).model_copy(
                update={"job_id": job.job_id}), "accepted")
            coordinator = EscrowAccount(rig.sender, rig.escrow)
            issued = await ReceiptIssuer(rig.attacker, db, coordinator, AuditLogs(None)).issue(
                TRAINING, [rig.provider.address])
            assert [(r.round, r.cumulative_wei) for r in issued] == [(1, PRICE)]
            key = training_key(rig.attacker.address, TRAINING)
            slot = (key, rig.provider.address)
            await rig.provider.receipts.book.wait_for(slot, cumulative_wei=PRICE, timeout=WAIT_S)
            # While the training is open its coordinator may still release: the provider leaves it alone.
            assert rig.provider.chain is not None
            assert await redeem_due(rig.provider.receipts.book, rig.provider.chain, rig.provider.account) == []

            # Ctrl-C: the coordinator refunds and releases nothing. The slot's unpaid part is held.
            before = await servers.w3.eth.get_balance(rig.provider.address)
            await rig.escrow.refund(rig.sender, key)
            await rig.provider.receipts.book.wait_for(slot, settled_wei=PRICE, timeout=WAIT_S)

            state, held = await rig.escrow.training(key), await rig.escrow.held(key)
            assert (await rig.escrow.slot(key, rig.provider.address)).paid == PRICE
            assert state.deposited == state.paid + state.refunded + held.amount == 5 * PRICE
            assert await servers.w3.eth.get_balance(rig.escrow.address) == held.amount
            redeemed = await rig.escrow.events(key, names=("Redeemed",))
            assert [(e.args["worker"], e.args["amount"]) for e in redeemed] == [(rig.provider.address, PRICE)]
            tx = await servers.w3.eth.get_transaction_receipt(redeemed[0].tx_hash)
            gas = tx["gasUsed"] * tx["effectiveGasPrice"]
            assert await servers.w3.eth.get_balance(rig.provider.address) == before + PRICE - gas

            # Settlement reads what the chain paid: nothing is owed twice.
            paid = await coordinator.paid_on_chain(TRAINING, [rig.provider.address])
            assert plan_payouts([contract], await db.checkpoints(TRAINING), paid) == []


async def test_a_coordinator_that_sends_no_receipts_gets_no_more_rounds(servers):
    async with provider_rig(servers, max_unreceipted_rounds=1) as rig:
        contract_id = await rig.hire()
        await _deliver(rig, contract_id, round=1)

        second = (await rig.job(contract_id)).model_copy(update={"round": 2})
        await rig.send(topics.jobs(rig.provider.address), second)
        failed = await rig.feeds["progress"].first(
            lambda v: v.message.job_id == second.job_id and v.message.status == "failed")
        assert failed.sender == rig.provider.address  # signed by the provider
        assert failed.message.error.startswith("refused: 1 delivered rounds have no payment receipt")
        assert not [v for v in rig.feeds["results"].items if v.message.job_id == second.job_id]

        # A receipt for round 1 and the next round's job is worked again.
        key = training_key(rig.attacker.address, TRAINING)
        await rig.send(topics.receipts(rig.provider.address), _signed(rig, key, 1, PRICE))
        await rig.provider.receipts.book.wait_for((key, rig.provider.address), cumulative_wei=PRICE, timeout=WAIT_S)
        third = (await rig.job(contract_id)).model_copy(update={"round": 2})
        await rig.send(topics.jobs(rig.provider.address), third)
        await rig.feeds["results"].first(lambda v: v.message.job_id == third.job_id)


async def test_a_forged_receipt_is_ignored_and_never_redeemed(servers):
    async with provider_rig(servers, offer_refresh_s=0.5) as rig:
        await _fund_provider_gas(servers, rig)
        contract_id = await rig.hire()
        await _deliver(rig, contract_id, round=1)
        key = training_key(rig.attacker.address, TRAINING)
        slot = (key, rig.provider.address)

        everything = 5 * PRICE
        stranger = _signed(rig, key, 1, everything, signer=Account.create())
        other_training = _signed(rig, training_key(rig.attacker.address, "training_another0000000000"), 1, everything)
        for forged in (stranger, other_training):
            await rig.send(topics.receipts(rig.provider.address), forged)
        await rig.send(topics.receipts(rig.provider.address), _signed(rig, key, 1, PRICE))

        entry = await rig.provider.receipts.book.wait_for(slot, cumulative_wei=PRICE, timeout=WAIT_S)
        assert entry.receipt is not None and entry.receipt.cumulative_wei == PRICE
        assert rig.provider.dropped["receipts: not signed by the training's coordinator"] == 2

        await rig.escrow.refund(rig.sender, key)
        await rig.provider.receipts.book.wait_for(slot, settled_wei=PRICE, timeout=WAIT_S)
        assert (await rig.escrow.slot(key, rig.provider.address)).paid == PRICE
        state, held = await rig.escrow.training(key), await rig.escrow.held(key)
        assert held.amount == everything - PRICE and state.deposited == state.paid + state.refunded + held.amount


async def _chain_time(w3: AsyncWeb3, timestamp: int) -> None:
    """The next block is mined at ``timestamp`` (the session's anvil: every later block follows it)."""
    await w3.provider.make_request(RPCEndpoint("evm_setNextBlockTimestamp"), [timestamp])
    await w3.provider.make_request(RPCEndpoint("evm_mine"), [])


async def test_a_restarted_provider_refunds_a_training_left_open_past_its_grace_period_and_redeems(servers, tmp_path):
    async with provider_rig(servers) as rig:
        await _fund_provider_gas(servers, rig)
        contract_id = await rig.hire()
        await _deliver(rig, contract_id, round=1)
        chain, account = rig.provider.chain, rig.provider.account
        assert chain is not None
        key = training_key(rig.attacker.address, TRAINING)
        slot = (key, account.address)

        # The provider's receipts in its directory: it keeps the coordinator's receipt for round 1, then stops.
        first = ProviderReceipts(chain, account, 2, work_dir=tmp_path)
        first.delivered(key, TRAINING, rig.attacker.address, 1, PRICE)
        receipt = _signed(rig, key, 1, PRICE)
        assert await first.take(Verified(rig.attacker.address, topics.receipts(account.address), receipt,
                                         time.time())) is None
        del first

        # Restarted after the coordinator vanished: the receipt is read back (and checked again).
        restarted = ProviderReceipts(chain, account, 2, work_dir=tmp_path)
        entry = restarted.book.entry(slot)
        assert entry is not None and entry.receipt == receipt

        # Past the deadline the coordinator may still be paying, so a redemption could pay twice: none.
        deadline = (await rig.escrow.training(key)).deadline
        await _chain_time(servers.w3, deadline)
        assert await redeem_due(restarted.book, chain, account) == []
        # Past the grace period the provider closes the training itself, then redeems from the held slot.
        await _chain_time(servers.w3, deadline + GRACE_PERIOD_S)
        await restarted.redeem()
        state, held = await rig.escrow.training(key), await rig.escrow.held(key)
        assert state.closed and (await rig.escrow.slot(key, account.address)).paid == PRICE
        refunded = await rig.escrow.events(key, names=("Refunded",))
        assert [(await servers.w3.eth.get_transaction(e.tx_hash))["from"] for e in refunded] == [account.address]
        assert state.deposited == state.paid + state.refunded + held.amount == 5 * PRICE
        assert ReceiptFile(tmp_path / RECEIPTS_FILE).load() == []  # redeemed: nothing left to keep
