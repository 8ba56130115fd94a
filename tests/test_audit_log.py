"""Audit log: hash chain, tamper detection with line numbers, resume, concurrency, secrets."""

from __future__ import annotations

import asyncio
import hashlib
import json
from itertools import count
from pathlib import Path

import pytest

from aitbc_agent_sdk.audit import (
    GENESIS_PREV,
    AuditEntry,
    AuditLog,
    AuditLogError,
    build_entry,
    canonical_json,
    entry_hash,
    is_secret_name,
    parse_line,
    read_log,
    verify_log,
)
from aitbc_agent_sdk.errors import AitbcError

WEI = 12_345_678_901_234_567_890_123_456_789  # far beyond 2**64 and float precision


def fake_clock(start: float = 1_700_000_000.25):
    ticks = count()
    return lambda: start + next(ticks) * 0.5


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "trainings" / "t-1" / "audit.jsonl"


async def write_five(path: Path) -> list[AuditEntry]:
    log = AuditLog(path, clock=fake_clock())
    return [
        await log.append("failure_detected", worker="w1", round=1),
        await log.append("reassigned", job="j1", from_worker="w1", to_worker="w2"),
        await log.append("rejected", worker="w3", reason="score below threshold"),
        await log.append("payment", worker="w2", amount_wei=WEI, tx="0xabc"),
        await log.append("refund", amount_wei=1, to="0xdef"),
    ]


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def write_lines(path: Path, content: list[bytes]) -> None:
    path.write_bytes(b"".join(content))


# --- pure helpers -----------------------------------------------------------------------


def test_canonical_json_is_sorted_compact_ascii() -> None:
    assert canonical_json({"b": 1, "a": {"d": [1, 2], "c": "é"}}) == b'{"a":{"c":"\\u00e9","d":[1,2]},"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_entry_hash_ignores_hash_key_and_covers_everything_else() -> None:
    entry = build_entry(1, 1.5, "payment", {"amount_wei": WEI}, GENESIS_PREV)
    body = {k: v for k, v in entry.items() if k != "hash"}
    assert entry["hash"] == hashlib.sha256(canonical_json(body)).hexdigest()
    assert entry_hash(entry) == entry_hash(body)
    for key, other in [("seq", 2), ("ts", 1.25), ("event", "refund"), ("fields", {"amount_wei": WEI + 1}),
                       ("prev", "1" * 64)]:
        assert entry_hash({**body, key: other}) != entry["hash"], key


def test_parse_line_rejects_non_canonical_and_bad_hash() -> None:
    entry = build_entry(1, 1.5, "payment", {"amount_wei": 5}, GENESIS_PREV)
    raw = canonical_json(entry)
    assert parse_line(raw) == entry
    with pytest.raises(ValueError, match="canonical"):
        parse_line(json.dumps(entry).encode())  # same data, spaces after separators
    with pytest.raises(ValueError, match="hash mismatch"):
        parse_line(raw.replace(b'"amount_wei":5', b'"amount_wei":6'))
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_line(raw[:-3])


@pytest.mark.parametrize("name", ["password", "db_Password", "private_key", "PrivateKey", "PRIVATE-KEY",
                                  "client_secret", "secretName", "mnemonic", "wallet_mnemonic_words"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["worker", "amount_wei", "public_key", "reason", "tx_hash", "private"])
def test_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)


# --- append, read, verify ---------------------------------------------------------------


async def test_append_then_verify_and_read(path: Path) -> None:
    written = await write_five(path)
    result = verify_log(path)
    assert result.ok and result.entries == 5
    assert result.first_bad_line is None and result.reason is None
    assert result.head == hashlib.sha256(lines(path)[-1].rstrip(b"\n")).hexdigest()

    assert read_log(path) == written
    assert [e.seq for e in written] == [1, 2, 3, 4, 5]
    assert written[0].prev == GENESIS_PREV
    for before, after, raw in zip(written, written[1:], lines(path)):
        assert after.prev == hashlib.sha256(raw.rstrip(b"\n")).hexdigest() != before.hash
    assert written[2].fields == {"worker": "w3", "reason": "score below threshold"}
    assert [e.ts for e in written] == [1_700_000_000.25 + 0.5 * i for i in range(5)]


