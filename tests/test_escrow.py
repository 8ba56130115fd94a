"""TrainingEscrow through the SDK's async chain client, on the embedded py-evm chain and on anvil."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3.providers.eth_tester import AsyncEthereumTesterProvider
from web3.types import RPCEndpoint

from aitbc_agent_sdk.chain import (
    ContractArtifact,
    DevChain,
    EscrowClient,
    RegistryClient,
    TransactionSender,
    connect_rpc,
    deploy,
    ETH_TOKEN,
    load_artifact,
    result_hash,
    sign_consent,
    sign_receipt,
    start_embedded_chain,
    training_salt,
)
from aitbc_agent_sdk.chain._escrow import key_of
from aitbc_agent_sdk.errors import ChainError, ContractRevertError, InsufficientFundsError

ETH = 10**18
TEST_ARTIFACTS = Path(__file__).parent / "artifacts"


# Test workers that sign their consent to a slot; any other worker is a contract wallet whose
# EIP-1271 hook (RevertingReceiver, ReentrantAttacker) approves any signature.
KEYS: dict[str, LocalAccount] = {}


def worker_account() -> LocalAccount:
    account: LocalAccount = Account.create()
    KEYS[account.address] = account
    return account


class ConsentingEscrow(EscrowClient):
    """The escrow client with each worker's real consent filled in, so tests read like the old API."""

    async def consent(self, tid: bytes, worker: str) -> bytes:
        account = KEYS.get(worker)
        if account is None:
            return b"\x01"  # a contract wallet approves through isValidSignature
        return sign_consent(account, await self.chain_id(), self.address, tid)

    async def open(self, sender: TransactionSender, salt: bytes, workers: Sequence[str],  # type: ignore[override]
                   amounts: Sequence[int], consents: Sequence[bytes] | None = None, **kwargs: Any) -> Any:
        if consents is None:
            tid = key_of(sender.address, salt)
            consents = [await self.consent(tid, w) for w in workers]
        return await super().open(sender, salt, workers, amounts, consents, **kwargs)

    async def add_worker(self, sender: TransactionSender, training_id: bytes, worker: str,  # type: ignore[override]
                         amount: int, consent: bytes | None = None, **kwargs: Any) -> Any:
        consent = await self.consent(training_id, worker) if consent is None else consent
        return await super().add_worker(sender, training_id, worker, amount, consent, **kwargs)

    async def replace_worker(self, sender: TransactionSender, training_id: bytes, old_worker: str,  # type: ignore[override]
                             new_worker: str, consent: bytes | None = None) -> Any:
        consent = await self.consent(training_id, new_worker) if consent is None else consent
        return await super().replace_worker(sender, training_id, old_worker, new_worker, consent)


def tkey(sender: TransactionSender, name: str) -> bytes:
    """The id the escrow gives ``sender``'s training ``name``."""
    return key_of(sender.address, training_salt(name))


@dataclass
class Env:
    chain: DevChain
    escrow: EscrowClient
    coordinator: TransactionSender
    workers: list[LocalAccount]
    trainings: list[bytes]  # every training opened, for the conservation check
    registry: RegistryClient


async def advance_time(chain: DevChain, seconds: int) -> None:
    """Move the chain's clock forward: the next block is at least ``seconds`` later."""
    w3 = chain.w3
    if isinstance(w3.provider, AsyncEthereumTesterProvider):
        pending = int((await w3.eth.get_block("pending"))["timestamp"])
        await w3.provider.make_request(RPCEndpoint("testing_timeTravel"), [pending + seconds])
    else:
        await w3.provider.make_request(RPCEndpoint("evm_increaseTime"), [seconds])
        await w3.provider.make_request(RPCEndpoint("evm_mine"), [])


async def _new_sender(chain: DevChain, wei: int) -> TransactionSender:
    account = worker_account()  # may be given a slot: it signs its consent
    await chain.fund(account.address, wei)
    return TransactionSender(chain.w3, account)


@pytest.fixture(params=["eth-tester", "anvil"])
def chain_url(request: pytest.FixtureRequest) -> str | None:
    """None for py-evm in-process, else a real JSON-RPC node's URL (anvil auto-mines too)."""
    if request.param == "eth-tester":
        return None
    # Resolved lazily (and from a sync fixture, outside the test's running loop), so
    # eth-tester-only runs never start anvil.
    return str(request.getfixturevalue("anvil").url)


@pytest.fixture
async def chain(chain_url: str | None) -> AsyncIterator[DevChain]:
    if chain_url is None:
        yield await start_embedded_chain()
        return
    w3 = await connect_rpc(chain_url)
    # anvil unlocks its funded dev accounts, so DevChain.fund's eth_sendTransaction works unchanged.
    accounts = tuple(w3.to_checksum_address(a) for a in await w3.eth.accounts)
    try:
        yield DevChain(w3=w3, accounts=accounts)
    finally:
        await w3.provider.disconnect()


