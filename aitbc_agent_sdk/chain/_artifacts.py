"""Compiled contract artifacts shipped with the package, and deployment."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from eth_typing import ChecksumAddress
from web3 import AsyncWeb3
from web3.types import Wei

from aitbc_agent_sdk.errors import ChainError, ConfigError, NotFoundError

from ._tx import TransactionSender

__all__ = ["ContractArtifact", "deploy", "load_artifact"]


@dataclass(frozen=True)
class ContractArtifact:
    """One contract as written by ``contracts/build.mjs``."""

    name: str
    abi: list[dict[str, Any]]
    bytecode: str
    deployed_bytecode: str
    compiler_version: str
    source_sha256: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ContractArtifact:
        try:
            return cls(
                name=data["contractName"],
                abi=list(data["abi"]),
                bytecode=data["bytecode"],
                deployed_bytecode=data["deployedBytecode"],
                compiler_version=data["compiler"]["version"],
                source_sha256=data["sourceSha256"],
            )
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"malformed contract artifact: missing {exc}") from exc

    @classmethod
    def from_file(cls, path: Path) -> ContractArtifact:
        """Load an artifact outside the package (e.g. the tests-only contracts)."""
        try:
            return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
        except OSError as exc:
            raise NotFoundError(f"cannot read contract artifact {path}: {exc}") from exc


def load_artifact(name: str = "TrainingEscrow") -> ContractArtifact:
    """Load a shipped artifact by contract name from ``aitbc_agent_sdk/chain/artifacts``."""
    ref = resources.files("aitbc_agent_sdk.chain").joinpath("artifacts", f"{name}.json")
    try:
        text = ref.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NotFoundError(f"no contract artifact named {name!r}; run scripts/build_contracts.sh") from exc
    return ContractArtifact.from_json(json.loads(text))


async def deploy(
    sender: TransactionSender, artifact: ContractArtifact, *args: Any, value: int = 0
) -> ChecksumAddress:
    """Deploy ``artifact`` with constructor ``args`` from the sender's account."""
    factory = sender.w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
    data = factory.constructor(*args).data_in_transaction
    receipt = await sender.send(
        {"data": data, "value": Wei(value)},
        abi=artifact.abi,
        label=f"deploy {artifact.name}",
    )
    address = receipt.get("contractAddress")
    if address is None:
        raise ChainError(f"deploy {artifact.name}: receipt has no contract address")
    return AsyncWeb3.to_checksum_address(address)
