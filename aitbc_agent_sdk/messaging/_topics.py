"""Topic layout (documented in docs/protocol.md). Every topic starts with the protocol prefix.

Each builder checks the levels it is given: an id carrying ``/`` would move a message onto
another topic, and a wildcard or NUL would make the publish fail.
"""

from __future__ import annotations

from ..errors import UnsafeNameError

PREFIX = "aitbc/v1"
_FORBIDDEN = ("/", "+", "#", "\x00")


def level(value: str) -> str:
    """``value`` as one topic level; UnsafeNameError when empty or holding ``/``, ``+``, ``#`` or NUL."""
    if not isinstance(value, str) or not value or any(c in value for c in _FORBIDDEN):
        raise UnsafeNameError(f"{value!r} cannot be a topic level")
    return value


def offer(provider: str) -> str:
    return f"{PREFIX}/offers/{level(provider)}"


OFFERS = f"{PREFIX}/offers/+"


def heartbeat(provider: str) -> str:
    return f"{PREFIX}/heartbeat/{level(provider)}"


HEARTBEATS = f"{PREFIX}/heartbeat/+"


def negotiate(provider: str) -> str:
    return f"{PREFIX}/negotiate/{level(provider)}"


def negotiate_reply(coordinator: str, contract_id: str) -> str:
    return f"{PREFIX}/negotiate-reply/{level(coordinator)}/{level(contract_id)}"


def jobs(provider: str) -> str:
    return f"{PREFIX}/jobs/{level(provider)}"


def progress(training_id: str, job_id: str) -> str:
    return f"{PREFIX}/progress/{level(training_id)}/{level(job_id)}"


def all_progress(training_id: str) -> str:
    return f"{PREFIX}/progress/{level(training_id)}/+"


def results(training_id: str) -> str:
    return f"{PREFIX}/results/{level(training_id)}"


def cancel(provider: str) -> str:
    return f"{PREFIX}/cancel/{level(provider)}"


def ping(provider: str) -> str:
    return f"{PREFIX}/ping/{level(provider)}"


def pong(coordinator: str, nonce: str) -> str:
    return f"{PREFIX}/pong/{level(coordinator)}/{level(nonce)}"


def resend(provider: str) -> str:
    return f"{PREFIX}/resend/{level(provider)}"


def challenge(provider: str) -> str:
    """Spot checks: open segments of a committed trajectory."""
    return f"{PREFIX}/challenge/{level(provider)}"


def openings(training_id: str) -> str:
    return f"{PREFIX}/openings/{level(training_id)}"


def verify(provider: str) -> str:
    """Verification work: re-execute one segment of another worker's committed trajectory."""
    return f"{PREFIX}/verify/{level(provider)}"


def verified(training_id: str) -> str:
    return f"{PREFIX}/verified/{level(training_id)}"


def hardware_check(provider: str) -> str:
    """The timed hardware challenge at hiring."""
    return f"{PREFIX}/hwcheck/{level(provider)}"


def hardware_answer(coordinator: str, nonce: str) -> str:
    return f"{PREFIX}/hwcheck-reply/{level(coordinator)}/{level(nonce)}"


def receipts(provider: str) -> str:
    """The coordinator's signed payment receipts for a provider's accepted rounds."""
    return f"{PREFIX}/receipts/{level(provider)}"