@pytest.fixture
async def env(chain: DevChain) -> Env:
    coordinator = await _new_sender(chain, 100 * ETH)
    address = await deploy(coordinator, load_artifact("TrainingEscrow"))
    workers = [worker_account() for _ in range(4)]
    escrow = ConsentingEscrow(chain.w3, address)
    registry = RegistryClient(chain.w3, await escrow.registry())
    return Env(chain, escrow, coordinator, workers, [], registry)


async def _open(env: Env, name: str, amounts: list[int], workers: Sequence[str] | None = None) -> bytes:
    tid = tkey(env.coordinator, name)
    addrs = workers or [w.address for w in env.workers[: len(amounts)]]
    await env.escrow.open(env.coordinator, training_salt(name), addrs, amounts)
    env.trainings.append(tid)
    return tid


async def assert_conserved(env: Env, owed_accounts: tuple[str, ...] = ()) -> None:
    """Every wei deposited is paid, refunded, or still in the contract (held or owed)."""
    held = 0
    for tid in env.trainings:
        state = await env.escrow.training(tid)
        amount, _ = await env.escrow.held(tid)
        assert state.paid + state.refunded + amount == state.deposited
        held += amount
    owed = sum([await env.escrow.owed(a) for a in owed_accounts])
    assert await env.chain.balance(env.escrow.address) == held + owed


def _gas_cost(receipt: Mapping[str, Any]) -> int:
    return int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])


