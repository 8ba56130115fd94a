"""The shared base of the SDK's contract clients: encode calls, send through a sender, call views.

Subclasses only add typed methods; the signer lives in the :class:`TransactionSender` the caller
passes to each write.
"""

from __future__ import annotations

from typing import Any

from eth_typing import ChecksumAddress
from web3 import AsyncWeb3
from web3.types import TxParams, TxReceipt, Wei

from ._artifacts import ContractArtifact, load_artifact
from ._tx import CHAIN_EXCEPTIONS, TransactionSender, map_chain_error

__all__ = ["ContractClient"]


class ContractClient:
    """Reads and writes one deployed contract of the artifact named by ``ARTIFACT``."""

    ARTIFACT = ""

    def __init__(self, w3: AsyncWeb3, address: str, artifact: ContractArtifact | None = None) -> None:
        self._artifact = artifact or load_artifact(self.ARTIFACT)
        self._w3 = w3
        self.address: ChecksumAddress = AsyncWeb3.to_checksum_address(address)
        self._contract = w3.eth.contract(address=self.address, abi=self._artifact.abi)

    @property
    def abi(self) -> list[dict[str, Any]]:
        return self._artifact.abi

    def build(self, fn: str, *args: Any, value: int = 0) -> TxParams:
        """An unsigned ``{to, data, value}`` for any contract function; the sender fills the rest."""
        data = self._contract.encode_abi(fn, args=list(args))
        return {"to": self.address, "data": data, "value": Wei(value)}

    async def _transact(
        self, sender: TransactionSender, fn: str, args: list[Any], *, value: int = 0
    ) -> TxReceipt:
        tx = self.build(fn, *args, value=value)
        return await sender.send(tx, abi=self.abi, label=f"{self._artifact.name}.{fn}")

    async def _call(self, fn: str, *args: Any) -> Any:
        try:
            return await getattr(self._contract.functions, fn)(*args).call()
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, abi=self.abi, action=f"{self._artifact.name}.{fn}") from exc
