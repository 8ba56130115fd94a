"""Attack 8: text from another party is inert wherever it is shown.

A hired worker's ``Progress.error`` is bounded in length only. It reaches the audit log as the reason of a
replacement, and ``monitor``, ``logs`` and ``audit`` show it; an offer's hardware name reaches ``market list``
and the report. Before the fix ``monitor`` rendered it as Rich markup (``[/]`` made it exit 1) and every view let
escape sequences through to the terminal (set the title, clear the screen, reorder text, fake "paid in full").

Here a training is stored as a run leaves it (its record in aitbc.db, the hostile reasons in its real audit
log, a hostile progress record and payment hashes), and the real CLI is run on it: every command exits 0, its
output holds no control, C1 or bidi character, and each hostile text is shown literally, escapes visible.
The escape functions themselves are checked on any string (hypothesis), and the assistant's answers (chat and
MCP) on the same reasons.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.text import Text

from aitbc_agent_sdk.assistant._base import ToolContext
from aitbc_agent_sdk.assistant._executor import Executor, StepOutcome
from aitbc_agent_sdk.assistant._llm import LlmConfig
from aitbc_agent_sdk.assistant._mcp_server import call_result
from aitbc_agent_sdk.assistant._reply import answer, plan_lines
from aitbc_agent_sdk.assistant._session import Assistant
from aitbc_agent_sdk.audit import AuditLog
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.records import Payment, Progress, TrainingPhase, TrainingRecord, TrainingSpec, WorkerContract
from aitbc_agent_sdk.records._inert import html_text, terminal_markup, visible, visible_values
from aitbc_agent_sdk.profile import training_dir
from aitbc_cli.app import main
from tests.test_assistant_openai import FakeOpenAI, call, final

TRAINING_ID = "training_0123456789abcdef"
COORDINATOR = "0x" + "11" * 20
WORKER = "0x" + "ab" * 20
MODEL_TYPE = "[/]mlp\x1b]0;pwned\x07"  # not a stranger's, but what list shows of a training
# What a hired worker may put in Progress.error: each one is shown in monitor's 70-character detail column.
HOSTILE = (
    "[/]",  # closes a tag that is not open: Rich raised MarkupError, monitor exited 1
    "[bold red]paid in full[/]",  # styled text faking the coordinator's own words
    "\x1b]0;pwned\x07",  # OSC: sets the terminal's title
    "\x1b[2J\x1b[H",  # CSI: clears the screen and homes the cursor
    "\x9b2J",  # the same CSI as one C1 character
    "abc\u202edecaf\u2066x\u2069",  # bidi overrides: shown reversed
    "bell\x07del\x7fnul\x00cr\rback",  # C0 and DEL: a carriage return overwrites the line
    "ok\nfake line",  # a newline fakes a row of its own
    ":white_check_mark: paid",  # an emoji code Rich would draw
    "ends in a backslash\\",  # would escape the next markup tag
)
# No C0 but newline, no DEL, no C1, no lone surrogate, no line separator, no bidi control.
FORBIDDEN = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u2028\u2029"
                       "\u202a-\u202e\u2066-\u2069]")
ONE_LINE_ALLOWED = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u2028\u2029"
                              "\u202a-\u202e\u2066-\u2069]")


# -- the escape functions, on any string ---------------------------------------------------------------
PIECES = st.sampled_from([*HOSTILE, "[", "]", "\\", ":", "[b]", "[/b]", "[link=x]", "\\[", ":smile:", "&", "<"])
ANY_TEXT = st.lists(PIECES | st.text(st.characters(exclude_categories=()), max_size=8), max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT)
def test_visible_text_holds_no_control_character_and_is_stable(text: str) -> None:
    one_line, multi_line = visible(text), visible(text, multiline=True)
    assert not ONE_LINE_ALLOWED.search(one_line)
    assert not FORBIDDEN.search(multi_line.replace("\t", " "))
    assert multi_line.count("\n") == text.count("\n") and one_line.count("\n") == 0
    assert visible(one_line) == one_line and visible(multi_line, multiline=True) == multi_line  # escaping twice is once
    if not ONE_LINE_ALLOWED.search(text):
        assert one_line == text  # ordinary text (brackets, colons, accents, emoji) is left as it is


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT)
def test_rich_renders_terminal_markup_back_to_the_visible_text(text: str) -> None:
    markup = terminal_markup(text)
    assert Text.from_markup(markup).plain == visible(text)
    # inside the markup of a view: no tag of the text opens, closes or escapes the view's own
    assert Text.from_markup(f"[bold]{markup}[/bold] [red]{markup}[/]").plain == f"{visible(text)} {visible(text)}"


@settings(max_examples=200, deadline=None)
@given(ANY_TEXT)
def test_html_text_escapes_markup_and_control_characters(text: str) -> None:
    shown = html_text(text, multiline=True)
    assert not FORBIDDEN.search(shown.replace("\t", " ")) and not re.search("[<>\"']", shown)
    assert html.unescape(shown) == visible(text, multiline=True)


def test_the_escapes_are_spelled_as_python_writes_them() -> None:
    assert visible("\x1b]0;pwned\x07 \u202e \x9b \ud800 \u2028") == "\\x1b]0;pwned\\x07 \\u202e \\x9b \\ud800 \\u2028"
    assert visible("a\tb\nc\r", multiline=True) == "a\tb\nc\\r"
    assert terminal_markup("[bold red]paid in full[/]") == "\\[bold red]paid in full\\[/]"
    assert html_text("<b>\x1b</b>") == "&lt;b&gt;\\x1b&lt;/b&gt;"
    assert visible_values({"a\x1b": ["\u202e", 1, None, {"k": "x\ny\x07"}]}) == {
        "a\\x1b": ["\\u202e", 1, None, {"k": "x\ny\\x07"}]}


# -- the CLI on a training that holds a hostile worker's reasons -------------------------------------------
async def store_hostile_training(home: Path) -> None:
    """The training as the coordinator leaves it after replacing a worker whose jobs failed with ``HOSTILE``."""
    spec = TrainingSpec(model_type=MODEL_TYPE, target_workers=1, rounds=3)
    async with TrainingDatabase(home / "aitbc.db") as db:
        await db.save_training(TrainingRecord(training_id=TRAINING_ID, spec=spec, coordinator=COORDINATOR,
                                              phase=TrainingPhase.TRAINING, round=1))
        await db.save_contract(WorkerContract(contract_id="contract_1", training_id=TRAINING_ID, worker_id=WORKER,
                                              coordinator=COORDINATOR, price_wei=10**15, rounds=3, accepted_at=1.0))
        for n, (result_hash, tx_hash) in enumerate((("[/]", "\x1b[2J"), ("\u202e", "[red]x[/]"))):
            await db.save_payment(Payment(training_id=TRAINING_ID, worker_id=WORKER, contract_id=f"contract_p{n}",
                                          amount_wei=10**15, tx_hash=tx_hash, result_hash=result_hash))
    log = AuditLog(training_dir(home, TRAINING_ID) / "audit.jsonl")
    for n, error in enumerate(HOSTILE):
        # The record accepts it as it arrives: bounded in length, nothing else.
        failed = Progress.model_validate_json(json.dumps({
            "job_id": f"job_{n}", "training_id": TRAINING_ID, "worker_id": WORKER, "round": 1, "status": "failed",
            "epoch": 0, "epochs": 1, "progress": 0.0, "error": error}))
        await log.append("job_failed", worker=WORKER, job_id=failed.job_id, round=1, reason=failed.error)
        await log.append("worker_replaced", worker=WORKER, replacement=COORDINATOR, shard_index=0,
                         reason=f"its job failed: {failed.error}", tx="0x" + "00" * 32)


@pytest.fixture
def hostile_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping: each reason is checked whole
    home = tmp_path / "home"
    asyncio.run(store_hostile_training(home))
    return home


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(args)
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out + out.err


def assert_inert(output: str, shown: tuple[str, ...]) -> None:
    bad = sorted({repr(c) for c in FORBIDDEN.findall(output)})
    assert not bad, f"characters that drive the terminal reached it: {bad}\n{output}"
    for text in shown:
        assert visible(text) in output, f"{visible(text)!r} is not shown literally:\n{output}"
    assert "✅" not in output


@pytest.mark.parametrize(("command", "shown"), [
    (["monitor", "--training-id", TRAINING_ID], tuple(f"its job failed: {e}" for e in HOSTILE)),
    (["logs", TRAINING_ID], HOSTILE),
    (["audit", "--training-id", TRAINING_ID], HOSTILE),
    (["payments", "--training-id", TRAINING_ID], ("[/]", "\x1b[2J", "\u202e", "[red]x[/]")),
    (["list"], (TRAINING_ID, MODEL_TYPE)),
])
def test_the_cli_shows_a_hostile_workers_words_inert(hostile_home: Path, capsys: pytest.CaptureFixture[str],
                                                       command: list[str], shown: tuple[str, ...]) -> None:
    code, output = run_cli(["distributed-training", *command, "--home", str(hostile_home)], capsys)
    assert code == 0, output
    assert_inert(output, shown)


# -- the assistant: chat answers and MCP results ---------------------------------------------------------
def test_chat_shows_the_monitor_and_its_answer_inert(hostile_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = run_cli(["chat", "--offline", "--home", str(hostile_home), f"how is {TRAINING_ID} doing?"],
                           capsys)
    assert code == 0, output
    assert_inert(output, tuple(f"its job failed: {e}" for e in HOSTILE))


@pytest.mark.parametrize("reason", HOSTILE)
def test_an_answer_quoting_a_reason_is_inert(reason: str) -> None:
    failed = StepOutcome("monitor", {"training_id": reason}, "failed", error=f"its job failed: {reason}")
    for text in (answer([failed]), "\n".join(plan_lines([failed]))):
        assert not ONE_LINE_ALLOWED.search(text.replace("\n", " ")) and text.count("\n") == 0
        assert visible(reason) in text
    result = call_result(failed)
    assert [c.text for c in result.content] == [f"monitor failed: its job failed: {visible(reason)}"]
    assert result.structured_content["error"] == f"its job failed: {visible(reason, multiline=True)}"


async def test_mcp_returns_the_monitors_reasons_inert(hostile_home: Path) -> None:
    outcome = await Executor(ToolContext(home=hostile_home)).call("monitor", {"training_id": TRAINING_ID},
                                                                  request="how is it doing?")
    assert outcome.status == "done", outcome.error
    assert any(FORBIDDEN.search(t) for t in strings_in(outcome.as_json()))  # the hostile reasons are in the data
    result = call_result(outcome)
    assert not [t for t in strings_in(result.structured_content) if FORBIDDEN.search(t.replace("\t", " "))]
    reasons = [e["reason"] for e in result.structured_content["result"]["data"]["events"]]
    assert reasons == [visible(f"its job failed: {e}", multiline=True) for e in HOSTILE]
    assert not FORBIDDEN.search(result.content[0].text)


def strings_in(value: object) -> list[str]:
    """Every string of a JSON value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value.keys(), *(s for v in value.values() for s in strings_in(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in strings_in(v)]
    return []


async def test_a_models_answer_echoing_the_reasons_is_inert(hostile_home: Path) -> None:
    """A model (the OpenAI-compatible path) read the monitor's data and quotes a worker's words back."""
    echoed = f"Round 1 is running. The worker said: {HOSTILE[1]} {HOSTILE[2]} {HOSTILE[5]}\nAnything else?"
    with FakeOpenAI([call("monitor", {"training_id": TRAINING_ID}), final(echoed)]) as api:
        reply = await Assistant(home=hostile_home, llm=LlmConfig(api.url, "m")).handle("how is it doing?")
    assert [o.status for o in reply.outcomes] == ["done"] and reply.via == "llm"
    assert reply.text == visible(echoed, multiline=True) and not FORBIDDEN.search(reply.text)
