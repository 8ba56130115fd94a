"""Revert decoding and the mapping of web3 / eth-tester / transport errors onto the SDK's errors."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from eth_abi import decode as abi_decode
from eth_abi.exceptions import DecodingError
from eth_utils import ValidationError as EthValidationError
from eth_utils.abi import abi_to_signature, function_signature_to_4byte_selector, get_abi_input_types
from hexbytes import HexBytes
from web3.exceptions import (
    ContractLogicError,
    ContractPanicError,
    ProviderConnectionError,
    TimeExhausted,
    Web3Exception,
    Web3RPCError,
)

from aitbc_agent_sdk.errors import (
    AitbcError, ChainError, ChainUnreachableError, ContractRevertError, InsufficientFundsError,
)

__all__ = ["CHAIN_EXCEPTIONS", "decode_revert_data", "map_chain_error"]

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
        return ChainUnreachableError(f"{action}: RPC node unreachable or not answering ({type(exc).__name__}: {text})")
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
