"""On-chain side of the SDK: wallets, transaction sending, the escrow and registry contracts, dev chains."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "_artifacts": ("ContractArtifact", "deploy", "load_artifact"),
    "_devchain": ("DevChain", "connect_rpc", "start_embedded_chain"),
    "_escrow": ("ETH_TOKEN", "EscrowClient", "EscrowEvent", "EscrowState", "HeldFunds", "SlotState", "consent_digest",
               "consent_signer", "receipt_digest", "receipt_signer", "result_hash", "sign_consent", "sign_receipt",
               "training_key", "training_salt"),
    "_registry": ("EvidenceDomain", "ProviderState", "RegistryClient", "SlashEvidence", "is_canonical_signature",
                 "result_digest", "sign_result", "signature_signer"),
    "_tx": ("TransactionSender", "decode_revert_data", "map_chain_error", "CHAIN_EXCEPTIONS"),
    "_wallet": ("Wallet", "WalletStore"),
}, globals())

if TYPE_CHECKING:
    from ._artifacts import ContractArtifact, deploy, load_artifact
    from ._devchain import DevChain, connect_rpc, start_embedded_chain
    from ._escrow import (ETH_TOKEN, EscrowClient, EscrowEvent, EscrowState, HeldFunds, SlotState, consent_digest,
                         consent_signer, receipt_digest, receipt_signer, result_hash, sign_consent, sign_receipt,
                         training_key, training_salt)
    from ._registry import (EvidenceDomain, ProviderState, RegistryClient, SlashEvidence, is_canonical_signature,
                           result_digest, sign_result, signature_signer)
    from ._tx import TransactionSender, decode_revert_data, map_chain_error
    from ._wallet import Wallet, WalletStore
    from ._tx import CHAIN_EXCEPTIONS
