"""TransactionSender, deployment and error mapping against a real anvil node over JSON-RPC."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import AsyncWeb3

from aitbc_agent_sdk.chain import (
    ContractArtifact,
    EscrowClient,
    TransactionSender,
    connect_rpc,
    deploy,
    load_artifact,
    result_hash,
    training_key,
    training_salt,
)
from aitbc_agent_sdk.chain._deployment import Deployment, deploy_contracts, fund_accounts, verify_deployment
from aitbc_agent_sdk.devnet._anvil import anvil_path, dev_accounts, rpc_url, start_chain_node
from aitbc_agent_sdk.devnet._service import ServiceError, free_port, stop
from aitbc_agent_sdk.errors import ChainError, ContractRevertError, InsufficientFundsError
from test_escrow import ConsentingEscrow, worker_account

ETH = 10**18
TEST_ARTIFACTS = Path(__file__).parent / "artifacts"


@pytest.fixture
async def funder(anvil_w3: AsyncWeb3, anvil_dev_accounts: list[LocalAccount]) -> TransactionSender:
    # Dev account 1: account 0 is used by DevChain.fund (node-side nonces) in the escrow tests.
    return TransactionSender(anvil_w3, anvil_dev_accounts[1])


async def _fresh_sender(w3: AsyncWeb3, funder: TransactionSender, wei: int) -> TransactionSender:
    account = Account.create()
    if wei:
        await fund_accounts(funder, [account.address], wei)
    return TransactionSender(w3, account)


@pytest.fixture
async def own_node(tmp_path: Path) -> AsyncIterator[str]:
    """A second, empty anvil: the 'devnet was reset' case."""
    service = await start_chain_node(tmp_path / "node")
    try:
        yield rpc_url(service)
    finally:
        stop(service)


async def test_dev_accounts_match_the_node(anvil_w3: AsyncWeb3, anvil_dev_accounts: list[LocalAccount]) -> None:
    assert [a.address for a in anvil_dev_accounts] == list(await anvil_w3.eth.accounts)
    # The first key is the well-known one every Foundry/Hardhat user has seen.
    assert anvil_dev_accounts[0].address == "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    assert await anvil_w3.eth.chain_id == 31337


async def test_twenty_concurrent_sends_get_consecutive_nonces(
    anvil_w3: AsyncWeb3, funder: TransactionSender
) -> None:
    sender = await _fresh_sender(anvil_w3, funder, 10 * ETH)
    targets = [Account.create().address for _ in range(20)]
    receipts = await fund_accounts(sender, targets, 10**15)
    assert all(r["status"] == 1 for r in receipts)
    txs = await asyncio.gather(*(anvil_w3.eth.get_transaction(r["transactionHash"]) for r in receipts))
    assert sorted(int(tx["nonce"]) for tx in txs) == list(range(20))
    assert await anvil_w3.eth.get_transaction_count(sender.address) == 20
    assert [await anvil_w3.eth.get_balance(t) for t in targets] == [10**15] * 20


async def test_gas_is_estimated_with_margin_and_eip1559_fees(anvil_w3: AsyncWeb3, funder: TransactionSender) -> None:
    sender = await _fresh_sender(anvil_w3, funder, 10 * ETH)
    receipt = (await fund_accounts(sender, [Account.create().address], 1))[0]
    tx = await anvil_w3.eth.get_transaction(receipt["transactionHash"])
    assert receipt["gasUsed"] == 21_000
    assert tx["gas"] == math.ceil(21_000 * 1.2)
    assert tx["type"] == 2 and tx["maxFeePerGas"] >= receipt["effectiveGasPrice"]

    escrow = ConsentingEscrow(anvil_w3, await deploy(sender, _escrow_artifact()))
    opened = await escrow.open(sender, training_salt("gas"), [worker_account().address], [ETH])
    tx = await anvil_w3.eth.get_transaction(opened["transactionHash"])
    assert opened["gasUsed"] <= tx["gas"] <= math.ceil(opened["gasUsed"] * 1.2) + 50_000


async def test_revert_is_decoded_over_json_rpc(anvil_w3: AsyncWeb3, funder: TransactionSender) -> None:
    sender = await _fresh_sender(anvil_w3, funder, 10 * ETH)
    escrow = ConsentingEscrow(anvil_w3, await deploy(sender, _escrow_artifact()))
    tid, worker = training_key(sender.address, "revert"), worker_account().address
    await escrow.open(sender, training_salt("revert"), [worker], [ETH])

    # Caught at gas estimation (anvil answers code 3 with the revert bytes in `data`).
    with pytest.raises(ContractRevertError) as info:
        await escrow.release(sender, tid, [worker], [ETH + 1], [result_hash("a")])
    assert info.value.reason == "OverRelease"
    assert f"remaining={ETH}" in str(info.value) and f"requested={ETH + 1}" in str(info.value)

    # Mined with status 0 (explicit gas skips estimation), then replayed with eth_call for the reason.
    tx = escrow.build("release", tid, [worker], [2 * ETH], [result_hash("b")])
    with pytest.raises(ContractRevertError) as info:
        await sender.send({**tx, "gas": 200_000}, abi=escrow.abi)
    assert info.value.reason == "OverRelease"
    assert "(tx 0x" in str(info.value)

    # A custom error without arguments.
    with pytest.raises(ContractRevertError) as info:
        await escrow.withdraw(sender)
    assert info.value.reason == "NothingOwed"
    assert (await escrow.slot(tid, worker)).paid == 0


async def test_insufficient_funds(anvil_w3: AsyncWeb3, funder: TransactionSender) -> None:
    poor = await _fresh_sender(anvil_w3, funder, ETH // 100)
    with pytest.raises(InsufficientFundsError):
        await fund_accounts(poor, [Account.create().address], ETH)
    escrow = ConsentingEscrow(anvil_w3, await deploy(funder, _escrow_artifact()))
    with pytest.raises(InsufficientFundsError):
        await escrow.open(poor, training_salt("poor"), [worker_account().address], [ETH])
    empty = await _fresh_sender(anvil_w3, funder, 0)
    with pytest.raises(InsufficientFundsError):
        await fund_accounts(empty, [Account.create().address], 1)


async def test_dead_rpc_fails_quickly_with_chain_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ChainError, match="unreachable") as info:
        await connect_rpc(url, timeout=1.0)
    assert "is the node running?" in str(info.value) and url in str(info.value)

    w3 = await connect_rpc(url, timeout=1.0, check=False)
    sender = TransactionSender(w3, Account.create())
    with pytest.raises(ChainError, match="unreachable"):
        await sender.send({"to": Account.create().address, "value": 1})
    await w3.provider.disconnect()
    # web3 retries refused connections a few times with backoff (~2 s); never the 120 s receipt wait.
    assert time.monotonic() - started < 15


async def test_deploy_and_verify(anvil_w3: AsyncWeb3, funder: TransactionSender) -> None:
    sender = await _fresh_sender(anvil_w3, funder, 10 * ETH)
    deployment = await deploy_contracts(sender)
    assert isinstance(deployment, Deployment)
    assert (deployment.chain_id, deployment.deployer) == (31337, sender.address)
    assert deployment.block == await anvil_w3.eth.block_number
    assert deployment.addresses() == {"escrow": deployment.escrow}
    await verify_deployment(anvil_w3, deployment)
    # The deployment round-trips through JSON (a devnet profile stores it).
    assert Deployment.model_validate_json(deployment.model_dump_json()) == deployment
    escrow = EscrowClient(anvil_w3, deployment.escrow)
    assert not (await escrow.training(training_key(sender.address, "none"))).exists

    # Another contract at the recorded address is refused too.
    other = await deploy(sender, ContractArtifact.from_file(TEST_ARTIFACTS / "RevertingReceiver.json"))
    with pytest.raises(ChainError, match="not this SDK's TrainingEscrow"):
        await verify_deployment(anvil_w3, deployment.model_copy(update={"escrow": other}))


async def test_verify_fails_clearly_on_a_reset_chain(anvil_w3: AsyncWeb3, funder: TransactionSender,
                                                     own_node: str) -> None:
    deployment = await deploy_contracts(await _fresh_sender(anvil_w3, funder, 10 * ETH))
    fresh = await connect_rpc(own_node)
    try:
        with pytest.raises(ChainError, match="chain was reset"):
            await verify_deployment(fresh, deployment)
        with pytest.raises(ChainError, match="for chain 1 but the node is on chain 31337"):
            await verify_deployment(fresh, deployment.model_copy(update={"chain_id": 1}))
    finally:
        await fresh.provider.disconnect()


async def test_state_file_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    service = await start_chain_node(tmp_path / "a", state_file=state)
    try:
        w3 = await connect_rpc(rpc_url(service))
        deployment = await deploy_contracts(TransactionSender(w3, dev_accounts(1)[0]))
        await w3.provider.disconnect()
    finally:
        stop(service)  # SIGTERM: anvil dumps its state on the way out
    assert state.is_file()
    service = await start_chain_node(tmp_path / "b", state_file=state)
    try:
        w3 = await connect_rpc(rpc_url(service))
        await verify_deployment(w3, deployment)
        assert await w3.eth.block_number >= deployment.block
        await w3.provider.disconnect()
    finally:
        stop(service)


def test_missing_binary_says_make_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match="make setup"):
        anvil_path(tmp_path)


def _escrow_artifact() -> ContractArtifact:
    return load_artifact("TrainingEscrow")
