"""The coordinator's signed receipt for a provider's accepted rounds, redeemable from the escrow."""

from __future__ import annotations

from pydantic import Field

from ._base import Address, Id, Record

MAX_UINT64 = 2**64 - 1
MAX_UINT256 = 2**256 - 1


class PaymentReceipt(Record):
    """What the coordinator owes ``worker_id`` in ``training_id`` after accepting ``round``, in total.

    ``signature`` is the coordinator's EIP-191 signature over the escrow's ``receiptDigest``
    (``chain.escrow.sign_receipt``): the worker, or anyone, can redeem it on chain without the
    coordinator. Receipts are cumulative, so the newest supersedes every older one.
    """

    training_id: Id
    worker_id: Address
    round: int = Field(ge=1, le=MAX_UINT64)  # the contract's uint64
    cumulative_wei: int = Field(ge=0, le=MAX_UINT256)
    signature: str = Field(pattern=r"^0x[0-9a-fA-F]{130}$")
