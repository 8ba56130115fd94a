"""Messaging: the Bus port, its adapters, signed envelopes and the topic layout."""

from . import topics
from .channel import SignedChannel
from .envelope import Envelope, EnvelopeSigner, EnvelopeVerifier, Verified
from .memory import InMemoryBus
from .port import Bus, BusMessage, topic_matches

__all__ = [
    "Bus", "BusMessage", "Envelope", "EnvelopeSigner", "EnvelopeVerifier", "InMemoryBus",
    "SignedChannel", "Verified", "topic_matches", "topics",
]
