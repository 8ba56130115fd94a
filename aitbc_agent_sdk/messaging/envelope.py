"""Signed envelopes: every message carries its sender's Ethereum signature.

The signature (EIP-191 personal message) covers the topic, the sender, a nonce,
a timestamp, the message kind and the payload, so a message cannot be moved to
another topic, replayed, or kept back and delivered late.
"""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import SignatureError
from ..models import Address

M = TypeVar("M", bound=BaseModel)


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str
    sender: Address
    nonce: int
    sent_at: float
    kind: str
    payload: dict[str, Any]
    signature: str

    def signing_text(self) -> str:
        return canonical_text(self.topic, self.sender, self.nonce, self.sent_at, self.kind, self.payload)


def canonical_text(topic: str, sender: str, nonce: int, sent_at: float, kind: str, payload: dict[str, Any]) -> str:
    body = {"kind": kind, "nonce": nonce, "payload": payload, "sender": sender, "sent_at": sent_at, "topic": topic}
    return "aitbc-envelope-v1:" + json.dumps(body, sort_keys=True, separators=(",", ":"))


class EnvelopeSigner:
    """Signs messages for one account. Nonces grow with wall time, so a restart never reuses one."""

    def __init__(self, account: LocalAccount) -> None:
        self._account = account
        self._last_nonce = 0

    @property
    def address(self) -> str:
        return self._account.address

    def _next_nonce(self) -> int:
        self._last_nonce = max(self._last_nonce + 1, time.time_ns() // 1000)
        return self._last_nonce

    def seal(self, topic: str, message: BaseModel) -> bytes:
        payload = message.model_dump(mode="json")
        nonce = self._next_nonce()
        sent_at = round(time.time(), 6)
        kind = type(message).__name__
        text = canonical_text(topic, self.address, nonce, sent_at, kind, payload)
        signature = self._account.sign_message(encode_defunct(text=text)).signature.hex()
        envelope = Envelope(
            topic=topic, sender=self.address, nonce=nonce, sent_at=sent_at,
            kind=kind, payload=payload, signature=signature,
        )
        return envelope.model_dump_json().encode()


@dataclass(frozen=True)
class Verified(Generic[M]):
    sender: str
    topic: str
    message: M
    sent_at: float


@dataclass
class EnvelopeVerifier:
    """Checks signature, topic binding, freshness and replays; counts every drop by reason."""

    max_age_s: float = 120.0
    max_future_s: float = 5.0
    dropped: Counter[str] = field(default_factory=Counter)
    _seen: set[tuple[str, int]] = field(default_factory=set)
    _seen_order: deque[tuple[float, str, int]] = field(default_factory=deque)

    def open(self, topic: str, raw: bytes, model: type[M], *, now: float | None = None,
             check_replay: bool = True) -> Verified[M]:
        """Return the verified message or raise SignatureError (and count the reason).

        Retained messages are legitimately delivered again to each new subscriber, so
        their replay check is skipped; freshness still applies.
        """
        now = time.time() if now is None else now
        try:
            envelope = Envelope.model_validate_json(raw)
        except ValidationError as exc:
            raise self._drop("malformed", f"not a signed envelope on {topic}") from exc
        if envelope.topic != topic:
            raise self._drop("wrong_topic", f"envelope for {envelope.topic} arrived on {topic}")
        if envelope.kind != model.__name__:
            raise self._drop("wrong_kind", f"expected {model.__name__}, got {envelope.kind}")
        try:
            signer = Account.recover_message(encode_defunct(text=envelope.signing_text()),
                                             signature=envelope.signature)
        except Exception as exc:  # eth-keys raises several unrelated types for garbage input
            raise self._drop("forged", "signature does not recover") from exc
        if signer != envelope.sender:
            raise self._drop("forged", f"signed by {signer}, claims {envelope.sender}")
        if envelope.sent_at > now + self.max_future_s:
            raise self._drop("future", "timestamp is in the future")
        if envelope.sent_at < now - self.max_age_s:
            raise self._drop("stale", f"older than {self.max_age_s:.0f}s")
        key = (envelope.sender, envelope.nonce)
        if check_replay and key in self._seen:
            raise self._drop("replayed", f"nonce {envelope.nonce} from {envelope.sender} seen before")
        try:
            message = model.model_validate(envelope.payload)
        except ValidationError as exc:
            raise self._drop("invalid", f"invalid {model.__name__}: {exc.errors()[0]['msg']}") from exc
        self._remember(key, envelope.sent_at, now)
        return Verified(sender=envelope.sender, topic=topic, message=message, sent_at=envelope.sent_at)

    def _remember(self, key: tuple[str, int], sent_at: float, now: float) -> None:
        self._seen.add(key)
        self._seen_order.append((sent_at, *key))
        # Anything older than the freshness window is rejected as stale anyway, so forget it.
        while self._seen_order and self._seen_order[0][0] < now - self.max_age_s:
            _, sender, nonce = self._seen_order.popleft()
            self._seen.discard((sender, nonce))

    def _drop(self, reason: str, detail: str) -> SignatureError:
        self.dropped[reason] += 1
        return SignatureError(f"dropped message ({reason}): {detail}")
