"""On-chain side of the SDK: wallets, transaction sending, the escrow and registry contracts, dev chains."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "artifacts": ("ContractArtifact", "deploy", "load_artifact"),
    "devchain": ("DevChain", "connect_rpc", "start_embedded_chain"),
    "escrow": ("ETH_TOKEN", "EscrowClient", "EscrowEvent", "EscrowState", "HeldFunds", "SlotState", "consent_digest",
               "consent_signer", "receipt_digest", "receipt_signer", "result_hash", "sign_consent", "sign_receipt",
               "training_key", "training_salt"),
    "registry": ("EvidenceDomain", "ProviderState", "RegistryClient", "SlashEvidence", "is_canonical_signature",
                 "result_digest", "sign_result", "signature_signer"),
    "tx": ("TransactionSender", "decode_revert_data", "map_chain_error", "CHAIN_EXCEPTIONS"),
    "wallet": ("Wallet", "WalletStore"),
}, globals())

if TYPE_CHECKING:
    from .artifacts import ContractArtifact, deploy, load_artifact
    from .devchain import DevChain, connect_rpc, start_embedded_chain
    from .escrow import (ETH_TOKEN, EscrowClient, EscrowEvent, EscrowState, HeldFunds, SlotState, consent_digest,
                         consent_signer, receipt_digest, receipt_signer, result_hash, sign_consent, sign_receipt,
                         training_key, training_salt)
    from .registry import (EvidenceDomain, ProviderState, RegistryClient, SlashEvidence, is_canonical_signature,
                           result_digest, sign_result, signature_signer)
    from .tx import TransactionSender, decode_revert_data, map_chain_error
    from .wallet import Wallet, WalletStore
    from .tx import CHAIN_EXCEPTIONS
