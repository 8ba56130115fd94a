"""Signing, nonces, gas and fees for one local account; chain errors are mapped in ``revert``.

The sender is the only object in the chain package that holds a signer; contract
wrappers build ``{"to", "data", "value"}`` dicts and hand them to :meth:`TransactionSender.send`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from hexbytes import HexBytes
from web3 import AsyncWeb3
from web3.exceptions import TransactionNotFound, Web3Exception, Web3RPCError
from web3.types import TxParams, TxReceipt

from aitbc_agent_sdk.errors import AitbcError, ChainError, ConfigError, ContractRevertError

from ._revert import CHAIN_EXCEPTIONS, decode_revert_data, map_chain_error

__all__ = [
    "CHAIN_EXCEPTIONS",
    "DEVNET_CONFIRMATIONS",
    "PUBLIC_CONFIRMATIONS",
    "SentTx",
    "TransactionSender",
    "decode_revert_data",
    "default_confirmations",
    "map_chain_error",
]

log = logging.getLogger(__name__)


# Blocks a receipt must have on top of (and including) its own before ``send`` returns it.
# A local devnet has one honest miner and no reorgs; a public chain can reorg a few blocks,
# and 12 is the depth Ethereum wallets and exchanges commonly wait for (about 2.5 minutes).
DEVNET_CONFIRMATIONS = 1
PUBLIC_CONFIRMATIONS = 12
DEV_CHAIN_IDS = frozenset({1337, 31337, 131277322940537})  # geth --dev, anvil/hardhat, eth-tester (embedded)


def default_confirmations(chain_id: int) -> int:
    return DEVNET_CONFIRMATIONS if chain_id in DEV_CHAIN_IDS else PUBLIC_CONFIRMATIONS


@dataclass
class SentTx:
    """One nonce's transaction as broadcast: every version's hash (fee bumps) and the last signed bytes."""

    nonce: int
    tx: dict[str, Any]
    hashes: list[HexBytes] = field(default_factory=list)
    raw: bytes = b""


# How long a nonce the node counts as used may go without a receipt for our transaction
# before we conclude another transaction took it.
NONCE_TAKEN_GRACE_S = 5.0

# Called with the SentTx before each broadcast of it (first send and every replacement), so a
# caller can record what is about to happen before the node can act on it.
OnBroadcast = Callable[[SentTx], Awaitable[None]]


class TransactionSender:
    """Signs and sends transactions for one account; safe for concurrent ``send`` calls.

    Nonces come from a local counter seeded from the node's pending count, so several
    coroutines can send back to back without waiting for each other's receipts. A
    transaction the node forgets (dropped from its pool) is broadcast again; one left
    unmined for ``stuck_after_s`` is replaced by the same nonce at a fee ``fee_bump`` times
    higher; one still unmined at the timeout gives its nonce back (the counter re-reads the
    node), and because a replacement reuses that nonce, at most one of them is ever mined.
    ``confirmations`` (None: :func:`default_confirmations` of the chain id) is how many
    blocks, counting its own, a receipt must have before ``send`` returns it.
    """

    def __init__(
        self,
        w3: AsyncWeb3,
        account: LocalAccount,
        *,
        gas_margin: float = 1.2,
        receipt_timeout: float = 120.0,
        poll_interval: float = 0.1,
        default_priority_fee: int = 1_000_000_000,
        confirmations: int | None = None,
        stuck_after_s: float = 30.0,
        fee_bump: float = 1.25,
        max_fee_bumps: int = 5,
    ) -> None:
        if gas_margin < 1.0:
            raise ConfigError("gas_margin must be >= 1.0")
        if confirmations is not None and confirmations < 1:
            raise ConfigError("confirmations must be >= 1 (1: the block that includes the transaction)")
        if fee_bump < 1.125:  # geth and anvil refuse a replacement less than 10% dearer
            raise ConfigError("fee_bump must be >= 1.125")
        if stuck_after_s <= 0 or max_fee_bumps < 0:
            raise ConfigError("stuck_after_s must be positive and max_fee_bumps non-negative")
        self._w3 = w3
        self._account = account
        self._gas_margin = gas_margin
        self._receipt_timeout = receipt_timeout
        self._poll_interval = poll_interval
        self._default_priority_fee = default_priority_fee
        self._confirmations = confirmations
        self._stuck_after = stuck_after_s
        self._fee_bump = fee_bump
        self._max_bumps = max_fee_bumps
        self._lock = asyncio.Lock()
        self._next_nonce: int | None = None
        self._chain_id: int | None = None

    @property
    def address(self) -> ChecksumAddress:
        return self._account.address

    @property
    def account(self) -> LocalAccount:
        """The signing account: a coordinator signs its payment receipts with the key it pays from."""
        return self._account

    @property
    def w3(self) -> AsyncWeb3:
        return self._w3

    async def confirmations(self) -> int:
        if self._confirmations is None:
            self._confirmations = default_confirmations(await self._chain())
        return self._confirmations

    async def balance(self) -> int:
        try:
            return int(await self._w3.eth.get_balance(self.address))
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, action="get_balance") from exc

    async def send(
        self,
        tx: TxParams,
        *,
        abi: Sequence[Mapping[str, Any]] = (),
        label: str | None = None,
        timeout: float | None = None,
        on_broadcast: OnBroadcast | None = None,
    ) -> TxReceipt:
        """Fill, sign and broadcast ``tx``; return its receipt once mined and confirmed.

        ``abi`` is used to decode custom errors and ``label`` names the action in error
        messages (e.g. ``"TrainingEscrow.release"``). Raises ContractRevertError when the call
        would revert (caught at gas estimation) or the mined receipt has status 0, and
        ChainError when it is not mined within ``timeout`` (its nonce is then re-read).
        """
        action = label or _describe(tx)
        wait = self._receipt_timeout if timeout is None else timeout
        try:
            filled = await self._fill(dict(tx))
            sent = await self._sign_and_broadcast(filled, on_broadcast)
            receipt = await self._until_mined(sent, wait, action, on_broadcast)
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, abi=abi, action=action) from exc
        if receipt["status"] != 1:
            raise await self._explain_failure(sent.tx, receipt, abi, action)
        return receipt

    async def reset_nonce(self) -> None:
        """Forget the local nonce; the next send re-reads the node's pending count."""
        async with self._lock:
            self._next_nonce = None

    async def wait_settled(self, timeout: float | None = None) -> None:
        """Wait until none of this account's transactions is pending at the node (all mined or gone).

        Reads made after it see every earlier transaction of this account that will ever be
        mined (as far as this node knows); raises ChainError if one is still pending at ``timeout``.
        """
        eth = self._w3.eth
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._receipt_timeout if timeout is None else timeout)
        try:
            while True:
                mined = int(await eth.get_transaction_count(self.address, "latest"))
                pending = int(await eth.get_transaction_count(self.address, "pending"))
                if pending <= mined:
                    return
                if loop.time() >= deadline:
                    raise ChainError(f"{pending - mined} transaction(s) of {self.address} are still pending "
                                     f"(nonces {mined}..{pending - 1}); not acting on a state they may change")
                await asyncio.sleep(self._poll_interval)
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, action="read pending transactions") from exc

    async def _chain(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(await self._w3.eth.chain_id)
        return self._chain_id

    async def _fill(self, tx: dict[str, Any]) -> dict[str, Any]:
        eth = self._w3.eth
        tx["from"] = self.address
        tx.setdefault("value", 0)
        tx["chainId"] = await self._chain()
        if "gas" not in tx:
            # Estimation runs the call, so a revert surfaces here with its reason, before a nonce is spent.
            estimate = await eth.estimate_gas(tx)  # type: ignore[arg-type]
            tx["gas"] = math.ceil(estimate * self._gas_margin)
        if not {"gasPrice", "maxFeePerGas"} & tx.keys():
            tx.update(await self._fees())
        return tx

    async def _fees(self) -> dict[str, int]:
        eth = self._w3.eth
        block = await eth.get_block("latest")
        base_fee = block.get("baseFeePerGas")
        if base_fee is None:  # pre-London node: legacy pricing
            return {"gasPrice": int(await eth.gas_price)}
        try:
            priority = int(await eth.max_priority_fee)
        except (Web3Exception, ValueError):
            priority = self._default_priority_fee
        # 2x base fee survives six full blocks of base-fee growth before the tx is priced out.
        return {"maxPriorityFeePerGas": priority, "maxFeePerGas": 2 * int(base_fee) + priority}

    async def _sign_and_broadcast(self, tx: dict[str, Any], on_broadcast: OnBroadcast | None) -> SentTx:
        async with self._lock:
            if self._next_nonce is None:
                self._next_nonce = int(await self._w3.eth.get_transaction_count(self.address, "pending"))
            tx["nonce"] = self._next_nonce
            sent = SentTx(nonce=self._next_nonce, tx=tx)
            try:
                await self._broadcast(sent, tx, on_broadcast)
            except BaseException:
                # The node may or may not have taken it; re-read the pending count next time.
                self._next_nonce = None
                raise
            self._next_nonce += 1
            return sent

    async def _broadcast(self, sent: SentTx, tx: dict[str, Any], on_broadcast: OnBroadcast | None) -> None:
        signed = self._account.sign_transaction(tx)
        sent.tx, sent.raw = tx, bytes(signed.raw_transaction)
        sent.hashes.append(HexBytes(signed.hash))
        if on_broadcast is not None:
            await on_broadcast(sent)
        await self._w3.eth.send_raw_transaction(signed.raw_transaction)

    async def _until_mined(self, sent: SentTx, timeout: float, action: str,
                           on_broadcast: OnBroadcast | None) -> TxReceipt:
        """Poll for a receipt of any version of ``sent``; re-broadcast, bump or give the nonce back."""
        eth = self._w3.eth
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last_broadcast, last_resend, bumps = loop.time(), -math.inf, 0
        taken_since: float | None = None
        while True:
            receipt = await self._receipt(sent)
            if receipt is not None:
                confirmed = await self._confirmed(sent, receipt, deadline)
                if confirmed is not None:
                    return confirmed
                continue  # reorged out while waiting: look again
            if loop.time() >= deadline:
                await self._give_back(sent)
                raise ChainError(f"{action}: not mined within {timeout:g}s (nonce {sent.nonce}, "
                                 f"tx {sent.hashes[-1].to_0x_hex()}); the nonce is re-read for the next send")
            if int(await eth.get_transaction_count(self.address, "latest")) > sent.nonce:
                # A node may count the nonce a moment before it serves the receipt (anvil does, under
                # load): only a nonce taken and still receipt-less after a grace is another's.
                taken_since = loop.time() if taken_since is None else taken_since
                if loop.time() - taken_since >= NONCE_TAKEN_GRACE_S and await self._receipt(sent) is None:
                    await self._give_back(sent)
                    raise ChainError(f"{action}: nonce {sent.nonce} was used by another transaction "
                                     f"of {self.address}; this one will never be mined")
                await asyncio.sleep(self._poll_interval)
                continue
            now = loop.time()
            if now - last_broadcast >= self._stuck_after and bumps < self._max_bumps:
                bumps += 1
                await self._replace(sent, on_broadcast, action)
                last_broadcast = now
            elif now - last_resend >= self._stuck_after / 4 and not await self._known(sent.hashes[-1]):
                # Dropped from the node's pool (restart, eviction): the same bytes are still valid.
                # A resend is not a new fee, so a node that keeps dropping it still sees a bump later.
                log.warning("%s: tx %s dropped by the node; broadcasting it again", action,
                            sent.hashes[-1].to_0x_hex())
                await self._resend(sent, on_broadcast, action)
                last_resend = now
            await asyncio.sleep(self._poll_interval)

    async def _receipt(self, sent: SentTx) -> TxReceipt | None:
        for tx_hash in reversed(sent.hashes):
            try:
                return await self._w3.eth.get_transaction_receipt(tx_hash)
            except TransactionNotFound:
                continue
        return None

    async def _known(self, tx_hash: HexBytes) -> bool:
        try:
            await self._w3.eth.get_transaction(tx_hash)
        except TransactionNotFound:
            return False
        return True

    async def _confirmed(self, sent: SentTx, receipt: TxReceipt, deadline: float) -> TxReceipt | None:
        """Wait until ``receipt`` has enough blocks; None if it left the canonical chain meanwhile."""
        need = await self.confirmations()
        loop = asyncio.get_running_loop()
        block = int(receipt["blockNumber"])
        while int(await self._w3.eth.block_number) < block + need - 1:
            if loop.time() >= deadline + self._receipt_timeout:
                raise ChainError(f"tx {HexBytes(receipt['transactionHash']).to_0x_hex()} has not reached "
                                 f"{need} confirmations")
            await asyncio.sleep(self._poll_interval)
        if need == 1:
            return receipt
        again = await self._receipt(sent)
        return again if again is not None and again["blockHash"] == receipt["blockHash"] else None

    async def _resend(self, sent: SentTx, on_broadcast: OnBroadcast | None, action: str) -> None:
        try:
            await self._w3.eth.send_raw_transaction(sent.raw)
        except Web3RPCError as exc:
            text = str(exc).lower()
            if "already" in text or "nonce too low" in text:
                return  # known again, or mined: the next poll sees which
            if "fee" in text or "underpriced" in text:  # dropped for its price: offer today's fee
                await self._replace(sent, on_broadcast, action)
                return
            await self._give_back(sent)
            raise

    async def _replace(self, sent: SentTx, on_broadcast: OnBroadcast | None, action: str) -> None:
        """Re-sign the same nonce at a higher fee (at least today's), so the node prefers it."""
        tx = dict(sent.tx)
        fresh = await self._fees()
        for key in ("gasPrice", "maxFeePerGas", "maxPriorityFeePerGas"):
            if key in tx:
                tx[key] = max(math.ceil(int(tx[key]) * self._fee_bump), int(fresh.get(key, 0)))
        log.warning("%s: nonce %d unmined for %gs; replacing it at a higher fee", action, sent.nonce, self._stuck_after)
        before = (sent.tx, sent.raw)
        try:
            await self._broadcast(sent, tx, on_broadcast)
        except Web3RPCError as exc:  # e.g. mined meanwhile ("nonce too low"): keep waiting on what was sent
            sent.tx, sent.raw = before
            sent.hashes.pop()
            log.warning("%s: replacement refused: %s", action, exc)

    async def _give_back(self, sent: SentTx) -> None:
        """This nonce may be free again: let the next send re-read the node's pending count."""
        async with self._lock:
            self._next_nonce = None

    async def _explain_failure(
        self, tx: dict[str, Any], receipt: TxReceipt, abi: Sequence[Mapping[str, Any]], action: str
    ) -> AitbcError:
        """Replay a mined-but-failed tx as a call on the parent block to recover the reason."""
        tx_hash = HexBytes(receipt["transactionHash"]).to_0x_hex()
        call = {k: tx[k] for k in ("from", "to", "data", "value", "gas") if k in tx}
        try:
            await self._w3.eth.call(call, block_identifier=max(int(receipt["blockNumber"]) - 1, 0))  # type: ignore[arg-type]
        except CHAIN_EXCEPTIONS as exc:
            err = map_chain_error(exc, abi=abi, action=action)
            if isinstance(err, ContractRevertError):
                return ContractRevertError(f"{err} (tx {tx_hash})", reason=err.reason)
        if int(receipt["gasUsed"]) >= int(tx.get("gas", 0)):
            return ChainError(f"{action} ran out of gas (tx {tx_hash}, gas {receipt['gasUsed']})")
        return ContractRevertError(f"{action} reverted (tx {tx_hash})", reason=None)


def _describe(tx: Mapping[str, Any]) -> str:
    if tx.get("to") is None:
        return "contract deployment"
    data = tx.get("data")
    selector = HexBytes(data)[:4].hex() if data else ""
    return f"transaction to {tx['to']}" + (f" (selector 0x{selector})" if selector else "")
