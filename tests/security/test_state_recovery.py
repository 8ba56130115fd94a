"""State that a crash or a careless phrase leaves behind: half-recorded replacements, cut-off
audit logs, and secrets that redaction only partly blanked.

Before the fix: a crash between ``replaceWorker`` and the two SQLite writes left a database that
made every later ``release`` revert with ``NotAWorker``; an audit log ending in a partial line
refused every append; "mnemonic is abandon ability ..." kept 11 of its 12 words in the
assistant's log and "password: correct horse battery staple" kept 3 of 4.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import AsyncWeb3

from aitbc_agent_sdk.chain import TransactionSender
from aitbc_agent_sdk.audit import AuditLog, AuditLogError, read_log, verify_log
from aitbc_agent_sdk.devnet._anvil import dev_accounts

from tests.security.anvil_node import node  # noqa: F401 (a fixture)

CID = "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH"
PRICE = 10**15


def coordinator_on(tmp_path: Path, w3: AsyncWeb3, account: LocalAccount, escrow_address: str, db):
    from aitbc_agent_sdk.chain import EscrowClient
    from aitbc_agent_sdk.coordinator import Coordinator, CoordinatorSettings, EscrowAccount
    from aitbc_agent_sdk.market import WeightedScore
    from aitbc_agent_sdk.messaging import InMemoryBus, SignedChannel
    from aitbc_agent_sdk.storage import LocalContentStore

    escrow = EscrowAccount(TransactionSender(w3, account, poll_interval=0.05), EscrowClient(w3, escrow_address))
    return Coordinator(channel=SignedChannel(InMemoryBus(), account), store=LocalContentStore(tmp_path / "store"),
                       db=db, escrow=escrow, scoring=WeightedScore(),
                       settings=CoordinatorSettings(audit_dir=tmp_path / "trainings"))


def contract_for(worker: LocalAccount, tid: str, coordinator, role: str, shard: int | None):
    from aitbc_agent_sdk.chain import sign_consent
    from aitbc_agent_sdk.records import WorkerContract, new_id

    consent = sign_consent(worker, 31337, coordinator.escrow.escrow.address, coordinator.escrow.key(tid))
    return WorkerContract(contract_id=new_id("contract"), training_id=tid, worker_id=worker.address,
                          coordinator=coordinator.address, price_wei=PRICE, rounds=3, accepted_at=0.0, role=role,
                          shard_index=shard, consent="0x" + consent.hex())


async def accept(db, tid: str, worker: str, round_: int) -> None:
    from aitbc_agent_sdk.records import CheckpointRef, new_id

    job = new_id("job")
    await db.save_checkpoint(CheckpointRef(checkpoint_id=job, cid=CID, job_id=job, worker_id=worker, training_id=tid,
                                           round=round_, samples=10, loss=0.1), "accepted")


class SimulatedCrash(BaseException):
    """Fault injection: the process dies right after the chain call returned."""


async def test_a_crash_after_replace_worker_is_reconciled_on_resume_and_release_pays(
        tmp_path: Path, node: AsyncWeb3, monkeypatch: pytest.MonkeyPatch) -> None:
    from aitbc_agent_sdk.chain import deploy, load_artifact
    from aitbc_agent_sdk.coordinator import TrainingDatabase
    from aitbc_agent_sdk.coordinator.round._run import reassigner_for
    from aitbc_agent_sdk.records import new_id

    account = dev_accounts(3)[2]
    address = await deploy(TransactionSender(node, account), load_artifact("TrainingEscrow"))
    failed, spare = Account.create(), Account.create()
    db = await TrainingDatabase(tmp_path / "aitbc.db").open()
    coordinator = coordinator_on(tmp_path, node, account, address, db)
    tid = new_id("training")
    old = contract_for(failed, tid, coordinator, "worker", 0)
    new = contract_for(spare, tid, coordinator, "spare", None)
    for contract in (old, new):
        await db.save_contract(contract)
    await coordinator.money.fund_escrow(tid)
    await accept(db, tid, failed.address, 1)  # delivered round 1, then went silent
    await accept(db, tid, spare.address, 2)  # the spare took over and delivered round 2

    real_replace = coordinator.escrow.replace

    async def replace_then_crash(*args, **kwargs):  # fault injection: dies after the chain call
        await real_replace(*args, **kwargs)
        raise SimulatedCrash

    monkeypatch.setattr(coordinator.escrow, "replace", replace_then_crash)
    with pytest.raises(SimulatedCrash):
        await reassigner_for(coordinator, tid).take_over_slot(old, new, "silent")
    slot = await coordinator.escrow.escrow.slot(coordinator.escrow.key(tid), spare.address)
    assert slot.amount == 3 * PRICE  # the chain moved the slot; the database did not hear of it
    await db.close()

    # Restart: a new process opens the same database and resumes the training.
    db = await TrainingDatabase(tmp_path / "aitbc.db").open()
    try:
        resumed = coordinator_on(tmp_path, node, account, address, db)
        reconcile = getattr(reassigner_for(resumed, tid), "reconcile", None)  # the unfixed code had none
        if reconcile is not None:
            [settled] = await reconcile()
            assert settled.status == "done"
        # Unfixed, the DB still names the old worker, whose slot is empty: the spare is never paid.
        [payment] = await resumed.money.pay(tid)
        assert [c.worker_id for c in await db.contracts(tid, "worker")] == [spare.address]
        assert (payment.worker_id, payment.amount_wei) == (spare.address, PRICE)
        assert await node.eth.get_balance(spare.address) == PRICE
        assert await node.eth.get_balance(failed.address) == 0
        events = [e.event for e in read_log(tmp_path / "trainings" / tid / "audit.jsonl")]
        assert "worker_replaced" in events and "payment" in events
    finally:
        await db.close()


# --- an audit log cut off in the middle of a line ----------------------------------------------


async def test_a_partial_last_line_is_repaired_and_later_appends_verify(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    for n in range(3):
        await log.append("round", n=n)
    whole = path.read_bytes()
    fragment = b'{"event":"payment","fields":{"amount_wei":12'  # what a crash mid-write leaves
    path.write_bytes(whole + fragment)
    assert not verify_log(path).ok

    after = AuditLog(path)  # a restarted process
    await after.append("training_resumed")
    await after.append("payment", amount_wei=7)
    result = verify_log(path)
    assert result.ok and result.entries == 6
    entries = read_log(path)
    assert path.read_bytes().startswith(whole)  # the good prefix is kept byte for byte
    repaired = entries[3]
    assert repaired.event == "repaired" and repaired.fields["dropped_bytes"] == len(fragment)
    assert [e.event for e in entries[4:]] == ["training_resumed", "payment"]


async def test_tampering_is_not_repaired_away(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    for n in range(3):
        await log.append("round", n=n)
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"n":1', b'"n":9')
    path.write_bytes(b"\n".join(lines) + b"partial")
    before = path.read_bytes()
    with pytest.raises(AuditLogError, match="line 2"):
        await AuditLog(path).append("payment", amount_wei=1)
    assert path.read_bytes() == before  # left for a person to look at


def test_the_audit_command_repairs_and_verifies(aitbc_cmd, cli_env, aitbc_home: Path) -> None:
    import asyncio

    tid = "training_0123456789abcdef"
    path = aitbc_home / "trainings" / tid / "audit.jsonl"

    async def write() -> None:
        await AuditLog(path).append("escrow_funded", deposit_wei=3)

    asyncio.run(write())
    path.write_bytes(path.read_bytes() + b'{"seq":2,')
    broken = subprocess.run([*aitbc_cmd, "distributed-training", "audit", "--training-id", tid, "--json"],
                            env=cli_env, capture_output=True, text=True, timeout=120)
    assert broken.returncode == 1 and json.loads(broken.stdout)["ok"] is False
    fixed = subprocess.run([*aitbc_cmd, "distributed-training", "audit", "--training-id", tid, "--json", "--repair"],
                           env=cli_env, capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    report = json.loads(fixed.stdout)
    assert report["ok"] and [e["event"] for e in report["entries"]] == ["escrow_funded", "repaired"]


# --- redaction in the assistant's audit log ------------------------------------------------------

MNEMONIC = "abandon ability able about above absent absorb abstract absurd abuse access accident"
KEY = "0x" + "4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"


@pytest.mark.parametrize(("request_text", "secret_words"), [
    (f"my mnemonic is {MNEMONIC}", MNEMONIC.split()),
    ("password: correct horse battery staple", ["correct", "horse", "battery", "staple"]),
    ("wallet password=correct horse battery staple host=devnet", ["correct", "horse", "battery", "staple"]),
    ('import {"password": "tiger lily moon", "name": "w1"}', ["tiger", "lily", "moon"]),
    (f"restore from {MNEMONIC}, then list offers", MNEMONIC.split()),
    (f"my seed phrase: {MNEMONIC}", MNEMONIC.split()),
    (f"private key {KEY} please", [KEY[2:]]),
    ("the passphrase is 'open sesame now'. Then list offers", ["open", "sesame", "now"]),
])
async def test_every_word_of_a_secret_is_blanked(tmp_path: Path, request_text: str, secret_words: list[str]) -> None:
    from aitbc_agent_sdk.assistant._audit import AssistantAudit, assistant_log_path

    audit = AssistantAudit(tmp_path, source="test")
    await audit.record("request", request=request_text, reply=f"echo: {request_text}")
    written = assistant_log_path(tmp_path).read_text()
    kept = [w for w in secret_words if w in written.replace("<redacted>", " ")]
    assert kept == [], f"kept {len(kept)} of {len(secret_words)} secret words: {written}"
    assert verify_log(assistant_log_path(tmp_path)).ok


async def test_ordinary_requests_are_kept(tmp_path: Path) -> None:
    from aitbc_agent_sdk.assistant._audit import scrub_text

    for text in ("train a small mlp on digits with 2 workers for 3 rounds", "show the payments of my last training",
                 "which token does the escrow use?"):
        assert scrub_text(text, keys=True) == text
