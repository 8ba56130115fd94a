"""Signed envelopes: every message carries its sender's Ethereum signature.

The signature (EIP-191 personal message) covers the topic, the sender, a nonce,
a timestamp, the message kind and the payload, so a message cannot be moved to
another topic, replayed, or kept back and delivered late. A message its sender published
as retained (a state such as an offer, meant for every later subscriber) says so under the
signature, so nobody can turn a captured one-off message into a retained one.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import SignatureError
from ..records import Address
from ._replay import MemorySeen, SeenStore

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
    retained: bool = False

    def signing_text(self) -> str:
        return canonical_text(self.topic, self.sender, self.nonce, self.sent_at, self.kind, self.payload,
                              retained=self.retained)


def canonical_text(topic: str, sender: str, nonce: int, sent_at: float, kind: str, payload: dict[str, Any],
                   *, retained: bool = False) -> str:
    body: dict[str, Any] = {"kind": kind, "nonce": nonce, "payload": payload, "sender": sender,
                            "sent_at": sent_at, "topic": topic}
    if retained:  # only then, so the text of every other message is unchanged
        body["retained"] = True
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

    def seal(self, topic: str, message: BaseModel, *, retain: bool = False) -> bytes:
        payload = message.model_dump(mode="json")
        nonce = self._next_nonce()
        sent_at = round(time.time(), 6)
        kind = type(message).__name__
        text = canonical_text(topic, self.address, nonce, sent_at, kind, payload, retained=retain)
        signature = self._account.sign_message(encode_defunct(text=text)).signature.hex()
        envelope = Envelope(
            topic=topic, sender=self.address, nonce=nonce, sent_at=sent_at,
            kind=kind, payload=payload, signature=signature, retained=retain,
        )
        return envelope.model_dump_json(exclude=None if retain else {"retained"}).encode()


@dataclass(frozen=True)
class Verified(Generic[M]):
    sender: str
    topic: str
    message: M
    sent_at: float
    nonce: int = 0
    retained: bool = False


@dataclass
class EnvelopeVerifier:
    """Checks signature, topic binding, freshness and replays; counts every drop by reason.

    ``max_age_s`` is the clock-skew window (``BusSettings.clock_skew_s``): older messages are
    stale, and accepted nonces are remembered in ``seen`` for that long. Give ``seen`` a
    ``SqliteSeen`` so that a restarted verifier still refuses what it accepted before.
    """

    max_age_s: float = 120.0
    max_future_s: float = 5.0
    dropped: Counter[str] = field(default_factory=Counter)
    seen: SeenStore = field(default_factory=MemorySeen)

    def open(self, topic: str, raw: bytes, model: type[M], *, now: float | None = None,
             check_replay: bool = True, retained: bool = False) -> Verified[M]:
        """Return the verified message or raise SignatureError (and count the reason).

        ``retained``: the broker delivered it as a retained message. Only a message its
        sender sealed as retained may arrive that way; anything else is a captured message
        republished with the retain flag. ``check_replay=False`` skips the seen-nonce check,
        for a retained state message that the caller deduplicates per subscription.
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
        if retained and not envelope.retained:
            raise self._drop("retained_replay", f"a one-off {envelope.kind} delivered as a retained message")
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
        if check_replay and self.seen.contains(envelope.sender, envelope.nonce):
            raise self._drop("replayed", f"nonce {envelope.nonce} from {envelope.sender} seen before")
        try:
            message = model.model_validate(envelope.payload)
        except ValidationError as exc:
            raise self._drop("invalid", f"invalid {model.__name__}: {exc.errors()[0]['msg']}") from exc
        self.seen.add(envelope.sender, envelope.nonce, envelope.sent_at)
        # Anything older than the freshness window is rejected as stale anyway, so forget it.
        self.seen.forget_before(now - self.max_age_s)
        return Verified(sender=envelope.sender, topic=topic, message=message, sent_at=envelope.sent_at,
                        nonce=envelope.nonce, retained=envelope.retained)

    def _drop(self, reason: str, detail: str) -> SignatureError:
        self.dropped[reason] += 1
        return SignatureError(f"dropped message ({reason}): {detail}")
