"""The CLI's shared vocabulary, piece by piece: amount and endpoint parsers, wei as JSON strings,
the exit-code table, the spend confirmation, the home check and the database made by its first write."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from aitbc_agent_sdk.errors import (
    AitbcError, BrokerUnreachableError, ChainError, ChainUnreachableError, ConfigError, ContentNotFoundError,
    DatasetError, InsufficientFundsError, IntegrityError, NotEnoughWorkersError, NotFoundError, SignatureError,
    StorageError, StoreUnreachableError, TrainingError,
)
from aitbc_agent_sdk.storage import InvalidCidError
from aitbc_cli.common import (
    ConfirmationRequired, HomeError, SpendPreview, check_home, confirm_spend, print_json, wei_strings,
)
from aitbc_cli.exits import ExitCode, error_object, exit_code_for, exit_codes_epilog
from aitbc_cli.params import format_eth, parse_broker, parse_ipfs_api, parse_rpc_url, parse_wei


@pytest.mark.parametrize(("text", "wei"), [
    ("0.01", 10**16), ("0.01eth", 10**16), ("0.01 ETH", 10**16), ("1ether", 10**18), ("10gwei", 10**10),
    ("1000wei", 1000), ("0", 0), (".5", 5 * 10**17), ("0.000000000000000001", 1), (10**16, 10**16),
    ("1.5gwei", 1_500_000_000),
])
def test_one_parser_for_every_eth_amount(text: str | int, wei: int) -> None:
    assert parse_wei(text) == wei


@pytest.mark.parametrize(("text", "why"), [
    ("-1", "not an amount"), ("1e-3", "not an amount"), ("abc", "not an amount"), ("10 usd", "not an amount"),
    ("1.5wei", "fraction of a wei"), ("0.0000000000000000001", "fraction of a wei"), ("0.1234567891gwei", "fraction"),
    (-5, "negative"), ("", "not an amount"),
])
def test_amounts_that_are_refused_say_why(text: str | int, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_wei(text)


def test_eth_is_printed_exactly() -> None:
    assert format_eth(10**16) == "0.01"
    assert format_eth(123456789 * 10**18 + 1) == "123456789.000000000000000001"
    assert format_eth(0) == "0"


@pytest.mark.parametrize(("text", "url"), [
    ("/ip4/127.0.0.1/tcp/5001", "http://127.0.0.1:5001"),
    ("/dns4/ipfs.example/tcp/443/https", "https://ipfs.example:443"),
    ("/ip6/::1/tcp/5001", "http://[::1]:5001"), ("http://127.0.0.1:5001/", "http://127.0.0.1:5001"),
])
def test_ipfs_api_takes_kubos_multiaddr(text: str, url: str) -> None:
    assert parse_ipfs_api(text) == url


@pytest.mark.parametrize("text", ["/ip4/127.0.0.1/udp/5001", "ftp://host:21", "/unix/tmp/api"])
def test_ipfs_api_refuses_other_addresses(text: str) -> None:
    with pytest.raises(ValueError, match="multiaddr"):
        parse_ipfs_api(text)


def test_rpc_and_broker_addresses() -> None:
    assert parse_rpc_url("localhost:8545") == "http://localhost:8545"
    assert parse_rpc_url("https://rpc.example/v1/") == "https://rpc.example/v1"
    with pytest.raises(ValueError, match="JSON-RPC"):
        parse_rpc_url("ws://node:8546")
    assert parse_broker("b.example") == "mqtt://b.example:1883"
    assert parse_broker("mqtts://b.example") == "mqtts://b.example:8883"
    with pytest.raises(ValueError, match="broker"):
        parse_broker("http://b.example")


def test_wei_values_are_json_strings_at_any_depth(capsys: pytest.CaptureFixture[str]) -> None:
    big = 2**64 + 1  # above 2**53: jq and JavaScript would round it
    value = {"wei": big, "price_wei": 5, "workers": [{"paid_wei": big, "rounds": 3}], "prices_wei": [1, big],
             "ok": True, "score": 0.5, "name_wei": None}
    assert wei_strings(value) == {"wei": str(big), "price_wei": "5", "workers": [{"paid_wei": str(big), "rounds": 3}],
                                  "prices_wei": ["1", str(big)], "ok": True, "score": 0.5, "name_wei": None}
    # under a wei key: a mapping's values are wei, a list's records go by their own keys
    assert wei_strings({"per_worker_wei": {"0xa": big}, "per_round_wei": [{"round": 1, "wei": big}]}) == {
        "per_worker_wei": {"0xa": str(big)}, "per_round_wei": [{"round": 1, "wei": str(big)}]}
    print_json({"escrow": {"deposited_wei": big}})
    assert json.loads(capsys.readouterr().out) == {"escrow": {"deposited_wei": str(big)}}


@pytest.mark.parametrize(("error", "code"), [
    (ConfigError("x"), ExitCode.USAGE), (DatasetError("x"), ExitCode.USAGE), (InvalidCidError("x"), ExitCode.USAGE),
    (ChainUnreachableError("x"), ExitCode.UNREACHABLE), (BrokerUnreachableError("x"), ExitCode.UNREACHABLE),
    (StoreUnreachableError("x"), ExitCode.UNREACHABLE), (NotEnoughWorkersError("x"), ExitCode.NOT_ENOUGH_PROVIDERS),
    (InsufficientFundsError("x"), ExitCode.PAYMENT), (ChainError("x"), ExitCode.PAYMENT),
    (NotFoundError("x"), ExitCode.NOT_FOUND), (ContentNotFoundError("x"), ExitCode.NOT_FOUND),
    (IntegrityError("x"), ExitCode.INTEGRITY), (SignatureError("x"), ExitCode.INTEGRITY),
    (TrainingError("x"), ExitCode.TRAINING), (StorageError("x"), ExitCode.FAILED), (AitbcError("x"), ExitCode.FAILED),
])
def test_each_error_class_has_its_exit_code(error: Exception, code: ExitCode) -> None:
    assert exit_code_for(error) == code
    assert error_object(str(error), exit_code_for(error), type(error).__name__) == {
        "error": "x", "code": int(code), "type": type(error).__name__}


def test_the_help_lists_every_exit_code() -> None:
    text = exit_codes_epilog()
    for code in ExitCode:
        assert f"{int(code)} " in text


def test_spending_needs_yes_or_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    preview = SpendPreview("fund the escrow of t-1", (("3 workers x 2 rounds", 6 * 10**16), ("gas (max)", 10**15)))
    assert preview.as_json() == {"action": "fund the escrow of t-1", "total_wei": str(61 * 10**15),
                                 "items": [{"what": "3 workers x 2 rounds", "wei": str(6 * 10**16)},
                                           {"what": "gas (max)", "wei": str(10**15)}]}
    assert confirm_spend(preview, yes=False, dry_run=True) is False
    assert confirm_spend(preview, yes=True, dry_run=False) is True
    shown = capsys.readouterr()
    assert shown.out == "" and "0.061 ETH" in shown.err  # the preview goes to stderr: stdout may be JSON
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)  # fault injected: pytest's stdin is never a terminal anyway
    with pytest.raises(ConfirmationRequired, match="--yes"):
        confirm_spend(preview, yes=False, dry_run=False)


def test_a_home_that_is_a_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("not a directory")
    for bad in (file, file / "sub" / "deeper"):
        with pytest.raises(HomeError, match="is a file, not a directory"):
            check_home(bad)
    assert check_home(tmp_path / "new" / "home") == tmp_path / "new" / "home"
    assert not (tmp_path / "new").exists()  # checking creates nothing


async def test_the_database_file_is_made_by_the_first_write(tmp_path: Path) -> None:
    from aitbc_agent_sdk.coordinator import TrainingDatabase
    from aitbc_agent_sdk.records import TrainingRecord, TrainingSpec

    path = tmp_path / "home" / "aitbc.db"
    async with TrainingDatabase(path) as db:
        assert await db.trainings() == []
        with pytest.raises(NotFoundError):
            await db.training("training-nope")
    assert not path.exists() and not path.parent.exists()  # read-only and failed: nothing left behind

    record = TrainingRecord(training_id="training-1", spec=TrainingSpec(model_type="mlp", target_workers=2),
                            coordinator="0x" + "11" * 20)
    async with TrainingDatabase(path) as db:
        assert await db.trainings() == []
        await db.save_training(record)
        assert [r.training_id for r in await db.trainings()] == ["training-1"]
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT training_id FROM trainings").fetchall() == [("training-1",)]
    async with TrainingDatabase(path) as db:
        assert (await db.training("training-1")).training_id == "training-1"
