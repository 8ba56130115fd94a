"""What a provider checks on chain before it works for anybody, and what it signs.

A proposal on the bus proves only that some key sent it. Before the first job of a contract
the provider reads the escrow: the training must exist, be open, be paid in native ETH, have
the proposal's sender as its coordinator, and hold a slot for this provider funded with at
least its price for the contract's rounds. The verdict is cached per contract, so the chain
is read once. The decision itself is a pure function (:func:`contract_problem`).
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_account.signers.local import LocalAccount
from web3 import AsyncWeb3

from ..chain.escrow import ETH_TOKEN, EscrowClient, EscrowState, SlotState, sign_consent, training_key
from ..chain.registry import EvidenceDomain, sign_result
from ..models import ContractProposal

__all__ = ["ProviderChain", "contract_problem"]


def contract_problem(proposal: ContractProposal, provider: str, state: EscrowState, slot: SlotState) -> str | None:
    """Why the provider must not work under ``proposal``, or None when the chain backs it."""
    if not state.exists:
        return f"training {proposal.training_id} does not exist on chain"
    if state.coordinator.lower() != proposal.coordinator.lower():
        return f"training {proposal.training_id} on chain belongs to {state.coordinator}, not {proposal.coordinator}"
    if state.closed:
        return f"training {proposal.training_id} is closed on chain"
    if state.token != ETH_TOKEN:
        return f"training {proposal.training_id} pays in token {state.token}, not in ETH"
    owed = proposal.price_wei * proposal.rounds
    if slot.amount - slot.paid < owed:
        return (f"slot of {provider} in training {proposal.training_id} holds {slot.amount - slot.paid} wei unpaid, "
                f"less than {owed} wei ({proposal.rounds} rounds at {proposal.price_wei})")
    return None


@dataclass
class ProviderChain:
    """The provider's read-only view of one escrow deployment (no signer: it never transacts here)."""

    escrow: EscrowClient
    domain: EvidenceDomain

    @classmethod
    async def connect(cls, w3: AsyncWeb3, escrow_address: str) -> ProviderChain:
        escrow = EscrowClient(w3, escrow_address)
        return cls(escrow, EvidenceDomain(await escrow.chain_id(), await escrow.registry()))

    def key(self, proposal: ContractProposal) -> bytes:
        return training_key(proposal.coordinator, proposal.training_id)

    def consent(self, account: LocalAccount, proposal: ContractProposal) -> str:
        """``0x``-hex consent to a slot in the proposal's training (and only under its coordinator)."""
        return "0x" + sign_consent(account, self.domain.chain_id, self.escrow.address, self.key(proposal)).hex()

    def sign_result(self, account: LocalAccount, proposal: ContractProposal, round: int, cid: str) -> str:
        """``0x``-hex evidence over (chain, registry, training, round, CID)."""
        return "0x" + sign_result(account, self.domain, self.key(proposal), round, cid).hex()

    async def closed(self, training_id: str, coordinator: str) -> bool:
        """Whether the chain shows this coordinator's training closed (settled or refunded)."""
        return (await self.escrow.training(training_key(coordinator, training_id))).closed

    async def check(self, proposal: ContractProposal, provider: str) -> str | None:
        """Read the training and the provider's slot; None when it may work under ``proposal``."""
        key = self.key(proposal)
        return contract_problem(proposal, provider, await self.escrow.training(key), await self.escrow.slot(key, provider))
