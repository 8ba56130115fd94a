"""What a provider checks on chain before it works for anybody, and what it signs.

A proposal on the bus proves only that some key sent it. Before the first job of a contract
the provider reads the escrow: the training must exist, be open, be paid in native ETH, have
the proposal's sender as its coordinator, and hold a slot for this provider funded with at
least its price for the contract's rounds. The verdict is cached per contract, so the chain
is read once. The decision itself is a pure function (:func:`contract_problem`).

The coordinator's payment receipts are checked here too (:meth:`ProviderChain.receipt_ok`), and redeemed
with the provider's own account when it is owed (:meth:`ProviderChain.redeem`, ``provider.receipts``); a
training left open past its deadline and grace period is first refunded by the provider
(:meth:`ProviderChain.refund`), which anyone may do then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eth_account.signers.local import LocalAccount
from web3 import AsyncWeb3

from ..chain._escrow import (ETH_TOKEN, GRACE_PERIOD_S, EscrowClient, EscrowState, HeldFunds, SlotState, receipt_signer,
                            sign_consent, training_key)
from ..chain._registry import EvidenceDomain, sign_result
from ..chain._tx import CHAIN_EXCEPTIONS, TransactionSender, map_chain_error
from ..errors import ConfigError
from ..records import ContractProposal, PaymentReceipt

__all__ = ["GRACE_PERIOD_S", "ProviderChain", "SlotView", "contract_problem"]


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


@dataclass(frozen=True)
class SlotView:
    """One escrow slot and its training as the chain shows them now (``now``: the latest block's time)."""

    state: EscrowState
    slot: SlotState
    held: HeldFunds
    now: int


@dataclass
class ProviderChain:
    """The provider's view of one escrow deployment; it transacts only to redeem its own receipts."""

    escrow: EscrowClient
    domain: EvidenceDomain
    w3: AsyncWeb3 | None = None  # redeeming needs it; a read-only view does not
    confirmations: int | None = None  # of its transactions (None: the chain's default)
    _senders: dict[str, TransactionSender] = field(default_factory=dict, repr=False)  # one per account: its nonces

    @classmethod
    async def connect(cls, w3: AsyncWeb3, escrow_address: str, *, confirmations: int | None = None) -> ProviderChain:
        escrow = EscrowClient(w3, escrow_address)
        return cls(escrow, EvidenceDomain(await escrow.chain_id(), await escrow.registry()), w3, confirmations)

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

    def receipt_ok(self, receipt: PaymentReceipt, coordinator: str) -> bool:
        """Whether ``receipt`` is ``coordinator``'s canonical signature for its training on this chain and
        escrow, to this worker, round and amount: exactly what ``redeem`` accepts from an EOA coordinator."""
        signer = receipt_signer(self.domain.chain_id, self.escrow.address,
                                training_key(coordinator, receipt.training_id), receipt.worker_id, receipt.round,
                                receipt.cumulative_wei, bytes.fromhex(receipt.signature[2:]))
        return signer is not None and signer.lower() == coordinator.lower()

    async def slot_view(self, key: bytes, worker: str) -> SlotView:
        try:
            now = int((await self.rpc.eth.get_block("latest"))["timestamp"])
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, action="read the latest block") from exc
        return SlotView(await self.escrow.training(key), await self.escrow.slot(key, worker),
                        await self.escrow.held(key), now)

    async def redeem(self, account: LocalAccount, key: bytes, receipt: PaymentReceipt) -> str:
        """Send the receipt to the escrow from the provider's own account; returns the tx hash."""
        tx = await self.escrow.redeem(self._sender(account), key, receipt.worker_id, receipt.round,
                                      receipt.cumulative_wei, bytes.fromhex(receipt.signature[2:]))
        return tx["transactionHash"].to_0x_hex()

    async def refund(self, account: LocalAccount, key: bytes) -> str:
        """Close an overdue training from the provider's own account (the slots' unpaid part stays held for
        receipts); returns the tx hash."""
        tx = await self.escrow.refund(self._sender(account), key)
        return tx["transactionHash"].to_0x_hex()

    @property
    def rpc(self) -> AsyncWeb3:
        if self.w3 is None:
            raise ConfigError("this provider's chain view has no RPC connection to transact with")
        return self.w3

    def _sender(self, account: LocalAccount) -> TransactionSender:
        if account.address not in self._senders:
            self._senders[account.address] = TransactionSender(self.rpc, account, confirmations=self.confirmations)
        return self._senders[account.address]

    async def check(self, proposal: ContractProposal, provider: str) -> str | None:
        """Read the training and the provider's slot; None when it may work under ``proposal``."""
        key = self.key(proposal)
        return contract_problem(proposal, provider, await self.escrow.training(key), await self.escrow.slot(key, provider))
