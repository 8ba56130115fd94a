"""Signing, nonces, gas and fees for one local account, plus chain-error mapping.

The sender is the only object in the chain package that holds a signer; contract
wrappers build ``{"to", "data", "value"}`` dicts and hand them to :meth:`TransactionSender.send`.
"""

from __future__ import annotations

import ast
import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from eth_abi import decode as abi_decode
from eth_abi.exceptions import DecodingError
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils import ValidationError as EthValidationError
from eth_utils.abi import abi_to_signature, function_signature_to_4byte_selector, get_abi_input_types
from hexbytes import HexBytes
from web3 import AsyncWeb3
from web3.exceptions import (
    ContractLogicError,
    ContractPanicError,
    ProviderConnectionError,
    TimeExhausted,
    Web3Exception,
    Web3RPCError,
)
from web3.types import TxParams, TxReceipt

from aitbc_agent_sdk.errors import (
    AitbcError,
    ChainError,
    ConfigError,
    ContractRevertError,
    InsufficientFundsError,
)

__all__ = ["CHAIN_EXCEPTIONS", "TransactionSender", "decode_revert_data", "map_chain_error"]

_ERROR_STRING = bytes.fromhex("08c379a0")  # Error(string)
_PANIC = bytes.fromhex("4e487b71")  # Panic(uint256)
_REVERT_PREFIX = "execution reverted"
_FUNDS_MARKERS = ("insufficient funds", "cannot afford", "not have enough balance")

try:  # eth-tester is a dev dependency; without it its error simply never occurs
    from eth_tester.exceptions import TransactionFailed as _TesterTxFailed
except ImportError:  # pragma: no cover
    _TesterTxFailed = None


def decode_revert_data(data: bytes, abi: Sequence[Mapping[str, Any]] = ()) -> tuple[str, str]:
    """Decode revert bytes into ``(reason, detail)``.

    ``reason`` is the custom error name (``"OverRelease"``), the ``Error(string)`` text,
    or ``"Panic(0x11)"``; ``detail`` adds the decoded arguments for humans.
    """
    selector, payload = bytes(data[:4]), bytes(data[4:])
    try:
        if selector == _ERROR_STRING:
            (text,) = abi_decode(["string"], payload)
            return text, text
        if selector == _PANIC:
            (code,) = abi_decode(["uint256"], payload)
            return f"Panic({code:#x})", f"Panic({code:#x})"
        for entry in abi:
            if entry.get("type") != "error":
                continue
            signature = abi_to_signature(entry)  # type: ignore[arg-type]
            if function_signature_to_4byte_selector(signature) != selector:
                continue
            values = abi_decode(get_abi_input_types(entry), payload)  # type: ignore[arg-type]
            names = [i.get("name") or f"arg{n}" for n, i in enumerate(entry.get("inputs", []))]
            args = ", ".join(f"{k}={_fmt(v)}" for k, v in zip(names, values))
            return entry["name"], f"{entry['name']}({args})"
    except DecodingError:
        pass
    if not data:
        return "reverted without reason", "reverted without reason"
    return f"unknown error 0x{selector.hex()}", f"unknown error data 0x{bytes(data).hex()}"


def _fmt(value: Any) -> str:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return str(value)


def _revert_bytes(exc: BaseException) -> bytes | None:
    """Raw revert data from web3's ContractLogicError or eth-tester's TransactionFailed."""
    if isinstance(exc, ContractLogicError) and isinstance(exc.data, str) and exc.data.startswith("0x"):
        return bytes(HexBytes(exc.data))
    text = str(exc.args[0]) if exc.args else ""
    # eth-tester puts the revert bytes' Python repr after the prefix: "execution reverted: b'\xed...'"
    _, _, tail = text.partition(f"{_REVERT_PREFIX}: ")
    if tail[:2] in ("b'", 'b"'):
        try:
            value = ast.literal_eval(tail)
        except (ValueError, SyntaxError):
            return None
        return value if isinstance(value, bytes) else None
    return None


