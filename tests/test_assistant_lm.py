"""Language models in plain words: "train a GPT on my text corpus ./wiki" plans a gpt training on that
corpus (DiLoCo, the sizes and the update encoding the request names), says so in the reply, and a
corpus that is missing or is not text is answered before anything runs.

Plan-level checks on real directories; the devnet test of the gpt task itself trains one for real.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aitbc_agent_sdk.assistant._base import ToolContext
from aitbc_agent_sdk.assistant._executor import Executor
from aitbc_agent_sdk.assistant._market_tools import InitArgs, UploadArgs, training_spec, upload_data
from aitbc_agent_sdk.assistant._planner import plan_request
from aitbc_agent_sdk.assistant._session import Assistant
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.records import TaskRef, TrainingRecord, TrainingSpec
from aitbc_agent_sdk.tasks._builtin_tasks import BUILTIN_TASKS

MARKET_TRAIN = ["training_init", "upload_data", "discover_workers", "distribute"]
SIZED = ("train a 2-layer GPT with 2 heads, width 64 and context 32 on my text corpus ./wiki "
         "with 4 workers over a slow network")


@pytest.fixture
def corpus_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """./wiki (two .txt files), ./tables (not text) and ./notes.txt (a file), in a fresh working directory."""
    monkeypatch.chdir(tmp_path)
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    (wiki / "a.txt").write_text("The quick brown fox jumps over the lazy dog.\n")
    (wiki / "b.txt").write_text("Pack my box with five dozen liquor jugs.\n")
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "x.csv").write_text("a,label\n1,0\n")
    (tmp_path / "tables" / "y.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("one file, not a corpus\n")
    return tmp_path


def checked(request: str, home: Path) -> list:  # type: ignore[type-arg]
    """The plan's steps as the executor would run them: validated, defaults filled in, preflights run."""
    executor = Executor(ToolContext(home=home))
    return [executor.check(s.tool, s.arguments) for s in plan_request(request).steps]


def test_a_gpt_request_becomes_a_gpt_spec_on_that_corpus(corpus_dir: Path) -> None:
    init, upload, discover, distribute = checked("train a GPT on my text corpus ./wiki", corpus_dir / "home")
    assert [o.tool for o in (init, upload, discover, distribute)] == MARKET_TRAIN
    assert all(o.status == "skipped" and o.error is None for o in (init, upload, discover, distribute))
    spec = training_spec(InitArgs.model_validate(init.arguments))
    assert spec.task == TaskRef(name="gpt") and spec.model_type == "gpt"
    assert (spec.outer, spec.upload_encoding) == ("diloco", "float32")
    assert upload.arguments["data_path"] == "./wiki" and upload.arguments["text_corpus"] is True

    init, upload, discover, _ = checked(SIZED, corpus_dir / "home")
    spec = training_spec(InitArgs.model_validate(init.arguments))
    assert spec.task is not None and dict(spec.task.params) == {"layers": 2, "heads": 2, "width": 64, "context": 32}
    BUILTIN_TASKS["gpt"].Params.model_validate(spec.task.params)  # the names are the gpt task's own
    assert (spec.outer, spec.upload_encoding, spec.target_workers) == ("diloco", "int8", 4)
    assert discover.arguments["required_workers"] == 4  # "4 workers", not a size taken for a count


async def test_the_reply_says_it_trains_a_gpt_on_the_corpus(corpus_dir: Path) -> None:
    home = corpus_dir / "home"
    reply = await Assistant(home=home).handle("train a GPT on my text corpus ./wiki", dry_run=True)
    assert reply.ok and [o.status for o in reply.outcomes] == ["dry-run"] * 4
    first = reply.text.splitlines()[0]
    assert first.startswith("What this trains: a GPT language model (task gpt")
    assert "on the text corpus at ./wiki" in first and "DiLoCo" in first and "mlp" not in reply.text
    assert not home.exists()  # a dry run writes nothing


@pytest.mark.parametrize(("request_text", "data_path", "outer", "encoding"), [
    ("train a language model on ./wiki with 3 workers", "./wiki", "diloco", None),
    ("train a transformer on the text in ./wiki", "./wiki", "diloco", None),
    ("I want a next-token model trained on ~/books over the internet", "~/books", "diloco", None),
    ("find 3 RTX 4090 workers under 0.2 eth and train an LLM on /data/wiki with compressed updates",
     "/data/wiki", "diloco", "int8"),
    ("train a GPT with fedavg and bf16 updates on ./wiki", "./wiki", "fedavg", "bf16"),
    ("train a GPT on my text corpus wiki, outer lr 0.5", "wiki", "diloco", None),
])
def test_language_model_phrasings(request_text: str, data_path: str, outer: str, encoding: str | None) -> None:
    steps = plan_request(request_text).steps
    assert [s.tool for s in steps] == MARKET_TRAIN, request_text
    assert steps[0].arguments["task"] == "gpt" and "model_type" not in steps[0].arguments
    assert (steps[0].arguments["outer"], steps[0].arguments.get("update_encoding")) == (outer, encoding)
    assert steps[1].arguments == {"data_path": data_path, "text_corpus": True}


def test_classifier_requests_stay_classifiers() -> None:
    for request_text, model in (("train my transformer on ./data with 4 workers", "transformer"),
                                ("train a cnn on my text files in ./notes with 2 workers", "cnn"),
                                ("rent 2 workers and train an mlp on digits", "mlp")):
        init, upload = plan_request(request_text).steps[:2]
        assert init.arguments.get("model_type") == model and "task" not in init.arguments, request_text
        assert "text_corpus" not in upload.arguments


@pytest.mark.parametrize(("request_text", "said"), [
    ("train a GPT on my text corpus ./missing", "./missing: no such directory"),
    ("train a GPT on ./tables", "./tables is not a text corpus (files data: it holds .csv, .json files)"),
    ("train a GPT on ./notes.txt", "./notes.txt is a file"),
    ("train a GPT with 2 workers", "no text corpus was named"),
])
async def test_an_lm_on_a_missing_or_wrong_corpus_is_answered_before_anything_runs(
        corpus_dir: Path, request_text: str, said: str) -> None:
    assistant = Assistant(home=corpus_dir / "home")
    reply = await assistant.handle(request_text, confirm=lambda outcomes: pytest.fail("asked to confirm"))
    assert not reply.ok and [o.status for o in reply.outcomes] == ["skipped", "invalid", "skipped", "skipped"]
    assert said in reply.outcomes[1].error and "directory of .txt files" in reply.outcomes[1].error
    assert reply.text.startswith("You asked for: a GPT language model")
    assert f"cannot run it yet: {reply.outcomes[1].error}" in reply.text
    assert assistant.trace == [] and not (corpus_dir / "home" / "aitbc.db").exists()  # nothing was created


async def test_uploading_other_data_to_a_gpt_training_is_refused_before_connecting(corpus_dir: Path) -> None:
    home = corpus_dir / "home"
    home.mkdir()
    tid = "training_00aa11bb22cc33dd"
    spec = TrainingSpec(model_type="gpt", task=TaskRef(name="gpt"), target_workers=2)
    async with TrainingDatabase(home / "aitbc.db") as db:
        await db.save_training(TrainingRecord(training_id=tid, spec=spec, coordinator="0x" + "11" * 20))
    with pytest.raises(DatasetError, match="tables is not a text corpus"):  # no devnet runs: it stops first
        await upload_data(ToolContext(home=home), UploadArgs(training_id=tid, data_path=str(corpus_dir / "tables")))
