"""BPE corpora (issue #27): a byte-level BPE learnt at import with ``tokenizers``, stored by CID in the dataset,
tokens sized to its vocabulary, hostile manifests and tokenizers refused, and ``sample`` speaking the BPE.

The corpus is generated: a few hundred KB of English-like sentences over a Zipf-distributed lexicon of made-up
words (seeded), so the BPE has real merges to learn and every run sees the same text."""

from __future__ import annotations

import asyncio
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from aitbc_agent_sdk import Agent, AgentConfig
from aitbc_agent_sdk.coordinator.data._datasets import DatasetStore
from aitbc_agent_sdk.coordinator.data._generation import SampleRequest, load_codec, prompt_tokens, sample_text
from aitbc_agent_sdk.coordinator.data._sharding import publish_shards
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.coordinator.data._tasks import TaskCache
from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.flow import check_dataset
from aitbc_agent_sdk.records import TaskRef, TrainingPhase, TrainingRecord, TrainingSpec
from aitbc_agent_sdk.records._datasets import (
    MAX_VOCAB, DataSlices, DatasetManifest, FileSlice, ShardData, TokenLayout,
)
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.wire._checkpoint import encode_state
from aitbc_agent_sdk.data._bpe import load_tokenizer
from aitbc_agent_sdk.data._corpus import tokenize_corpus
from aitbc_agent_sdk.tasks._gpt import GPT, generate
from aitbc_agent_sdk.tasks._gpt_task import GptTask
from aitbc_agent_sdk.data._shard_files import SHARD_INFO, TokenData, load_shard, part_name
from aitbc_agent_sdk.tasks._task import DataInfo

VOCAB = 1024
DOCUMENTS = 3
CID = "QmULKig5Fxrs2sC4qt9nNduucXfb92AFYQ6Hi3YRqDmrYC"
GPT_PARAMS = {"layers": 1, "heads": 2, "width": 32, "context": 16}
PROMPT = "The market of the river, café"
BYTE_MANIFEST = "QmQBcUk4NXtpGCswdjkujax4GaWKdfEVaABZncMKVSThJj"
BYTE_ROOT = "QmS2dJWRHkP5whqeZ7DDbpfjy8ZSpcuTg551Pme5y2hTs6"