async def test_lines_are_canonical_json(path: Path) -> None:
    await write_five(path)
    for raw in lines(path):
        assert raw.endswith(b"\n")
        body = raw.rstrip(b"\n")
        assert canonical_json(json.loads(body)) == body


async def test_async_verify_and_read_wrappers(path: Path) -> None:
    written = await write_five(path)
    log = AuditLog(path)
    assert (await log.verify()).entries == 5
    assert await log.read() == written


def test_missing_and_empty_files_are_ok(path: Path) -> None:
    missing = verify_log(path)
    assert missing.ok and missing.entries == 0 and missing.reason is None and missing.head == GENESIS_PREV
    assert read_log(path) == []
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert verify_log(path).ok and verify_log(path).entries == 0


async def test_nested_values_and_big_ints_round_trip_exactly(path: Path) -> None:
    fields = {
        "amount_wei": WEI,
        "negative": -(2**200),
        "payouts": [{"worker": "w1", "wei": WEI}, {"worker": "w2", "wei": 2**256 - 1}],
        "meta": {"ratio": 0.1, "tiny": 5e-324, "flags": [True, False, None], "text": "naïve ✓\n\"q\""},
        "empty": {"list": [], "dict": {}},
    }
    entry = await AuditLog(path).append("payment", **fields)
    assert entry.fields == fields
    (back,) = read_log(path)
    assert back.fields == fields
    assert type(back.fields["amount_wei"]) is int and back.fields["payouts"][1]["wei"] == 2**256 - 1
    assert back == entry


# --- tampering --------------------------------------------------------------------------


async def test_edited_field_value_is_detected_at_its_line(path: Path) -> None:
    await write_five(path)
    content = lines(path)
    content[3] = content[3].replace(str(WEI).encode(), str(WEI + 1).encode())
    write_lines(path, content)
    result = verify_log(path)
    assert not result.ok
    assert (result.first_bad_line, result.entries) == (4, 3)
    assert "hash mismatch" in result.reason
    with pytest.raises(AuditLogError, match="line 4"):
        read_log(path)


async def test_edit_with_recomputed_hash_is_detected_at_the_next_line(path: Path) -> None:
    await write_five(path)
    content = lines(path)
    forged = json.loads(content[1])
    forged["fields"]["to_worker"] = "w666"
    rebuilt = build_entry(forged["seq"], forged["ts"], forged["event"], forged["fields"], forged["prev"])
    content[1] = canonical_json(rebuilt) + b"\n"
    write_lines(path, content)
    result = verify_log(path)
    assert (result.ok, result.first_bad_line) == (False, 3)
    assert "prev" in result.reason


async def test_dropped_middle_line_is_detected(path: Path) -> None:
    await write_five(path)
    content = lines(path)
    del content[2]
    write_lines(path, content)
    result = verify_log(path)
    assert (result.ok, result.first_bad_line, result.entries) == (False, 3, 2)
    assert "seq 4 where 3" in result.reason


async def test_dropped_first_line_is_detected(path: Path) -> None:
    await write_five(path)
    write_lines(path, lines(path)[1:])
    assert verify_log(path).first_bad_line == 1


async def test_dropped_line_with_renumbered_seq_is_detected_by_prev(path: Path) -> None:
    await write_five(path)
    content = lines(path)
    del content[2]
    for index in (2, 3):  # renumber and rehash the later lines, but keep their prev
        old = json.loads(content[index])
        rebuilt = build_entry(index + 1, old["ts"], old["event"], old["fields"], old["prev"])
        content[index] = canonical_json(rebuilt) + b"\n"
    write_lines(path, content)
    result = verify_log(path)
    assert (result.ok, result.first_bad_line) == (False, 3)
    assert "prev does not match" in result.reason


async def test_swapped_lines_are_detected(path: Path) -> None:
    await write_five(path)
    content = lines(path)
    content[1], content[2] = content[2], content[1]
    write_lines(path, content)
    result = verify_log(path)
    assert (result.ok, result.first_bad_line, result.entries) == (False, 2, 1)


async def test_truncated_last_line_is_detected(path: Path) -> None:
    await write_five(path)
    data = path.read_bytes()
    for cut in (1, 2, 40):  # just the newline, the closing brace, a chunk of the line
        path.write_bytes(data[:-cut])
        result = verify_log(path)
        assert (result.ok, result.first_bad_line, result.entries) == (False, 5, 4), cut
        assert "truncated" in result.reason


