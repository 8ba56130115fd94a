"""A user's first hour, the cheap parts (issue #26): no terminal and no --yes, init on a machine without a
devnet, where a wallet password comes from, Ctrl-C's guard and line, and chat's cost questions. In process:
pytest's stdin is never a terminal, as under `setsid make demo < /dev/null`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.flow._costs import estimate_text, preview
from aitbc_agent_sdk.flow._trainings import Interrupted
from aitbc_cli.app import main
from aitbc_cli.common import (
    ConfirmationRequired, PasswordSource, SpendPreview, confirm_spend, wallet_password, wallet_store,
)
from aitbc_cli.interrupts import interrupted_line, stop_on_signal
from aitbc_cli.steps import devnet_choice

PASSWORD = "correct horse battery staple"
ETH = 10**18


def aitbc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The CLI in this process, as a user's shell runs it: exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    out, err = capsys.readouterr()
    return int(ended.value.code or 0), out, err


@pytest.fixture
def no_password(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AITBC_PASSWORD", "AITBC_WALLET_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


# -- no terminal, no --yes ---------------------------------------------------------------------

def test_play_money_is_shown_and_never_asked_and_real_money_needs_yes(capsys: pytest.CaptureFixture[str]) -> None:
    spend = SpendPreview("fund the escrow of a new training", (("escrow deposit", 3 * ETH // 100),))
    assert confirm_spend(spend, yes=False, dry_run=False, play_money=True)
    assert "nothing to confirm" in capsys.readouterr().err
    with pytest.raises(ConfirmationRequired, match="pass --yes"):
        confirm_spend(spend, yes=False, dry_run=False)


def test_chat_without_a_terminal_refuses_what_it_would_have_to_ask(
        capsys: pytest.CaptureFixture[str], aitbc_home: Path, no_password: None) -> None:
    code, out, err = aitbc(capsys, "chat", "--offline", "find 2 workers under 1 eth each and train an mlp on digits "
                                                        "for 1 round")
    assert code == 2, out + err
    assert "--yes" in err and "spends money" in err and "Traceback" not in err
    assert "discover_workers" in out  # the plan was shown; nothing ran (no devnet was even needed)
    assert not (aitbc_home / "aitbc.db").exists()


# -- init on a machine without a devnet -----------------------------------------------------------

@pytest.mark.parametrize(("has_profile", "yes", "can_ask", "choice"), [
    (True, False, False, "use"), (True, True, True, "use"),
    (False, True, False, "start"), (False, True, True, "start"),
    (False, False, True, "ask"), (False, False, False, "refuse"),
])
def test_what_init_does_about_the_devnet(has_profile: bool, yes: bool, can_ask: bool, choice: str) -> None:
    assert devnet_choice(has_profile=has_profile, yes=yes, can_ask=can_ask) == choice


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_init_with_no_devnet_and_nobody_to_ask_names_yes_before_any_password(
        capsys: pytest.CaptureFixture[str], aitbc_home: Path, no_password: None, json_flag: list[str]) -> None:
    code, out, err = aitbc(capsys, "distributed-training", "init", "--wallet", "my-agent-wallet", *json_flag)
    assert code == 2
    message = json.loads(out)["error"] if json_flag else err
    assert "--yes" in message and "aitbc devnet up" in message and "password" not in err
    assert not aitbc_home.exists()  # nothing started, nothing written


# -- wallet passwords ----------------------------------------------------------------------------

def test_a_password_comes_from_the_file_then_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             no_password: None) -> None:
    secret = tmp_path / "pw"
    secret.write_text(f"{PASSWORD}\nsecond line ignored\n")
    monkeypatch.setenv("AITBC_PASSWORD", "from the environment")
    assert wallet_password(tmp_path, "w", PasswordSource(secret, interactive=False)) == PASSWORD
    assert wallet_password(tmp_path, "w", PasswordSource(None, interactive=False)) == "from the environment"
    monkeypatch.delenv("AITBC_PASSWORD")
    with pytest.raises(ConfigError, match=r"AITBC_PASSWORD or pass --password-file"):
        wallet_password(tmp_path, "w", PasswordSource(None, interactive=False))  # --json: never a prompt
    secret.write_text("\n")
    with pytest.raises(ConfigError, match=f"--password-file {secret}: its first line is empty"):
        wallet_password(tmp_path, "w", PasswordSource(secret))
    with pytest.raises(ConfigError, match="cannot read it"):
        wallet_password(tmp_path, "w", PasswordSource(tmp_path / "absent"))


def test_wallet_commands_take_the_password_file_or_env_and_json_never_prompts(
        capsys: pytest.CaptureFixture[str], aitbc_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        no_password: None) -> None:
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD + "\n")
    code, out, err = aitbc(capsys, "wallet", "create", "alice", "--password-file", str(secret), "--json")
    assert code == 0, err
    address = json.loads(out)["address"]
    assert asyncio.run(wallet_store(aitbc_home).unlock("alice", PASSWORD)).address == address

    monkeypatch.setenv("AITBC_PASSWORD", PASSWORD)
    assert aitbc(capsys, "wallet", "create", "bob", "--json")[0] == 0  # --json: only the environment can have said

    monkeypatch.delenv("AITBC_PASSWORD")
    code, out, err = aitbc(capsys, "wallet", "create", "carol", "--json")
    assert code == 2 and "AITBC_PASSWORD" in json.loads(out)["error"] and "--password-file" in out
    assert "Password" not in err and not (aitbc_home / "wallets" / "carol.json").exists()


@pytest.mark.parametrize("command", [
    ["provider", "register", "--stake", "1"], ["provider", "stake", "--amount", "1"], ["provider", "unregister"],
    ["provider", "start", "--price", "0.01"]])
def test_provider_commands_under_json_never_prompt_and_take_the_password_file(
        capsys: pytest.CaptureFixture[str], aitbc_home: Path, tmp_path: Path, no_password: None,
        command: list[str]) -> None:
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD + "\n")
    assert aitbc(capsys, "wallet", "create", "gpu-box", "--password-file", str(secret), "--json")[0] == 0
    code, out, err = aitbc(capsys, *command, "--wallet", "gpu-box", "--json")
    assert code == 2 and "--json never prompts" in json.loads(out)["error"], (out, err)
    # With the file the wallet opens; what stops it next is the missing devnet, not a password.
    code, out, err = aitbc(capsys, *command, "--wallet", "gpu-box", "--password-file", str(secret), "--json")
    assert code == 2 and "password" not in json.loads(out.splitlines()[-1])["error"].lower(), (out, err)


# -- Ctrl-C and SIGTERM on run -------------------------------------------------------------------

def test_the_first_signal_stops_the_work_and_a_second_is_only_noted() -> None:
    notes: list[str] = []

    async def scenario() -> tuple[int, int | None]:
        second = asyncio.Event()

        def note(line: str) -> None:
            notes.append(line)
            if len(notes) == 2:
                second.set()

        work = asyncio.ensure_future(asyncio.Event().wait())  # a training that would never end by itself
        async with stop_on_signal(work, note) as caught:
            os.kill(os.getpid(), signal.SIGTERM)
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(work, 30)
            os.kill(os.getpid(), signal.SIGINT)  # during the settlement: noted, not obeyed
            await asyncio.wait_for(second.wait(), 30)
        return caught.exit_code, caught.signum

    assert asyncio.run(scenario()) == (143, signal.SIGTERM)
    assert notes[0].startswith("SIGTERM: stopping") and "ignored" in notes[1]


def test_the_interrupted_line_says_what_was_paid_refunded_and_why_there_is_no_resume() -> None:
    settled = Interrupted("training_ab12", accepted_rounds=29, workers_paid=4, paid_wei=29 * 4 * ETH // 100,
                          refunded_wei=12 * ETH // 100, funded=True)
    assert interrupted_line(settled) == (
        "interrupted after round 29 of training_ab12: paid 4 workers 1.1600 ETH for 29 accepted rounds, "
        "refunded 0.1200 ETH; cannot resume: the embedded network's chain and market end with this process; "
        "start a new run")
    assert interrupted_line(Interrupted(None)) == "interrupted before the escrow was funded: nothing was spent"


# -- chat: a cost question gets a figure ----------------------------------------------------------

def test_a_cost_question_is_an_estimate_not_a_training_plan() -> None:
    from aitbc_agent_sdk.assistant._planner import plan_request

    plan = plan_request("how much would 8 RTX 4090s for 20 rounds cost?")
    assert plan.as_json()["steps"] == [{"tool": "cost_estimate",
                                        "arguments": {"workers": 8, "rounds": 20, "min_gpu": "RTX4090"}}]
    assert plan_request("how much did training_ab12 cost?").steps[0].tool == "payments"  # the past: what was paid


def test_the_estimate_is_the_dry_runs_preview_in_words() -> None:
    cost = preview([ETH // 100, 11 * ETH // 1000], [], 20)  # what run --dry-run computes from the same prices
    text = estimate_text(cost, asked=8, hardware="RTX4090")
    assert text.startswith("2 workers (RTX4090 or faster) for 20 rounds would put 0.4200 ETH into the escrow")
    assert "only 2 offers" in text and "8 cannot be hired" in text
    assert estimate_text(preview([], [], 20), asked=8, hardware=None).startswith("No offers for any hardware")