async def test_open_release_partial_and_full_then_refund(env: Env) -> None:
    amounts = [1 * ETH, 2 * ETH, 3 * ETH]
    tid = await _open(env, "training-1", amounts)
    w0, w1, w2 = (w.address for w in env.workers[:3])
    state = await env.escrow.training(tid)
    assert (state.coordinator, state.deposited, state.paid, state.closed, state.token) == (
        env.coordinator.address, 6 * ETH, 0, False, ETH_TOKEN,
    )
    assert state.deadline > (await env.chain.w3.eth.get_block("latest"))["timestamp"]
    assert await env.escrow.slot(tid, w1) == (2 * ETH, 0)
    await assert_conserved(env)

    h0, h1 = result_hash("bafy-cid-0"), result_hash("bafy-cid-1")
    await env.escrow.release(env.coordinator, tid, [w0, w1], [ETH * 4 // 10, 2 * ETH], [h0, h1])
    assert await env.escrow.slot(tid, w0) == (ETH, ETH * 4 // 10)
    assert await env.escrow.slot(tid, w1) == (2 * ETH, 2 * ETH)
    await assert_conserved(env)

    await env.escrow.release(env.coordinator, tid, [w0], [ETH * 6 // 10], [h0])
    assert await env.escrow.slot(tid, w0) == (ETH, ETH)
    await assert_conserved(env)

    # w2's slot is active and unpaid: a receipt could still claim it, so the refund holds it back.
    before = await env.chain.balance(env.coordinator.address)
    receipt = await env.escrow.refund(env.coordinator, tid)
    closed_at = int((await env.chain.w3.eth.get_block("latest"))["timestamp"])
    after = await env.chain.balance(env.coordinator.address)
    assert after == before - _gas_cost(receipt)
    state = await env.escrow.training(tid)
    assert (state.paid, state.refunded, state.closed, state.remaining) == (3 * ETH, 0, True, 3 * ETH)
    window = int(await env.escrow._call("CLAIM_WINDOW"))
    assert await env.escrow.held(tid) == (3 * ETH, closed_at + window)
    await assert_conserved(env)
    # Once the claim window is over, the held part goes back to the depositor.
    await advance_time(env.chain, window)
    receipt = await env.escrow.reclaim(env.coordinator, tid)
    assert await env.chain.balance(env.coordinator.address) == after - _gas_cost(receipt) + 3 * ETH
    state = await env.escrow.training(tid)
    assert (state.paid, state.refunded, state.remaining) == (3 * ETH, 3 * ETH, 0)
    await assert_conserved(env)

    # Workers held nothing before and sent nothing, so balances equal their payments exactly.
    assert [await env.chain.balance(a) for a in (w0, w1, w2)] == [ETH, 2 * ETH, 0]

    events = await env.escrow.events(tid)
    names = [e.name for e in events]
    assert names == ["SlotOpened"] * 3 + ["TrainingOpened"] + ["Released"] * 3 + ["Refunded", "Reclaimed"]
    released = [(e.args["worker"], e.args["amount"], e.args["resultHash"]) for e in events if e.name == "Released"]
    assert released == [(w0, ETH * 4 // 10, h0), (w1, 2 * ETH, h1), (w0, ETH * 6 // 10, h0)]
    assert events[-2].args == {"trainingId": tid, "to": env.coordinator.address, "amount": 0}
    assert events[-1].args == {"trainingId": tid, "to": env.coordinator.address, "amount": 3 * ETH}
    # Another training's events are not mixed in.
    await _open(env, "training-2", [ETH])
    assert len(await env.escrow.events(tid)) == len(events)


async def test_over_release_reverts_with_reason(env: Env) -> None:
    tid = await _open(env, "t", [ETH, ETH, ETH])
    w0 = env.workers[0].address
    await env.escrow.release(env.coordinator, tid, [w0], [ETH // 2], [result_hash("a")])
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.release(env.coordinator, tid, [w0], [ETH // 2 + 1], [result_hash("b")])
    assert info.value.reason == "OverRelease"
    assert f"remaining={ETH // 2}" in str(info.value)
    assert await env.escrow.slot(tid, w0) == (ETH, ETH // 2)
    await assert_conserved(env)


async def test_mined_revert_is_explained(env: Env) -> None:
    """With an explicit gas limit estimation is skipped; the failed receipt is replayed for a reason."""
    tid = await _open(env, "t", [ETH])
    tx = env.escrow.build("release", tid, [env.workers[0].address], [2 * ETH], [result_hash("x")])
    with pytest.raises(ContractRevertError) as info:
        await env.coordinator.send({**tx, "gas": 200_000}, abi=env.escrow.abi)
    assert info.value.reason == "OverRelease"
    await assert_conserved(env)


async def test_release_by_non_coordinator_reverts(env: Env) -> None:
    tid = await _open(env, "t", [ETH, ETH, ETH])
    stranger = await _new_sender(env.chain, ETH)
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.release(stranger, tid, [env.workers[0].address], [1], [result_hash("a")])
    assert info.value.reason == "NotCoordinator"
    # Before deadline + grace period only the coordinator may close the training.
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.refund(stranger, tid)
    assert info.value.reason == "RefundTooEarly"
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.replace_worker(stranger, tid, env.workers[0].address, env.workers[3].address)
    assert info.value.reason == "NotCoordinator"
    await assert_conserved(env)


async def test_double_refund_and_release_after_refund_revert(env: Env) -> None:
    tid = await _open(env, "t", [ETH, ETH, ETH])
    await env.escrow.release(env.coordinator, tid, [env.workers[0].address], [ETH], [result_hash("a")])
    await env.escrow.refund(env.coordinator, tid)
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.refund(env.coordinator, tid)
    assert info.value.reason == "TrainingClosed"
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.release(env.coordinator, tid, [env.workers[1].address], [1], [result_hash("b")])
    assert info.value.reason == "TrainingClosed"
    state = await env.escrow.training(tid)
    assert (state.paid, state.refunded) == (ETH, 0)
    assert (await env.escrow.held(tid)).amount == 2 * ETH  # w1's and w2's unpaid slots, for their receipts
    await assert_conserved(env)


async def test_open_rejects_bad_deposits_and_workers(env: Env) -> None:
    salt, tid = training_salt("t"), tkey(env.coordinator, "t")
    w = [a.address for a in env.workers[:3]]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"workers": w, "amounts": [ETH] * 3, "value": 3 * ETH - 1}, "DepositMismatch"),
        ({"workers": w, "amounts": [ETH] * 3, "value": 3 * ETH + 1}, "DepositMismatch"),
        ({"workers": [w[0], w[1], w[0]], "amounts": [ETH] * 3}, "DuplicateWorker"),
        ({"workers": w, "amounts": [ETH, 0, ETH]}, "ZeroAmount"),
        ({"workers": [], "amounts": []}, "NoWorkers"),
        ({"workers": w, "amounts": [ETH] * 3, "deadline": 1}, "DeadlineInPast"),
        ({"workers": w, "amounts": [ETH] * 3, "deadline": 2**64 - 1}, "DeadlineTooFar"),
        ({"workers": w, "amounts": [ETH] * 3, "consents": [b""] * 3}, "NoConsent"),
    ]
    for kwargs, reason in cases:
        with pytest.raises(ContractRevertError) as info:
            await env.escrow.open(env.coordinator, salt, **kwargs)
        assert info.value.reason == reason, kwargs
    assert not (await env.escrow.training(tid)).exists

    await _open(env, "t", [ETH])
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.open(env.coordinator, salt, [w[1]], [ETH])
    assert info.value.reason == "TrainingExists"
    await assert_conserved(env)


async def test_reverting_receiver_does_not_block_others_and_cannot_withdraw(env: Env) -> None:
    receiver_art = ContractArtifact.from_file(TEST_ARTIFACTS / "RevertingReceiver.json")
    receiver = await deploy(env.coordinator, receiver_art)
    w1, w2 = env.workers[0].address, env.workers[1].address
    tid = await _open(env, "t", [ETH, 2 * ETH, 3 * ETH], workers=[receiver, w1, w2])

    receipt = await env.escrow.release(
        env.coordinator, tid, [receiver, w1, w2], [ETH, 2 * ETH, ETH], [result_hash("c")] * 3
    )
    assert receipt["status"] == 1
    assert [await env.chain.balance(a) for a in (receiver, w1, w2)] == [0, 2 * ETH, ETH]
    assert await env.escrow.owed(receiver) == ETH
    deferred = [e for e in await env.escrow.events(tid) if e.name == "PaymentDeferred"]
    assert [(e.args["to"], e.args["amount"]) for e in deferred] == [(receiver, ETH)]
    await assert_conserved(env, owed_accounts=(receiver,))

    # The receiver pulls, but refuses the ETH again: the whole withdraw reverts, owed stays.
    data = env.chain.w3.eth.contract(abi=receiver_art.abi).encode_abi("pull", args=[env.escrow.address])
    with pytest.raises(ContractRevertError) as info:
        await env.coordinator.send({"to": receiver, "data": data}, abi=receiver_art.abi + env.escrow.abi)
    assert info.value.reason == "TransferFailed"
    assert await env.escrow.owed(receiver) == ETH
    assert await env.chain.balance(receiver) == 0

    # A worker with nothing owed cannot withdraw either.
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.withdraw(env.coordinator)
    assert info.value.reason == "NothingOwed"

    await env.escrow.refund(env.coordinator, tid)
    await assert_conserved(env, owed_accounts=(receiver,))


async def test_concurrent_sends_share_one_nonce_sequence(env: Env) -> None:
    names = [f"c{i}" for i in range(6)]
    tids = [tkey(env.coordinator, n) for n in names]
    worker = env.workers[0].address
    receipts = await asyncio.gather(*(env.escrow.open(env.coordinator, training_salt(n), [worker], [ETH])
                                      for n in names))
    assert all(r["status"] == 1 for r in receipts)
    env.trainings.extend(tids)
    await assert_conserved(env)


async def test_insufficient_funds(env: Env) -> None:
    poor = await _new_sender(env.chain, ETH // 100)
    with pytest.raises(InsufficientFundsError):
        await env.escrow.open(poor, training_salt("p"), [env.workers[0].address], [ETH])


async def test_dead_rpc_gives_chain_error() -> None:
    with pytest.raises(ChainError, match="unreachable"):
        await connect_rpc("http://127.0.0.1:9", timeout=1.0)


async def test_release_gas_for_four_workers(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """Measure a 4-payee release against 4 plain transfers (21000 gas each)."""
    workers = [w.address for w in env.workers]
    tid = await _open(env, "gas", [ETH] * 4, workers=workers)
    hashes = [result_hash(f"cid-{i}") for i in range(4)]
    first = await env.escrow.release(env.coordinator, tid, workers, [ETH // 2] * 4, hashes)
    second = await env.escrow.release(env.coordinator, tid, workers, [ETH // 2] * 4, hashes)
    with capsys.disabled():
        print(
            f"\nrelease(4 workers): first {first['gasUsed']} gas (fresh payees, zero slots),"
            f" second {second['gasUsed']} gas; 4 plain transfers: {4 * 21000} gas"
        )
    assert second["gasUsed"] < first["gasUsed"] < 400_000
    await assert_conserved(env)


# --- v2: double release, slot replacement, deadlines, ERC-20, reentrancy ------------------


async def test_double_release_of_a_full_slot_reverts(env: Env) -> None:
    tid = await _open(env, "double", [ETH, ETH])
    w0 = env.workers[0].address
    await env.escrow.release(env.coordinator, tid, [w0], [ETH], [result_hash("a")])
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.release(env.coordinator, tid, [w0], [ETH], [result_hash("a")])
    assert info.value.reason == "OverRelease" and "remaining=0" in str(info.value)
    # The same worker twice in one batch cannot exceed the slot either.
    w1 = env.workers[1].address
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.release(env.coordinator, tid, [w1, w1], [ETH // 2 + 1, ETH // 2], [result_hash("b")] * 2)
    assert info.value.reason == "OverRelease"
    assert await env.escrow.slot(tid, w1) == (ETH, 0)
    await assert_conserved(env)


async def test_replace_worker_moves_an_unpaid_slot_and_records_outcomes(env: Env) -> None:
    w0, w1, w2, w3 = (w.address for w in env.workers)
    tid = await _open(env, "replace", [ETH, 2 * ETH, 3 * ETH])
    assert [(await env.registry.provider(w)).assigned for w in (w0, w1, w2, w3)] == [1, 1, 1, 0]
    await env.escrow.release(env.coordinator, tid, [w0], [ETH // 2], [result_hash("r0")])

    with pytest.raises(ContractRevertError) as info:
        await env.escrow.replace_worker(env.coordinator, tid, w0, w3)
    assert info.value.reason == "SlotAlreadyPaid"
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.replace_worker(env.coordinator, tid, w3, w1)
    assert info.value.reason == "NotAWorker"

    await env.escrow.replace_worker(env.coordinator, tid, w1, w3)
    assert await env.escrow.slot(tid, w1) == (0, 0)
    assert await env.escrow.slot(tid, w3) == (2 * ETH, 0)
    assert await env.escrow.workers(tid) == [w0, w1, w2, w3]
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.release(env.coordinator, tid, [w1], [1], [result_hash("x")])
    assert info.value.reason == "NotAWorker"
    # A replaced worker cannot come back into the same training.
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.replace_worker(env.coordinator, tid, w2, w1)
    assert info.value.reason == "DuplicateWorker"
    replaced = [e for e in await env.escrow.events(tid) if e.name == "WorkerReplaced"]
    assert [(e.args["oldWorker"], e.args["newWorker"], e.args["amount"]) for e in replaced] == [(w1, w3, 2 * ETH)]

    await env.escrow.release(env.coordinator, tid, [w3], [2 * ETH], [result_hash("r3")])
    await env.escrow.refund(env.coordinator, tid)
    # Paid at all = completed; replaced or never paid = failed; nobody stays assigned.
    states = {w: await env.registry.provider(w) for w in (w0, w1, w2, w3)}
    assert {w: (p.assigned, p.completed, p.failed) for w, p in states.items()} == {
        w0: (0, 1, 0), w1: (0, 0, 1), w2: (0, 0, 1), w3: (0, 1, 0),
    }
    # Reputation is the value paid, not the number of trainings.
    assert {w: p.earned for w, p in states.items()} == {w0: ETH // 2, w1: 0, w2: 0, w3: 2 * ETH}
    assert [await env.chain.balance(w) for w in (w0, w1, w2, w3)] == [ETH // 2, 0, 0, 2 * ETH]
    await assert_conserved(env)


async def test_replace_into_a_funded_slot_only_retires_the_old_one(env: Env) -> None:
    """A spare given its own slot for a speculative copy keeps it; the straggler's slot is retired."""
    w0, w1, w2, _ = (w.address for w in env.workers)
    tid = await _open(env, "spec", [ETH, ETH])
    await env.escrow.add_worker(env.coordinator, tid, w2, 2 * ETH)
    await env.escrow.replace_worker(env.coordinator, tid, w0, w2, b"")  # no consent needed: it has its slot
    assert await env.escrow.slot(tid, w0) == (0, 0)
    assert await env.escrow.slot(tid, w2) == (2 * ETH, 0)
    # An unused slot is taken back without counting a failure.
    await env.escrow.drop_worker(env.coordinator, tid, w1)
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.drop_worker(env.coordinator, tid, w1)
    assert info.value.reason == "NotAWorker"
    await env.escrow.release(env.coordinator, tid, [w2], [ETH], [result_hash("s")])
    await env.escrow.refund(env.coordinator, tid)
    states = {w: await env.registry.provider(w) for w in (w0, w1, w2)}
    assert {w: (p.assigned, p.completed, p.failed, p.earned) for w, p in states.items()} == {
        w0: (0, 0, 1, 0), w1: (0, 0, 0, 0), w2: (0, 1, 0, ETH)}
    state = await env.escrow.training(tid)
    # Back at once: the retired and dropped slots; held: the rest of w2's active slot.
    assert (state.deposited, state.paid, state.refunded) == (4 * ETH, ETH, 2 * ETH)
    assert (await env.escrow.held(tid)).amount == ETH
    await assert_conserved(env)


async def test_refund_by_anyone_only_after_deadline_and_grace(env: Env) -> None:
    stranger = await _new_sender(env.chain, ETH)
    now = int((await env.chain.w3.eth.get_block("latest"))["timestamp"])
    tid = tkey(env.coordinator, "deadline")
    w1 = env.workers[1].address
    await env.escrow.open(env.coordinator, training_salt("deadline"), [env.workers[0].address, w1],
                          [2 * ETH, 3 * ETH], deadline=now + 3600)
    env.trainings.append(tid)
    await env.escrow.release(env.coordinator, tid, [env.workers[0].address], [ETH], [result_hash("d")])

    grace = int(await env.escrow._call("GRACE_PERIOD"))
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.refund(stranger, tid)
    assert info.value.reason == "RefundTooEarly"
    await advance_time(env.chain, 3600 + 10)  # past the deadline, inside the grace period
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.refund(stranger, tid)
    assert info.value.reason == "RefundTooEarly"
    await advance_time(env.chain, grace)

    await env.escrow.drop_worker(env.coordinator, tid, w1)  # unpaid and dropped: refunded at once

    coordinator_before = await env.chain.balance(env.coordinator.address)
    stranger_before = await env.chain.balance(stranger.address)
    receipt = await env.escrow.refund(stranger, tid)
    # The remainder goes to the depositor, never to whoever triggered the refund; the part the
    # active slot could still claim with a receipt is held for the claim window.
    assert await env.chain.balance(env.coordinator.address) == coordinator_before + 3 * ETH
    assert await env.chain.balance(stranger.address) == stranger_before - _gas_cost(receipt)
    state = await env.escrow.training(tid)
    assert (state.closed, state.refunded) == (True, 3 * ETH)
    assert (await env.escrow.held(tid)).amount == ETH
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.release(env.coordinator, tid, [env.workers[0].address], [1], [result_hash("late")])
    assert info.value.reason == "TrainingClosed"
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.refund(stranger, tid)
    assert info.value.reason == "TrainingClosed"
    await assert_conserved(env)
    # After the claim window the stranger can return the held part, again to the depositor only.
    await advance_time(env.chain, int(await env.escrow._call("CLAIM_WINDOW")))
    stranger_before = await env.chain.balance(stranger.address)
    receipt = await env.escrow.reclaim(stranger, tid)
    assert await env.chain.balance(env.coordinator.address) == coordinator_before + 4 * ETH
    assert await env.chain.balance(stranger.address) == stranger_before - _gas_cost(receipt)
    assert (await env.escrow.training(tid)).refunded == 4 * ETH
    await assert_conserved(env)


@dataclass
class Token:
    address: str
    artifact: ContractArtifact
    env: Env

    def tx(self, fn: str, *args: Any) -> dict[str, Any]:
        data = self.env.chain.w3.eth.contract(abi=self.artifact.abi).encode_abi(fn, args=list(args))
        return {"to": self.address, "data": data}

    async def send(self, sender: TransactionSender, fn: str, *args: Any) -> None:
        await sender.send(self.tx(fn, *args), abi=self.artifact.abi)

    async def balance(self, account: str) -> int:
        contract = self.env.chain.w3.eth.contract(address=self.address, abi=self.artifact.abi)
        return int(await contract.functions.balanceOf(account).call())


async def deploy_token(env: Env) -> Token:
    artifact = ContractArtifact.from_file(TEST_ARTIFACTS / "TestToken.json")
    return Token(await deploy(env.coordinator, artifact), artifact, env)


async def assert_token_conserved(env: Env, token: Token, tids: Sequence[bytes], owed: Sequence[str] = ()) -> None:
    held = 0
    for tid in tids:
        state = await env.escrow.training(tid)
        held += state.deposited - state.paid - state.refunded
    owed_total = sum([await env.escrow.owed(a, token.address) for a in owed])
    assert await token.balance(env.escrow.address) == held + owed_total


async def test_erc20_budget_pays_defers_and_refunds(env: Env) -> None:
    token = await deploy_token(env)
    await token.send(env.coordinator, "mint", env.coordinator.address, 100 * ETH)
    w0, w1, w2 = (w.address for w in env.workers[:3])
    salt, tid = training_salt("erc20"), tkey(env.coordinator, "erc20")

    # Without approval the pull fails; ETH sent along with a token budget is refused.
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.open(env.coordinator, salt, [w0], [ETH], token=token.address)
    assert info.value.reason == "TransferFailed"
    await token.send(env.coordinator, "approve", env.escrow.address, 6 * ETH)
    with pytest.raises(ContractRevertError) as info:
        await env.escrow.open(env.coordinator, salt, [w0], [ETH], token=token.address, value=1)
    assert info.value.reason == "DepositMismatch"

    eth_before = await env.chain.balance(env.escrow.address)
    await env.escrow.open(env.coordinator, salt, [w0, w1, w2], [ETH, 2 * ETH, 3 * ETH], token=token.address)
    assert await token.balance(env.escrow.address) == 6 * ETH
    assert await env.chain.balance(env.escrow.address) == eth_before
    assert (await env.escrow.training(tid)).token == token.address
    await assert_token_conserved(env, token, [tid])

    # A payee the token refuses (a blocklist) is deferred; the others are paid in the same batch.
    await token.send(env.coordinator, "setBlocked", w1, True)
    await env.escrow.release(env.coordinator, tid, [w0, w1, w2], [ETH, 2 * ETH, ETH], [result_hash("t")] * 3)
    assert [await token.balance(w) for w in (w0, w1, w2)] == [ETH, 0, ETH]
    assert await env.escrow.owed(w1, token.address) == 2 * ETH
    assert await env.escrow.owed(w1) == 0
    await assert_token_conserved(env, token, [tid], owed=[w1])

    # Unblocked, the worker pulls its tokens (it needs gas money to send the tx).
    await token.send(env.coordinator, "setBlocked", w1, False)
    await env.chain.fund(w1, ETH // 10)
    await env.escrow.withdraw(TransactionSender(env.chain.w3, env.workers[1]), token.address)
    assert await token.balance(w1) == 2 * ETH and await env.escrow.owed(w1, token.address) == 0

    # w2's slot (1 of 3 paid) is held for its receipts; a receipt redeemed in the window pays in the token.
    coordinator_tokens = await token.balance(env.coordinator.address)
    await env.escrow.refund(env.coordinator, tid)
    assert await token.balance(env.coordinator.address) == coordinator_tokens
    assert await token.balance(env.escrow.address) == 2 * ETH
    await assert_token_conserved(env, token, [tid], owed=[w1])
    chain_id = await env.escrow.chain_id()
    signature = sign_receipt(KEYS[env.coordinator.address], chain_id, env.escrow.address, tid, w2, 2, 2 * ETH)
    await env.escrow.redeem(env.coordinator, tid, w2, 2, 2 * ETH, signature)
    assert await token.balance(w2) == 2 * ETH
    await advance_time(env.chain, int(await env.escrow._call("CLAIM_WINDOW")))
    await env.escrow.reclaim(env.coordinator, tid)
    assert await token.balance(env.coordinator.address) == coordinator_tokens + ETH
    assert await token.balance(env.escrow.address) == 0
    await assert_token_conserved(env, token, [tid], owed=[w1])
    await assert_conserved(env)  # no ETH moved through the escrow for this training
    # A token's amounts are not comparable to ETH (a worthless token would forge any value): no reputation.
    assert [(await env.registry.provider(w)).earned for w in (w0, w1, w2)] == [0, 0, 0]


@dataclass
class Attacker:
    address: str
    artifact: ContractArtifact
    env: Env

    def _data(self, fn: str, *args: Any) -> str:
        return self.env.chain.w3.eth.contract(abi=self.artifact.abi).encode_abi(fn, args=list(args))

    async def arm(self, target: str, payload: str) -> None:
        await self.env.coordinator.send({"to": self.address, "data": self._data("arm", target, payload)})

    async def exec(self, target: str, payload: str, *, value: int = 0, abi: Sequence[Any] = ()) -> None:
        tx = {"to": self.address, "data": self._data("exec", target, payload), "value": value}
        await self.env.coordinator.send(tx, abi=[*self.artifact.abi, *abi])  # type: ignore[typeddict-item]

    async def view(self, fn: str) -> int:
        contract = self.env.chain.w3.eth.contract(address=self.address, abi=self.artifact.abi)
        return int(await getattr(contract.functions, fn)().call())


async def deploy_attacker(env: Env) -> Attacker:
    artifact = ContractArtifact.from_file(TEST_ARTIFACTS / "ReentrantAttacker.json")
    return Attacker(await deploy(env.coordinator, artifact), artifact, env)


async def test_reentrant_worker_is_paid_exactly_once(env: Env) -> None:
    attacker = await deploy_attacker(env)
    w1 = env.workers[1].address
    tid = await _open(env, "reenter-worker", [ETH, ETH], workers=[attacker.address, w1])
    # On receipt the attacker re-enters withdraw, then (second test) release on itself.
    await attacker.arm(env.escrow.address, env.escrow.build("withdraw", ETH_TOKEN)["data"])
    await env.escrow.release(env.coordinator, tid, [attacker.address, w1], [ETH // 2, ETH], [result_hash("a")] * 2)
    assert await env.chain.balance(w1) == ETH
    if await env.escrow.owed(attacker.address):  # its hook ran out of the push's gas cap: pull
        await attacker.exec(env.escrow.address, env.escrow.build("withdraw", ETH_TOKEN)["data"], abi=env.escrow.abi)
    assert await env.chain.balance(attacker.address) == ETH // 2
    assert await attacker.view("received") == ETH // 2
    assert await attacker.view("attempts") >= 1 and await attacker.view("successes") == 0
    assert await env.escrow.owed(attacker.address) == 0
    await assert_conserved(env, owed_accounts=(attacker.address,))


async def test_reentrant_coordinator_cannot_refund_twice(env: Env) -> None:
    attacker = await deploy_attacker(env)
    salt = training_salt("reenter-coordinator")
    tid = key_of(attacker.address, salt)
    w0, w1 = env.workers[0].address, env.workers[1].address
    deadline = int((await env.chain.w3.eth.get_block("latest"))["timestamp"]) + 3600
    consents = [await env.escrow.consent(tid, w) for w in (w0, w1)]
    open_data = env.escrow.build("open", salt, ETH_TOKEN, [w0, w1], [2 * ETH, ETH], consents, deadline)["data"]
    await attacker.exec(env.escrow.address, open_data, value=3 * ETH, abi=env.escrow.abi)
    env.trainings.append(tid)
    assert (await env.escrow.training(tid)).coordinator == attacker.address
    release = env.escrow.build("release", tid, [w0], [ETH], [result_hash("x")])["data"]
    await attacker.exec(env.escrow.address, release, abi=env.escrow.abi)
    # w1's dropped slot comes back at once; the rest of w0's active slot is held, then reclaimed.
    await attacker.exec(env.escrow.address, env.escrow.build("dropWorker", tid, w1)["data"], abi=env.escrow.abi)

    async def pay_out(call: str) -> None:
        """``call`` with the attacker re-entering the same call when it is paid (also for a pulled deferral)."""
        data = env.escrow.build(call, tid)["data"]
        await attacker.arm(env.escrow.address, data)
        await attacker.exec(env.escrow.address, data, abi=env.escrow.abi)
        if await env.escrow.owed(attacker.address):
            await attacker.arm(env.escrow.address, data)
            await attacker.exec(env.escrow.address, env.escrow.build("withdraw", ETH_TOKEN)["data"],
                                abi=env.escrow.abi)

    await pay_out("refund")
    assert await attacker.view("received") == ETH
    await advance_time(env.chain, int(await env.escrow._call("CLAIM_WINDOW")))
    await pay_out("reclaim")
    assert await attacker.view("attempts") >= 2 and await attacker.view("successes") == 0
    assert await attacker.view("received") == 2 * ETH
    assert await env.chain.balance(attacker.address) == 2 * ETH
    state = await env.escrow.training(tid)
    assert (state.paid, state.refunded, state.closed) == (ETH, 2 * ETH, True)
    await assert_conserved(env, owed_accounts=(attacker.address,))


async def test_add_worker_funds_one_more_slot_in_an_open_training(env: Env) -> None:
    w0, w1, w2, w3 = (w.address for w in env.workers)
    tid = await _open(env, "grow", [ETH, ETH])
    await env.escrow.add_worker(env.coordinator, tid, w2, 3 * ETH)
    assert await env.escrow.slot(tid, w2) == (3 * ETH, 0)
    assert (await env.escrow.training(tid)).deposited == 5 * ETH
    assert (await env.registry.provider(w2)).assigned == 1
    assert await env.escrow.workers(tid) == [w0, w1, w2]
    for bad, reason in (((w2, ETH), "DuplicateWorker"), ((w3, 0), "ZeroAmount")):
        with pytest.raises(ContractRevertError) as info:
            await env.escrow.add_worker(env.coordinator, tid, *bad)
        assert info.value.reason == reason
    with pytest.raises(ContractRevertError) as info:  # the deposit must match the slot exactly
        await env.escrow.add_worker(env.coordinator, tid, w3, ETH, value=ETH - 1)
    assert info.value.reason == "DepositMismatch"
    with pytest.raises(ContractRevertError) as info:  # only the training's coordinator
        await env.escrow.add_worker(await _new_sender(env.chain, 2 * ETH), tid, w3, ETH)
    assert info.value.reason == "NotCoordinator"
    await env.escrow.release(env.coordinator, tid, [w2], [2 * ETH], [result_hash("r2")])
    await env.escrow.refund(env.coordinator, tid)
    with pytest.raises(ContractRevertError) as info:  # closed: no more slots
        await env.escrow.add_worker(env.coordinator, tid, w3, ETH)
    assert info.value.reason == "TrainingClosed"
    state = await env.escrow.training(tid)
    # Nothing back at once: every unpaid wei is in an active slot that a receipt could still claim.
    assert (state.deposited, state.paid, state.refunded) == (5 * ETH, 2 * ETH, 0)
    assert (await env.escrow.held(tid)).amount == 3 * ETH
    assert (await env.registry.provider(w2)).completed == 1
    await assert_conserved(env)


async def test_verifiers_are_paid_per_check_from_a_budget_whose_rest_is_refunded(env: Env) -> None:
    w0, w1, w2, stranger = (w.address for w in env.workers)
    tid = await _open(env, "verified", [ETH, ETH, ETH])
    await env.escrow.fund_verification(env.coordinator, tid, ETH // 10)
    assert await env.escrow.verification_budget(tid) == ETH // 10
    assert (await env.escrow.training(tid)).deposited == 3 * ETH + ETH // 10
    before = await env.chain.balance(w1)
    await env.escrow.pay_verifiers(env.coordinator, tid, [w1, w2], [ETH // 50, ETH // 100],
                                   [result_hash("report-1"), result_hash("report-2")])
    assert await env.chain.balance(w1) == before + ETH // 50
    assert await env.escrow.verification_budget(tid) == ETH // 10 - 3 * ETH // 100
    assert await env.escrow.slot(tid, w1) == (ETH, 0)  # a slot's pay for its own work is apart
    paid = [e for e in await env.escrow.events(tid) if e.name == "VerifierPaid"]
    assert [(e.args["verifier"], e.args["amount"]) for e in paid] == [(w1, ETH // 50), (w2, ETH // 100)]
    for args, reason in ((([stranger], [1], [result_hash("x")]), "NotAWorker"),
                         (([w1], [0], [result_hash("x")]), "ZeroAmount"),
                         (([w1], [ETH], [result_hash("x")]), "OverVerificationBudget")):
        with pytest.raises(ContractRevertError) as info:
            await env.escrow.pay_verifiers(env.coordinator, tid, *args)
        assert info.value.reason == reason
    with pytest.raises(ContractRevertError) as info:  # only the training's coordinator
        await env.escrow.pay_verifiers(await _new_sender(env.chain, ETH), tid, [w1], [1], [result_hash("x")])
    assert info.value.reason == "NotCoordinator"
    with pytest.raises(ContractRevertError) as info:  # the deposit must match exactly
        await env.escrow.fund_verification(env.coordinator, tid, ETH, value=ETH - 1)
    assert info.value.reason == "DepositMismatch"
    await env.escrow.release(env.coordinator, tid, [w0, w1, w2], [ETH] * 3, [result_hash(f"r{i}") for i in range(3)])
    await env.escrow.refund(env.coordinator, tid)
    state = await env.escrow.training(tid)
    assert state.refunded == ETH // 10 - 3 * ETH // 100  # the budget's rest, no slot holds it
    with pytest.raises(ContractRevertError) as info:  # closed: no more verification pay
        await env.escrow.pay_verifiers(env.coordinator, tid, [w1], [1], [result_hash("x")])
    assert info.value.reason == "TrainingClosed"
    await assert_conserved(env)