@pytest.mark.parametrize("garbage", [
    b"not json at all\n", b"\n", b"[1, 2]\n", b'{"seq": 3}\n', b"\xff\xfe\n",
])
async def test_inserted_garbage_is_detected(path: Path, garbage: bytes) -> None:
    await write_five(path)
    content = lines(path)
    content.insert(2, garbage)
    write_lines(path, content)
    result = verify_log(path)
    assert (result.ok, result.first_bad_line, result.entries) == (False, 3, 2)


async def test_reencoded_line_is_detected(path: Path) -> None:
    await write_five(path)
    content = lines(path)
    content[0] = json.dumps(json.loads(content[0]), sort_keys=True).encode() + b"\n"  # same data, spaces
    write_lines(path, content)
    result = verify_log(path)
    assert (result.first_bad_line, result.entries) == (1, 0)
    assert "canonical" in result.reason


# --- resume, concurrency, refusals ------------------------------------------------------


async def test_reopening_continues_the_chain(path: Path) -> None:
    first = await write_five(path)
    head = verify_log(path).head
    log = AuditLog(path)
    sixth = await log.append("payment", worker="w4", amount_wei=7)
    seventh = await log.append("refund", amount_wei=3)
    assert (sixth.seq, seventh.seq) == (6, 7)
    assert sixth.prev == head != first[-1].hash
    result = verify_log(path)
    assert result.ok and result.entries == 7
    assert read_log(path)[5:] == [sixth, seventh]


async def test_resume_reads_a_long_last_line(path: Path) -> None:
    log = AuditLog(path)
    await log.append("a")
    await log.append("big", blob="x" * 50_000)  # last line spans several tail blocks
    await AuditLog(path).append("after")
    assert verify_log(path).entries == 3


async def test_resume_refuses_a_broken_tail(path: Path) -> None:
    # A partial last line (a crash) is repaired on append: tests/security/test_state_recovery.py.
    await write_five(path)
    path.write_bytes(path.read_bytes()[:-10])
    path.write_bytes(path.read_bytes().rsplit(b"\n", 1)[0] + b"\n" + b"garbage\n")
    with pytest.raises(AuditLogError, match="bad last line"):
        await AuditLog(path).append("payment", amount_wei=1)
    assert issubclass(AuditLogError, AitbcError)


async def test_concurrent_appends_stay_consistent(path: Path) -> None:
    logs = AuditLog(path)

    async def worker(task: int) -> list[AuditEntry]:
        out = []
        for step in range(10):
            out.append(await logs.append("progress", task=task, step=step))
            await asyncio.sleep(0)
        return out

    results = await asyncio.gather(*(worker(t) for t in range(20)))
    result = verify_log(path)
    assert result.ok and result.entries == 200
    entries = read_log(path)
    assert [e.seq for e in entries] == list(range(1, 201))
    assert sorted(e.seq for batch in results for e in batch) == list(range(1, 201))
    for task in range(20):  # each task's own appends land in its order
        assert [e.fields["step"] for e in entries if e.fields["task"] == task] == list(range(10))


@pytest.mark.parametrize("fields", [
    {"password": "hunter2"},
    {"wallet": {"PrivateKey": "0x01"}},
    {"payouts": [{"worker": "w1"}, {"meta": {"client_secret": "s"}}]},
    {"Seed_Mnemonic": "abandon abandon"},
])
async def test_secret_field_names_are_refused_and_nothing_is_written(path: Path, fields: dict) -> None:
    log = AuditLog(path)
    with pytest.raises(ValueError, match="secret"):
        await log.append("wallet_created", **fields)
    assert not path.exists()
    await log.append("ok", worker="w1")
    assert verify_log(path).entries == 1


@pytest.mark.parametrize("fields", [
    {"t": (1, 2)}, {"s": {1, 2}}, {"nan": float("nan")}, {"d": {1: "int key"}}, {"b": b"bytes"},
])
async def test_values_that_would_not_round_trip_are_refused(path: Path, fields: dict) -> None:
    with pytest.raises(ValueError):
        await AuditLog(path).append("x", **fields)
    assert not path.exists()


async def test_event_name_is_required(path: Path) -> None:
    with pytest.raises(ValueError):
        await AuditLog(path).append("")
