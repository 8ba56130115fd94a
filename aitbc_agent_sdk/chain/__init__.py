"""On-chain side of the SDK: wallets, transaction sending, the escrow contract, dev chains."""

from .artifacts import ContractArtifact, deploy, load_artifact
from .devchain import DevChain, connect_rpc, start_embedded_chain
from .escrow import EscrowClient, EscrowEvent, EscrowState, SlotState, result_hash, training_key
from .tx import TransactionSender, decode_revert_data, map_chain_error
from .wallet import Wallet, WalletStore

__all__ = [
    "ContractArtifact",
    "DevChain",
    "EscrowClient",
    "EscrowEvent",
    "EscrowState",
    "SlotState",
    "TransactionSender",
    "Wallet",
    "WalletStore",
    "connect_rpc",
    "decode_revert_data",
    "deploy",
    "load_artifact",
    "map_chain_error",
    "result_hash",
    "start_embedded_chain",
    "training_key",
]