def map_chain_error(
    exc: BaseException, *, abi: Sequence[Mapping[str, Any]] = (), action: str = "chain call"
) -> AitbcError:
    """Map a web3 / eth-tester / transport error onto the SDK's most specific error."""
    if isinstance(exc, AitbcError):
        return exc
    text = str(exc)
    if any(marker in text.lower() for marker in _FUNDS_MARKERS):
        return InsufficientFundsError(f"{action}: insufficient funds ({text})")
    if isinstance(exc, ContractLogicError) or (
        _TesterTxFailed is not None and isinstance(exc, _TesterTxFailed)
    ):
        data = _revert_bytes(exc)
        if data is not None:
            reason, detail = decode_revert_data(data, abi)
        elif isinstance(exc, ContractPanicError):
            reason = detail = exc.message or text
        else:
            reason = detail = text.removeprefix(f"{_REVERT_PREFIX}: ").removeprefix(_REVERT_PREFIX).strip()
            reason = reason or "reverted without reason"
        return ContractRevertError(f"{action} reverted: {detail}", reason=reason)
    if isinstance(exc, TimeExhausted):
        return ChainError(f"{action}: {text}")
    if isinstance(exc, aiohttp.ClientError | ProviderConnectionError | OSError | asyncio.TimeoutError):
        return ChainError(f"{action}: RPC node unreachable or not answering ({type(exc).__name__}: {text})")
    if isinstance(exc, Web3RPCError | Web3Exception | EthValidationError):
        return ChainError(f"{action} failed: {text}")
    return ChainError(f"{action} failed unexpectedly: {type(exc).__name__}: {text}")


# What web3, eth-tester and the HTTP transport raise for chain trouble; mapped, never leaked.
CHAIN_EXCEPTIONS: tuple[type[BaseException], ...] = (
    Web3Exception,
    EthValidationError,
    aiohttp.ClientError,
    OSError,
    asyncio.TimeoutError,
) + ((_TesterTxFailed,) if _TesterTxFailed is not None else ())


class TransactionSender:
    """Signs and sends transactions for one account; safe for concurrent ``send`` calls.

    Nonces come from a local counter seeded from the node's pending count, so several
    coroutines can send back to back without waiting for each other's receipts.
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
    ) -> None:
        if gas_margin < 1.0:
            raise ConfigError("gas_margin must be >= 1.0")
        self._w3 = w3
        self._account = account
        self._gas_margin = gas_margin
        self._receipt_timeout = receipt_timeout
        self._poll_interval = poll_interval
        self._default_priority_fee = default_priority_fee
        self._lock = asyncio.Lock()
        self._next_nonce: int | None = None
        self._chain_id: int | None = None

    @property
    def address(self) -> ChecksumAddress:
        return self._account.address

    @property
    def w3(self) -> AsyncWeb3:
        return self._w3

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
    ) -> TxReceipt:
        """Fill, sign and broadcast ``tx``; return its receipt once mined.

        ``abi`` is used to decode custom errors and ``label`` names the action in error
        messages (e.g. ``"TrainingEscrow.release"``). Raises ContractRevertError when the call
        would revert (caught at gas estimation) or the mined receipt has status 0.
        """
        action = label or _describe(tx)
        try:
            filled = await self._fill(dict(tx))
            tx_hash = await self._sign_and_broadcast(filled)
            receipt = await self._w3.eth.wait_for_transaction_receipt(
                tx_hash,
                timeout=self._receipt_timeout if timeout is None else timeout,
                poll_latency=self._poll_interval,
            )
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, abi=abi, action=action) from exc
        if receipt["status"] != 1:
            raise await self._explain_failure(filled, receipt, abi, action)
        return receipt

    async def reset_nonce(self) -> None:
        """Forget the local nonce; the next send re-reads the node's pending count."""
        async with self._lock:
            self._next_nonce = None

    async def _fill(self, tx: dict[str, Any]) -> dict[str, Any]:
        eth = self._w3.eth
        tx["from"] = self.address
        tx.setdefault("value", 0)
        if self._chain_id is None:
            self._chain_id = int(await eth.chain_id)
        tx["chainId"] = self._chain_id
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

    async def _sign_and_broadcast(self, tx: dict[str, Any]) -> HexBytes:
        async with self._lock:
            if self._next_nonce is None:
                self._next_nonce = int(await self._w3.eth.get_transaction_count(self.address, "pending"))
            tx["nonce"] = self._next_nonce
            signed = self._account.sign_transaction(tx)
            try:
                tx_hash = await self._w3.eth.send_raw_transaction(signed.raw_transaction)
            except BaseException:
                # The node may or may not have taken it; re-read the pending count next time.
                self._next_nonce = None
                raise
            self._next_nonce += 1
            return tx_hash

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
