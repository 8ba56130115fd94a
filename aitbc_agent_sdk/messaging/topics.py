"""Topic layout (documented in docs/protocol.md). Every topic starts with the protocol prefix."""

from __future__ import annotations

PREFIX = "aitbc/v1"


def offer(provider: str) -> str:
    return f"{PREFIX}/offers/{provider}"


OFFERS = f"{PREFIX}/offers/+"


def heartbeat(provider: str) -> str:
    return f"{PREFIX}/heartbeat/{provider}"


HEARTBEATS = f"{PREFIX}/heartbeat/+"


def negotiate(provider: str) -> str:
    return f"{PREFIX}/negotiate/{provider}"


def negotiate_reply(coordinator: str, contract_id: str) -> str:
    return f"{PREFIX}/negotiate-reply/{coordinator}/{contract_id}"


def jobs(provider: str) -> str:
    return f"{PREFIX}/jobs/{provider}"


def progress(training_id: str, job_id: str) -> str:
    return f"{PREFIX}/progress/{training_id}/{job_id}"


def all_progress(training_id: str) -> str:
    return f"{PREFIX}/progress/{training_id}/+"


def results(training_id: str) -> str:
    return f"{PREFIX}/results/{training_id}"


def cancel(provider: str) -> str:
    return f"{PREFIX}/cancel/{provider}"


def ping(provider: str) -> str:
    return f"{PREFIX}/ping/{provider}"


def pong(coordinator: str, nonce: str) -> str:
    return f"{PREFIX}/pong/{coordinator}/{nonce}"


def resend(provider: str) -> str:
    return f"{PREFIX}/resend/{provider}"
