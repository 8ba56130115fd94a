import json

import pytest
from eth_account import Account

from aitbc_agent_sdk.errors import SignatureError
from aitbc_agent_sdk.messaging import EnvelopeSigner, EnvelopeVerifier
from aitbc_agent_sdk.records import Heartbeat

TOPIC = "aitbc/v1/heartbeat/x"


@pytest.fixture
def alice():
    return Account.create()


def beat(account) -> Heartbeat:
    return Heartbeat(provider=account.address, sent_at=1.0, busy_jobs=0)


def test_a_signed_message_verifies(alice):
    raw = EnvelopeSigner(alice).seal(TOPIC, beat(alice))
    verified = EnvelopeVerifier().open(TOPIC, raw, Heartbeat)
    assert verified.sender == alice.address
    assert verified.message == beat(alice)


def tamper(raw: bytes, **changes) -> bytes:
    body = json.loads(raw)
    for key, value in changes.items():
        if key == "busy_jobs":
            body["payload"]["busy_jobs"] = value
        else:
            body[key] = value
    return json.dumps(body).encode()


def test_a_changed_payload_is_dropped_as_forged(alice):
    verifier = EnvelopeVerifier()
    raw = tamper(EnvelopeSigner(alice).seal(TOPIC, beat(alice)), busy_jobs=7)
    with pytest.raises(SignatureError, match="forged"):
        verifier.open(TOPIC, raw, Heartbeat)
    assert verifier.dropped["forged"] == 1


def test_claiming_another_sender_is_dropped(alice):
    mallory = Account.create()
    raw = tamper(EnvelopeSigner(mallory).seal(TOPIC, beat(alice)), sender=alice.address)
    with pytest.raises(SignatureError, match="forged"):
        EnvelopeVerifier().open(TOPIC, raw, Heartbeat)


def test_a_replayed_message_is_dropped_once_seen(alice):
    verifier = EnvelopeVerifier()
    raw = EnvelopeSigner(alice).seal(TOPIC, beat(alice))
    verifier.open(TOPIC, raw, Heartbeat)
    with pytest.raises(SignatureError, match="replayed"):
        verifier.open(TOPIC, raw, Heartbeat)
    # a retained message is delivered again legitimately
    verifier.open(TOPIC, raw, Heartbeat, check_replay=False)
    assert verifier.dropped == {"replayed": 1}


def test_stale_and_future_messages_are_dropped(alice):
    verifier = EnvelopeVerifier(max_age_s=60)
    raw = EnvelopeSigner(alice).seal(TOPIC, beat(alice))
    sent = json.loads(raw)["sent_at"]
    with pytest.raises(SignatureError, match="stale"):
        verifier.open(TOPIC, raw, Heartbeat, now=sent + 61)
    with pytest.raises(SignatureError, match="future"):
        verifier.open(TOPIC, raw, Heartbeat, now=sent - 10)
    assert verifier.dropped == {"stale": 1, "future": 1}


def test_a_message_moved_to_another_topic_is_dropped(alice):
    raw = EnvelopeSigner(alice).seal(TOPIC, beat(alice))
    with pytest.raises(SignatureError, match="wrong_topic"):
        EnvelopeVerifier().open("aitbc/v1/heartbeat/y", raw, Heartbeat)
    # rewriting the topic field too breaks the signature
    with pytest.raises(SignatureError, match="forged"):
        EnvelopeVerifier().open("aitbc/v1/heartbeat/y", tamper(raw, topic="aitbc/v1/heartbeat/y"), Heartbeat)


def test_unsigned_and_garbage_input_is_dropped(alice):
    verifier = EnvelopeVerifier()
    with pytest.raises(SignatureError, match="malformed"):
        verifier.open(TOPIC, b'{"provider": "x"}', Heartbeat)
    raw = tamper(EnvelopeSigner(alice).seal(TOPIC, beat(alice)), signature="0x" + "00" * 65)
    with pytest.raises(SignatureError, match="forged"):
        verifier.open(TOPIC, raw, Heartbeat)
    assert verifier.dropped == {"malformed": 1, "forged": 1}


def test_nonces_increase_even_within_one_microsecond(alice):
    signer = EnvelopeSigner(alice)
    nonces = [json.loads(signer.seal(TOPIC, beat(alice)))["nonce"] for _ in range(50)]
    assert nonces == sorted(set(nonces))
