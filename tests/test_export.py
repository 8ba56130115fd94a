"""``distributed-training export`` and ``Agent.export_model``: the GPT-2 mapping gives the SDK model's logits,
a real small training exports as safetensors with its provenance and as a ``transformers`` directory that
``AutoModelForCausalLM`` loads with the same logits and ``AutoTokenizer`` with the corpus's tokens, and bad
input is exit 2 with ``--out`` left as it was."""

from __future__ import annotations

import asyncio
import json
import sysconfig
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingSpec
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.coordinator.data._datasets import DatasetStore
from aitbc_agent_sdk.coordinator.data._export import NotExportableError
from aitbc_agent_sdk.coordinator.data._generation import load_codec, load_language_model
from aitbc_agent_sdk.coordinator.data._tasks import TaskCache
from aitbc_agent_sdk.data._bpe import byte_tokenizer
from aitbc_agent_sdk.data._corpus import ByteCodec
from aitbc_agent_sdk.records import RoundMetrics, TaskRef, TrainingRecord
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.tasks._gpt import GPT, GptConfig
from aitbc_agent_sdk.tasks._gpt_export import gpt2_config, gpt2_state_dict
from aitbc_agent_sdk.wire._checkpoint import decode_state, encode_state
from aitbc_cli.app import main

transformers = pytest.importorskip("transformers")  # the dev extra; without it the hf half cannot be checked

GPT_PARAMS = {"layers": 1, "heads": 2, "width": 32, "context": 16, "windows_per_epoch": 32, "eval_windows": 8}
PROMPT = "def main():\n    return self.value  # é €"
TOLERANCE = 1e-5


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(args)
    return int(done.value.code or 0), capsys.readouterr().out


def hf_logits(directory: Path, tokens: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(tokens).logits


# -- the mapping alone -------------------------------------------------------------------------


def random_gpt(config: GptConfig) -> GPT:
    """A GPT with weights far from GPT-2's init (N(0, 0.5)), so a wrong transpose or activation shows."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = GPT(config).eval()
        for p in model.parameters():
            p.data.normal_(0.0, 0.5)
    return model


def test_the_gpt2_mapping_gives_the_sdk_models_logits() -> None:
    config = GptConfig(vocab_size=300, layers=2, heads=4, width=32, context=16)
    ours = random_gpt(config)
    tokens = torch.randint(0, 300, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ours(tokens)

    def gpt2(**override: object) -> torch.Tensor:
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**gpt2_config(config, eot=0), **override}))
        missing, unexpected = hf.load_state_dict(gpt2_state_dict(ours.state_dict(), config), strict=False)
        assert (missing, unexpected) == (["lm_head.weight"], [])  # the tied head: the embedding itself
        assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()
        with torch.no_grad():
            return hf.eval()(tokens).logits

    difference = float((gpt2() - expected).abs().max())
    assert difference <= TOLERANCE, difference
    # The switches matter: GPT-2's own tanh GELU, or no 1/sqrt(head) scaling, is measurably another model.
    for override in ({"activation_function": "gelu_new"}, {"scale_attn_weights": False}):
        assert float((gpt2(**override) - expected).abs().max()) > 1e-3, override


def test_the_mapping_refuses_a_state_that_is_not_the_configs_gpt() -> None:
    config = GptConfig(vocab_size=300, layers=2, heads=2, width=32, context=16)
    state = random_gpt(config).state_dict()
    with pytest.raises(ValueError, match="missing"):
        gpt2_state_dict({k: v for k, v in state.items() if not k.startswith("blocks.1.")}, config)
    with pytest.raises(ValueError, match="unexpected"):
        gpt2_state_dict(state, GptConfig(vocab_size=300, layers=1, heads=2, width=32, context=16))


def test_the_byte_tokenizer_encodes_as_the_corpus_import() -> None:
    text = PROMPT + "".join(map(chr, range(1, 400))) + "\U0001f642"
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(256))
    ids = tokenizer(text)["input_ids"]
    assert ids == ByteCodec().encode(text) and tokenizer.decode(ids) == text
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") == 256 and len(tokenizer) == 257


# -- a real training, exported -----------------------------------------------------------------------


def small_corpus(target: Path) -> None:
    """Some of the standard library's sources as .txt files: real text, a few tens of KB."""
    target.mkdir()
    for source in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:6]:
        (target / f"{source.stem}.txt").write_bytes(source.read_bytes()[:6000])


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrainingRecord, list[RoundMetrics], Path]:
    """Two rounds of a tiny gpt on a BPE corpus, embedded (about 10 s), and the agent's own hf export of it."""
    base = tmp_path_factory.mktemp("export")
    small_corpus(base / "corpus")
    home = base / "home"

    async def train() -> tuple[TrainingRecord, list[RoundMetrics]]:
        async with Agent(AgentConfig(home=home, providers=1)) as agent:
            spec = TrainingSpec(model_type="gpt", task=TaskRef(name="gpt", params=GPT_PARAMS), target_workers=1,
                                rounds=2, vocab_size=512, job=JobConfig(batch_size=16, epochs=1, learning_rate=3e-3))
            report = await agent.run_distributed_training(spec, dataset=base / "corpus")
            await agent.export_model(report.training_id, base / "by-agent", format="hf")
            with pytest.raises(NotExportableError, match="no round 5"):
                await agent.export_model(report.training_id, base / "never", round=5)
            return (await agent.coordinator.db.training(report.training_id),
                    await agent.coordinator.db.rounds(report.training_id))

    record, rounds = asyncio.run(train())
    assert [r.round for r in rounds] == [1, 2] and not (base / "never").exists()
    return home, record, rounds, base / "by-agent"