def english_ish(seed: int, chars: int) -> str:
    """Sentences of made-up words (onset, vowel, coda syllables), Zipf-distributed as a language's words are."""
    rng = np.random.default_rng(seed)
    onsets = "b c d f g h j k l m n p r s t v w y z br ch cl dr fl gr pl sh st th tr wh".split()
    vowels = "a e i o u ai ea ee ie oo ou".split()
    codas = ["", "", "n", "r", "s", "t", "nd", "ng", "st", "ck", "ll"]
    lexicon = sorted({"".join(str(rng.choice(onsets)) + str(rng.choice(vowels)) + str(rng.choice(codas))
                              for _ in range(int(rng.integers(1, 4)))) for _ in range(4000)})
    lexicon += "the of and to in a is that for it as was with market river".split()
    weights = 1.0 / np.arange(1, len(lexicon) + 1) ** 1.1
    order = rng.permutation(len(lexicon))
    out, size = [], 0
    while size < chars:
        words = [lexicon[order[i]] for i in rng.choice(len(lexicon), int(rng.integers(5, 16)), p=weights / weights.sum())]
        sentence = " ".join(words).capitalize() + str(rng.choice([".", ".", "?", "!", ", café."]))
        out.append(sentence + ("\n" if rng.random() < 0.1 else " "))
        size += len(sentence) + 1
    return "".join(out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bpe") / "corpus"
    root.mkdir()
    for i in range(DOCUMENTS):
        (root / f"doc{i}.txt").write_text(english_ish(i, 100_000))
    return root


def import_corpus(corpus: Path, where: Path, **options) -> tuple[DatasetStore, str, DatasetManifest]:
    data = DatasetStore(LocalContentStore(where / "store"), where / "data")
    cid, manifest = asyncio.run(data.import_dataset(corpus, **options))
    return data, cid, manifest


def stored_tokens(data: DatasetStore, manifest: DatasetManifest) -> np.ndarray:
    layout = manifest.tokens
    assert layout is not None
    files = [f for f in manifest.files if f.path != layout.tokenizer_file]
    blobs = [asyncio.run(data._store.cat(f.cid)) for f in files]
    return np.concatenate([np.frombuffer(b, dtype="<u2" if layout.dtype == "uint16" else "<u4") for b in blobs])


def test_a_corpus_imports_with_a_bpe_whose_tokens_fit_its_vocabulary(corpus: Path, tmp_path: Path) -> None:
    data, cid, manifest = import_corpus(corpus, tmp_path, vocab_size=VOCAB)
    layout = manifest.tokens
    assert layout is not None and layout.tokenizer == "bpe" and layout.dtype == "uint16"
    assert 257 < layout.vocab_size <= VOCAB  # merges were learnt; never more than asked
    assert manifest.file(layout.tokenizer_file).cid == layout.tokenizer_cid
    tokens = stored_tokens(data, manifest)
    assert int(tokens.max()) < layout.vocab_size and int((tokens == layout.eot).sum()) == DOCUMENTS
    text_bytes = sum(p.stat().st_size for p in corpus.glob("*.txt"))
    assert text_bytes / len(tokens) > 2.5  # a BPE, not one token per byte
    codec = asyncio.run(load_codec(data, manifest))
    first = (corpus / "doc0.txt").read_text()
    assert codec.decode([int(t) for t in tokens[: list(tokens).index(layout.eot)]]) == first  # lossless
    assert layout.eot not in codec.encode("a <|endoftext|> in a document is text")  # only the import separates


def test_the_same_corpus_and_vocabulary_give_the_same_cids(corpus: Path, tmp_path: Path) -> None:
    """Twice here and once in a fresh process (another hash seed): the same tokenizer, tokens and CIDs."""
    _, cid, manifest = import_corpus(corpus, tmp_path / "a", vocab_size=VOCAB)
    _, again, _ = import_corpus(corpus, tmp_path / "b", vocab_size=VOCAB)
    assert again == cid
    script = ("import sys; from pathlib import Path; from aitbc_agent_sdk.data._corpus import tokenize_corpus; "
              f"tokenize_corpus(Path(sys.argv[1]), Path(sys.argv[2]), vocab_size={VOCAB})")
    out = tmp_path / "fresh"
    subprocess.run([sys.executable, "-c", script, str(corpus), str(out)], check=True, timeout=300)
    store = LocalContentStore(tmp_path / "c")
    assert asyncio.run(store.add_directory(out, only_hash=True)) == manifest.root
    _, other, _ = import_corpus(corpus, tmp_path / "d", vocab_size=2 * VOCAB)
    assert other != cid  # the vocabulary is part of what the import made


def test_byte_level_stays_the_default_and_256_means_bytes(corpus: Path, tmp_path: Path) -> None:
    _, plain, manifest = import_corpus(corpus, tmp_path / "a")
    _, bytes_, _ = import_corpus(corpus, tmp_path / "b", vocab_size=256)
    assert plain == bytes_ and manifest.tokens == TokenLayout(vocab_size=257, eot=256)
    assert [f.path for f in manifest.files] == ["000000.bin"]
    with pytest.raises(DatasetError, match="512 to"):
        tokenize_corpus(corpus, tmp_path / "small", vocab_size=300)
    small = tmp_path / "small-corpus"
    small.mkdir()
    for i in range(4):
        (small / f"{i}.txt").write_text(f"document {i} é. " * 300)
    _, cid, manifest = import_corpus(small, tmp_path / "c")
    # What the byte-level import gave before BPE existed (the same manifest bytes: no new field in them).
    assert (cid, manifest.root) == (BYTE_MANIFEST, BYTE_ROOT)


def test_token_files_are_sized_to_the_vocabulary(tmp_path: Path) -> None:
    assert TokenLayout(dtype="uint32", vocab_size=70_000, eot=0, tokenizer="bpe", tokenizer_file="tokenizer.json")
    for dtype, vocab in (("uint16", 70_000), ("uint32", 8192)):  # too narrow wraps tokens; too wide is refused
        with pytest.raises(ValidationError, match="stored as"):
            TokenLayout(dtype=dtype, vocab_size=vocab, eot=0, tokenizer="bpe", tokenizer_file="tokenizer.json")
    layout = TokenLayout(dtype="uint32", vocab_size=70_000, eot=0, tokenizer="bpe", tokenizer_file="tokenizer.json")
    loaded = load_shard(*write_token_shard(tmp_path / "ok", np.array([69_999, 0, 65_536], dtype="<u4"), layout))
    assert isinstance(loaded, TokenData) and loaded.parts[0].dtype == np.dtype("<u4")
    assert list(loaded.parts[0]) == [69_999, 0, 65_536]


def write_token_shard(directory: Path, tokens: np.ndarray, layout: TokenLayout) -> tuple[Path, ShardData]:
    blob = tokens.tobytes()
    shard = ShardData(kind="tokens", tokens=layout, data=DataSlices(
        slices=(FileSlice(path="000000.bin", cid=CID, offset=0, length=len(blob)),), samples=len(tokens)))
    directory.mkdir(parents=True)
    (directory / part_name(0)).write_bytes(blob)
    (directory / SHARD_INFO).write_text(shard.model_dump_json())
    return directory, shard


def test_a_hostile_manifest_or_shard_is_refused(corpus: Path, tmp_path: Path) -> None:
    data, cid, manifest = import_corpus(corpus, tmp_path, vocab_size=VOCAB)
    good = json.loads(manifest.model_dump_json())

    def tampered(**tokens) -> str:
        return json.dumps({**good, "tokens": {**good["tokens"], **tokens}})

    for change, why in (({"vocab_size": MAX_VOCAB + 1, "dtype": "uint32"}, "less than or equal"),
                        ({"tokenizer_cid": "../../etc/passwd"}, "not a CID"),
                        ({"tokenizer_cid": CID}, "under the CID"),  # a CID, but not the tokenizer's file
                        ({"tokenizer_file": None, "tokenizer_cid": None}, "names its tokenizer"),
                        ({"eot": VOCAB + 5}, "separator")):
        with pytest.raises(ValidationError, match=why):
            DatasetManifest.model_validate_json(tampered(**change))
    # A shard that declares a smaller vocabulary than its tokens use: refused when loaded, before training.
    published = asyncio.run(publish_shards(data, TrainingRecord(
        training_id="training_bpe", spec=TrainingSpec(model_type="mlp", target_workers=1),
        coordinator="0x" + "1" * 40, dataset_cid=cid), manifest, 1))
    shard = asyncio.run(data.shard(published.shards[0].cid))
    assert isinstance(asyncio.run(data.load(published.shards[0].cid)), TokenData)
    assert shard.tokens is not None
    lying = shard.model_copy(update={"tokens": shard.tokens.model_copy(update={"vocab_size": 300})})
    directory = asyncio.run(data.materialize(lying, tmp_path / "lying"))
    with pytest.raises(DatasetError, match="outside its vocabulary of 300"):
        load_shard(directory, lying)


def test_a_hostile_tokenizer_is_refused_before_it_runs(corpus: Path, tmp_path: Path) -> None:
    data, _, manifest = import_corpus(corpus, tmp_path, vocab_size=VOCAB)
    layout = manifest.tokens
    assert layout is not None and layout.tokenizer_file is not None
    blob = asyncio.run(data.read_file(manifest, layout.tokenizer_file, max_bytes=1 << 26))
    assert load_tokenizer(blob, layout).encode("the river")  # the stored one loads
    doc = json.loads(blob)
    regex = {"type": "Replace", "pattern": {"Regex": "(a+)+$"}, "content": ""}
    for bad, why in ((pickle.dumps({"model": "BPE"}), "not JSON"),
                     (json.dumps({**doc, "normalizer": regex}).encode(), "normalizer"),
                     (json.dumps({**doc, "decoder": {"type": "Metaspace"}}).encode(), "decoder"),
                     (json.dumps({**doc, "model": {**doc["model"], "type": "WordPiece"}}).encode(), "plain BPE"),
                     (json.dumps({**doc, "added_tokens": []}).encode(), "special token")):
        with pytest.raises(DatasetError, match=why):
            load_tokenizer(bad, layout)
    with pytest.raises(DatasetError, match="vocabulary"):  # a tokenizer of another size than the layout says
        load_tokenizer(blob, layout.model_copy(update={"vocab_size": layout.vocab_size - 1}))
    with pytest.raises(DatasetError, match="above the limit"):
        asyncio.run(data.read_file(manifest, layout.tokenizer_file, max_bytes=len(blob) - 1))


def test_the_gpt_task_trains_on_bpe_tokens(corpus: Path, tmp_path: Path) -> None:
    data, cid, manifest = import_corpus(corpus, tmp_path, vocab_size=VOCAB)
    published = asyncio.run(publish_shards(data, TrainingRecord(
        training_id="training_bpe", spec=TrainingSpec(model_type="mlp", target_workers=1),
        coordinator="0x" + "1" * 40, dataset_cid=cid), manifest, 1))
    shard = asyncio.run(data.load(published.shards[0].cid))
    assert isinstance(shard, TokenData) and shard.vocab_size == manifest.tokens.vocab_size
    task = GptTask()
    params = task.params(GPT_PARAMS)
    model = task.build_model(DataInfo(feature_shape=(1,), num_classes=shard.num_classes, samples=len(shard)), params)
    batch = next(iter(task.batches(shard, params, 8, torch.Generator().manual_seed(0), torch.device("cpu"))))
    assert torch.isfinite(task.loss(model, batch, params))


async def store_lm_training(corpus: Path, home: Path, **options) -> tuple[TrainingRecord, GPT]:
    """A gpt training on the BPE corpus as a run leaves it: record in aitbc.db, dataset and model in home/store."""
    store = LocalContentStore(home / "store")
    data = DatasetStore(store, home / "datasets")
    dataset_cid, manifest = await data.import_dataset(corpus, vocab_size=VOCAB, **options)
    task = GptTask()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        model = task.build_model(DataInfo(feature_shape=(1,), num_classes=manifest.tokens.vocab_size, samples=0),
                                 task.params(GPT_PARAMS))
        for p in model.parameters():
            p.data.normal_(0.0, 0.5)  # not what a fresh build gives: the sample must come from these weights
    assert isinstance(model, GPT)
    spec = TrainingSpec(model_type="transformer", target_workers=1, task=TaskRef(name="gpt", params=GPT_PARAMS),
                        encrypt=bool(options.get("encrypt")))
    record = TrainingRecord(training_id="training_bpe", spec=spec, coordinator="0x" + "ab" * 20,
                            dataset_cid=dataset_cid, model_cid=await store.add(encode_state(model.state_dict())),
                            phase=TrainingPhase.TRAINING, round=2)
    async with TrainingDatabase(home / "aitbc.db") as db:
        await db.save_training(record)
    return record, model


@pytest.mark.parametrize("encrypt", [False, True])
def test_sample_encodes_the_prompt_and_decodes_with_the_corpus_tokenizer(corpus: Path, tmp_path: Path,
                                                                        encrypt: bool) -> None:
    """The prompt becomes BPE tokens (fewer than its bytes, and they decode back to it), and the continuation
    is the model's own greedy tokens decoded by the tokenizer; a sealed dataset's tokenizer is opened first."""
    home = tmp_path / "home"
    record, model = asyncio.run(store_lm_training(corpus, home, encrypt=encrypt))
    store = LocalContentStore(home / "store")
    data = DatasetStore(store, home / "datasets")
    manifest = asyncio.run(data.manifest(record.dataset_cid))
    assert (manifest.sealed is not None) == encrypt
    codec = asyncio.run(load_codec(data, manifest))
    ids = prompt_tokens(PROMPT, manifest.tokens, codec)
    assert codec.decode(ids) == PROMPT and len(ids) < len(PROMPT.encode()) and max(ids) >= 257
    result = asyncio.run(sample_text(store, data, TaskCache(store, tmp_path / "tasks"), record,
                                     SampleRequest(PROMPT, tokens=12, temperature=0.0)))
    expected = codec.decode(generate(model, ids, 12, temperature=0.0))
    assert (result.text, result.tokens) == (expected, 12)


def test_upload_data_takes_a_vocabulary_for_a_corpus_only(corpus: Path, tmp_path: Path) -> None:
    csv = tmp_path / "rows.csv"
    csv.write_text("a,y\n1,0\n2,1\n")
    with pytest.raises(DatasetError, match="applies to a text corpus"):
        check_dataset(csv, "y", None, VOCAB)
    with pytest.raises(DatasetError, match="512 to"):
        check_dataset(corpus, None, None, 300)
    check_dataset(corpus, None, None, VOCAB)

    async def upload() -> DatasetManifest:  # the agent's step, through the coordinator, into the import
        async with Agent(AgentConfig(home=tmp_path / "home", providers=0, auto_resume=False)) as agent:
            record = await agent.coordinator.initialize(TrainingSpec(model_type="transformer", target_workers=1))
            cid = await agent.upload_training_data(record.training_id, corpus, vocab_size=VOCAB)
            return await agent.coordinator.data.manifest(cid)
    manifest = asyncio.run(upload())
    assert manifest.tokens is not None and manifest.tokens.tokenizer == "bpe"