def sdk_model(home: Path, record: TrainingRecord, tmp_path: Path):
    """The training's model and tokenizer, loaded the way ``sample`` loads them."""
    store = LocalContentStore(home / "store")
    data = DatasetStore(store, home / "datasets")

    async def load():
        model, _, _ = await load_language_model(store, data, TaskCache(store, tmp_path / "tasks"), record)
        return model, await load_codec(data, await data.manifest(record.dataset_cid))
    return asyncio.run(load())


def test_safetensors_holds_the_rounds_weights_with_their_provenance_and_a_card(
        trained, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home, record, rounds, _ = trained
    for round_, chosen in ((None, rounds[-1]), (1, rounds[0])):
        out = tmp_path / f"round-{round_}"
        args = ["distributed-training", "export", "--training-id", record.training_id, "--out", str(out),
                "--home", str(home), "--json"]
        code, printed = run_cli(args + (["--round", str(round_)] if round_ else []), capsys)
        assert code == 0, printed
        result = json.loads(printed)
        assert (result["round"], result["model_cid"], result["format"]) == (chosen.round, chosen.model_cid,
                                                                            "safetensors")
        assert sorted(p.name for p in out.iterdir()) == sorted(result["files"]) == ["README.md", "model.safetensors"]
        with safe_open(out / "model.safetensors", "pt") as f:
            metadata = f.metadata()
            weights = {k: f.get_tensor(k) for k in f.keys()}
        assert metadata["training_id"] == record.training_id and metadata["round"] == str(chosen.round)
        assert metadata["model_cid"] == chosen.model_cid and metadata["dataset_cid"] == record.dataset_cid
        assert json.loads(metadata["task"])["name"] == "gpt" and json.loads(metadata["task_params"]) == GPT_PARAMS
        stored = decode_state(asyncio.run(LocalContentStore(home / "store").cat(chosen.model_cid)))
        assert stored.keys() == weights.keys() and all(torch.equal(stored[k], weights[k]) for k in stored)
    card = (tmp_path / "round-None" / "README.md").read_text()
    for fact in ("`gpt`", record.dataset_cid, "2 of 2", "Workers: 1", "perplexity",
                 f"{rounds[-1].metrics['perplexity']:.4g}", rounds[-1].model_cid):
        assert fact in card, (fact, card)


def test_hf_loads_in_transformers_with_the_sdk_models_logits_and_tokens(
        trained, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home, record, _, by_agent = trained
    out = tmp_path / "gpt-hf"
    code, printed = run_cli(["distributed-training", "export", "--training-id", record.training_id, "--out",
                             str(out), "--format", "hf", "--home", str(home)], capsys)
    assert code == 0 and "as hf to" in printed, printed
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                    "tokenizer.json", "tokenizer_config.json"]
    model, codec = sdk_model(home, record, tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ids = tokenizer(PROMPT)["input_ids"]
    assert ids == codec.encode(PROMPT) and len(ids) < len(PROMPT.encode())  # the corpus's BPE, not bytes
    tokens = torch.tensor([ids[:16], list(range(500, 512)) + ids[:4]])
    with torch.no_grad():
        expected = model.eval()(tokens)
    for directory in (out, by_agent):  # the CLI's export and the agent's
        difference = float((hf_logits(directory, tokens) - expected).abs().max())
        assert difference <= TOLERANCE, (directory, difference)


async def stored_training(home: Path, training_id: str, spec: TrainingSpec, *, rounds: int,
                          dataset_cid: str | None = None) -> TrainingRecord:
    """A record (and ``rounds`` round rows) as a run leaves them, without training: for the refusals."""
    record = TrainingRecord(training_id=training_id, spec=spec, coordinator="0x" + "ab" * 20, round=rounds,
                            dataset_cid=dataset_cid)
    async with TrainingDatabase(home / "aitbc.db") as db:
        await db.save_training(record)
        for r in range(1, rounds + 1):
            await db.finish_round(RoundMetrics(round=r, accuracy=0.5, loss=1.0, workers=1,
                                               model_cid="QmULKig5Fxrs2sC4qt9nNduucXfb92AFYQ6Hi3YRqDmrYC"), record)
    return record


def test_a_byte_level_corpus_exports_a_tokenizer_of_its_bytes(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Without a BPE the tokens are the text's bytes and 256 the separator: the exported tokenizer says so."""
    home = tmp_path / "home"
    small_corpus(tmp_path / "corpus")
    config = GptConfig(vocab_size=257, layers=1, heads=2, width=32, context=16)
    model = random_gpt(config)

    async def store() -> TrainingRecord:
        content = LocalContentStore(home / "store")
        dataset_cid, _ = await DatasetStore(content, home / "datasets").import_dataset(tmp_path / "corpus")
        record = await stored_training(home, "training_bytes", TrainingSpec(
            model_type="gpt", task=TaskRef(name="gpt", params={"layers": 1, "heads": 2, "width": 32, "context": 16}),
            target_workers=1), rounds=0, dataset_cid=dataset_cid)
        model_cid = await content.add(encode_state(model.state_dict()))
        async with TrainingDatabase(home / "aitbc.db") as db:
            await db.finish_round(RoundMetrics(round=1, accuracy=None, loss=5.0, workers=1, model_cid=model_cid),
                                  record.model_copy(update={"round": 1, "model_cid": model_cid}))
        return record

    record = asyncio.run(store())
    out = tmp_path / "bytes-hf"
    code, printed = run_cli(["distributed-training", "export", "--training-id", record.training_id, "--out",
                             str(out), "--format", "hf", "--home", str(home)], capsys)
    assert code == 0, printed
    ids = transformers.AutoTokenizer.from_pretrained(out)(PROMPT)["input_ids"]
    assert ids == list(PROMPT.encode())
    tokens = torch.tensor([ids[:16]])
    with torch.no_grad():
        difference = float((hf_logits(out, tokens) - model(tokens)).abs().max())
    assert difference <= TOLERANCE, difference
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 256


def test_bad_input_is_exit_2_and_leaves_out_as_it_was(trained, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    home, record, _, _ = trained
    untrained = asyncio.run(stored_training(home, "training_untrained", TrainingSpec(
        model_type="gpt", task=TaskRef(name="gpt", params=GPT_PARAMS), target_workers=1), rounds=0))
    classifier = asyncio.run(stored_training(home, "training_mlp", TrainingSpec(model_type="mlp", target_workers=1),
                                             rounds=1))
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    out = tmp_path / "out"
    cases = [
        (record.training_id, out, ["--round", "3"], "has no round 3"),
        (untrained.training_id, out, [], "has no trained model yet"),
        (classifier.training_id, out, ["--format", "hf"], "runs task 'mlp'"),
        (record.training_id, used, [], "already exists"),
        (record.training_id, used / "notes.txt", [], "already exists"),
        (record.training_id, used / "notes.txt" / "gpt", [], "cannot create"),
        (record.training_id, out, ["--format", "onnx"], "onnx"),
    ]
    for tid, target, extra, why in cases:
        code, printed = run_cli(["distributed-training", "export", "--training-id", tid, "--out", str(target),
                                 "--home", str(home), "--json", *extra], capsys)
        assert code == 2 and why in json.loads(printed)["error"], (extra, printed)
        assert not out.exists()
        assert [p.name for p in used.iterdir()] == ["notes.txt"] and (used / "notes.txt").read_text() == "mine"
        assert [p.name for p in tmp_path.iterdir()] == ["used"]  # no partial directory left beside it
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty directory is as good as none
    code, printed = run_cli(["distributed-training", "export", "--training-id", record.training_id, "--out",
                             str(empty), "--home", str(home)], capsys)
    assert code == 0 and (empty / "model.safetensors").is_file(), printed
